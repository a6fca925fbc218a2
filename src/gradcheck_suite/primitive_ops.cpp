// The suite of primitive-op gradient checks behind `tapeformer gradcheck`: every op of ops.h on small
// random inputs, grouped as in ops.h. Each group is one function; check_primitive_ops runs them in order.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tapeformer/gradcheck_suite.h"
#include "tapeformer/error.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {

// What every group shares: the results so far, and a fresh seed for every random input.
// With `only_op`, runs just the first check of that op (its simplest form), keeping every element.
class OpChecks {
public:
    OpChecks(std::uint64_t seed, std::string only_op) : seed_(seed), next_seed_(seed * 1000), only_op_(std::move(only_op)) {}

    // A random input with values uniform in [lo, hi).
    Tensor rnd(const Shape& s, double lo = -1, double hi = 1) { return random_tensor(s, ++next_seed_, lo, hi); }
    // Every element of every input perturbed.
    void check(const std::string& name, const GradcheckFn& f, std::vector<Tensor> in) { run(name, f, std::move(in), 0); }
    // For inputs big enough to take an op's threaded or BLAS path: 64 elements of each input, spread out.
    void check_sampled(const std::string& name, const GradcheckFn& f, std::vector<Tensor> in) { run(name, f, std::move(in), 64); }

    std::vector<GradcheckResult> results;
    std::vector<std::string> ops;  // the ops checked, in order: the first word of each check's name

private:
    void run(const std::string& name, const GradcheckFn& f, std::vector<Tensor> in, std::int64_t per_input) {
        const std::string op = name.substr(0, name.find(' '));
        if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
        if (!only_op_.empty() && (op != only_op_ || !results.empty())) return;
        GradcheckOptions o{1e-6, 1e-6, seed_, per_input};
        o.keep_elements = !only_op_.empty();
        results.push_back(gradcheck(name, f, std::move(in), o));
    }

    std::uint64_t seed_;       // of the upstream vectors
    std::uint64_t next_seed_;  // of the inputs
    std::string only_op_;
};

