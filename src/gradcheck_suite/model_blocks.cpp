// Gradient checks of whole model blocks: attention with each kind of mask, encoder and decoder layers in
// both norm positions and with parts switched off, the head gates, the label-smoothed loss and a tiny
// complete model. Every block is
// a composition of primitive ops, so these checks prove the compositions, not new backward code.
#include <memory>

#include "tapeformer/gradcheck_suite.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {

// The distinct parameter tensors, as gradcheck inputs.
std::vector<Tensor> tensors_of(const ParamList& params) {
    std::vector<Tensor> out;
    for (const NamedTensor& p : unique_parameters(params)) out.push_back(p.tensor);
    return out;
}

// Perturbs the parameters' values a little away from their initial values (zero biases, unit LayerNorm
// weights) so that every term of every backward is exercised.
void jitter(const ParamList& params, std::uint64_t seed) {
    for (const auto& p : params) {
        Tensor t = p.tensor;
        Tensor noise = random_tensor(t.shape(), seed++, -0.3, 0.3, false);
        for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] += noise.data()[i];
    }
}

ModelConfig tiny_config(NormPosition norm, Activation act) {
    ModelConfig c;
    c.src_vocab = 11;
    c.tgt_vocab = 13;
    c.d_model = 8;
    c.heads = 2;
    c.ffn = 12;
    c.enc_layers = 1;
    c.dec_layers = 1;
    c.dropout = c.attention_dropout = c.activation_dropout = 0.2;
    c.norm = norm;
    c.activation = act;
    c.max_len = 16;
    return c;
}

}  // namespace

