// BLAS and thread settings. This is the one file that includes cblas.h, dnnl.hpp and libxsmm.h (and omp.h
// outside kernels).
#include "tapeformer/blas.h"
#include "tapeformer/parallel.h"

#include <cblas.h>
#include <omp.h>
#include <libxsmm.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

TF_NAMESPACE_BEGIN

// ---- small fp32 products: libxsmm's kernels ----------------------------------------------------------------
// A small product (attention's per-head 20×64·64×20: 13,800 of them a training step of the benchmark's
// model; everything in toy models) goes to a kernel libxsmm generates for its exact shape,
// with no packing — unless OpenBLAS runs its SkylakeX kernels (or Cooperlake's, built on them), which have
// small-matrix kernels of their own, without packing, 8–21% faster than libxsmm's on attention's products.
// The other kernel sets pack both operands at every call, and libxsmm is 1.8–2.4× faster than their sgemm
// there (Haswell's, which the AMD EPYC machines' environment selects; bench_matmul --only attn on a Zen 5,
// bench/README.md).

// Below this many multiply-adds a product is small: one tile (waking threads costs more than it saves; gemm
// below), and libxsmm's. OpenBLAS keeps products up to this size single-threaded too (interface/gemm.c:
// 65536 × GEMM_MULTITHREAD_THRESHOLD 4).
constexpr std::int64_t kSmallProduct = std::int64_t(1) << 18;

static bool small_products_on_xsmm() {
    static const bool yes = [] {
        const std::string core = openblas_get_corename();
        return core != "SkylakeX" && core != "Cooperlake";
    }();
    return yes;
}

// C (M, N) = α op(A) op(B) + β C, row-major, through libxsmm; false where it has no kernel for the shape (a
// CPU older than AVX, or a size past its limits): then sgemm does it. libxsmm is column-major and its kernels
// take α = 1, β ∈ {0, 1} and no transposed first operand, so, read column-major, the product is
// Cᵀ = op(B)ᵀ op(A)ᵀ, with op(B) transposed into a copy where the row-major B is transposed, and α and other
// βs applied to the product held apart.
static bool xsmm_product(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                         std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    if (M * N * K >= kSmallProduct || !small_products_on_xsmm()) return false;
    const bool apart = (alpha != 1 && beta != 0) || (beta != 0 && beta != 1);  // the product into `product` first
    const int flags = ta ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
    const float one = 1, kernel_beta = apart ? 0 : beta;
    const libxsmm_blasint m = libxsmm_blasint(N), n = libxsmm_blasint(M), k = libxsmm_blasint(K),
                          ld_first = libxsmm_blasint(tb ? N : ldb), ld_second = libxsmm_blasint(lda),
                          ld_out = libxsmm_blasint(apart ? N : ldc);
    const libxsmm_smmfunction kernel =
        libxsmm_smmdispatch(m, n, k, &ld_first, &ld_second, &ld_out, &one, &kernel_beta, &flags, nullptr);
    if (!kernel) return false;
    thread_local std::vector<float> b_copy, product;
    if (tb) {  // B (N, K) -> its transpose (K, N); column-major, that is (K, N) with stride ldb -> (N, K)
        b_copy.resize(std::size_t(K * N));
        libxsmm_otrans(b_copy.data(), B, sizeof(float), libxsmm_blasint(K), libxsmm_blasint(N), libxsmm_blasint(ldb),
                       libxsmm_blasint(N));
        B = b_copy.data();
    }
    float* out = C;
    if (apart) {
        product.resize(std::size_t(M * N));
        out = product.data();
    }
    kernel(B, A, out);  // out (M, N) row-major = op(A) op(B) (+ C when kernel_beta is 1)
    if (apart) {
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = alpha * out[i * N + j] + beta * C[i * ldc + j];
    } else if (alpha != 1) {
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] *= alpha;
    }
    return true;
}

