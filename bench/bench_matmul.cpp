// bench_matmul: how fast is tf::matmul next to raw cblas_sgemm on the products the default model runs
// (B=64, T=20, C=256, H=4, D=64, F=1024, V=8000), and on one large square product (the hardware's rate)?
// For each shape it times the op's forward and its backward and the same products made with cblas_sgemm
// directly, and prints GFLOP/s and their ratio (library / raw).
//
// With --precision bf16 the op runs as `--precision bf16` training runs it (operands rounded to bf16 per
// call, tiles on oneDNN; products below 2^18 multiply-adds, the attention cases, stay fp32 sgemm) and the raw
// side is oneDNN's own bf16 matmul at its best (fp32 for the attention cases, as the op): operands already
// bf16, the weights side reordered once into the layout the kernel asks for, one primitive over all threads.
// That is the anchor of issue #32 §1 — on an AMX CPU, AMX's rate for each shape — as sgemm is for fp32.
// (--raw onednn gives the fp32 products the same treatment.)
//
//   bench_matmul [--threads N] [--precision fp32|bf16] [--raw sgemm|onednn] [--reps N] [--min-time S]
//                [--only TEXT] [--json]
//
// Backward is timed by calling the matmul's tape record directly — the closure tf::backward runs for it —
// with the upstream gradient dC already in the output's gradient buffer: exactly the two gradient products
// (beta = 1, accumulating into dA and dB), without the seeding of dC that tf::backward does for its root.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/ops.h"

static_assert(std::is_same_v<tf::real, float>, "bench_matmul compares against sgemm: link the float32 core");

namespace {

struct Options {
    int threads = 0;        // 0: all cores
    int reps = 5;           // each function runs at least this many timed times...
    double min_time = 0.3;  // ...and for at least this many seconds
    int warmup = 2;         // untimed runs first (pool buffers, BLAS buffers, caches)
    std::string only;       // run only the cases whose name contains this
    bool json = false;      // one JSON object per row instead of the table
    tf::Precision precision = tf::Precision::FP32;  // the op's precision: FP32 or BF16
    bool raw_onednn = false;  // the raw side: oneDNN's matmul (always in bf16) rather than cblas_sgemm
};

// One product as the model runs it: op(a) · op(b), shapes as the library sees them.
struct Case {
    std::string name;
    tf::Shape a, b;
    bool ta = false, tb = false;
};

// The same product as BLAS sees it: `batch` gemms of op(A) (M, K) · op(B) (K, N) at the library's strides.
// A 3-D a with a 2-D b is one gemm over all B·T rows, as in tf::matmul.
struct Gemms {
    std::int64_t batch, M, N, K, lda, ldb, a_step, b_step, c_step;
    bool ta, tb;
    double flops() const { return 2.0 * double(batch) * double(M) * double(N) * double(K); }  // one product
};

Gemms gemms_of(const Case& c) {
    Gemms g{};
    g.ta = c.ta;
    g.tb = c.tb;
    const bool shared_b = c.b.rank == 2 && c.a.rank > 2;
    if (shared_b) {
        g.batch = 1;
        g.M = c.a.leading();
        g.K = c.a.last();
    } else {
        g.batch = c.a.numel() / (c.a[-1] * c.a[-2]);
        g.M = c.ta ? c.a[-1] : c.a[-2];
        g.K = c.ta ? c.a[-2] : c.a[-1];
    }
    g.N = c.tb ? c.b[-2] : c.b[-1];
    g.lda = c.a.last();
    g.ldb = c.b.last();
    g.a_step = shared_b ? 0 : g.M * g.K;
    g.b_step = shared_b ? 0 : g.K * g.N;
    g.c_step = g.M * g.N;
    return g;
}

std::string shape_str(const tf::Shape& s) {
    std::string out = "(";
    for (int i = 0; i < s.rank; ++i) out += (i ? "," : "") + std::to_string(s.dims[i]);
    return out + ")";
}

std::string product_str(const Case& c) {
    return shape_str(c.a) + (c.ta ? "^T" : "") + " x " + shape_str(c.b) + (c.tb ? "^T" : "");
}

// ---- raw BLAS --------------------------------------------------------------------------------------------
// Plain buffers for the raw side: operands, output, upstream gradient and the two gradients.
struct RawBuffers {
    std::vector<float> A, B, C, dC, dA, dB;
};

CBLAS_TRANSPOSE op(bool t) { return t ? CblasTrans : CblasNoTrans; }

// C_i = op(A_i) · op(B_i) for every i; with `parallel` the loop is split across OpenMP threads (OpenBLAS
// runs each call single-threaded inside the parallel region).
void raw_forward(const Gemms& g, RawBuffers& m, bool parallel) {
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t i = 0; i < g.batch; ++i)
        cblas_sgemm(CblasRowMajor, op(g.ta), op(g.tb), g.M, g.N, g.K, 1.0f, m.A.data() + i * g.a_step, g.lda,
                    m.B.data() + i * g.b_step, g.ldb, 0.0f, m.C.data() + i * g.c_step, g.N);
}

