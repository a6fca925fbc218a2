// oneDNN: fp32 tiles on CPUs with AVX-512, bf16 products (--precision bf16) and the matrices held packed for
// decoding (FrozenMatrices), in int8 quantised (--precision int8). The one file that includes dnnl.hpp;
// blas.cpp decides which tile goes where.
#include "blas_backends.h"
#include "tapeformer/lanes.h"
#include "tapeformer/parallel.h"
#include "tapeformer/reference_ops.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

TF_NAMESPACE_BEGIN

// ---- bf16 products through oneDNN -------------------------------------------------------------------------
// gemm_bf16 (products of 2^18 multiply-adds and more) rounds the stored operands to bf16 once (same layout,
// dense rows), then runs the tiles of C above, each as one oneDNN matmul primitive (bf16 × bf16 → fp32, α as output scale, β as a sum post-op)
// created and executed with OpenMP's thread count set to 1 on the calling thread: oneDNN then neither
// splits a tile by the thread count nor opens a region of its own, so a tile is computed the same way on
// any thread count, as with sgemm.

Precision g_precision = Precision::FP32;

namespace {

// Round to nearest, ties to even (what PyTorch's .to(torch.bfloat16) and AVX512-BF16's vcvtneps2bf16 do);
// a NaN stays a quiet NaN instead of rounding up into an infinity.
inline bf16_t to_bf16(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return bf16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

}  // namespace

// x (rows, cols) with row stride ld -> out (rows, cols), dense.
void round_to_bf16(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, bf16_t* out) {
#pragma omp parallel for schedule(static) if (rows * cols >= (std::int64_t(1) << 16) && !omp_in_parallel())
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ld;
        bf16_t* o = out + r * cols;
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c) o[c] = to_bf16(xr[c]);
    }
}

namespace {

// One band's columns [c0, c1) of round_to_bf16_summing_columns, its rows in order; kGated: through the gate.
template <bool kGated>
void round_band_summing_columns(const float* x, const float* gate, float gate_scale, std::int64_t rows, std::int64_t c0,
                                std::int64_t c1, std::int64_t ld, std::int64_t cols, bf16_t* out, float* sums, bool overwrite) {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ld;
        const float* gr = kGated ? gate + r * ld : nullptr;
        bf16_t* o = out + r * cols;
        const auto value = [&](std::int64_t c) { return kGated ? ReluGate::pass(gr[c], xr[c], gate_scale) : xr[c]; };
        if (r == 0 && overwrite) {
#pragma omp simd
            for (std::int64_t c = c0; c < c1; ++c) {
                const float v = value(c);
                o[c] = to_bf16(v);
                sums[c] = v;
            }
        } else {
#pragma omp simd
            for (std::int64_t c = c0; c < c1; ++c) {
                const float v = value(c);
                o[c] = to_bf16(v);
                sums[c] += v;
            }
        }
    }
}

}  // namespace

// In bands of column_band_width columns (parallel.h), each band's rows in order on one thread: the sums' bits
// do not depend on the bands or the threads.
void round_to_bf16_summing_columns(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, bf16_t* out,
                                   float* sums, bool overwrite, const float* gate, float gate_scale) {
    const bool parallel = rows * cols >= (std::int64_t(1) << 16) && !omp_in_parallel();
    const std::int64_t band_width = parallel ? column_band_width(cols) : cols;
    const std::int64_t bands = (cols + band_width - 1) / band_width;
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t band = 0; band < bands; ++band) {
        const std::int64_t c0 = band * band_width, c1 = std::min(cols, c0 + band_width);
        if (gate)
            round_band_summing_columns<true>(x, gate, gate_scale, rows, c0, c1, ld, cols, out, sums, overwrite);
        else
            round_band_summing_columns<false>(x, gate, gate_scale, rows, c0, c1, ld, cols, out, sums, overwrite);
    }
}