[[maybe_unused]] static void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc) {
    if (xsmm_product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

[[maybe_unused]] static void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                      const double* A, std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C,
                      std::int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

// ---- gemm: one product split into tiles of C -------------------------------------------------------------
// Every product is split here, into tiles of C whose sizes depend on the product's shape only — never on
// the thread count — and the tiles are shared out among OpenMP's threads, each tile one single-threaded
// BLAS call over the whole inner dimension: libxsmm or sgemm for small products (kSmallProduct, above),
// oneDNN's matmul for the others where it has AVX-512 kernels (cpu_has_avx512 below). (OpenBLAS's OpenMP
// build runs single-threaded inside a parallel region, and outside one for small products; larger products
// always run inside one.) So
// each element of C is computed by the same kernel call, summing the same numbers in the same order, on
// 1, 2 or 16 threads: results are bit-identical whatever the thread count. (OpenBLAS's own threading
// splits a product by the thread count, and its single- and multi-threaded paths block the inner
// dimension differently on some kernel sets, e.g. Haswell with OPENBLAS_L2_SIZE on AMD EPYC.)

namespace {

constexpr std::int64_t kMaxTiles = 4;    // shared evenly among 1, 2 or 4 threads; more tiles cost more packing
constexpr std::int64_t kMinSplit = 256;  // a tile side is halved only while it has at least this much

struct Tiling {
    std::int64_t rows, cols;  // the size of a tile of C (the last row and column of tiles may be smaller)
    std::int64_t row_tiles, col_tiles;
};

// Halves the longer side of the tile while the product has work for more tiles: tiles of at least
// kMinSplit/2 rows or columns keep the cost of packing the operands small next to the multiply-adds.
Tiling tiling(std::int64_t M, std::int64_t N, std::int64_t K) {
    Tiling t{M, N, 1, 1};
    const std::int64_t work = M * N * K;
    std::int64_t tiles = 1;
    while (tiles < kMaxTiles && work >= kSmallProduct * tiles) {
        if (t.rows >= t.cols && t.rows >= kMinSplit) t.rows = (t.rows + 1) / 2;
        else if (t.cols >= kMinSplit) t.cols = (t.cols + 1) / 2;
        else if (t.rows >= kMinSplit / 8) t.rows = (t.rows + 1) / 2;  // a small C with a long inner dimension
        else break;
        t.row_tiles = (M + t.rows - 1) / t.rows;
        t.col_tiles = (N + t.cols - 1) / t.cols;
        tiles = t.row_tiles * t.col_tiles;
    }
    return t;
}

}  // namespace

// ---- bf16 products through oneDNN -------------------------------------------------------------------------
// gemm_bf16 (products of 2^18 multiply-adds and more) rounds the stored operands to bf16 once (same layout,
// dense rows), then runs the tiles of C above, each as one oneDNN matmul primitive (bf16 × bf16 → fp32, α as output scale, β as a sum post-op)
// created and executed with OpenMP's thread count set to 1 on the calling thread: oneDNN then neither
// splits a tile by the thread count nor opens a region of its own, so a tile is computed the same way on
// any thread count, as with sgemm.
namespace {

using bf16_t = std::uint16_t;  // the upper half of an fp32: sign, 8 exponent bits, 7 mantissa bits

Precision g_precision = Precision::FP32;

// Round to nearest, ties to even (what PyTorch's .to(torch.bfloat16) and AVX512-BF16's vcvtneps2bf16 do);
// a NaN stays a quiet NaN instead of rounding up into an infinity.
inline bf16_t to_bf16(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return bf16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

// x (rows, cols) with row stride ld -> out (rows, cols), dense.
[[maybe_unused]] void round_to_bf16(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, bf16_t* out) {
#pragma omp parallel for schedule(static) if (rows * cols >= (std::int64_t(1) << 16) && !omp_in_parallel())
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ld;
        bf16_t* o = out + r * cols;
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c) o[c] = to_bf16(xr[c]);
    }
}

// x (rows, cols) with row stride ld -> out (rows, cols), dense: the values rounded to bf16, held as floats.
void round_through_bf16(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* out) {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ld;
        float* o = out + r * cols;
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c) {
            const std::uint32_t u = std::uint32_t(to_bf16(xr[c])) << 16;
            std::memcpy(o + c, &u, sizeof u);
        }
    }
}

// OpenMP's thread count for oneDNN is 1 while one of these lives (the calling thread's setting only).
struct OneThread {
    int saved = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(saved); }
};

// Whether the instruction set oneDNN uses here (ONEDNN_MAX_CPU_ISA can lower it) includes `wanted`: each
// cpu_isa value contains the bits of those it extends.
bool onednn_isa_has(dnnl::cpu_isa wanted) {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa()), bits = static_cast<unsigned>(wanted);
    return (isa & bits) == bits;
}

const dnnl::engine& cpu_engine() {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

// α as an output scale, β as a sum post-op; the scratch space from the caller (run_product), so that the
// primitives of a thread share one buffer instead of holding one each.
dnnl::primitive_attr product_attr(float alpha, float beta) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
    }
    return attr;
}