// dA_i += dC_i · op(B_i)ᵀ and dB_i += op(A_i)ᵀ · dC_i (written for the stored layouts), beta = 1 as on the tape.
void raw_backward(const Gemms& g, RawBuffers& m, bool parallel) {
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t i = 0; i < g.batch; ++i) {
        const float *A = m.A.data() + i * g.a_step, *B = m.B.data() + i * g.b_step, *dC = m.dC.data() + i * g.c_step;
        float *dA = m.dA.data() + i * g.a_step, *dB = m.dB.data() + i * g.b_step;
        if (!g.ta)  // dA (M,K) += dC (M,N) · op(B)ᵀ (N,K)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, op(!g.tb), g.M, g.K, g.N, 1.0f, dC, g.N, B, g.ldb, 1.0f, dA, g.lda);
        else        // A stored (K,M): dA += op(B) (K,N) · dCᵀ (N,M)
            cblas_sgemm(CblasRowMajor, op(g.tb), CblasTrans, g.K, g.M, g.N, 1.0f, B, g.ldb, dC, g.N, 1.0f, dA, g.lda);
        if (!g.tb)  // dB (K,N) += op(A)ᵀ (K,M) · dC (M,N)
            cblas_sgemm(CblasRowMajor, op(!g.ta), CblasNoTrans, g.K, g.N, g.M, 1.0f, A, g.lda, dC, g.N, 1.0f, dB, g.ldb);
        else        // B stored (N,K): dB += dCᵀ (N,M) · op(A) (M,K)
            cblas_sgemm(CblasRowMajor, CblasTrans, op(g.ta), g.N, g.K, g.M, 1.0f, dC, g.N, A, g.lda, 1.0f, dB, g.ldb);
    }
}

// ---- raw oneDNN ------------------------------------------------------------------------------------------
// One product of a raw pass as oneDNN's matmul at its best: dst (+)= src · weights, with src and weights
// converted once to the data type (bf16 or f32) in their stored layout, the weights then reordered into the
// layout the kernel prefers (format any), and one primitive over all of OpenMP's threads. Only execute() is
// timed.

// A (rows, cols) matrix, `batch` of them `step` apart, at p with the given strides: a view of one of the
// float buffers, transposed by swapping the strides.
struct View {
    float* p;
    std::int64_t batch, rows, cols, row_stride, col_stride, step;
    View t() const { return {p, batch, cols, rows, col_stride, row_stride, step}; }
    dnnl::memory::desc desc(dnnl::memory::data_type type) const {
        if (batch == 1) return {{rows, cols}, type, dnnl::memory::dims{row_stride, col_stride}};
        return {{batch, rows, cols}, type, dnnl::memory::dims{step, row_stride, col_stride}};
    }
};

// op(X) of a product's operand X stored (rows, cols) with row stride ld: the stored matrix, or its transpose.
View stored(float* p, std::int64_t batch, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t step,
            bool transposed) {
    const View v{p, batch, rows, cols, ld, 1, step};
    return transposed ? v.t() : v;
}