namespace {

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
Product make_product(const dnnl::matmul::primitive_desc& pd, const std::string& kind, Precision p, std::int64_t m,
                     std::int64_t n, std::int64_t K) {
    if (std::getenv("TAPEFORMER_ONEDNN_VERBOSE"))
        std::fprintf(stderr, "%s %s m=%lld n=%lld K=%lld: %s\n", precision_name(p), kind.c_str(), (long long)m,
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
    return make_product(pd, std::string("tile ") + (ta ? 'T' : 'N') + (tb ? 'T' : 'N') + (bias ? " +bias" : ""), bf16 ? Precision::BF16 : Precision::FP32, m, n, K);
}

}  // namespace

// C = α·op(A)·op(B) + β·C, or with `bias` (n values; the key says so, and then α = 1 and β = 0), op(A)·op(B)
// + the bias on every row, added in the kernel.
void onednn_tile(const TileKey& key, const void* A, const void* B, float* C, const float* bias) {
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
    if (text == "int8") return Precision::INT8;
    if (text == "auto") return Precision::AUTO;
    throw std::invalid_argument("precision must be one of fp32, bf16, int8, auto, got '" + text + "'");
}

const char* precision_name(Precision p) {
    switch (p) {
        case Precision::BF16: return "bf16";
        case Precision::INT8: return "int8";
        case Precision::AUTO: return "auto";
        case Precision::FP32: break;
    }
    return "fp32";
}

bool cpu_has_bf16() { return onednn_isa_has(dnnl::cpu_isa::avx512_core_bf16); }  // AMX's value contains its bits

// AVX-512 VNNI (vpdpbusd: four u8·s8 products summed into an int32 lane); AMX's value contains its bits.
// Without VNNI, AVX-512's int8 multiply (vpmaddubsw) sums pairs of products in int16 with saturation, which
// oneDNN works around by scaling; the exact int32 sum --precision int8 promises is VNNI's (and AMX's).
bool cpu_has_int8() { return onednn_isa_has(dnnl::cpu_isa::avx512_core_vnni); }

namespace {
bool cpu_is_amd() {
#if defined(__x86_64__) || defined(__i386__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);  // the vendor string is EBX, EDX, ECX
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    return std::string(vendor) == "AuthenticAMD";
#else
    return false;
#endif
}
}  // namespace

Precision auto_precision(std::int64_t d_model, std::string& why) {
    const std::string rule = " (auto: bf16 where AMX-BF16 or AMD's AVX512-BF16 make a step faster, for d_model >= " +
                             std::to_string(kAutoBf16MinWidth) + ")";
    if (!std::is_same_v<real, float> || reference_mode()) {
        why = "precision auto: fp32 (reference mode, and the float64 build, multiply without bf16)";
        return Precision::FP32;
    }
    const bool amx = onednn_isa_has(dnnl::cpu_isa::avx512_core_amx), bf16 = cpu_has_bf16();
    if (!amx && !(bf16 && cpu_is_amd())) {
        why = std::string("precision auto: fp32, as this CPU has ") +
              (bf16 ? "AVX512-BF16 without AMX, where bf16 products measured slower than fp32"
                    : "no bf16 products (AVX512-BF16 or AMX) for oneDNN") + rule;
        return Precision::FP32;
    }
    const std::string unit = amx ? "AMX-BF16" : "AVX512-BF16";
    if (d_model < kAutoBf16MinWidth) {
        why = "precision auto: fp32, as d_model " + std::to_string(d_model) + " is below " +
              std::to_string(kAutoBf16MinWidth) + ", where fp32's results are the same on every CPU (" + unit +
              " here; --precision bf16 to use it)";
        return Precision::FP32;
    }
    why = "precision auto: bf16 products with fp32 sums, on this CPU's " + unit + rule + "; --precision fp32 for fp32";
    return Precision::BF16;
}

std::string set_precision(Precision p) {
    if (p == Precision::AUTO) throw std::logic_error("set_precision(AUTO): resolve it with auto_precision first");
    if (p == Precision::BF16 && !cpu_has_bf16()) {
        g_precision = Precision::FP32;
        return "precision bf16: this CPU has no bf16 instructions (AVX512-BF16 or AMX) for oneDNN; running fp32";
    }
    if (p == Precision::INT8 && (!cpu_has_int8() || !std::is_same_v<real, float>)) {
        g_precision = Precision::FP32;
        return "precision int8: this CPU has no int8 instructions (AVX512-VNNI or AMX) for oneDNN; running fp32";
    }
    g_precision = std::is_same_v<real, float> ? p : Precision::FP32;
    return "";
}

Precision precision() { return g_precision; }

// The scale of a row, then one multiply and a rounding per value, vectorised; reference_ops.cpp writes the
// same steps as plain loops with std::nearbyint. (GCC left a loop over nearbyint scalar: 8% of int8 greedy
// decoding's time under perf, bench/README.md; y + 1.5·2^23 − 1.5·2^23 rounds y to nearest even as
// nearbyint does, for |y| < 2^22, and vectorises. Clamping before rounding equals clamping after: ±127
// are integers and rounding is monotonic.)
void int8_quantize_rows(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int8_t* q,
                        float* scale) {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ld;  // (cols)
        std::int8_t* qr = q + r * cols;
        float part[kLanes] = {};  // max |x| in fixed lanes (lanes.h): a loop that vectorises
        std::int64_t k = 0;
        for (; k + kLanes <= cols; k += kLanes)
            for (std::int64_t l = 0; l < kLanes; ++l) {
                const float a = std::fabs(xr[k + l]);
                part[l] = part[l] > a ? part[l] : a;  // (std::max, through references, stays scalar)
            }
        float amax = 0;
        for (std::int64_t l = 0; l < kLanes; ++l) amax = std::max(amax, part[l]);
        for (; k < cols; ++k) amax = std::max(amax, std::fabs(xr[k]));
        if (amax == 0) {
            scale[r] = 0;
            std::memset(qr, 0, std::size_t(cols));
            continue;
        }
        const float inv = 127.0f / amax;
        scale[r] = amax / 127.0f;
        constexpr float kRound = 12582912.0f;  // 1.5·2^23
#pragma omp simd
        for (std::int64_t k = 0; k < cols; ++k) {
            float y = xr[k] * inv;
            y = y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y;
            qr[k] = std::int8_t(static_cast<int>((y + kRound) - kRound));
        }
    }
}