// A matmul made with product_attr and the scratch space it needs.
struct Product {
    dnnl::matmul matmul;
    std::size_t scratch_bytes;
};

// With TAPEFORMER_ONEDNN_VERBOSE set, each new product prints one line: what it is (`kind`, its precision
// and m, n, K) and the kernel oneDNN chose for it.
Product make_product(const dnnl::matmul::primitive_desc& pd, const std::string& kind, bool bf16, std::int64_t m,
                     std::int64_t n, std::int64_t K) {
    if (std::getenv("TAPEFORMER_ONEDNN_VERBOSE"))
        std::fprintf(stderr, "%s %s m=%lld n=%lld K=%lld: %s\n", bf16 ? "bf16" : "fp32", kind.c_str(), (long long)m,
                     (long long)n, (long long)K, pd.impl_info_str());
    return {dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
}

// Runs it on this thread's stream, with this thread's scratch buffer.
// `bias` (optional, a (1, n) row added to every row of C) for a primitive made with one.
void run_product(const Product& product, const dnnl::memory& a, const dnnl::memory& b, const dnnl::memory& c,
                 const dnnl::memory* bias = nullptr) {
    thread_local dnnl::stream stream(cpu_engine());
    thread_local std::vector<char> scratch;
    if (scratch.size() < product.scratch_bytes) scratch.resize(product.scratch_bytes);
    const dnnl::memory scratch_mem({{std::int64_t(product.scratch_bytes)}, dnnl::memory::data_type::u8, dnnl::memory::dims{1}},
                                   cpu_engine(), scratch.data());
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, scratch_mem}};
    if (bias) args.emplace(DNNL_ARG_BIAS, *bias);
    product.matmul.execute(stream, args);
    stream.wait();
}

// One tile: C (m, n) = α·op(A) (m, K) · op(B) (K, n) + β·C, A and B bf16 (or fp32) with row strides lda, ldb
// as stored.
using TileKey = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, float, float, bool, bool>;  // ta, tb, m, n, K, lda, ldb, ldc, α, β, bf16, bias

dnnl::memory::desc operand_desc(bool transposed, std::int64_t rows, std::int64_t cols, std::int64_t ld, bool bf16) {
    using dt = dnnl::memory::data_type;
    return {{rows, cols}, bf16 ? dt::bf16 : dt::f32, transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1}};
}

dnnl::memory::desc bias_desc(std::int64_t n) { return {{1, n}, dnnl::memory::data_type::f32, dnnl::memory::dims{n, 1}}; }

Product make_tile_primitive(const TileKey& key) {
    const auto [ta, tb, m, n, K, lda, ldb, ldc, alpha, beta, bf16, bias] = key;
    const dnnl::memory::desc c_md({m, n}, dnnl::memory::data_type::f32, dnnl::memory::dims{ldc, 1});
    const dnnl::memory::desc a_md = operand_desc(ta, m, K, lda, bf16), b_md = operand_desc(tb, K, n, ldb, bf16);
    const dnnl::matmul::desc desc = bias ? dnnl::matmul::desc(a_md, b_md, bias_desc(n), c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
    const dnnl::matmul::primitive_desc pd(desc, product_attr(alpha, beta), cpu_engine());
    return make_product(pd, std::string("tile ") + (ta ? 'T' : 'N') + (tb ? 'T' : 'N') + (bias ? " +bias" : ""), bf16, m, n, K);
}

// C = α·op(A)·op(B) + β·C, or with `bias` (n values; the key says so, and then α = 1 and β = 0), op(A)·op(B)
// + the bias on every row, added in the kernel.
[[maybe_unused]] void onednn_tile(const TileKey& key, const void* A, const void* B, float* C, const float* bias = nullptr) {
    // Each thread keeps its own primitives and stream: no locks, and no primitive runs on two threads at once.
    thread_local std::map<TileKey, Product> primitives;
    OneThread one_thread;
    auto it = primitives.find(key);
    if (it == primitives.end()) it = primitives.emplace(key, make_tile_primitive(key)).first;
    const auto [ta, tb, m, n, K, lda, ldb, ldc, alpha, beta, bf16, has_bias] = key;
    const dnnl::memory a(operand_desc(ta, m, K, lda, bf16), cpu_engine(), const_cast<void*>(A));
    const dnnl::memory b(operand_desc(tb, K, n, ldb, bf16), cpu_engine(), const_cast<void*>(B));
    const dnnl::memory c({{m, n}, dnnl::memory::data_type::f32, dnnl::memory::dims{ldc, 1}}, cpu_engine(), C);
    if (!has_bias) return run_product(it->second, a, b, c);
    const dnnl::memory bias_mem(bias_desc(n), cpu_engine(), const_cast<float*>(bias));
    run_product(it->second, a, b, c, &bias_mem);
}

}  // namespace