const dnnl::engine& engine() {
    static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

class RawProduct {
  public:
    RawProduct(const View& src, const View& weights, const View& dst, float beta, dnnl::memory::data_type type) {
        using dt = dnnl::memory::data_type;
        dnnl::primitive_attr attr;
        if (beta != 0.0f) {
            dnnl::post_ops ops;
            ops.append_sum(beta);
            attr.set_post_ops(ops);
        }
        const dnnl::memory::desc w_any = weights.batch == 1
            ? dnnl::memory::desc({weights.rows, weights.cols}, type, dnnl::memory::format_tag::any)
            : dnnl::memory::desc({weights.batch, weights.rows, weights.cols}, type, dnnl::memory::format_tag::any);
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src.desc(type), w_any, dst.desc(dt::f32)), attr, engine());
        kernel_ = pd.impl_info_str();
        matmul_ = dnnl::matmul(pd);
        dnnl::stream stream(engine());
        dnnl::memory src_f32(src.desc(dt::f32), engine(), src.p), w_f32(weights.desc(dt::f32), engine(), weights.p);
        src_ = dnnl::memory(src.desc(type), engine());
        weights_ = dnnl::memory(pd.weights_desc(), engine());
        dnnl::reorder(src_f32, src_).execute(stream, src_f32, src_);  // to bf16 (rounded to nearest even)
        dnnl::reorder(w_f32, weights_).execute(stream, w_f32, weights_);
        dst_ = dnnl::memory(dst.desc(dt::f32), engine(), dst.p);
        stream.wait();
    }
    void run() const {
        dnnl::stream stream(engine());
        matmul_.execute(stream, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}});
        stream.wait();
    }
    const std::string& kernel() const { return kernel_; }

  private:
    dnnl::matmul matmul_;
    dnnl::memory src_, weights_, dst_;
    std::string kernel_;
};

// The forward product C = op(A)·op(B), and backward's dA += dC·op(B)ᵀ and dB += op(A)ᵀ·dC (written for the
// stored layouts, as raw_backward does), over m's buffers.
struct RawOnednn {
    std::vector<RawProduct> forward, backward;
    RawOnednn(const Gemms& g, RawBuffers& m, dnnl::memory::data_type type) {
        const View A = stored(m.A.data(), g.batch, g.ta ? g.K : g.M, g.ta ? g.M : g.K, g.lda, g.a_step, g.ta);  // op(A) (M, K)
        const View B = stored(m.B.data(), g.batch, g.tb ? g.N : g.K, g.tb ? g.K : g.N, g.ldb, g.b_step, g.tb);  // op(B) (K, N)
        const View C{m.C.data(), g.batch, g.M, g.N, g.N, 1, g.c_step}, dC{m.dC.data(), g.batch, g.M, g.N, g.N, 1, g.c_step};
        forward.emplace_back(A, B, C, 0.0f, type);
        // op(dA) (M, K) = dC (M, N) · op(B)ᵀ; where A is stored transposed, its gradient is written transposed too
        const View dA = stored(m.dA.data(), g.batch, g.ta ? g.K : g.M, g.ta ? g.M : g.K, g.lda, g.a_step, g.ta);
        const View dB = stored(m.dB.data(), g.batch, g.tb ? g.N : g.K, g.tb ? g.K : g.N, g.ldb, g.b_step, g.tb);
        if (!g.ta) backward.emplace_back(dC, B.t(), dA, 1.0f, type);
        else backward.emplace_back(B, dC.t(), dA.t(), 1.0f, type);     // dAᵀ (K, M) = op(B) · dCᵀ
        if (!g.tb) backward.emplace_back(A.t(), dC, dB, 1.0f, type);
        else backward.emplace_back(dC.t(), A, dB.t(), 1.0f, type);     // dBᵀ (N, K) = dCᵀ · op(A)
    }
};

// ---- timing ---------------------------------------------------------------------------------------------

// Median seconds per call of each function. Calls are interleaved (f0, f1, f2, f0, f1, ...) so that a burst
// of load from other processes slows all of them alike rather than whichever ran during it.
std::vector<double> time_interleaved(const std::vector<std::function<void()>>& fns, const Options& o) {
    using clock = std::chrono::steady_clock;
    for (int w = 0; w < o.warmup; ++w)
        for (const auto& f : fns) f();
    std::vector<std::vector<double>> times(fns.size());
    const auto start = clock::now();
    const double budget = o.min_time * double(fns.size());
    for (int rep = 0;; ++rep) {
        const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
        if (rep >= o.reps && elapsed >= budget) break;
        for (std::size_t k = 0; k < fns.size(); ++k) {
            const auto t0 = clock::now();
            fns[k]();
            times[k].push_back(std::chrono::duration<double>(clock::now() - t0).count());
        }
    }
    std::vector<double> medians;
    for (auto& t : times) {
        std::sort(t.begin(), t.end());
        const std::size_t n = t.size();
        medians.push_back(n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]));
    }
    return medians;
}

