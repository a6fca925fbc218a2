// The fused kernels: each computes what a composition of ops.cpp's primitives computes, bit for bit, in one
// op with a backward of its own, because it pays off in time or memory (a linear layer, a post-norm
// sublayer's add and norm, the FFN's relu and dropout, alone or with its first layer, attention over heads
// read in place, heads cut out of a fused projection). Above each, "composed:" names the composition it
// equals and the test that holds it to that, where one does; every one is also gradient-checked alone
// (src/gradcheck_suite/primitive_ops.cpp).
// In reference mode (reference_ops.h) each checks its arguments, then runs that composition instead
// (reference_ops.cpp).
#include "tapeformer/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "ops_kernels.h"
#include "tapeformer/reference_ops.h"

TF_NAMESPACE_BEGIN

// ---- affine (a linear layer) ------------------------------------------------------------------------------
// y = x Wᵀ + b over N = rows of x. With dy the upstream gradient (N, out):
//   dx (N, in) += dy · W,   dW (out, in) += dyᵀ · x,   db (out) += Σ_n dy[n, :].
// composed: add(matmul(x, W, false, true), b), up to the last bits (the bias is added inside the product's
// kernel, or the product onto rows that start as the bias): "reference ops: a linear layer and attention over
// heads equal the fast fused ops" (tests/test_reference_ops.cpp), within float rounding.