// fp32 tiles go to oneDNN rather than sgemm where it has AVX-512 kernels. On the AMD EPYCs of these machines
// the environment sets OPENBLAS_CORETYPE=Haswell, and OpenBLAS's Haswell sgemm (AVX2) made a training step
// 1.6x slower than oneDNN's (328-349 against 212 ms, Zen 4, 2 threads); with OpenBLAS's SkylakeX kernels the
// two are as fast (204-213 against 212-213 ms).
bool cpu_has_avx512() {
    static const bool yes = onednn_isa_has(dnnl::cpu_isa::avx512_core);
    return yes;
}

Precision parse_precision(const std::string& text) {
    if (text == "fp32") return Precision::FP32;
    if (text == "bf16") return Precision::BF16;
    throw std::invalid_argument("precision must be one of fp32, bf16, got '" + text + "'");
}

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "fp32"; }

bool cpu_has_bf16() { return onednn_isa_has(dnnl::cpu_isa::avx512_core_bf16); }  // AMX's value contains its bits

std::string set_precision(Precision p) {
    if (p == Precision::BF16 && !cpu_has_bf16()) {
        g_precision = Precision::FP32;
        return "precision bf16: this CPU has no bf16 instructions (AVX512-BF16 or AMX) for oneDNN; running fp32";
    }
    g_precision = std::is_same_v<real, float> ? p : Precision::FP32;
    return "";
}

Precision precision() { return g_precision; }

// Products below kSmallProduct multiply-adds (attention's per-head 20×64·64×20, and everything in toy
// models): A and B rounded to bf16 but held as floats, multiplied by sgemm. A product of two bf16 values is
// exact in fp32 and the sums are fp32, so this computes what oneDNN's bf16 kernel computes (up to the order
// of the sums), without its cost per call, which for these sizes exceeds the product itself (the backward
// of attention's products: 110 ms a step through oneDNN's batched bf16 matmul, 28 ms this way, default
// bench config). One single-threaded call.
[[maybe_unused]] static void bf16_small_product(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K,
                                                float alpha, const float* A, std::int64_t lda, const float* B,
                                                std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    thread_local std::vector<float> a_r, b_r;  // this thread's rounded copies of A and B
    a_r.resize(std::size_t(a_rows * a_cols));
    b_r.resize(std::size_t(b_rows * b_cols));
    round_through_bf16(A, a_rows, a_cols, lda, a_r.data());
    round_through_bf16(B, b_rows, b_cols, ldb, b_r.data());
    gemm_impl(ta, tb, M, N, K, alpha, a_r.data(), a_cols, b_r.data(), b_cols, beta, C, ldc);
}

// ---- frozen matrices -----------------------------------------------------------------------------------

namespace {
const FrozenMatrices* g_frozen = nullptr;  // the one that lives, if any
}

// The packed copies: one per (first row, rows, precision) of a held matrix, made at first use under the lock
// (decoding's groups run on several threads at once), then only read.
struct FrozenMatrices::Packed {
    std::mutex mutex;
    std::map<std::tuple<const real*, std::int64_t, bool>, dnnl::memory> copies;
#ifndef TAPEFORMER_F64
    // The copy of B (N, K) with row stride ldb for products in fp32 or bf16, packed at its first use; an
    // empty memory where oneDNN would not use its brgemm kernel for it (then B is left to the usual path).
    dnnl::memory copy_of(const real* B, std::int64_t N, std::int64_t K, std::int64_t ldb, bool bf16) {
        using dt = dnnl::memory::data_type;
        using dims = dnnl::memory::dims;
        std::lock_guard<std::mutex> lock(mutex);
        auto it = copies.find({B, N, bf16});
        if (it != copies.end()) return it->second;
        // The layout oneDNN's kernel prefers for B (N, K), read as Bᵀ (K, N), asked for a canonical product
        // (32 dense rows, α = 1, β = 0), so that it depends on N, K and the precision only: the primitives of
        // multiply() are keyed by those, not by the layout.
        const dt type = bf16 ? dt::bf16 : dt::f32;
        const dnnl::memory::desc any({K, N}, type, dnnl::memory::format_tag::any);
        const dnnl::memory::desc a32({32, K}, type, dims{K, 1}), c32({32, N}, dt::f32, dims{N, 1});
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a32, any, c32), cpu_engine());
        // Only for oneDNN's brgemm kernels (AVX-512 CPUs): its gemm:jit fallback packs per call as sgemm
        // does, and is no faster.
        dnnl::memory copy;
        if (std::string(pd.impl_info_str()).rfind("brg", 0) == 0) {
            dnnl::memory plain({{K, N}, dt::f32, dims{1, ldb}}, cpu_engine(), const_cast<float*>(B));
            copy = dnnl::memory(pd.weights_desc(), cpu_engine());
            dnnl::stream stream(cpu_engine());
            dnnl::reorder(plain, copy).execute(stream, plain, copy);  // f32 -> bf16 rounds to nearest even
            stream.wait();
        }
        return copies.emplace(std::make_tuple(B, N, bf16), copy).first->second;
    }
