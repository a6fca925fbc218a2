// The primitive differentiable ops. Each computes its output and, when an input requires grad and the tape is
// recording, records a backward closure next to the forward code: src/ops.cpp, one section per op; the fused
// kernels (affine, slice_heads, add_*layer_norm, relu_dropout, affine_relu_dropout, attention_heads) in
// fused_ops.cpp, the L0 gates in study_ops.cpp, linear attention's φ and prefix sum in
// linear_attention_ops.cpp. Everything higher (attention, feed-forward, the model) is composed and has no
// backward.
//
// Shapes use fixed letters: B batch, S source length, T target length, C model width, H heads,
// D head width, F FFN width, V vocabulary, N "rows" (all leading dimensions flattened).
// Bad shapes or arguments throw std::invalid_argument naming the op and the shapes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/random.h"
#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

// ---- elementwise, with broadcasting ----------------------------------------------------------------
// NumPy/PyTorch broadcasting: shapes are right-aligned and an extent of 1 stretches to match, so a bias
// (C) adds to (B, T, C), a key mask (B, 1, 1, S) to scores (B, H, T, S) and a head gate (1, H, 1, 1)
// multiplies (B, H, T, D). The gradient of a stretched input is summed over the stretched axes.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, real s);  // a * s

// ---- matrix products -------------------------------------------------------------------------------
// alpha · op(a) @ op(b), op = optional transpose of the last two axes. a: (..., M, K), b: (..., K, N) with
// equal leading axes (batched: one product per leading index), or b 2-D (K, N) shared by every row of a
// (then a is treated as one (N·M, K) matrix). Every product runs through BLAS gemm: large ones one after
// another, each with its rows split across the threads; many small ones (attention's (T, D) @ (D, S))
// split across the threads. alpha folds a scale into the product (attention's 1/√D).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false, real alpha = 1);

// y = x Wᵀ + b: a linear layer in one op. x: (..., in), weight: (out, in) as PyTorch stores it, bias: (out)
// or undefined (none). One gemm onto rows pre-filled with the bias; backward is two gemms and a column sum
// of dy for the bias, instead of a matmul and a broadcast add.
Tensor affine(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- shape ------------------------------------------------------------------------------------------
Tensor reshape(const Tensor& a, const Shape& shape);          // a view: shares values and gradient
Tensor permute(const Tensor& a, const std::vector<int>& axes); // out.shape[i] = a.shape[axes[i]]
Tensor transpose(const Tensor& a, int i, int j);              // permute swapping two axes
Tensor concat_last(const std::vector<Tensor>& parts);         // join along the last axis
Tensor slice_last(const Tensor& a, std::int64_t begin, std::int64_t end);  // a[..., begin:end]
// Attention heads out of a fused projection, in one copy: x (B, T, W) -> x[..., begin:end] seen as
// (B, T, H, D) with D = (end − begin) / H, permuted to (B, H, T, D). The Q, K or V part of (B, T, 3C).
Tensor slice_heads(const Tensor& x, std::int64_t begin, std::int64_t end, std::int64_t H);

// ---- reductions -------------------------------------------------------------------------------------
Tensor sum(const Tensor& a, int axis, bool keepdim = false);
Tensor mean(const Tensor& a, int axis, bool keepdim = false);
Tensor sum_all(const Tensor& a);                              // a one-element tensor of shape ()

// ---- activations and elementwise functions ------------------------------------------------------------------------------------
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a);  // exact: x · Φ(x) = 0.5 x (1 + erf(x / √2)), PyTorch's default
// The textbook functions of a first graph (`tapeformer tape --expr`, micrograd's tanh(a*b + c)), elementwise.
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);        // σ(x) = 1 / (1 + e^(−x))
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);            // natural logarithm; −inf at 0, NaN below, as std::log
Tensor pow(const Tensor& a, real p);    // a^p for a constant exponent p