std::vector<GradcheckResult> check_model_blocks(std::uint64_t seed) {
    std::vector<GradcheckResult> out;
    const GradcheckOptions opt{1e-6, 1e-6, seed};
    std::uint64_t k = seed * 7919;
    const std::int64_t B = 2, T = 3, S = 4, C = 8, H = 2;
    // Row 1 of the source has one padded position, row 1 of the target too.
    const std::vector<std::int32_t> src = {5, 6, 7, 2, 8, 9, 2, 0};
    const std::vector<std::int32_t> tgt = {1, 4, 5, 1, 6, 0};
    const Tensor src_mask = key_padding_mask(src, B, S, 0);        // (B, 1, 1, S)
    const Tensor tgt_mask = causal_padding_mask(tgt, B, T, 0);     // (B, 1, T, T)

    {  // attention: self with key padding, causal self, cross; the head gate as an input
        auto attn = std::make_shared<MultiHeadAttention>(C, H, real(0.2));
        Rng init(seed);
        attn->init(init);
        ParamList params = named_parameters(*attn);
        jitter(params, ++k);
        std::vector<Tensor> in = {random_tensor({B, S, C}, ++k)};
        for (const Tensor& t : tensors_of(params)) in.push_back(t);
        out.push_back(gradcheck("attention: self + key padding mask + dropout", [attn, src_mask](auto& x) {
            Rng rng(3);
            return attn->forward(x[0], x[0], src_mask, Pass{&rng});
        }, in, opt));
        std::vector<Tensor> in_t = in;
        in_t[0] = random_tensor({B, T, C}, ++k);
        out.push_back(gradcheck("attention: causal self + padding mask", [attn, tgt_mask](auto& x) {
            return attn->forward(x[0], x[0], tgt_mask, Pass{});
        }, in_t, opt));
        std::vector<Tensor> in_x = in;
        in_x.insert(in_x.begin() + 1, random_tensor({B, S, C}, ++k));
        in_x[0] = random_tensor({B, T, C}, ++k);
        out.push_back(gradcheck("attention: cross (decoder -> encoder)", [attn, src_mask](auto& x) {
            return attn->forward(x[0], x[1], src_mask, Pass{});
        }, in_x, opt));
        Tensor gate = random_tensor({1, H, 1, 1}, ++k, 0.5, 1.5);
        attn->gate = gate;
        out.push_back(gradcheck("attention: head gates xi", [attn, src_mask](auto& x) {
            return attn->forward(x[0], x[0], src_mask, Pass{});
        }, {in[0].clone().set_requires_grad(false), gate}, opt));
    }
    // Causal self-attention of another scoring, against every parameter (jittered) and the input.
    auto check_self_attention = [&](const char* name, std::shared_ptr<MultiHeadAttention> attn) {
        Rng init(seed);
        attn->init(init);
        ParamList params = named_parameters(*attn);
        jitter(params, ++k);
        std::vector<Tensor> in = {random_tensor({B, T, C}, ++k)};
        for (const Tensor& t : tensors_of(params)) in.push_back(t);
        out.push_back(gradcheck(name, [attn, tgt_mask](auto& x) { return attn->forward(x[0], x[0], tgt_mask, Pass{}); }, in, opt));
    };
    // additive scoring v·tanh(q + k): every parameter, v included
    check_self_attention("attention: additive scores, causal self + padding mask",
                         std::make_shared<MultiHeadAttention>(C, H, real(0), AttentionScore::Additive));
    // Linear attention (φ(q)·φ(k), φ = elu + 1): causal self with padding (prefix sums), encoder self with
    // key padding, and cross-attention; local attention (a window of 2) on causal and on encoder self.
    check_self_attention("attention: linear, causal self + padding mask",
                         std::make_shared<MultiHeadAttention>(C, H, real(0), AttentionScore::Linear));
    check_self_attention("attention: local window 2, causal self + padding mask",
                         std::make_shared<MultiHeadAttention>(C, H, real(0), AttentionScore::Local, true, 2));
    for (AttentionScore kind : {AttentionScore::Linear, AttentionScore::Local}) {
        auto attn = std::make_shared<MultiHeadAttention>(C, H, real(0), kind, true, kind == AttentionScore::Local ? 2 : 0);
        Rng init(seed);
        attn->init(init);
        ParamList params = named_parameters(*attn);
        jitter(params, ++k);
        std::vector<Tensor> in = {random_tensor({B, S, C}, ++k)};
        for (const Tensor& t : tensors_of(params)) in.push_back(t);
        const std::string name = kind == AttentionScore::Linear ? "attention: linear" : "attention: local window 2";
        out.push_back(gradcheck(name + ", self + key padding mask", [attn, src_mask](auto& x) {
            return attn->forward(x[0], x[0], src_mask, Pass{});
        }, in, opt));
        std::vector<Tensor> in_x = in;
        in_x.insert(in_x.begin(), random_tensor({B, T, C}, ++k));
        out.push_back(gradcheck(name + ", cross (decoder -> encoder)", [attn, src_mask](auto& x) {
            return attn->forward(x[0], x[1], src_mask, Pass{});
        }, in_x, opt));
    }
    // An encoder and a decoder layer built with `c`, each with every parameter as an input.
    auto check_layers = [&](const std::string& tag, const ModelConfig& c) {
        auto enc = std::make_shared<EncoderLayer>(c);
        auto dec = std::make_shared<DecoderLayer>(c);
        Rng init(seed + 1);
        enc->init(init);
        dec->init(init);
        ParamList pe = named_parameters(*enc), pd = named_parameters(*dec);
        jitter(pe, ++k);
        jitter(pd, ++k);
        std::vector<Tensor> in_e = {random_tensor({B, S, C}, ++k)};
        for (const Tensor& t : tensors_of(pe)) in_e.push_back(t);
        out.push_back(gradcheck("encoder layer" + tag, [enc, src_mask](auto& x) {
            Rng rng(5);
            return enc->forward(x[0], src_mask, Pass{&rng});
        }, in_e, opt));
        std::vector<Tensor> in_d = {random_tensor({B, T, C}, ++k), random_tensor({B, S, C}, ++k)};
        for (const Tensor& t : tensors_of(pd)) in_d.push_back(t);
        out.push_back(gradcheck("decoder layer" + tag, [dec, tgt_mask, src_mask](auto& x) {
            Rng rng(6);
            return dec->forward(x[0], x[1], tgt_mask, src_mask, Pass{&rng});
        }, in_d, opt));
    };
    check_layers(" (post-norm)", tiny_config(NormPosition::Post, Activation::ReLU));
    check_layers(" (pre-norm, gelu)", tiny_config(NormPosition::Pre, Activation::GELU));
    {  // the layers with the efficient attentions
        ModelConfig linear = tiny_config(NormPosition::Pre, Activation::ReLU), local = linear;
        linear.attention = AttentionScore::Linear;
        local.attention = AttentionScore::Local;
        local.window = 2;
        check_layers(" (linear attention)", linear);
        check_layers(" (local attention, window 2)", local);
    }
    {  // the loss the model minimises, on (B, T, V) logits with padded targets
        const std::vector<std::int32_t> target = {4, 5, 2, 6, 2, 0};
        out.push_back(gradcheck("label-smoothed loss (eps 0.1, pad ignored)", [target](auto& x) {
            return sequence_loss(x[0], target, 0, real(0.1));
        }, {random_tensor({B, T, 7}, ++k, -2, 2)}, opt));
    }
    // A whole tiny model, to the loss: untied, tied, and with the decoder's and the input's switches off
    // (no causal mask, no positions, unscaled scores: no layer check above sees them).
    struct ModelVariant {
        std::string tag;
        ModelConfig config;
    };
    std::vector<ModelVariant> models = {{"tie none", tiny_config(NormPosition::Post, Activation::ReLU)},
                                        {"tie all", tiny_config(NormPosition::Post, Activation::ReLU)},
                                        {"no causal mask, positional none, unscaled scores",
                                         tiny_config(NormPosition::Post, Activation::ReLU)}};
    models[1].config.tie = Tying::All;
    models[1].config.tgt_vocab = models[1].config.src_vocab;
    models[2].config.causal_mask = models[2].config.score_scaling = false;
    models[2].config.positional = PositionalKind::None;
    for (const ModelVariant& variant : models) {
        auto model = std::make_shared<Transformer>(variant.config, seed + 2);
        ParamList params = model->parameters();
        jitter(params, ++k);
        const std::vector<std::int32_t> target = {4, 5, 2, 6, 2, 0};
        // About 2,000 values: 16 evenly spread elements of each tensor keep the check quick.
        out.push_back(gradcheck("whole model to the loss (" + variant.tag + ")",
                                [model, src, tgt, target](auto&) {
                                    Rng rng(9);
                                    Tensor logits = model->forward(src, 2, 4, tgt, 3, Pass{&rng});
                                    return sequence_loss(logits, target, 0, real(0.1));
                                },
                                tensors_of(params), GradcheckOptions{1e-6, 1e-6, seed, 16}));
    }
    // dot scores without the 1/√D (--no-score-scaling)
    check_self_attention("attention: unscaled dot scores, causal self + padding mask",
                         std::make_shared<MultiHeadAttention>(C, H, real(0), AttentionScore::Dot, /*scaled=*/false));
    {  // the layers with parts switched off (the whole model above has the rest)
        ModelConfig post = tiny_config(NormPosition::Post, Activation::ReLU), pre = tiny_config(NormPosition::Pre, Activation::ReLU);
        post.residual = pre.residual = false;
        check_layers(" (post-norm, no residual)", post);
        check_layers(" (pre-norm, no residual)", pre);
        ModelConfig no_norm = tiny_config(NormPosition::Post, Activation::ReLU);
        no_norm.layer_norm = false;
        check_layers(" (no LayerNorm)", no_norm);
        no_norm.residual = false;
        check_layers(" (no LayerNorm, no residual)", no_norm);
    }
    {  // the decoder-only model (GPT): its layer has no cross-attention, and the model reads one sequence
        ModelConfig lm = tiny_config(NormPosition::Pre, Activation::GELU);
        lm.arch = Architecture::DecoderOnly;
        lm.src_vocab = lm.tgt_vocab;
        auto dec = std::make_shared<DecoderLayer>(lm);
        Rng init(seed + 3);
        dec->init(init);
        ParamList pd = named_parameters(*dec);
        jitter(pd, ++k);
        std::vector<Tensor> in_d = {random_tensor({B, T, C}, ++k)};
        for (const Tensor& t : tensors_of(pd)) in_d.push_back(t);
        out.push_back(gradcheck("decoder-only layer (pre-norm, gelu, no cross-attention)", [dec, tgt_mask](auto& x) {
            Rng rng(7);
            return dec->forward(x[0], Tensor(), tgt_mask, Tensor(), Pass{&rng});
        }, in_d, opt));
        auto model = std::make_shared<Transformer>(lm, seed + 4);
        ParamList params = model->parameters();
        jitter(params, ++k);
        const std::vector<std::int32_t> target = {4, 5, 2, 6, 2, 0};
        out.push_back(gradcheck("whole model to the loss (decoder-only)",
                                [model, tgt, target](auto&) {
                                    Rng rng(9);
                                    Tensor logits = model->forward({}, 2, 0, tgt, 3, Pass{&rng});
                                    return sequence_loss(logits, target, 0, real(0.1));
                                },
                                tensors_of(params), GradcheckOptions{1e-6, 1e-6, seed, 16}));
    }
    return out;
}

TF_NAMESPACE_END