#endif
};

FrozenMatrices::FrozenMatrices() : packed_(std::make_unique<Packed>()) {
    if (g_frozen) throw std::logic_error("FrozenMatrices: another one is alive; only one may live at a time");
    g_frozen = this;
}

FrozenMatrices::~FrozenMatrices() { g_frozen = nullptr; }

void FrozenMatrices::add(const real* data, std::int64_t rows, std::int64_t cols) {
#ifndef TAPEFORMER_F64
    if (rows > 0 && cols > 0) matrices_[data] = {rows, cols};
#else
    (void)data, (void)rows, (void)cols;  // the float64 build multiplies with dgemm only
#endif
}

bool FrozenMatrices::holds(const real* B, std::int64_t rows, std::int64_t cols, std::int64_t ld) const {
    auto it = matrices_.upper_bound(B);  // the held matrix that starts at or before B
    if (it == matrices_.begin()) return false;
    --it;
    const auto [m_rows, m_cols] = it->second;
    const std::ptrdiff_t offset = B - it->first;
    return cols == m_cols && ld == m_cols && offset % m_cols == 0 && offset / m_cols + rows <= m_rows;
}

// One oneDNN matmul on this thread over B's packed copy. In bf16, A is rounded to a dense bf16 copy first
// (oneDNN multiplies bf16 by bf16 only).
bool FrozenMatrices::multiply(std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
                              std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C,
                              std::int64_t ldc) const {
#ifdef TAPEFORMER_F64
    (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
    return false;
#else
    if (!cpu_has_avx512() || !holds(B, N, K, ldb)) return false;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const bool bf16 = g_precision == Precision::BF16;
    const dt type = bf16 ? dt::bf16 : dt::f32;
    const std::int64_t a_ld = bf16 ? K : lda;
    const dnnl::memory::desc a_md({M, K}, type, dims{a_ld, 1});
    const dnnl::memory::desc c_md({M, N}, dt::f32, dims{ldc, 1});
    using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float, float, bool>;
    thread_local std::map<Key, Product> primitives;  // per thread: no primitive runs on two at once
    try {
        OneThread one_thread;  // oneDNN neither splits the product nor opens a region of its own
        const dnnl::memory weights = packed_->copy_of(B, N, K, ldb, bf16);
        if (!weights) return false;
        const Key key{M, N, K, a_ld, ldc, alpha, beta, bf16};  // with N, K and bf16, the layout of `weights`
        auto it = primitives.find(key);
        if (it == primitives.end()) {
            const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, weights.get_desc(), c_md),
                                                  product_attr(alpha, beta), cpu_engine());
            it = primitives.emplace(key, make_product(pd, "held product", bf16, M, N, K)).first;
        }
        thread_local std::vector<bf16_t> a16;
        const void* a = A;
        if (bf16) {
            a16.resize(std::size_t(M * K));
            round_to_bf16(A, M, K, lda, a16.data());
            a = a16.data();
        }
        const dnnl::memory a_mem(a_md, cpu_engine(), const_cast<void*>(a));
        const dnnl::memory c_mem(c_md, cpu_engine(), C);
        run_product(it->second, a_mem, weights, c_mem);
        return true;
    } catch (const dnnl::error&) {
        return false;
    }
#endif
}

// ---- product timing ----------------------------------------------------------------------------------