// ---- normalisation over the last axis -----------------------------------------------------------------
// softmax(a + mask) over the last axis. mask (optional, undefined = none) is added before the softmax and
// broadcasts to a; use 0 to keep and -infinity to drop a position. It is a constant: no gradient. A row
// whose every position is dropped becomes all zeros (PyTorch would give NaN).
// Additive (Bahdanau-style) attention scores, one fused op: s[b,h,i,j] = Σ_d v[h,d] · tanh(q[b,h,i,d] + k[b,h,j,d]).
// q (B, H, Tq, D), k (B, H, Tk, D), v (H, D) -> (B, H, Tq, Tk). The projections W_q q and W_k k of the
// additive form are the attention's Q and K; v scores their sum. tanh is recomputed in backward.
Tensor additive_scores(const Tensor& q, const Tensor& k, const Tensor& v);
Tensor softmax(const Tensor& a, const Tensor& mask = Tensor());
Tensor log_softmax(const Tensor& a);
// y = (x − mean) / sqrt(var + eps) · gamma + beta over the last axis C; var is the biased variance.
// x: (..., C), gamma, beta: (C).
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, real eps = real(1e-5));
// layer_norm(x + residual, gamma, beta): a post-norm sublayer's "Add & Norm" in one op (one pass, one
// gradient for both). x and residual have the same shape. The record keeps the sum x + residual, so backward
// reads neither input's values, and the output's values may be dropped (Tensor::drop_values): they are
// computed again from the sum when read.
Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                      real eps = real(1e-5));
// layer_norm(x + dropout(residual, p)): the post-norm sublayer's dropout, residual add and norm in one op.
// The same numbers and the same draws from rng as the two ops one after the other, without the
// dropped-out copy of the residual. add_layer_norm when p == 0 or training is false.
Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, Rng& rng, const Tensor& gamma,
                              const Tensor& beta, real eps = real(1e-5), bool training = true);

// ---- deliberately wrong gradients, for teaching ---------------------------------------------------------
// While a BrokenGradientScope lives, the layer norm ops (layer_norm, add_*layer_norm) it records leave one
// term out of their hand-derived backward (ops.cpp, beside the term): layernorm-mean the path through the
// mean, layernorm-variance the path through the variance. Forward values are untouched, so gradcheck and
// explain --backward show a wrong gradient and nothing else. Only `gradcheck --break-grad` and
// `explain --backward --break-grad` open a scope; training refuses to run inside one.
enum class BrokenGradient { None, LayerNormMean, LayerNormVariance };
const char* to_string(BrokenGradient b);                         // "none", "layernorm-mean", "layernorm-variance"
BrokenGradient parse_broken_gradient(const std::string& name);   // throws std::invalid_argument listing the names
std::vector<std::string> broken_gradient_names();                // the names of the broken ones (not "none")
std::string broken_gradient_description(BrokenGradient b);       // what is left out, in a sentence
BrokenGradient broken_gradient();                                // the one in effect (None outside a scope)
class BrokenGradientScope {
public:
    explicit BrokenGradientScope(BrokenGradient b);
    ~BrokenGradientScope();
    BrokenGradientScope(const BrokenGradientScope&) = delete;
    BrokenGradientScope& operator=(const BrokenGradientScope&) = delete;

private:
    BrokenGradient previous_;
};

// ---- regularisation -----------------------------------------------------------------------------------
// Inverted dropout: each value is zeroed with probability p, survivors are scaled by 1/(1−p). The mask of
// element i is drawn from counter (rng.offset + i); the call advances rng by a.numel(). Identity when
// p == 0 or when training is false.
Tensor dropout(const Tensor& a, real p, Rng& rng, bool training = true);
// dropout(relu(a), p) in one op: the same numbers and draws as the two ops, one tensor fewer kept for
// backward (the feed-forward network's activation). relu(a) when p == 0 or training is false.
Tensor relu_dropout(const Tensor& a, real p, Rng& rng, bool training = true);
// relu_dropout(affine(x, weight, bias), p) in one op: the same numbers and draws, and the pre-activation
// x Wᵀ + b is never kept (the feed-forward network's first layer). relu(affine(...)) when p == 0 or training
// is false.
Tensor affine_relu_dropout(const Tensor& x, const Tensor& weight, const Tensor& bias, real p, Rng& rng,
                           bool training = true);

// ---- attention ------------------------------------------------------------------------------------------
// Scaled dot-product attention over H heads of D values, read in place: the same numbers and draws as
// attention.cpp's composition of slice_heads, matmul(q, kᵀ, 1/√D), softmax(·, mask), dropout, matmul(·, v)
// and merge_heads — one op, one parallel region a pass (over the B·H heads, each computed by one thread),
// no copies of the heads. Queries are columns [q_at, q_at + H·D) of xq (B, Tq, Wq); keys and values are
// columns [k_at, k_at + H·D) and [v_at, v_at + H·D) of xkv (B, Tk, Wkv), which may be xq itself
// (self-attention's fused Q, K, V). mask (optional) broadcasts to (B, H, Tq, Tk) as softmax's does; dropout
// with probability p on the weights when `training`, drawn from rng. Returns the heads' contexts side by
// side, (B, Tq, H·D). Backward keeps the weights (B, H, Tq, Tk) and draws the dropout mask again.
Tensor attention_heads(const Tensor& xq, std::int64_t q_at, const Tensor& xkv, std::int64_t k_at, std::int64_t v_at,
                       std::int64_t H, std::int64_t D, const Tensor& mask, real p, Rng& rng, bool training = true);