namespace {

struct AffineSizes {
    std::int64_t N, in_f, out_f;  // rows of x, and the weight's (out, in)
    Shape out_shape;              // x's shape with its last axis out
};

// affine's argument checks, shared with affine_relu_dropout (named `op` in the message).
AffineSizes check_affine(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
    require_defined(op, x, "input");
    require_defined(op, weight, "weight");
    const std::string shapes = x.shape().str() + " with weight " + weight.shape().str() +
                               (bias.defined() ? " and bias " + bias.shape().str() : "");
    if (x.rank() < 1 || weight.rank() != 2 || x.shape().last() != weight.size(1))
        fail(op, "needs x (..., in) and weight (out, in): got " + shapes);
    const std::int64_t out_f = weight.size(0);
    if (bias.defined() && bias.shape() != Shape{out_f}) fail(op, "bias must be (out): got " + shapes);
    Shape out_shape = x.shape();
    out_shape[-1] = out_f;
    return {x.shape().leading(), weight.size(1), out_f, out_shape};
}

// In bf16 precision, x and W rounded once for the layer's three products, which all have N·in·out
// multiply-adds (Bf16Copy, blas.h); null otherwise, and where nothing records (no backward to share them with).
struct AffineCopies {
    std::shared_ptr<const Bf16Copy> x, weight;
    // What backward reads, for its record to keep: x's copy for dW = dyᵀ·x, W's for dx = dy·W.
    AffineCopies for_backward(const Tensor& x, const Tensor& weight) const {
        return {weight.requires_grad() ? this->x : nullptr, x.requires_grad() ? this->weight : nullptr};
    }
};

AffineCopies affine_copies(const AffineSizes& s, const Tensor& x, const Tensor& weight, bool recording) {
    if (!recording) return {};
    const std::int64_t work = s.N * s.in_f * s.out_f;
    return {bf16_copy(x.data(), s.N, s.in_f, s.in_f, work), bf16_copy(weight.data(), s.out_f, s.in_f, s.in_f, work)};
}

// y (N, out) = x (N, in) @ W (out, in)ᵀ, added onto the bias rows or written.
void affine_forward(const AffineSizes& s, const Tensor& x, const Tensor& weight, const Tensor& bias, const AffineCopies& copies,
                    real* y) {
    gemm_group({GemmCall{false, true, s.N, s.out_f, s.in_f, 1, x.data(), s.in_f, weight.data(), s.in_f, 0, y, s.out_f, 1, 0,
                         0, 0, bias.defined() ? bias.data() : nullptr, copies.x.get(), copies.weight.get()}});
}

// relu_dropout's backward: the gradient passes (× 1/(1−p)) exactly where the output y is positive.
void relu_dropout_backward(real keep_scale, std::int64_t n, const real* y, const real* dy, const GradTarget& dx) {
    write_or_add(dx, n, [=](std::int64_t i) { return ReluGate::pass(y[i], dy[i], keep_scale); });
}

// The gradients of in = {x, W[, b]} from the output's gradient dy (N, out); with `gate`, from the gradient
// through a ReLU and dropout applied to the output (affine_relu_dropout: dy is then the op's output's gradient
// and gate.output its output): in bf16 that gradient is made only as the products' rounded copy (ReluGate), in
// fp32 in a buffer of its own. The three are independent: one parallel region computes them together
// (gemm_group).
void affine_backward(const AffineSizes& s, const real* dy, std::vector<Tensor>& in, const AffineCopies& copies,
                     ReluGate gate = {}) {
    const std::int64_t N = s.N, in_f = s.in_f, out_f = s.out_f;
    const bool dx_wanted = in[0].requires_grad(), dW_wanted = in[1].requires_grad();
    GradTarget db{nullptr, false};
    if (in.size() > 2 && in[2].requires_grad()) db = in[2].grad_target();
    // In bf16, dy rounded once for both products (as gemm_group would), its column sums, db, taken in the
    // same pass over dy: one read of dy less.
    std::shared_ptr<const Bf16Copy> dy16;
    if (dx_wanted || dW_wanted) {
        dy16 = bf16_copy(dy, N, out_f, out_f, N * in_f * out_f, {db.data, db.overwrite}, gate);
        if (dy16) db.data = nullptr;  // summed
    }
    Tensor gated;  // (N, out) the gradient through the gate, where no copy was made
    if (gate.output && dy16) {
        dy = nullptr;  // the products read only the copy
    } else if (gate.output) {
        gated = Tensor::empty(Shape{N, out_f});
        relu_dropout_backward(gate.scale, N * out_f, gate.output, dy, GradTarget{gated.data(), true});
        dy = gated.data();
    }
    GemmCall dx_call, dW_call;  // M = 0: not needed
    if (dx_wanted) {  // dx (N, in) += dy (N, out) · W (out, in)
        const GradTarget dx = in[0].grad_target();
        dx_call = {false, false, N, in_f, out_f, 1, dy, out_f, in[1].data(), in_f, dx.beta(), dx.data, in_f};
        dx_call.a16 = dy16.get();
        dx_call.b16 = copies.weight.get();
    }
    if (dW_wanted) {  // dW (out, in) += dyᵀ (out, N) · x (N, in)
        const GradTarget dW = in[1].grad_target();
        dW_call = {true, false, out_f, in_f, N, 1, dy, out_f, in[0].data(), in_f, dW.beta(), dW.data, in_f};
        dW_call.a16 = dy16.get();
        dW_call.b16 = copies.x.get();
    }
    // Otherwise (fp32, or products too small to round) db (out) += column sums of dy, in bands of
    // column_band_width (parallel.h; the bf16 pass's too), each a job beside the products' tiles.
    const std::int64_t band_width = column_band_width(out_f);
    auto db_band = [&](std::int64_t band) {
        sum_columns(N, band * band_width, std::min(out_f, (band + 1) * band_width), db,
                    [dy, out_f](std::int64_t n, std::int64_t o) { return dy[n * out_f + o]; });
    };
    const std::int64_t db_bands = db.data ? (out_f + band_width - 1) / band_width : 0;
    if (!in[0].same_storage(in[1])) return gemm_group({dx_call, dW_call}, db_bands, db_band);
    gemm_group({dx_call});  // x is (a view of) the weight: its two gradients are one buffer, added in turn
    gemm_group({dW_call}, db_bands, db_band);
}

std::vector<Tensor> affine_inputs(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    return inputs;
}

}  // namespace

Tensor affine(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    const AffineSizes s = check_affine("affine", x, weight, bias);
    if (reference_mode()) return reference::affine(x, weight, bias);  // matmul, then + b
    Tensor y = Tensor::empty(s.out_shape);  // (..., out)
    const bool recording = needs_grad({&x, &weight, &bias});
    const AffineCopies copies = affine_copies(s, x, weight, recording);
    affine_forward(s, x, weight, bias, copies, y.data());
    if (!recording) return y;
    return record("affine", y, affine_inputs(x, weight, bias),
                  [s, copies = copies.for_backward(x, weight)](Tensor& y, std::vector<Tensor>& in) {
                      affine_backward(s, y.grad(), in, copies);
                  });
}