// Element-wise arithmetic, with every kind of broadcast the model uses.
void check_arithmetic(OpChecks& c) {
    c.check("add", [](auto& x) { return add(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({2, 3, 4})});
    c.check("add (bias broadcast)", [](auto& x) { return add(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({4})});
    c.check("add (both broadcast)", [](auto& x) { return add(x[0], x[1]); }, {c.rnd({2, 1, 3, 4}), c.rnd({1, 5, 1, 4})});
    c.check("sub", [](auto& x) { return sub(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({3, 1})});
    c.check("sub (table broadcast (T,C))", [](auto& x) { return sub(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({3, 4})});
    c.check("mul (row broadcast (1,C))", [](auto& x) { return mul(x[0], x[1]); }, {c.rnd({1, 4}), c.rnd({2, 3, 4})});
    c.check_sampled("add (bias broadcast, split by columns)", [](auto& x) { return add(x[0], x[1]); },
                    {c.rnd({4, 32, 130}), c.rnd({130})});
    c.check("mul", [](auto& x) { return mul(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({2, 3, 4})});
    c.check("mul (head gate)", [](auto& x) { return mul(x[0], x[1]); }, {c.rnd({2, 3, 4, 5}), c.rnd({1, 3, 1, 1})});
    c.check("div", [](auto& x) { return div(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({2, 1, 4}, 0.5, 1.5)});
    c.check("scale", [](auto& x) { return scale(x[0], real(-0.7)); }, {c.rnd({3, 5})});
}

// Matrix products: every transpose combination, batched in 3-D and 4-D, scaled by α, small ones
// split across threads and large ones through BLAS.
void check_matmul(OpChecks& c) {
    c.check("matmul A B", [](auto& x) { return matmul(x[0], x[1]); }, {c.rnd({3, 4}), c.rnd({4, 5})});
    c.check("matmul A^T B", [](auto& x) { return matmul(x[0], x[1], true, false); }, {c.rnd({4, 3}), c.rnd({4, 5})});
    c.check("matmul A B^T", [](auto& x) { return matmul(x[0], x[1], false, true); }, {c.rnd({3, 4}), c.rnd({5, 4})});
    c.check("matmul A^T B^T", [](auto& x) { return matmul(x[0], x[1], true, true); }, {c.rnd({4, 3}), c.rnd({5, 4})});
    c.check("matmul batched 3-D", [](auto& x) { return matmul(x[0], x[1]); }, {c.rnd({2, 3, 4}), c.rnd({2, 4, 5})});
    c.check("matmul batched 4-D Q K^T", [](auto& x) { return matmul(x[0], x[1], false, true); },
            {c.rnd({2, 2, 3, 4}), c.rnd({2, 2, 5, 4})});
    c.check("matmul batched 4-D A^T B", [](auto& x) { return matmul(x[0], x[1], true, false); },
            {c.rnd({2, 2, 4, 3}), c.rnd({2, 2, 4, 5})});
    c.check("matmul (B,T,C) x W^T (linear)", [](auto& x) { return matmul(x[0], x[1], false, true); },
            {c.rnd({2, 3, 4}), c.rnd({5, 4})});
    // Many small batched products are split across threads: every transpose combination, with α.
    c.check("matmul batched 4-D A B alpha", [](auto& x) { return matmul(x[0], x[1], false, false, real(0.3)); },
            {c.rnd({2, 2, 3, 4}), c.rnd({2, 2, 4, 5})});
    c.check("matmul batched 4-D Q K^T alpha", [](auto& x) { return matmul(x[0], x[1], false, true, real(-0.5)); },
            {c.rnd({2, 2, 3, 4}), c.rnd({2, 2, 5, 4})});
    c.check("matmul batched 3-D A^T B^T", [](auto& x) { return matmul(x[0], x[1], true, true); },
            {c.rnd({3, 4, 3}), c.rnd({3, 5, 4})});
    c.check("matmul alpha (A B^T, 2-D)", [](auto& x) { return matmul(x[0], x[1], false, true, real(0.125)); },
            {c.rnd({3, 4}), c.rnd({5, 4})});
    // Large batched products run one after another, each split into tiles by gemm (blas.cpp).
    c.check_sampled("matmul batched large (BLAS per product)", [](auto& x) { return matmul(x[0], x[1], false, true, real(0.5)); },
                    {c.rnd({2, 40, 80}), c.rnd({2, 90, 80})});
}

// The fused x Wᵀ + b of every linear layer.
void check_affine(OpChecks& c) {
    c.check("affine x W^T + b", [](auto& x) { return affine(x[0], x[1], x[2]); }, {c.rnd({2, 3, 4}), c.rnd({5, 4}), c.rnd({5})});
    c.check("affine without bias", [](auto& x) { return affine(x[0], x[1], Tensor()); }, {c.rnd({3, 4}), c.rnd({5, 4})});
    c.check_sampled("affine (bias gradient split by columns)", [](auto& x) { return affine(x[0], x[1], x[2]); },
                    {c.rnd({4, 64, 8}), c.rnd({130, 8}), c.rnd({130})});
}

// Ops that only move values: reshape, permute, transpose, concatenation and slices.
void check_layout(OpChecks& c) {
    c.check("reshape", [](auto& x) { return mul(reshape(x[0], {3, 8}), x[1]); }, {c.rnd({2, 3, 4}), c.rnd({3, 8})});
    c.check("permute (0,2,1,3)", [](auto& x) { return permute(x[0], {0, 2, 1, 3}); }, {c.rnd({2, 3, 4, 5})});
    c.check("permute (2,0,1)", [](auto& x) { return permute(x[0], {2, 0, 1}); }, {c.rnd({2, 3, 4})});
    c.check("transpose (-1,-2)", [](auto& x) { return transpose(x[0], -1, -2); }, {c.rnd({2, 3, 4})});
    c.check("concat_last", [](auto& x) { return concat_last({x[0], x[1], x[2]}); },
            {c.rnd({2, 3, 2}), c.rnd({2, 3, 4}), c.rnd({2, 3, 1})});
    c.check("slice_last", [](auto& x) { return slice_last(x[0], 2, 5); }, {c.rnd({2, 3, 6})});
    c.check("slice_heads (B,T,W)[..., 4:10] -> (B,2,T,3)", [](auto& x) { return slice_heads(x[0], 4, 10, 2); },
            {c.rnd({2, 3, 12})});
}

// Sums and means over one axis or all.
void check_reductions(OpChecks& c) {
    c.check("sum axis 1", [](auto& x) { return sum(x[0], 1); }, {c.rnd({2, 3, 4})});
    c.check("sum axis -1 keepdim", [](auto& x) { return sum(x[0], -1, true); }, {c.rnd({2, 3, 4})});
    c.check("mean axis 0", [](auto& x) { return mean(x[0], 0); }, {c.rnd({2, 3, 4})});
    c.check("sum_all", [](auto& x) { return sum_all(x[0]); }, {c.rnd({2, 3, 4})});
}

// The FFN's activations, and the elementwise functions of a first graph (tape --expr).
void check_activations(OpChecks& c) {
    c.check("relu", [](auto& x) { return relu(x[0]); }, {c.rnd({3, 7})});
    c.check("gelu", [](auto& x) { return gelu(x[0]); }, {c.rnd({3, 7}, -3, 3)});
    c.check("tanh", [](auto& x) { return tanh(x[0]); }, {c.rnd({3, 7}, -3, 3)});
    c.check("sigmoid", [](auto& x) { return sigmoid(x[0]); }, {c.rnd({3, 7}, -4, 4)});
    c.check("exp", [](auto& x) { return exp(x[0]); }, {c.rnd({3, 7}, -2, 2)});
    c.check("log", [](auto& x) { return log(x[0]); }, {c.rnd({3, 7}, 0.5, 3)});  // away from 0, where 1/x blows up
    c.check("pow 3", [](auto& x) { return pow(x[0], real(3)); }, {c.rnd({3, 7})});
    c.check("pow -0.5", [](auto& x) { return pow(x[0], real(-0.5)); }, {c.rnd({3, 7}, 0.5, 2)});
}

// Softmax alone and under the two masks attention uses, and log-softmax.
void check_softmax(OpChecks& c) {
    const real inf = std::numeric_limits<real>::infinity();
    c.check("softmax", [](auto& x) { return softmax(x[0]); }, {c.rnd({2, 3, 6}, -2, 2)});
    {
        // A key padding mask (B, 1, 1, S): the last two keys of batch row 1 are padding.
        Tensor key_mask = Tensor::zeros({2, 1, 1, 5});
        key_mask.data()[5 + 3] = key_mask.data()[5 + 4] = -inf;
        c.check("softmax + key padding mask", [key_mask](auto& x) { return softmax(x[0], key_mask); },
                {c.rnd({2, 2, 3, 5}, -2, 2)});
        // A causal mask (T, T): position t sees keys 0..t.
        Tensor causal = Tensor::zeros({4, 4});
        for (int t = 0; t < 4; ++t)
            for (int s = t + 1; s < 4; ++s) causal.data()[t * 4 + s] = -inf;
        c.check("softmax + causal mask", [causal](auto& x) { return softmax(x[0], causal); }, {c.rnd({2, 2, 4, 4}, -2, 2)});
    }
    c.check("log_softmax", [](auto& x) { return log_softmax(x[0]); }, {c.rnd({3, 7}, -2, 2)});
}

// Additive attention scores v · tanh(q_i + k_j): q (B, H, Tq, D), k (B, H, Tk, D), v (H, D).
void check_additive_scores(OpChecks& c) {
    c.check("additive_scores", [](auto& x) { return additive_scores(x[0], x[1], x[2]); },
            {c.rnd({2, 2, 3, 4}), c.rnd({2, 2, 5, 4}), c.rnd({2, 4})});
}

// Linear attention's feature map φ(x) = elu(x) + 1 (both sides of its kink at 0) and the prefix sum along
// the time axis (B, T, D) and along the last axis.
void check_linear_attention_ops(OpChecks& c) {
    c.check("elu_plus_one", [](auto& x) { return elu_plus_one(x[0]); }, {c.rnd({3, 7}, -3, 3)});
    c.check("cumsum over time", [](auto& x) { return cumsum(x[0], 1); }, {c.rnd({2, 5, 3})});
    c.check("cumsum last axis", [](auto& x) { return cumsum(x[0], -1); }, {c.rnd({3, 4})});
}

// Attention over heads read in place: self-attention on a fused (B, T, 3C) Q, K, V with a causal mask and
// dropout, and cross-attention from (B, Tq, C) queries to a (B, Tk, 2C) key/value tensor with a key mask.
void check_attention_heads(OpChecks& c) {
    const real inf = std::numeric_limits<real>::infinity();
    Tensor causal = Tensor::zeros({1, 1, 3, 3});
    for (int t = 0; t < 3; ++t)
        for (int s = t + 1; s < 3; ++s) causal.data()[t * 3 + s] = -inf;
    c.check("attention_heads self, causal, dropout p=0.3", [causal](auto& x) {
        Rng rng(5);
        return attention_heads(x[0], 0, x[0], 4, 8, 2, 2, causal, real(0.3), rng);
    }, {c.rnd({2, 3, 12})});
    Tensor key_mask = Tensor::zeros({2, 1, 1, 4});
    key_mask.data()[4 + 3] = -inf;  // the last key of batch row 1 is padding
    c.check("attention_heads cross, key padding mask", [key_mask](auto& x) {
        Rng rng(5);
        return attention_heads(x[0], 0, x[1], 0, 4, 2, 2, key_mask, real(0), rng);
    }, {c.rnd({2, 3, 4}), c.rnd({2, 4, 8})});
}

// Local attention over a band (q, k, v (B, H, T, D) = (2, 2, 5, 3)): causal with dropout, both directions
// with a padded key, and a window wider than the sequence (every key in reach).
void check_band_attention(OpChecks& c) {
    const real inf = std::numeric_limits<real>::infinity();
    const real scale = real(1) / std::sqrt(real(3));
    c.check("band_attention causal W=2, dropout p=0.3", [scale](auto& x) {
        Rng rng(5);
        return band_attention(x[0], x[1], x[2], Tensor(), 2, true, scale, real(0.3), rng);
    }, {c.rnd({2, 2, 5, 3}), c.rnd({2, 2, 5, 3}), c.rnd({2, 2, 5, 3})});
    Tensor key_mask = Tensor::zeros({2, 1, 1, 5});
    key_mask.data()[5 + 4] = -inf;  // the last key of batch row 1 is padding
    c.check("band_attention both sides W=2, key padding", [key_mask, scale](auto& x) {
        Rng rng(5);
        return band_attention(x[0], x[1], x[2], key_mask, 2, false, scale, real(0), rng);
    }, {c.rnd({2, 2, 5, 3}), c.rnd({2, 2, 5, 3}), c.rnd({2, 2, 5, 3})});
    c.check("band_attention causal W=7 > T, key padding", [key_mask, scale](auto& x) {
        Rng rng(5);
        return band_attention(x[0], x[1], x[2], key_mask, 7, true, scale, real(0), rng);
    }, {c.rnd({2, 2, 5, 3}), c.rnd({2, 2, 5, 3}), c.rnd({2, 2, 5, 3})});
}

// Layer norm, and the fused residual add + layer norm of post-norm layers.
void check_layer_norm(OpChecks& c) {
    c.check("layer_norm", [](auto& x) { return layer_norm(x[0], x[1], x[2]); },
            {c.rnd({2, 3, 6}, -2, 2), c.rnd({6}, 0.5, 1.5), c.rnd({6})});
    c.check("add_layer_norm", [](auto& x) { return add_layer_norm(x[0], x[1], x[2], x[3]); },
            {c.rnd({2, 3, 6}, -2, 2), c.rnd({2, 3, 6}, -1, 1), c.rnd({6}, 0.5, 1.5), c.rnd({6})});
    c.check_sampled("add_layer_norm (rows split across threads)", [](auto& x) { return add_layer_norm(x[0], x[1], x[2], x[3]); },
                    {c.rnd({4, 64, 70}, -2, 2), c.rnd({4, 64, 70}, -1, 1), c.rnd({70}, 0.5, 1.5), c.rnd({70})});
    // With the residual's dropout inside (a fixed mask: a fresh Rng with the same seed on every call).
    c.check("add_dropout_layer_norm p=0.3",
            [](auto& x) { Rng rng(7); return add_dropout_layer_norm(x[0], x[1], real(0.3), rng, x[2], x[3]); },
            {c.rnd({2, 3, 6}, -2, 2), c.rnd({2, 3, 6}, -1, 1), c.rnd({6}, 0.5, 1.5), c.rnd({6})});
}

// Dropout with a fixed mask (a fresh Rng with the same seed on every call).
void check_dropout(OpChecks& c) {
    c.check("dropout p=0.3", [](auto& x) { Rng rng(7); return dropout(x[0], real(0.3), rng); }, {c.rnd({4, 6})});
    // ReLU and dropout in one op (the same random inputs as relu's check above).
    c.check("relu_dropout p=0.3", [](auto& x) { Rng rng(7); return relu_dropout(x[0], real(0.3), rng); }, {c.rnd({4, 6})});
    // And with the feed-forward network's first layer before them (the pre-activation is not kept).
    c.check("affine_relu_dropout p=0.3",
            [](auto& x) { Rng rng(7); return affine_relu_dropout(x[0], x[1], x[2], real(0.3), rng); },
            {c.rnd({2, 3, 4}), c.rnd({6, 4}), c.rnd({6})});
}

// The Hard-Concrete gate of L0 pruning: samples (a fresh Rng with the same seed on every call, so the noise
// is fixed) at Voita et al.'s temperature 0.33 and at Louizos et al.'s 2/3, the evaluation gate, and the
// probability of an open gate. log α spans [−4, 4], so some gates are clamped to 0 or 1 (zero gradient) and
// some are not.
void check_gates(OpChecks& c) {
    c.check("hard_concrete (sample, temperature 0.33)",
            [](auto& x) { Rng rng(11); return hard_concrete(x[0], real(0.33), real(-0.1), real(1.1), rng); }, {c.rnd({3, 8}, -4, 4)});
    c.check("hard_concrete (sample, temperature 2/3)",
            [](auto& x) { Rng rng(12); return hard_concrete(x[0], real(2.0 / 3), real(-0.1), real(1.1), rng); }, {c.rnd({2, 6}, -4, 4)});
    c.check("hard_concrete (evaluation)",
            [](auto& x) { Rng rng(13); return hard_concrete(x[0], real(0.33), real(-0.1), real(1.1), rng, false); },
            {c.rnd({16}, -4, 4)});
    c.check("hard_concrete_open", [](auto& x) { return hard_concrete_open(x[0], real(0.33), real(-0.1), real(1.1)); },
            {c.rnd({2, 5}, -4, 4)});
}

// Embedding lookups (with padding and threaded backward) and the label-smoothed cross-entropy.
void check_embedding_and_loss(OpChecks& c) {
    std::vector<std::int32_t> ids = {3, 0, 1, 3, 4, 0};  // 0 is padding: its row gets no gradient
    c.check("embedding", [ids](auto& x) { return embedding(x[0], ids, {2, 3}); }, {c.rnd({5, 4})});
    // With padding_idx the pad row gets no gradient, which is only the true derivative when padded
    // positions do not reach the output — as in the model, where masks cut them off. Zero them here.
    Tensor keep = Tensor::from({1, 0, 1, 1, 1, 0}, {2, 3, 1});
    c.check("embedding (pad 0, padded positions masked)",
            [ids, keep](auto& x) { return mul(embedding(x[0], ids, {2, 3}, 0), keep); }, {c.rnd({5, 4})});
    // Enough ids × columns for backward to split the columns across threads; ids repeat.
    std::vector<std::int32_t> many(130);
    for (std::size_t i = 0; i < many.size(); ++i) many[i] = std::int32_t((i * 5) % 7);
    c.check_sampled("embedding (wide, columns split)", [many](auto& x) { return embedding(x[0], many, {2, 65}); },
                    {c.rnd({7, 130})});
    std::vector<std::int32_t> target = {2, 0, 4, 1, 0, 3};  // 0 is the ignored index
    c.check("cross_entropy (eps 0.1, ignore 0)", [target](auto& x) { return cross_entropy(x[0], target, 0, real(0.1)); },
            {c.rnd({6, 5}, -2, 2)});
    c.check("cross_entropy (eps 0)", [target](auto& x) { return cross_entropy(x[0], target, -1, real(0)); },
            {c.rnd({6, 5}, -2, 2)});
}

}  // namespace

namespace {
void run_all(OpChecks& c) {
    check_arithmetic(c);
    check_matmul(c);
    check_affine(c);
    check_layout(c);
    check_reductions(c);
    check_activations(c);
    check_softmax(c);
    check_additive_scores(c);
    check_linear_attention_ops(c);
    check_attention_heads(c);
    check_band_attention(c);
    check_layer_norm(c);
    check_dropout(c);
    check_gates(c);
    check_embedding_and_loss(c);
}
}  // namespace

std::vector<GradcheckResult> check_primitive_ops(std::uint64_t seed) {
    OpChecks c(seed, "");
    run_all(c);
    return c.results;
}

std::vector<std::string> primitive_op_names() {
    OpChecks c(1, "\n");  // an op no check has: nothing runs, every op is named
    run_all(c);
    return c.ops;
}

GradcheckResult check_one_op(const std::string& op, std::uint64_t seed) {
    OpChecks c(seed, op);
    run_all(c);
    if (c.results.empty()) {
        std::string names;
        for (const std::string& n : c.ops) names += (names.empty() ? "" : ", ") + n;
        fail("--op", "no op '" + op + "'; the ops are: " + names);
    }
    return c.results.front();
}

TF_NAMESPACE_END