// ---- checks ---------------------------------------------------------------------------------------------

// The library and raw BLAS must compute the same numbers, or the comparison means nothing.
void check_close(const char* what, const Case& c, const float* lib, const float* raw, std::int64_t n) {
    double max_diff = 0, max_ref = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        max_diff = std::max(max_diff, double(std::fabs(lib[i] - raw[i])));
        max_ref = std::max(max_ref, double(std::fabs(raw[i])));
    }
    if (max_diff > 1e-4 * std::max(1.0, max_ref))
        throw std::runtime_error(c.name + ": library and raw products disagree on " + what + " (max difference " +
                                 std::to_string(max_diff) + ")");
}

// ---- one case -------------------------------------------------------------------------------------------

struct Row {
    std::string case_name, shape, op, raw;
    double flops, library_s, raw_s;
};

std::vector<float> random_values(std::int64_t n, std::mt19937& gen) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = u(gen);
    return v;
}

tf::Tensor tensor_of(const std::vector<float>& values, const tf::Shape& shape) {
    tf::Tensor t = tf::Tensor::from(values, shape);
    t.set_requires_grad(true);
    return t;
}

std::vector<Row> run_case(const Case& c, const Options& o) {
    const Gemms g = gemms_of(c);
    std::mt19937 gen(1234);
    RawBuffers m;
    m.A = random_values(c.a.numel(), gen);
    m.B = random_values(c.b.numel(), gen);
    m.dC = random_values(g.batch * g.c_step, gen);
    m.C.assign(m.dC.size(), 0.0f);
    m.dA.assign(m.A.size(), 0.0f);
    m.dB.assign(m.B.size(), 0.0f);
    tf::Tensor a = tensor_of(m.A, c.a), b = tensor_of(m.B, c.b);  // (..., M, K), (..., K, N) or (N, K)

    // Forward: the op under no_grad, as in evaluation (recording adds one tape record, no arithmetic).
    auto lib_forward = [&] {
        tf::NoGradGuard no_grad;
        tf::Tensor y = tf::matmul(a, b, c.ta, c.tb);
    };
    // Backward: record one forward, put dC in its gradient, keep a copy of the record and call its closure.
    tf::tape().clear();
    tf::Tensor y = tf::matmul(a, b, c.ta, c.tb);  // (..., M, N), recorded
    std::memcpy(y.grad(), m.dC.data(), m.dC.size() * sizeof(float));
    tf::TapeRecord record = tf::tape().records().back();
    tf::tape().clear();
    auto lib_backward = [&] { record.backward(record.out, record.in); };

    // The raw side: sgemm (a loop of them for batched products, and the loop split across the threads), or
    // oneDNN's matmul over operands converted beforehand.
    // In bf16 precision a product below kSmallProduct multiply-adds stays fp32 (blas.h): so does the raw one.
    std::unique_ptr<RawOnednn> onednn;
    const bool bf16 = o.precision == tf::Precision::BF16 && g.M * g.N * g.K >= tf::kSmallProduct;
    if (o.raw_onednn)
        onednn = std::make_unique<RawOnednn>(g, m, bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32);
    auto raw_pass = [&](bool fwd, bool parallel) {
        if (!onednn) return fwd ? raw_forward(g, m, parallel) : raw_backward(g, m, parallel);
        for (const RawProduct& p : fwd ? onednn->forward : onednn->backward) p.run();
    };

    // Same numbers on both sides: one forward, one backward from zero gradients.
    raw_pass(true, false);
    check_close("the forward product", c, y.data(), m.C.data(), y.numel());
    lib_backward();
    raw_pass(false, false);
    check_close("dA", c, a.grad(), m.dA.data(), a.numel());
    check_close("dB", c, b.grad(), m.dB.data(), b.numel());

    const bool loops = !onednn && g.batch > 1;  // sgemm over a batch: one loop, and one split across the threads
    std::vector<Row> rows;
    const std::string shape = product_str(c);
    for (const char* pass : {"fwd", "bwd"}) {
        const bool fwd = std::strcmp(pass, "fwd") == 0;
        const std::string raw_name = onednn ? "onednn " + (fwd ? onednn->forward : onednn->backward).front().kernel()
                                            : loops ? "sgemm loop" : "sgemm";
        std::vector<std::function<void()>> fns;
        fns.push_back(fwd ? std::function<void()>(lib_forward) : std::function<void()>(lib_backward));
        fns.push_back([&, fwd] { raw_pass(fwd, false); });
        if (loops) fns.push_back([&, fwd] { raw_pass(fwd, true); });
        const std::vector<double> t = time_interleaved(fns, o);
        const double flops = fwd ? g.flops() : 2 * g.flops();  // backward: two products of the same size
        rows.push_back({c.name, shape, pass, raw_name, flops, t[0], t[1]});
        if (loops) rows.push_back({c.name, shape, pass, "sgemm omp loop", flops, t[0], t[2]});
    }
    return rows;
}