// ---- slice_heads -----------------------------------------------------------------------------------------
// out[b, h, t, :] = x[b, t, begin + h·D : begin + (h+1)·D], and backward adds each row of g back there.
// composed: permute(reshape(slice_last(x, begin, end), (B, T, H, D)), {0, 2, 1, 3}); a copy of the same
// values either way: "reference ops: the copying ops give the fast ones' bits" (tests/test_reference_ops.cpp).

Tensor slice_heads(const Tensor& x, std::int64_t begin, std::int64_t end, std::int64_t H) {
    require_defined("slice_heads", x, "input");
    if (x.rank() != 3) fail("slice_heads", "input must be (B, T, W), got " + x.shape().str());
    const std::int64_t B = x.size(0), T = x.size(1), W = x.size(2);
    if (begin < 0 || end > W || begin >= end || H <= 0 || (end - begin) % H != 0)
        fail("slice_heads", "range [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + x.shape().str() +
                                " does not split into " + std::to_string(H) + " heads");
    if (reference_mode()) return reference::slice_heads(x, begin, end, H);  // slice, reshape, permute
    const std::int64_t D = (end - begin) / H, rows = B * H * T;
    Tensor out = Tensor::empty({B, H, T, D});  // (B, H, T, D)
    // Row r = (b, h, t) of the output starts at x[b, t, begin + h·D].
    auto source = [H, T, W, D, begin](std::int64_t r) {
        const std::int64_t t = r % T, h = (r / T) % H, b = r / (T * H);
        return (b * T + t) * W + begin + h * D;
    };
    const real* px = x.data();
    real* y = out.data();
#pragma omp parallel for schedule(static) if (rows * D >= kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(y + r * D, px + source(r), D * sizeof(real));
    if (!needs_grad({&x})) return out;
    return record("slice_heads", out, {x}, [rows, D, source](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        real* dx = in[0].grad();
#pragma omp parallel for schedule(static) if (rows * D >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r) {  // every row lands in its own place: no two threads meet
            real* d = dx + source(r);
#pragma omp simd
            for (std::int64_t j = 0; j < D; ++j) d[j] += g[r * D + j];
        }
    });
}

// ---- add_layer_norm, add_dropout_layer_norm: layer_norm(x + residual), layer_norm(x + dropout(residual)) ------
// One kernel with layer_norm (layer_norm_impl, ops.cpp), which adds the residual row by row and, when it records,
// keeps the sum for backward (so that a post-norm stack may drop the inputs' values and the output's).
// composed: layer_norm(add(x, residual)) and layer_norm(add(x, dropout(residual, p))), the same bits and the
// same draws ("ops: relu_dropout and add_dropout_layer_norm give the numbers of the ops they fuse ...",
// tests/test_ops.cpp, for the dropout form).

Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta, real eps) {
    check_layer_norm("add_layer_norm", x, &residual, gamma, beta);
    if (reference_mode()) return reference::add_layer_norm(x, residual, gamma, beta, eps);  // add, then layer_norm
    return layer_norm_impl("add_layer_norm", x, &residual, gamma, beta, eps);
}

Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, Rng& rng, const Tensor& gamma,
                              const Tensor& beta, real eps, bool training) {
    check_dropout_probability("add_dropout_layer_norm", p);
    if (!training || p == 0) return add_layer_norm(x, residual, gamma, beta, eps);
    check_layer_norm("add_dropout_layer_norm", x, &residual, gamma, beta);
    if (reference_mode()) return reference::add_dropout_layer_norm(x, residual, p, rng, gamma, beta, eps, training);
    const DropoutDraws draws(rng, residual.numel(), p);
    return layer_norm_impl("add_dropout_layer_norm", x, &residual, gamma, beta, eps, &draws);
}

// ---- relu_dropout ----------------------------------------------------------------------------------------------
namespace {
// y = dropout(relu(x)) over n values (y may be x): dropout, then ReLU, in chunks that stay in L1. The bits of
// relu, then dropout, since 1/(1−p) > 0 keeps each value's sign (−0 and NaN end as +0 either way).
void relu_dropout_values(const DropoutDraws& draws, std::int64_t n, const real* x, real* y) {
    dropout_in_pieces(draws, n, x, y, [](real* yc, std::int64_t m) {
        for (std::int64_t j = 0; j < m; ++j) yc[j] = yc[j] > 0 ? yc[j] : real(0);
    });
}

}  // namespace

