// The only door to BLAS (src/blas.cpp tiles the products; blas_openblas.cpp, blas_xsmm.cpp, blas_onednn.cpp
// hold one library each). gemm computes C = alpha * op(A) * op(B) + beta * C on row-major matrices, op(X) = X or
// Xᵀ, overloaded for float and double (the float64 build runs the same code through dgemm). set_threads sets
// OpenMP's and OpenBLAS's thread counts together, so that the two never oversubscribe the cores.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// op(A): (M, K), op(B): (K, N), C: (M, N); lda/ldb/ldc are the row strides of the stored matrices.
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, real alpha,
          const real* A, std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc);

// `batch` products of one shape, C_i = α·op(A_i)·op(B_i) + β·C_i with A_i = A + i·a_step, B_i = B + i·b_step,
// C_i = C + i·c_step. Small products (attention's 20×64·64×20) are shared out among the threads, each one
// computed whole by one thread; large ones are split into tiles as gemm's are, all the batch's tiles in one
// parallel region (a group of one, gemm_group below).
void gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K,
                  real alpha, const real* A, std::int64_t lda, std::int64_t a_step, const real* B, std::int64_t ldb,
                  std::int64_t b_step, real beta, real* C, std::int64_t ldc, std::int64_t c_step);

using bf16_t = std::uint16_t;  // a bfloat16: the upper half of an fp32 (sign, 8 exponent bits, 7 mantissa bits)

// X's column sums, taken by a Bf16Copy (below) in the pass that rounds X (a linear layer's bias gradient from dy):
// data[c] = Σ_r X[r, c] when `overwrite`, else += it; the rows added in order, so that the sums have the bits
// of a pass of their own (sum_columns, src/ops_kernels.h).
struct ColumnSums {
    real* data = nullptr;  // none
    bool overwrite = false;
};

// A gradient through a ReLU and dropout, rounded by a Bf16Copy (below) instead of X itself: X[r, c]·scale where
// output[r, c] > 0, else 0 (relu_dropout's backward, from the op's output, laid out as X). A feed-forward
// network's first layer (affine_relu_dropout) then never writes its pre-activation's gradient in fp32: the
// copy and the bias gradient's sums are all its backward reads.
struct ReluGate {
    const real* output = nullptr;  // none: X as it is
    real scale = 1;
    // The rule, for relu_dropout's backward and the rounding pass alike: x·scale where the output y is positive.
    template <class T>
    static T pass(T y, T x, T scale) { return y > T(0) ? x * scale : T(0); }
};

// A matrix rounded to bf16 once for several products that read it. In bf16 precision each large product
// rounds its operands A and B (below); a linear layer's three products read x and W twice each (y = x·Wᵀ
// forward, dx = dy·W and dW = dyᵀ·x backward), so the layer rounds them once in its forward and hands the
// same copies to its backward (GemmCall's a16, b16): the same bits as rounding them again, and a third of a
// bf16 step's rounding less, for the memory of the copies held until backward (as PyTorch's autocast holds
// its casts; bench/README.md, 2026-11-28 night). The values live in the buffer pool.
class Bf16Copy {
public:
    // X (rows, cols) with row stride ld (through `gate` where given), rounded to nearest even into dense rows;
    // the column sums of those values into `sums`.
    Bf16Copy(const real* X, std::int64_t rows, std::int64_t cols, std::int64_t ld, ColumnSums sums = {},
             ReluGate gate = {});
    ~Bf16Copy();
    Bf16Copy(const Bf16Copy&) = delete;
    Bf16Copy& operator=(const Bf16Copy&) = delete;

    const bf16_t* data() const { return values_; }  // (rows, cols), dense
    std::int64_t rows() const { return rows_; }
    std::int64_t cols() const { return cols_; }

private:
    real* storage_;  // from the pool: ⌈rows·cols·2 / sizeof(real)⌉ values
    const bf16_t* values_;
    std::int64_t rows_, cols_;
};

// The copy of X (rows, cols), row stride ld, that a product of `multiply_adds` multiply-adds would round it
// into, to be read by several: null where that product would not round (fp32 or int8 precision, a product
// below kSmallProduct, reference mode, the float64 build). With `sums`, a copy that is made also leaves X's
// column sums there (ColumnSums), and with `gate` the copy is of X through it (ReluGate); where none is made,
// neither are the sums.
std::shared_ptr<const Bf16Copy> bf16_copy(const real* X, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                          std::int64_t multiply_adds, ColumnSums sums = {}, ReluGate gate = {});