// ---- the model's products -------------------------------------------------------------------------------

std::vector<Case> model_cases() {
    const std::int64_t B = 64, T = 20, C = 256, H = 4, D = 64, F = 1024, V = 8000;
    std::vector<Case> cases;
    // Linear layers (tf::affine makes the same product) and the output projection onto the vocabulary:
    // x (B, T, in) · Wᵀ with W (out, in) shared by all B·T rows, and the same with x flattened to (B·T, in).
    struct Linear { const char* what; std::int64_t in, out; };
    for (Linear l : {Linear{"proj", C, C}, Linear{"qkv", C, 3 * C}, Linear{"ffn up", C, F},
                     Linear{"logits", C, V}, Linear{"ffn down", F, C}}) {
        const std::string name = std::string(l.what) + " " + std::to_string(l.in) + "->" + std::to_string(l.out);
        cases.push_back({name + " 3-D", tf::Shape{B, T, l.in}, tf::Shape{l.out, l.in}, false, true});
        cases.push_back({name + " 2-D", tf::Shape{B * T, l.in}, tf::Shape{l.out, l.in}, false, true});
    }
    // Attention: B·H = 256 small products. scores = Q · Kᵀ, (B, H, T, D) · (B, H, T, D)ᵀ -> (B, H, T, T);
    // context = weights · V, (B, H, T, T) · (B, H, T, D) -> (B, H, T, D).
    cases.push_back({"attn Q.K^T", tf::Shape{B, H, T, D}, tf::Shape{B, H, T, D}, false, true});
    cases.push_back({"attn P.V", tf::Shape{B, H, T, T}, tf::Shape{B, H, T, D}, false, false});
    // Not the model's: a product large enough that the kernel runs at the hardware's rate (the anchor the
    // model's shapes are measured against: AMX's peak in bf16, the FMA units' in fp32).
    cases.push_back({"square 2048", tf::Shape{2048, 2048}, tf::Shape{2048, 2048}, false, true});
    return cases;
}

// ---- command line ---------------------------------------------------------------------------------------

void usage(std::FILE* out) {
    std::fprintf(out,
                 "usage: bench_matmul [--threads N] [--precision fp32|bf16] [--raw sgemm|onednn] [--reps N]\n"
                 "                    [--min-time S] [--only TEXT] [--json]\n"
                 "  --threads N   OpenMP and OpenBLAS threads (default: all cores)\n"
                 "  --precision P the op's precision, as `--precision` in training: fp32 (default) or bf16\n"
                 "                (bf16 needs AVX512-BF16 or AMX; the raw side is then oneDNN's bf16 matmul)\n"
                 "  --raw R       what the op is measured against: sgemm (fp32's default) or onednn (oneDNN's\n"
                 "                matmul, operands converted and weights reordered beforehand)\n"
                 "  --reps N      at least N timed runs per measurement (default 5)\n"
                 "  --min-time S  and at least S seconds per measurement (default 0.3)\n"
                 "  --only TEXT   only the cases whose name contains TEXT (e.g. logits, attn)\n"
                 "  --json        one JSON object per row instead of the table\n");
}