// One op for what the feed-forward network does between its two linear layers. The output is positive
// exactly where x > 0 and the value survived, which is also exactly where the gradient passes (× 1/(1−p)):
// backward needs neither the mask nor relu(x), so the (B, T, F) tensor between the two ops is never made.
// composed: dropout(relu(a), p), the same bits and draws (the same test in tests/test_ops.cpp).
Tensor relu_dropout(const Tensor& a, real p, Rng& rng, bool training) {
    require_defined("relu_dropout", a, "input");
    check_dropout_probability("relu_dropout", p);
    if (!training || p == 0) return relu(a);
    if (reference_mode()) return reference::relu_dropout(a, p, rng, training);  // relu, then dropout
    const DropoutDraws draws(rng, a.numel(), p);
    Tensor out = Tensor::empty(a.shape());
    relu_dropout_values(draws, a.numel(), a.data(), out.data());
    if (!needs_grad({&a})) return out;
    const real keep_scale = draws.keep_scale;
    return record("relu_dropout", out, {a}, [keep_scale](Tensor& y, std::vector<Tensor>& in) {
        relu_dropout_backward(keep_scale, y.numel(), y.data(), y.grad(), in[0].grad_target());
    });
}

// ---- affine_relu_dropout: a feed-forward network's first layer and its activation -----------------------------
// dropout(relu(x Wᵀ + b)) with the product written straight into the output and ReLU and dropout applied there
// in place: the pre-activation (N, F), which neither relu_dropout's backward nor affine's needs, is never kept
// (12 of them are 75 MB at the end of the large benchmark model's forward). Backward: affine's backward through
// the ReLU and dropout (ReluGate): the pre-activation's gradient made in bf16 only as the products' rounded copy,
// in fp32 in a buffer of its own.
// composed: relu_dropout(affine(x, W, b), p): the same bits and draws ("ops: relu_dropout and
// add_dropout_layer_norm give the numbers of the ops they fuse ...", tests/test_ops.cpp; in bf16,
// "affine_relu_dropout's bf16 backward ...", tests/test_bf16.cpp).
Tensor affine_relu_dropout(const Tensor& x, const Tensor& weight, const Tensor& bias, real p, Rng& rng, bool training) {
    const char* op = "affine_relu_dropout";
    const AffineSizes s = check_affine(op, x, weight, bias);
    check_dropout_probability(op, p);
    if (!training || p == 0) return relu(affine(x, weight, bias));
    if (reference_mode()) return reference::affine_relu_dropout(x, weight, bias, p, rng, training);
    Tensor y = Tensor::empty(s.out_shape);  // (..., F)
    const bool recording = needs_grad({&x, &weight, &bias});
    const AffineCopies copies = affine_copies(s, x, weight, recording);
    affine_forward(s, x, weight, bias, copies, y.data());
    const DropoutDraws draws(rng, y.numel(), p);
    relu_dropout_values(draws, y.numel(), y.data(), y.data());
    if (!recording) return y;
    const real keep_scale = draws.keep_scale;
    return record(op, y, affine_inputs(x, weight, bias), [s, keep_scale, copies = copies.for_backward(x, weight)](
                                                              Tensor& y, std::vector<Tensor>& in) {
        affine_backward(s, y.grad(), in, copies, ReluGate{y.data(), keep_scale});
    });
}

// ---- attention over heads read in place ---------------------------------------------------------------------
// Per head (b, h), with Q (Tq, D), K, V (Tk, D) strided views of the inputs and s = 1/√D:
//   forward:  P = softmax(s·Q Kᵀ + mask),  Pd = dropout(P),  context = Pd V
//   backward: dPd = dC Vᵀ,  dV += Pdᵀ dC,  dP = dropout's backward of dPd,  dS = softmax's backward (P, dP),
//             dQ += s·dS K,  dK += s·dSᵀ Q
// The products are gemm's, with the shapes, α and order of the composed ops' products, and the rows are
// softmax_row / softmax_backward_row and DropoutDraws: the same bits as the composition.
// composed: MultiHeadAttention::attend (src/nn/attention.cpp) over slice_heads, matmul, softmax, dropout,
// matmul, merge_heads; "determinism: a model's loss and every gradient give the same bits on any thread
// count" (tests/test_determinism.cpp) compares a model's loss and gradients both ways, bit for bit.