// One product of a group (gemm_group): `batch` products C_i = α·op(A_i)·op(B_i) + β·C_i as gemm_batched's,
// or, with `bias` (N values), C_i = α·op(A_i)·op(B_i) + the bias on every row (β is then not used): added in
// the kernel where oneDNN runs the product, onto rows that start as the bias elsewhere (sgemm, held matrices).
// `a16`, `b16` (batch 1 only): bf16_copy's copies of A and B as stored, which a product that rounds its
// operands reads instead of rounding them; others ignore them. A copy of another size throws std::logic_error.
// With a16 given, A may be null (a matrix that exists only as its copy: affine_relu_dropout's gradient).
struct GemmCall {
    bool trans_a = false, trans_b = false;
    std::int64_t M = 0, N = 0, K = 0;
    real alpha = 1;
    const real* A = nullptr;
    std::int64_t lda = 0;
    const real* B = nullptr;
    std::int64_t ldb = 0;
    real beta = 0;
    real* C = nullptr;
    std::int64_t ldc = 0;
    std::int64_t batch = 1, a_step = 0, b_step = 0, c_step = 0;
    const real* bias = nullptr;
    const Bf16Copy* a16 = nullptr;
    const Bf16Copy* b16 = nullptr;
};

// Products that do not depend on each other, and `jobs` more pieces of other work (job(0) .. job(jobs-1),
// independent of each other and of the products, e.g. a bias's gradient by column blocks), in one parallel
// region: each wakes the threads once instead of once a product (about 43 µs each on these 2-core VMs with
// passive waiting, see configure_runtime: a linear layer's backward opened three regions, now one). The
// products are cut into the same tiles as gemm's and gemm_batched's and each tile is one single-threaded
// call, so C is bit-identical to running each product alone (gemm_batched, or a group of one where it has a
// bias), on any thread count; the threads take tiles and jobs as they come free (they differ in size).
void gemm_group(std::initializer_list<GemmCall> products, std::int64_t jobs = 0,
                const std::function<void(std::int64_t)>& job = {});

// The same product with three plain loops, which the tests compare gemm (and matmul) against, is
// reference::gemm (reference_ops.h). In reference mode every product of the three above runs through it.

// Below this many multiply-adds a product is small: one tile (waking threads costs more than it saves), and
// libxsmm's; OpenBLAS keeps products up to this size single-threaded too (interface/gemm.c: 65536 ×
// GEMM_MULTITHREAD_THRESHOLD 4). In bf16 precision a small product stays fp32 (below).
constexpr std::int64_t kSmallProduct = std::int64_t(1) << 18;

// ---- precision of the products ---------------------------------------------------------------------------
// FP32: gemm is sgemm (the default). BF16 (the float build only): every product of at least kSmallProduct
// (2^18) multiply-adds rounds its operands A and B to bfloat16 (to nearest, ties to even) and multiplies
// them with oneDNN's bf16 matmul, summing in fp32 — PyTorch's CPU autocast recipe for matmuls. Smaller
// products (attention's per-head ones, 20×64 by 64×20 in the benchmark's model; a held matrix times 1–3
// rows) stay fp32: no bf16 kernel runs them faster than sgemm, and rounding their operands cost a bf16
// training step 5 ms of its 216 for nothing (bench/README.md, 2026-11-28 night). Everything else (the
// weights and the optimizer's state, softmax, layer norm, the loss) stays fp32. The products are split into
// tiles as sgemm's are, each tile one single-threaded oneDNN call, so bf16 results too are the same on any
// thread count. The float64 build (gradient checks) ignores the setting.
// INT8 (inference only; the float build, CPUs with AVX-512 VNNI): the products over held matrices
// (FrozenMatrices below: a model's weights while it decodes — every linear layer and the output projection)
// multiply int8 by int8 with int32 sums, CTranslate2's and PyTorch's quantize_dynamic recipe:
//   s_w[n] = max_k |B[n,k]| / 127,  q_w[n,k] = round(B[n,k] / s_w[n])   (per output row, once, at first use)
//   s_a[m] = max_k |A[m,k]| / 127,  q_a[m,k] = round(A[m,k] / s_a[m])   (per row of A, at every product)
//   C[m,n] = α · float(Σ_k q_a[m,k]·q_w[n,k]) · (s_a[m]·s_w[n]) + β·C[m,n]   (the sum in int32, exact)
// symmetric, to nearest even, in [-127, 127] (int8_quantize_rows below). Every other product (attention's
// per-head QKᵀ and AV, and training's, which never holds its weights) stays fp32, as do softmax, layer norm
// and the log-softmax. reference::gemm_int8 (reference_ops.h) is the same product written plainly.
// AUTO is a choice, not a precision: `train`'s default, which a run turns into FP32 or BF16 before its first
// product (auto_precision below) and records as such; set_precision refuses it.
enum class Precision { FP32, BF16, INT8, AUTO };
Precision parse_precision(const std::string& text);  // "fp32", "bf16", "int8" or "auto"; std::invalid_argument otherwise
const char* precision_name(Precision p);              // "fp32", "bf16", "int8", "auto"