namespace {

ProductTimer* g_timer = nullptr;  // the one that lives, if any
thread_local bool t_in_product = false;

// Adds the wall time of the product it spans to g_timer, unless a product or a parallel region encloses it.
class TimedProduct {
public:
    TimedProduct() : on_(g_timer && !t_in_product && !omp_in_parallel()) {
        if (!on_) return;
        t_in_product = true;
        start_ = std::chrono::steady_clock::now();
    }
    ~TimedProduct() {
        if (!on_) return;
        g_timer->ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
        ++g_timer->calls;
        t_in_product = false;
    }
    TimedProduct(const TimedProduct&) = delete;
    TimedProduct& operator=(const TimedProduct&) = delete;

private:
    bool on_;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace

ProductTimer::ProductTimer() {
    if (g_timer) throw std::logic_error("ProductTimer: another one is alive; only one may live at a time");
    g_timer = this;
}

ProductTimer::~ProductTimer() { g_timer = nullptr; }

// ---- products, alone or in groups ----------------------------------------------------------------------
// Every product goes through gemm_group: gemm and gemm_batched are groups of one. A group is planned on
// the calling thread (products over held matrices run there and then; bf16 operands of large products are
// rounded), then its work items — tiles of large products, chunks of small batched ones, and the caller's
// jobs — run in one parallel region, or on this thread when it is already in one or the work is small.

namespace {

constexpr std::int64_t kBatchChunk = 16;  // small products of a batch taken together as one work item

// One product of a group, planned.
struct Planned {
    GemmCall call;
    bool large = false;   // each product of the batch has at least kSmallProduct multiply-adds: tiled
    Tiling tiling{};      // of one product of the batch (large only)
    std::int64_t items = 0;
    const bf16_t* A16 = nullptr;  // bf16 precision, large products: the rounded operands, dense, by product
    const bf16_t* B16 = nullptr;
};

[[maybe_unused]] std::int64_t a_rows(const GemmCall& c) { return c.trans_a ? c.K : c.M; }  // A as stored
[[maybe_unused]] std::int64_t a_cols(const GemmCall& c) { return c.trans_a ? c.M : c.K; }
[[maybe_unused]] std::int64_t b_rows(const GemmCall& c) { return c.trans_b ? c.N : c.K; }  // B as stored
[[maybe_unused]] std::int64_t b_cols(const GemmCall& c) { return c.trans_b ? c.K : c.N; }

// Rows [m0, m0 + m) and columns [n0, n0 + n) of C_e, the e-th product of the batch: α·op(A)·op(B) + β·C,
// or + the bias. One single-threaded call.
void compute_block(const Planned& p, std::int64_t e, std::int64_t m0, std::int64_t n0, std::int64_t m, std::int64_t n) {
    const GemmCall& c = p.call;
    real* C = c.C + e * c.c_step + m0 * c.ldc + n0;
    real beta = c.beta;
#ifndef TAPEFORMER_F64
    // oneDNN adds a bias in its kernel; elsewhere C starts as the bias rows, and the product is added to them
    // (the same sum, rounded by other kernels: the last bits differ).
    const bool onednn = p.large && (g_precision == Precision::BF16 || cpu_has_avx512());
#else
    const bool onednn = false;
#endif
    // (oneDNN 2.x scales its bias by an output scale α: only for α = 1, a linear layer's.)
    const bool kernel_bias = c.bias && onednn && c.alpha == real(1);
    if (c.bias && !kernel_bias) {
        for (std::int64_t i = 0; i < m; ++i) std::memcpy(C + i * c.ldc, c.bias + n0, std::size_t(n) * sizeof(real));
        beta = 1;
    }
    if (c.K == 0) {  // BLAS leaves C alone only for beta = 1; make the empty sum explicit
        for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) C[i * c.ldc + j] = beta == real(0) ? real(0) : beta * C[i * c.ldc + j];
        return;
    }
    const real* A = c.A + e * c.a_step;
    const real* B = c.B + e * c.b_step;
    const real* Ai = c.trans_a ? A + m0 : A + m0 * c.lda;  // rows m0.. of op(A): columns of A when stored transposed
    const real* Bi = c.trans_b ? B + n0 * c.ldb : B + n0;  // columns n0.. of op(B): rows of B when stored transposed
#ifndef TAPEFORMER_F64
    if (g_precision == Precision::BF16) {
        if (!p.large)
            return bf16_small_product(c.trans_a, c.trans_b, m, n, c.K, c.alpha, Ai, c.lda, Bi, c.ldb, beta, C, c.ldc);
        const std::int64_t ac = a_cols(c), bc = b_cols(c);
        const bf16_t* A16 = p.A16 + e * a_rows(c) * ac;
        const bf16_t* B16 = p.B16 + e * b_rows(c) * bc;
        const bf16_t* A16i = c.trans_a ? A16 + m0 : A16 + m0 * ac;
        const bf16_t* B16i = c.trans_b ? B16 + n0 * bc : B16 + n0;
        return onednn_tile(TileKey{c.trans_a, c.trans_b, m, n, c.K, ac, bc, c.ldc, c.alpha, kernel_bias ? 0 : beta, true, kernel_bias},
                           A16i, B16i, C, kernel_bias ? c.bias + n0 : nullptr);
    }
    if (onednn)
        return onednn_tile(TileKey{c.trans_a, c.trans_b, m, n, c.K, c.lda, c.ldb, c.ldc, c.alpha, kernel_bias ? 0 : beta, false, kernel_bias},
                           Ai, Bi, C, kernel_bias ? c.bias + n0 : nullptr);
#endif
    gemm_impl(c.trans_a, c.trans_b, m, n, c.K, c.alpha, Ai, c.lda, Bi, c.ldb, beta, C, c.ldc);
}

// Work item i of a planned product: a tile of one product of the batch (large), or kBatchChunk products.
void run_item(const Planned& p, std::int64_t i) {
    const GemmCall& c = p.call;
    if (!p.large) {
        for (std::int64_t e = i * kBatchChunk; e < std::min(c.batch, (i + 1) * kBatchChunk); ++e) compute_block(p, e, 0, 0, c.M, c.N);
        return;
    }
    const Tiling& t = p.tiling;
    const std::int64_t tiles = t.row_tiles * t.col_tiles, e = i / tiles, tile = i % tiles;
    const std::int64_t m0 = (tile / t.col_tiles) * t.rows, n0 = (tile % t.col_tiles) * t.cols;
    compute_block(p, e, m0, n0, std::min(t.rows, c.M - m0), std::min(t.cols, c.N - n0));
}

#ifndef TAPEFORMER_F64
// The bf16 copy of an operand of a large product: X (rows, cols) with row stride ld, `batch` of them `step`
// apart, rounded into `buffer` — or the copy an earlier product of the group made of the same matrices (a
// linear layer's backward multiplies dy by W and, transposed, by x: dy is rounded once).
const bf16_t* round_operand(const float* X, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                            std::int64_t step, std::vector<bf16_t>& buffer, const Planned* plans, std::size_t planned) {
    for (std::size_t k = 0; k < planned; ++k) {
        const GemmCall& o = plans[k].call;
        if (!plans[k].large || o.batch != batch) continue;
        if (o.A == X && a_rows(o) == rows && a_cols(o) == cols && o.lda == ld && o.a_step == step) return plans[k].A16;
        if (o.B == X && b_rows(o) == rows && b_cols(o) == cols && o.ldb == ld && o.b_step == step) return plans[k].B16;
    }
    const std::int64_t n = rows * cols;
    buffer.resize(std::size_t(batch * n));
    for (std::int64_t e = 0; e < batch; ++e) round_to_bf16(X + e * step, rows, cols, ld, buffer.data() + e * n);
    return buffer.data();
}

// Whether a held matrix (FrozenMatrices) took the product: then it is done, computed on this thread.
bool held_product(const GemmCall& c) {
    if (!g_frozen || c.batch != 1 || c.trans_a || !c.trans_b || c.K == 0 || !g_frozen->holds(c.B, c.N, c.K, c.ldb)) return false;
    if (c.bias)
        for (std::int64_t i = 0; i < c.M; ++i) std::memcpy(c.C + i * c.ldc, c.bias, std::size_t(c.N) * sizeof(real));
    return g_frozen->multiply(c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, c.bias ? real(1) : c.beta, c.C, c.ldc);
}
#endif

}  // namespace

void gemm_group(std::initializer_list<GemmCall> products, std::int64_t jobs, const std::function<void(std::int64_t)>& job) {
    const TimedProduct timed;
    // The plans, on the stack: a group is a few products, and attention_heads calls gemm thousands of times a
    // step, where a heap allocation per call would show.
    constexpr std::size_t kMaxProducts = 8;
    if (products.size() > kMaxProducts) throw std::logic_error("gemm_group: more than 8 products in one group");
    std::array<Planned, kMaxProducts> plans;
    std::size_t planned_count = 0;
    // bf16 copies of large products' operands, kept for the thread's next call (jobs must not call gemm).
    thread_local std::vector<std::vector<bf16_t>> rounded;
    std::int64_t items = 0, small_work = 0;
    bool any_large = false;
    for (const GemmCall& c : products) {
        if (c.M == 0 || c.N == 0 || c.batch == 0) continue;
        Planned p{c};
#ifndef TAPEFORMER_F64
        if (held_product(c)) continue;  // a bias, if any, is in C already, and the product added to it
#endif
        const std::int64_t work = c.M * c.N * c.K;
        p.large = work >= kSmallProduct;
        if (p.large) {
            p.tiling = tiling(c.M, c.N, c.K);
            p.items = c.batch * p.tiling.row_tiles * p.tiling.col_tiles;
            any_large = true;
#ifndef TAPEFORMER_F64
            if (g_precision == Precision::BF16) {  // A and B rounded into dense bf16 copies, product by product
                const std::size_t slot = 2 * planned_count;
                if (rounded.size() < slot + 2) rounded.resize(slot + 2);
                p.A16 = round_operand(c.A, a_rows(c), a_cols(c), c.lda, c.batch, c.a_step, rounded[slot], plans.data(), planned_count);
                p.B16 = round_operand(c.B, b_rows(c), b_cols(c), c.ldb, c.batch, c.b_step, rounded[slot + 1], plans.data(), planned_count);
            }
#endif
        } else {
            p.items = (c.batch + kBatchChunk - 1) / kBatchChunk;
            small_work += c.batch * work;
        }
        items += p.items;
        plans[planned_count++] = p;
    }
    // Item i: the products' items in order, then the jobs.
    auto run = [&](std::int64_t i) {
        for (std::size_t k = 0; k < planned_count; ++k) {
            if (i < plans[k].items) return run_item(plans[k], i);
            i -= plans[k].items;
        }
        job(i);
    };
    const std::int64_t total = items + jobs;
    // A region unless this thread is in one already or the work is small (waking the threads costs as much
    // as a small product). A large product always runs in one, so that OpenBLAS, inside it, does not split
    // a tile by the thread count.
    // (A plain loop otherwise: even an inactive region costs a team's setup, which shows on the small
    // products of attention_heads.)
    const bool threaded = !omp_in_parallel() && (any_large || (total > 1 && small_work >= kParallelGrain));
    if (!threaded) {
        for (std::int64_t i = 0; i < total; ++i) run(i);
        return;
    }
#pragma omp parallel for schedule(dynamic)
    for (std::int64_t i = 0; i < total; ++i) run(i);
}

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
          std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    gemm_group({GemmCall{ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc}});
}

void gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K, real alpha,
                  const real* A, std::int64_t lda, std::int64_t a_step, const real* B, std::int64_t ldb,
                  std::int64_t b_step, real beta, real* C, std::int64_t ldc, std::int64_t c_step) {
    gemm_group({GemmCall{ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, a_step, b_step, c_step}});
}

void gemm_reference(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
                    std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (std::int64_t k = 0; k < K; ++k) {
                real a = ta ? A[k * lda + i] : A[i * lda + k];
                real b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += double(a) * double(b);
            }
            real c = beta == real(0) ? real(0) : beta * C[i * ldc + j];
            C[i * ldc + j] = c + alpha * real(acc);
        }
}

void set_threads(int n) {
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    if (n <= 0) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

const char* blas_info() { return openblas_get_config(); }

const char* blas_core() { return openblas_get_corename(); }

std::string small_products_info() {
    if (!small_products_on_xsmm()) return std::string("OpenBLAS (its ") + openblas_get_corename() + " small-matrix kernels)";
    const std::string arch = libxsmm_get_target_arch();  // "generic" where it generates no kernels
    if (arch == "generic") return "OpenBLAS (libxsmm " LIBXSMM_VERSION " has no kernels for this CPU)";
    return "libxsmm " LIBXSMM_VERSION " (" + arch + ")";
}

void configure_runtime(char** argv) {
    bool changed = false;
    if (!std::getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        changed = true;
    }
    if (!std::getenv("OPENBLAS_CORETYPE") && std::strcmp(openblas_get_corename(), "Prescott") == 0) {
        const char* core = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : nullptr;
        if (core) {
            setenv("OPENBLAS_CORETYPE", core, 1);
            changed = true;
        }
    }
    if (changed) execv("/proc/self/exe", argv);  // only returns on failure: carry on as we are
}

TF_NAMESPACE_END