// ---- frozen matrices -----------------------------------------------------------------------------------

namespace {
const FrozenMatrices* g_frozen = nullptr;  // the one that lives, if any
}

// The packed copies: one per (first row, rows, precision) of a held matrix, made at first use under the lock
// (decoding's groups run on several threads at once), then only read.
struct FrozenMatrices::Packed {
    struct Copy {
        dnnl::memory weights;            // B packed for oneDNN: fp32, bf16 (rounded) or int8 (quantised)
        std::vector<float> row_scales;   // int8: s_w (N), one per row of B
    };
    std::mutex mutex;
    std::map<std::tuple<const real*, std::int64_t, Precision>, Copy> copies;
#ifndef TAPEFORMER_F64
    // The copy of B (N, K) with row stride ldb for products in precision p, packed at its first use; an
    // empty memory where oneDNN would not use its brgemm kernel for it (then B is left to the usual path).
    const Copy& copy_of(const real* B, std::int64_t N, std::int64_t K, std::int64_t ldb, Precision p) {
        using dt = dnnl::memory::data_type;
        using dims = dnnl::memory::dims;
        std::lock_guard<std::mutex> lock(mutex);
        auto it = copies.find({B, N, p});
        if (it != copies.end()) return it->second;
        // The layout oneDNN's kernel prefers for B (N, K), read as Bᵀ (K, N), asked for a canonical product
        // (32 dense rows, α = 1, β = 0), so that it depends on N, K and the precision only: the primitives of
        // multiply() are keyed by those, not by the layout. int8: s8 × s8 -> s32 (oneDNN's VNNI kernels take
        // an s8 source by adding 128 and subtracting 128·Σ_k w, a compensation the packed copy carries).
        const bool int8 = p == Precision::INT8;
        const dt type = int8 ? dt::s8 : p == Precision::BF16 ? dt::bf16 : dt::f32;
        const dnnl::memory::desc any({K, N}, type, dnnl::memory::format_tag::any);
        const dnnl::memory::desc a32({32, K}, type, dims{K, 1}), c32({32, N}, int8 ? dt::s32 : dt::f32, dims{N, 1});
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a32, any, c32), cpu_engine());
        // Only for oneDNN's brgemm kernels (AVX-512 CPUs): its gemm:jit fallback packs per call as sgemm
        // does, and is no faster.
        Copy copy;
        if (std::string(pd.impl_info_str()).rfind("brg", 0) == 0) {
            std::vector<std::int8_t> q;  // int8: B quantised, (N, K)
            dnnl::memory plain;
            if (int8) {
                q.resize(std::size_t(N * K));
                copy.row_scales.resize(std::size_t(N));
                int8_quantize_rows(B, N, K, ldb, q.data(), copy.row_scales.data());
                plain = dnnl::memory({{K, N}, dt::s8, dims{1, K}}, cpu_engine(), q.data());
            } else {
                plain = dnnl::memory({{K, N}, dt::f32, dims{1, ldb}}, cpu_engine(), const_cast<float*>(B));
            }
            copy.weights = dnnl::memory(pd.weights_desc(), cpu_engine());
            dnnl::stream stream(cpu_engine());
            dnnl::reorder(plain, copy.weights).execute(stream, plain, copy.weights);  // f32 -> bf16 rounds to nearest even
            stream.wait();
        }
        return copies.emplace(std::make_tuple(B, N, p), std::move(copy)).first->second;
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
// (oneDNN multiplies bf16 by bf16 only); in int8, A is quantised by rows to a dense int8 copy, the product
// is summed in int32, and C is rescaled here, row by row (blas.h's INT8: the steps of reference::gemm_int8).
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
    const Precision p = product_precision(M * N * K);
    const bool bf16 = p == Precision::BF16, int8 = p == Precision::INT8;
    const dt type = int8 ? dt::s8 : bf16 ? dt::bf16 : dt::f32;
    const std::int64_t a_ld = bf16 || int8 ? K : lda;
    const std::int64_t c_ld = int8 ? N : ldc;  // int8: the int32 sums, dense, before the rescale
    const dnnl::memory::desc a_md({M, K}, type, dims{a_ld, 1});
    const dnnl::memory::desc c_md({M, N}, int8 ? dt::s32 : dt::f32, dims{c_ld, 1});
    using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float, float, Precision>;
    thread_local std::map<Key, Product> primitives;  // per thread: no primitive runs on two at once
    try {
        OneThread one_thread;  // oneDNN neither splits the product nor opens a region of its own
        const Packed::Copy& copy = packed_->copy_of(B, N, K, ldb, p);
        if (!copy.weights) return false;
        // int8: α and β are applied in the rescale, the matmul makes the plain int32 sums
        const float m_alpha = int8 ? 1.0f : alpha, m_beta = int8 ? 0.0f : beta;
        const Key key{M, N, K, a_ld, c_ld, m_alpha, m_beta, p};  // with N, K and p, the layout of the copy
        auto it = primitives.find(key);
        if (it == primitives.end()) {
            const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, copy.weights.get_desc(), c_md),
                                                  product_attr(m_alpha, m_beta), cpu_engine());
            it = primitives.emplace(key, make_product(pd, "held product", p, M, N, K)).first;
        }
        thread_local std::vector<bf16_t> a16;
        thread_local std::vector<std::int8_t> a8;       // (M, K) int8: A quantised
        thread_local std::vector<float> a_scales;       // (M)
        thread_local std::vector<std::int32_t> sums;    // (M, N) int8: Σ_k q_a·q_w
        const void* a = A;
        void* c = C;
        if (bf16) {
            a16.resize(std::size_t(M * K));
            round_to_bf16(A, M, K, lda, a16.data());
            a = a16.data();
        } else if (int8) {
            a8.resize(std::size_t(M * K));
            a_scales.resize(std::size_t(M));
            sums.resize(std::size_t(M * N));
            int8_quantize_rows(A, M, K, lda, a8.data(), a_scales.data());
            a = a8.data();
            c = sums.data();
        }
        const dnnl::memory a_mem(a_md, cpu_engine(), const_cast<void*>(a));
        const dnnl::memory c_mem(c_md, cpu_engine(), c);
        run_product(it->second, a_mem, copy.weights, c_mem);
        if (int8)  // C = α·(float(Σ)·(s_a·s_w)) + β·C, as reference::gemm_int8 writes it
            for (std::int64_t i = 0; i < M; ++i) {
                const float sa = a_scales[std::size_t(i)];
                const float* sw = copy.row_scales.data();
                const std::int32_t* si = sums.data() + i * N;  // (N)
                float* ci = C + i * ldc;                       // (N)
                if (beta == 0.0f) {
#pragma omp simd
                    for (std::int64_t j = 0; j < N; ++j) ci[j] = 0.0f + alpha * (float(si[j]) * (sa * sw[j]));
                } else {
#pragma omp simd
                    for (std::int64_t j = 0; j < N; ++j) ci[j] = beta * ci[j] + alpha * (float(si[j]) * (sa * sw[j]));
                }
            }
        return true;
    } catch (const dnnl::error&) {
        return false;
    }
#endif
}

#ifndef TAPEFORMER_F64
// Whether a held matrix (FrozenMatrices) took the product: then it is done, computed on this thread.
bool held_product(const GemmCall& c) {
    if (!g_frozen || c.batch != 1 || c.trans_a || !c.trans_b || c.K == 0 || !g_frozen->holds(c.B, c.N, c.K, c.ldb)) return false;
    if (c.bias)
        for (std::int64_t i = 0; i < c.M; ++i) std::memcpy(c.C + i * c.ldc, c.bias, std::size_t(c.N) * sizeof(real));
    const real beta = c.bias ? real(1) : c.beta;
    if (g_frozen->multiply(c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, beta, c.C, c.ldc)) return true;
    if (g_precision != Precision::INT8) return false;  // (C started as the bias: gemm adds the product to it)
    // int8 where oneDNN has no kernel for the product: the same product, plainly
    reference::gemm_int8(c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, beta, c.C, c.ldc);
    return true;
}

bool held_int8(const GemmCall& c) {
    return g_precision == Precision::INT8 && g_frozen && c.batch == 1 && !c.trans_a && c.trans_b && c.K > 0 &&
           g_frozen->holds(c.B, c.N, c.K, c.ldb);
}
#endif

TF_NAMESPACE_END