// Whether this CPU multiplies int8 matrices with int32 sums in hardware (AVX-512 VNNI, or AMX-INT8), as
// oneDNN sees it: --precision int8 needs it (without, set_precision(INT8) runs fp32 with a note).
bool cpu_has_int8();

// The int8 quantisation of INT8 above, for the product and its reference alike: each row r of x (rows,
// cols), row stride ld, to q (rows, cols) dense with scale[r] = max |x[r,:]| / 127 and q = round(x · 127 /
// max) to nearest even (a row of zeros: scale 0, q 0).
void int8_quantize_rows(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int8_t* q,
                        float* scale);

// Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX), as oneDNN sees it (so that
// ONEDNN_MAX_CPU_ISA=AVX512_CORE hides it).
bool cpu_has_bf16();

// What `--precision auto` trains a model of width d_model in, and why (one line for the user): BF16 where
// bf16 products measured faster than fp32 ones for a training step — AMX-BF16 (an Intel Xeon: 1.35×) and
// AVX512-BF16 on AMD (Zen 4: 1.53×, Zen 5: 1.38×) — and d_model is at least kAutoBf16MinWidth; FP32
// elsewhere: Intel's AVX512-BF16 without AMX (0.67×, the Xeon with AMX hidden), CPUs without bf16 products,
// reference mode, and small models. Below that width a step takes milliseconds (the toy preset trains in
// minutes) and fp32 keeps a run's numbers the same on every CPU, which the lessons and tests rely on; bf16's
// sums follow each CPU's kernels. Figures: bench/README.md "--precision auto".
constexpr std::int64_t kAutoBf16MinWidth = 256;
Precision auto_precision(std::int64_t d_model, std::string& why);

// Whether oneDNN has AVX-512 kernels on this CPU, as it sees it (ONEDNN_MAX_CPU_ISA=AVX2 hides them): there,
// gemm's large fp32 products and the products over held weights (FrozenMatrices) run through oneDNN.
bool cpu_has_avx512();

// Sets the precision of every later gemm in this process. BF16 on a CPU without bf16 instructions, or INT8
// on one without int8 ones (cpu_has_int8), sets FP32 instead and returns one line saying so (for the
// user); otherwise returns "". AUTO: std::logic_error (resolve it with auto_precision first).
std::string set_precision(Precision p);
Precision precision();