// ---- local attention (band_attention_ops.cpp) ------------------------------------------------------------
// Sliding-window attention over H heads, O(T·W·D): query i sees key j = i − W + 1 + s for the slots s of a
// band of band_width(W, causal) = W (causal: i − W < j ≤ i) or 2W − 1 (|i − j| < W). q, k, v (B, H, T, D);
// key_mask (optional) the additive key padding mask (B, 1, 1, T) of 0 and −∞; scores q·k·scale; softmax over
// the band; dropout with probability p on the weights when `training`, one draw per band slot from rng.
// Returns the context (B, H, T, D). Equals softmax(Q Kᵀ·scale + band and key masks) V over the full (T, T)
// (reference::band_attention) within float rounding. Backward keeps the band's weights (B, H, T, band).
std::int64_t band_width(std::int64_t W, bool causal);
Tensor band_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask, std::int64_t W,
                      bool causal, real scale, real p, Rng& rng, bool training = true);

// ---- linear attention's primitives (linear_attention_ops.cpp) -------------------------------------------
// φ(x) = elu(x) + 1 elementwise (x + 1 for x > 0, eˣ otherwise): the positive feature map of linear attention
// (Katharopoulos et al. 2020), so that φ(q)·φ(k) > 0 can stand in for exp(q·k).
Tensor elu_plus_one(const Tensor& a);
// Prefix sums along `axis` (negative counts from the end): y[..., t, ...] = Σ_{s ≤ t} a[..., s, ...]. The
// causal form of linear attention's Σ_j φ(k_j) v_jᵀ. Backward is the suffix sum of the gradient.
Tensor cumsum(const Tensor& a, int axis);

// ---- stochastic gates (L0 regularisation) ---------------------------------------------------------------
// The Hard-Concrete gate of Louizos, Welling & Kingma (2018), one per element of log_alpha: a value in [0, 1]
// that is exactly 0 (and exactly 1) with non-zero probability, yet differentiable in log α:
//   training:    s = σ((ln u − ln(1 − u) + log α) / β),  u ~ U(0, 1)
//   evaluation:  s = σ(log α)
//   z = min(1, max(0, s (r − l) + l))
// β is the temperature, (l, r) the stretch (l < 0 < 1 < r). u of element i is drawn from counter
// (rng.offset + i); training advances rng by log_alpha.numel(). ∂z/∂log α is 0 where z is clamped.
Tensor hard_concrete(const Tensor& log_alpha, real beta, real l, real r, Rng& rng, bool training = true);
// The probability that the training gate is open, P(z > 0) = σ(log α − β ln(−l / r)), per element: the
// expected number of open gates is its sum, which an L0 penalty adds to the loss.
Tensor hard_concrete_open(const Tensor& log_alpha, real beta, real l, real r);

// ---- embeddings and the loss --------------------------------------------------------------------------
// out[n, :] = table[ids[n], :]. table: (V, C); ids: any shape (given as `ids_shape`), out: ids_shape + (C).
// Backward scatter-adds into table; rows with id == padding_idx get no gradient (padding_idx < 0: none).
Tensor embedding(const Tensor& table, const std::vector<std::int32_t>& ids, const Shape& ids_shape,
                 std::int32_t padding_idx = -1);

// What cross_entropy measured besides the loss it returns.
struct CrossEntropyStats {
    double nll_sum = 0;        // Σ −log p(target) over counted positions (no smoothing)
    std::int64_t count = 0;    // positions whose target is not ignore_index
};

// Label-smoothed cross-entropy, PyTorch's F.cross_entropy(logits, target, ignore_index, label_smoothing)
// with mean reduction:  loss = 1/n Σ_i [(1−ε)(−log p_i,t_i) + ε/V Σ_j (−log p_i,j)] over the n positions
// whose target is not ignore_index (0 when n = 0). logits: (N, V), target: N ids. Fused: the softmax is
// never stored; backward recomputes it from each row's saved max and 1 / Σ_j e^(x_j − max).
// `consume_logits`: the caller promises that nothing reads the logits' values once this call has returned,
// not even the backward of the op that made them (true of a linear layer's), and that backward will be
// seeded with `seed` (∂total/∂loss). Then the gradient is computed here, in the pass that has each row in
// cache, from the e^(x − max) its sum kept over the logits, and written over them; backward only hands that
// buffer over as their gradient (Tensor::grad_over_value): one pass over the (N, V) logits less, and one
// (N, V) buffer less at the step's peak of memory. The gradient's bits are those backward computes from
// the seed. A promise found broken in backward (another holder of the logits, another op's gradient for
// them, another seed) throws std::logic_error: the values are gone by then. A leaf's logits are never
// written over.
Tensor cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t ignore_index,
                     real label_smoothing, CrossEntropyStats* stats = nullptr, bool consume_logits = false,
                     real seed = 1);

TF_NAMESPACE_END