Options parse(int argc, char** argv) {
    Options o;
    auto value = [&](int& i, const std::string& flag) -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(flag + " expects a value");
        return argv[++i];
    };
    auto number = [](const std::string& flag, const std::string& s, double lo) {
        std::size_t used = 0;
        double v = 0;
        try {
            v = std::stod(s, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != s.size() || s.empty() || !(v >= lo))
            throw std::invalid_argument(flag + " expects a number >= " + std::to_string(int(lo)) + ", got '" + s + "'");
        return v;
    };
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--threads") o.threads = int(number(arg, value(i, arg), 1));
        else if (arg == "--reps") o.reps = int(number(arg, value(i, arg), 1));
        else if (arg == "--min-time") o.min_time = number(arg, value(i, arg), 0);
        else if (arg == "--only") o.only = value(i, arg);
        else if (arg == "--json") o.json = true;
        else if (arg == "--precision") {
            o.precision = tf::parse_precision(value(i, arg));
            if (o.precision != tf::Precision::FP32 && o.precision != tf::Precision::BF16)
                throw std::invalid_argument("--precision expects fp32 or bf16");
        } else if (arg == "--raw") {
            const std::string raw = value(i, arg);
            if (raw != "sgemm" && raw != "onednn") throw std::invalid_argument("--raw expects sgemm or onednn, got '" + raw + "'");
            o.raw_onednn = raw == "onednn";
        }
        else if (arg == "-h" || arg == "--help") { usage(stdout); std::exit(0); }
        else throw std::invalid_argument("unknown argument '" + arg + "' (see --help)");
    }
    if (o.precision == tf::Precision::BF16) o.raw_onednn = true;  // sgemm has no bf16
    return o;
}

double gflops(double flops, double seconds) { return flops / seconds * 1e-9; }

}  // namespace

int main(int argc, char** argv) {
    // As the CLI does: may restart the program once with OMP_WAIT_POLICY=passive and, on a CPU OpenBLAS does
    // not know, OPENBLAS_CORETYPE set, so that we time the kernels and threads training uses. Set either
    // variable yourself to time something else (OPENBLAS_CORETYPE=Prescott, OMP_WAIT_POLICY=active).
    tf::configure_runtime(argv);
    try {
        const Options o = parse(argc, argv);
        tf::set_threads(o.threads);
        const int threads = tf::num_threads();
        if (const std::string note = tf::set_precision(o.precision); !note.empty())
            throw std::runtime_error(note.substr(0, note.find(';')));  // "... for oneDNN; running fp32": not here
        const char* precision = tf::precision_name(o.precision);
        const char* wait_policy = std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "";
        if (!o.json) {
            std::printf("OpenBLAS: %s\nthreads: %d\nprecision: %s\n", tf::blas_info(), threads, precision);
            for (const char* var : {"OPENBLAS_CORETYPE", "OMP_WAIT_POLICY"})  // both change the numbers below a lot
                if (const char* v = std::getenv(var)) std::printf("%s=%s\n", var, v);
            std::printf("median of >= %d runs and >= %.2f s per measurement after %d warm-up runs; "
                        "library and raw runs interleaved\n", o.reps, o.min_time, o.warmup);
            std::printf("FLOPs = 2*M*N*K per product; bwd = dA and dB (2 products, beta=1) via the tape record\n\n");
            std::printf("%-22s %-34s %-4s %12s %12s  %-32s %8s\n", "case", "product", "op", "lib GFLOP/s",
                        "raw GFLOP/s", "raw", "lib/raw");
        }
        for (const Case& c : model_cases()) {
            if (!o.only.empty() && c.name.find(o.only) == std::string::npos) continue;
            for (const Row& r : run_case(c, o)) {
                const double lib = gflops(r.flops, r.library_s), raw = gflops(r.flops, r.raw_s);
                if (o.json) {
                    nlohmann::json j = {{"case", r.case_name}, {"product", r.shape}, {"op", r.op},
                                        {"threads", threads}, {"precision", precision}, {"library_gflops", lib}, {"raw_gflops", raw},
                                        {"raw", r.raw}, {"ratio", lib / raw}, {"library_ms", r.library_s * 1e3},
                                        {"raw_ms", r.raw_s * 1e3}, {"gflop", r.flops * 1e-9},
                                        {"blas", tf::blas_info()}, {"omp_wait_policy", wait_policy}};
                    std::cout << j.dump() << std::endl;
                } else {
                    std::printf("%-22s %-34s %-4s %12.1f %12.1f  %-32s %8.2f\n", r.case_name.c_str(), r.shape.c_str(),
                                r.op.c_str(), lib, raw, r.raw.c_str(), lib / raw);
                    std::fflush(stdout);
                }
            }
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_matmul: %s\n", e.what());
        return 2;
    }
}