// Matrices that do not change for a while — a model's weights while it decodes — packed once for the
// products that read them. While one of these lives, a gemm C = α·A·Bᵀ + β·C whose B is one of the (N, K)
// matrices added to it, or whole consecutive rows of one (the query rows of a fused Q, K, V weight), runs
// as one oneDNN matmul on the calling thread, reading a copy of B packed (and in bf16 precision rounded)
// at its first use, in the layout oneDNN's brgemm kernel reads — where oneDNN has one for the product (CPUs
// with AVX-512); elsewhere gemm takes its usual path. In int8 precision the copy is the quantised matrix and
// its row scales, and the product is int8's (above); in reference mode reference::gemm_int8 computes it. Decoding multiplies the same weights by a few rows
// at every step, and sgemm packed (in bf16: rounded and packed) the whole weight again at every call: a
// third of a decoding step (sgemm_incopy) in fp32; oneDNN's brgemm kernel on packed weights also runs
// these thin products faster than sgemm (AMD EPYC Zen 4, one core, bench_decode_products: 237 against 99
// GFLOP/s at 32 rows by the (8000, 256) output projection with OpenBLAS's Haswell kernels, 146 with SkylakeX's).
// A held product is one single-threaded call whatever the thread count, so its results are the same on
// any number of threads; they differ from sgemm's in the last bits (another kernel, another order of
// sums), as oneDNN's bf16 products differ from sgemm's on the rounded operands. Decoding runs its groups of
// sentences in parallel, one thread each (decode.cpp), so the products need no threads of their own.
// The matrices must not change while it lives; the caller (decode.h's FrozenWeights) makes sure of that.
// One lives at a time (a second one throws std::logic_error). The float64 build holds nothing.
class FrozenMatrices {
public:
    FrozenMatrices();
    ~FrozenMatrices();
    FrozenMatrices(const FrozenMatrices&) = delete;
    FrozenMatrices& operator=(const FrozenMatrices&) = delete;

    void add(const real* data, std::int64_t rows, std::int64_t cols);  // a dense (rows, cols) matrix
    std::size_t size() const { return matrices_.size(); }               // matrices held

    // Whether B, a (rows, cols) matrix with row stride ld, is one of the matrices held or some of its
    // consecutive rows, whole.
    bool holds(const real* B, std::int64_t rows, std::int64_t cols, std::int64_t ld) const;

    // C (M, N) = α·A (M, K)·Bᵀ + β·C (row strides lda, ldc) if B (N, K) with row stride ldb is held; gemm
    // calls it. Returns false, having done nothing, if B is not held or oneDNN has no kernel for the product.
    bool multiply(std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A, std::int64_t lda,
                  const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) const;

private:
    struct Packed;  // blas_onednn.cpp: the packed copies, made at first use
    std::map<const real*, std::pair<std::int64_t, std::int64_t>> matrices_;  // start -> (rows, cols)
    std::unique_ptr<Packed> packed_;
};

// While one lives, the wall time of every product (gemm, gemm_batched, gemm_group — a group's jobs included)
// is summed: `bench train --profile` sets the time a step spends in its products against the rest. A product
// inside a parallel region (attention_heads' per-head products) adds its time divided by the team's size: the
// region's wall time in products when its threads are evenly loaded, an estimate otherwise. Products inside
// others are not counted apart; one lives at a time (a second one throws std::logic_error).
class ProductTimer {
public:
    ProductTimer();
    ~ProductTimer();
    ProductTimer(const ProductTimer&) = delete;
    ProductTimer& operator=(const ProductTimer&) = delete;

    double ms = 0;           // summed wall time
    std::int64_t calls = 0;  // products timed
    double rounding_ms = 0;  // of `ms`, the wall time spent rounding operands to bf16 (bf16 precision)
};

void set_threads(int n);   // n <= 0: all cores; 1 whatever n while reference mode is on (reference_ops.h)
int num_threads();
const char* blas_info();   // OpenBLAS's configuration string (core, threading)
const char* blas_core();   // the kernel family OpenBLAS picked for this CPU ("SkylakeX", "Haswell", ...)
std::string small_products_info();  // what multiplies small fp32 products: "libxsmm 1.17 (clx)", or OpenBLAS

// Two settings that OpenMP and OpenBLAS read only when the program loads, so they are fixed by setting
// the environment and starting the program again (once; an explicit setting by the user is kept):
// - OMP_WAIT_POLICY=passive: by default idle OpenMP threads spin, which on a busy machine (more runnable
//   threads than cores) made 2-thread training 15-20x slower than passive waiting (604 vs 11,767 target
//   tokens/s on the toy preset at load 8). On an idle machine passive costs more per parallel region (43 µs
//   against 1 µs on these 2-core VMs): hence parallel.h's grain, and decoding's groups (decode.cpp).
// - OPENBLAS_CORETYPE: OpenBLAS 0.3.21 does not recognise some newer CPUs (e.g. Sapphire Rapids Xeons)
//   and falls back to its generic "Prescott" SSE3 kernels, 2.5-3x slower; with AVX-512 (AVX2) we ask
//   for SkylakeX (Haswell).
// Returns normally when nothing needs doing or the re-exec fails.
void configure_runtime(char** argv);

TF_NAMESPACE_END