namespace {
// True when column ranges [at, at + C) for each `at` tile [0, W) exactly: no gap, no overlap.
bool covers(std::int64_t W, std::vector<std::int64_t> at, std::int64_t C) {
    std::sort(at.begin(), at.end());
    std::int64_t next = 0;
    for (std::int64_t a : at) {
        if (a != next) return false;
        next = a + C;
    }
    return next == W;
}
}  // namespace

Tensor attention_heads(const Tensor& xq, std::int64_t q_at, const Tensor& xkv, std::int64_t k_at, std::int64_t v_at,
                       std::int64_t H, std::int64_t D, const Tensor& mask, real p, Rng& rng, bool training) {
    const char* op = "attention_heads";
    require_defined(op, xq, "queries");
    require_defined(op, xkv, "keys and values");
    check_dropout_probability(op, p);
    if (xq.rank() != 3 || xkv.rank() != 3 || xq.size(0) != xkv.size(0))
        fail(op, "needs queries (B, Tq, W) and keys/values (B, Tk, W'), got " + xq.shape().str() + " and " + xkv.shape().str());
    const std::int64_t B = xq.size(0), Tq = xq.size(1), Wq = xq.size(2), Tk = xkv.size(1), Wkv = xkv.size(2), C = H * D;
    if (H <= 0 || D <= 0 || q_at < 0 || q_at + C > Wq || k_at < 0 || k_at + C > Wkv || v_at < 0 || v_at + C > Wkv)
        fail(op, std::to_string(H) + " heads of " + std::to_string(D) + " at columns " + std::to_string(q_at) + " (queries), " +
                     std::to_string(k_at) + ", " + std::to_string(v_at) + " (keys, values) do not fit " + xq.shape().str() +
                     " and " + xkv.shape().str());
    const Shape weights_shape{B, H, Tq, Tk};
    std::int64_t ms[4] = {0, 0, 0, 0};  // the mask's strides over (B, H, Tq, Tk)
    if (mask.defined()) {
        if (mask.rank() > 4) fail(op, "mask " + mask.shape().str() + " has more than 4 axes");
        const Broadcast bc = broadcast(op, weights_shape, mask.shape());
        if (bc.out != weights_shape) fail(op, "mask " + mask.shape().str() + " does not broadcast to " + weights_shape.str());
        std::copy(bc.sb, bc.sb + 4, ms);
    }
    if (reference_mode())  // the composition: slice_heads, matmul, softmax, dropout, matmul, merged heads
        return reference::attention_heads(xq, q_at, xkv, k_at, v_at, H, D, mask, p, rng, training);
    const bool drop = training && p > 0;
    const DropoutDraws draws = drop ? DropoutDraws(rng, weights_shape.numel(), p) : DropoutDraws();
    const real scale = real(1) / std::sqrt(real(D));
    Tensor weights = Tensor::empty(weights_shape);  // P, kept for backward
    Tensor out = Tensor::empty({B, Tq, C});
    const real *pq = xq.data(), *pkv = xkv.data(), *pm = mask.defined() ? mask.data() : nullptr;
    real *pw = weights.data(), *py = out.data();
    // Where head i = (b, h) starts in xq (its Q), in xkv (its K and V) and in the output (its context).
    struct HeadAt {
        std::int64_t b, h, q, k, v, context;
    };
    auto head_at = [=](std::int64_t i) {
        const std::int64_t b = i / H, h = i % H;
        return HeadAt{b, h, b * Tq * Wq + q_at + h * D, b * Tk * Wkv + k_at + h * D, b * Tk * Wkv + v_at + h * D, b * Tq * C + h * D};
    };
    const std::int64_t work = B * H * Tq * Tk * D;
#pragma omp parallel for schedule(static) if (work >= kParallelGrain)
    for (std::int64_t i = 0; i < B * H; ++i) {
        const HeadAt at = head_at(i);
        real* P = pw + i * Tq * Tk;
        gemm(false, true, Tq, Tk, D, scale, pq + at.q, Wq, pkv + at.k, Wkv, 0, P, Tk);  // s·Q Kᵀ (Tq, Tk)
        for (std::int64_t t = 0; t < Tq; ++t)
            softmax_row(P + t * Tk, pm ? pm + at.b * ms[0] + at.h * ms[1] + t * ms[2] : nullptr, ms[3], Tk, P + t * Tk);
        const real* A = P;
        thread_local std::vector<real> scratch;  // Pd
        if (drop) {
            scratch.resize(std::size_t(Tq * Tk));
            draws.apply_n(i * Tq * Tk, Tq * Tk, P, scratch.data());
            A = scratch.data();
        }
        gemm(false, false, Tq, D, Tk, 1, A, Tk, pkv + at.v, Wkv, 0, py + at.context, C);  // Pd V (Tq, D)
    }
    if (!needs_grad({&xq, &xkv})) return out;
    const bool self = xkv.same_storage(xq);  // one gradient buffer: the heads' columns of it are disjoint
    if (self && (xkv.data() != xq.data() || xkv.shape() != xq.shape()))
        fail(op, "keys/values " + xkv.shape().str() + " are another view of the queries' storage " + xq.shape().str());
    std::vector<Tensor> inputs{xq};
    if (!self) inputs.push_back(xkv);
    return record(op, out, std::move(inputs),
                  [=](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();  // (B, Tq, C)
        // The heads' gradients go to disjoint columns of the inputs' gradients: each value receives one
        // product's result. Added to what is there, or written (β = 0) where a gradient not yet written is
        // covered whole by the heads' columns, so that it is never zeroed first.
        auto target = [](Tensor& t, bool covered) {
            if (!covered) return GradTarget{t.grad(), false};
            return t.grad_target();
        };
        const bool q_whole = self ? covers(Wq, {q_at, k_at, v_at}, C) : covers(Wq, {q_at}, C);
        const bool kv_whole = covers(Wkv, {k_at, v_at}, C);
        const GradTarget none{nullptr, false};
        const GradTarget gq = in[0].requires_grad() ? target(in[0], q_whole) : none;
        const GradTarget gkv = self ? gq : (in[1].requires_grad() ? target(in[1], kv_whole) : none);
        real *dxq = gq.data, *dxkv = gkv.data;
        const real beta_q = gq.beta(), beta_kv = gkv.beta();
        const real* P_all = weights.data();
#pragma omp parallel for schedule(static) if (work >= kParallelGrain)
        for (std::int64_t i = 0; i < B * H; ++i) {
            const HeadAt at = head_at(i);
            const real* P = P_all + i * Tq * Tk;
            const real* dC = g + at.context;  // (Tq, D), row stride C
            thread_local std::vector<real> pd, dp;
            pd.resize(std::size_t(Tq * Tk));
            dp.resize(std::size_t(Tq * Tk));
            const real* A = P;
            if (drop) {  // Pd again, from the same counters
                draws.apply_n(i * Tq * Tk, Tq * Tk, P, pd.data());
                A = pd.data();
            }
            gemm(false, true, Tq, Tk, D, 1, dC, C, pkv + at.v, Wkv, 0, dp.data(), Tk);  // dPd = dC Vᵀ (Tq, Tk)
            if (dxkv) gemm(true, false, Tk, D, Tq, 1, A, Tk, dC, C, beta_kv, dxkv + at.v, Wkv);  // dV += Pdᵀ dC
            if (drop) draws.apply_n(i * Tq * Tk, Tq * Tk, dp.data(), dp.data());  // dP
            for (std::int64_t t = 0; t < Tq; ++t)  // dS, over dP
                softmax_backward_row(dp.data() + t * Tk, P + t * Tk, Tk, pd.data() + t * Tk, true);
            const real* dS = pd.data();
            if (dxq) gemm(false, false, Tq, D, Tk, scale, dS, Tk, pkv + at.k, Wkv, beta_q, dxq + at.q, Wq);  // dQ += s·dS K
            if (dxkv) gemm(true, false, Tk, D, Tq, scale, dS, Tk, pq + at.q, Wq, beta_kv, dxkv + at.k, Wkv);  // dK += s·dSᵀ Q
        }
    });
}

TF_NAMESPACE_END
