// The Transformer's modules: configuration checks, parameter names, masks, positional encoding, attention
// weights and head gates, and an end-to-end overfitting run through the whole training stack.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "tapeformer/autograd.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/ops.h"
#include "tapeformer/optim.h"
#include "tapeformer/schedule.h"
#include "helpers.h"

using namespace tf;

namespace {
// Every probe a pass reports, in order: (module type, probe name, shape).
struct Recorder : ForwardObserver {
    struct Seen {
        std::string type, name;
        Shape shape;
        Tensor value;
    };
    std::vector<Seen> seen;
    std::vector<std::pair<std::string, Input>> sections;
    void probe(const void*, const char* type, const char* name, const Tensor& value) override {
        seen.push_back({type, name, value.shape(), value});
    }
    void section(const char* name, Input input) override { sections.push_back({name, input}); }
    const Tensor& first(const std::string& name) const {
        for (const Seen& s : seen)
            if (s.name == name) return s.value;
        throw std::logic_error("no probe " + name);
    }
};

ModelConfig small_config() { return tf_test::tiny_model_config(20, 16, 4, 32, 2, 2, 32); }  // V, C, H, F, layers, positions
}  // namespace

TEST_CASE("model config: invalid settings are refused with the numbers named", "[nn]") {
    ModelConfig c = small_config();
    c.d_model = 30;
    c.heads = 4;
    try {
        Transformer m(c);
        FAIL("no exception");
    } catch (const std::invalid_argument& e) {
        CHECK_THAT(e.what(), Catch::Contains("d_model 30") && Catch::Contains("heads 4"));
    }
    c = small_config();
    c.tie = Tying::All;
    c.tgt_vocab = 21;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("joint vocabulary") && Catch::Contains("21"));
    c = small_config();
    c.dropout = 1.0;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("dropout"));
    c = small_config();
    c.enc_layers = 0;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("enc_layers"));
    CHECK_THROWS_WITH(parse_tying("both"), Catch::Contains("none, decoder, all"));
}

TEST_CASE("parameter names follow PyTorch's nn.Transformer state dict", "[nn]") {
    ModelConfig c = small_config();
    Transformer post(c);
    std::set<std::string> names;
    for (const auto& p : post.parameters()) names.insert(p.name);
    for (const char* n : {"src_embed.weight", "tgt_embed.weight", "generator.weight", "encoder.layers.0.self_attn.in_proj_weight",
                          "encoder.layers.1.self_attn.in_proj_bias", "encoder.layers.0.self_attn.out_proj.weight",
                          "encoder.layers.0.linear1.weight", "encoder.layers.0.linear2.bias", "encoder.layers.0.norm2.weight",
                          "decoder.layers.1.multihead_attn.in_proj_weight", "decoder.layers.0.norm3.bias"})
        CHECK(names.count(n) == 1);
    CHECK(names.count("encoder.norm.weight") == 0);  // post-norm: no final LayerNorm
    CHECK(post.parameters().size() == 3 + 2 * 12 + 2 * 18);  // embeddings + generator, 12 per encoder layer, 18 per decoder layer

    c.norm = NormPosition::Pre;
    c.tie = Tying::All;
    Transformer pre(c);
    names.clear();
    for (const auto& p : pre.parameters()) names.insert(p.name);
    CHECK(names.count("encoder.norm.weight") == 1);
    CHECK(names.count("decoder.norm.bias") == 1);
    // Tied 'all': one table behind three names, counted once.
    CHECK(pre.src_embed.weight.same_storage(pre.generator));
    CHECK(pre.tgt_embed.weight.same_storage(pre.generator));
    CHECK(pre.parameter_count() < Transformer(small_config()).parameter_count());
}

TEST_CASE("module walk: every module knows its stack and its layer, which tools read instead of parsing names", "[nn]") {
    ModelConfig c = small_config();
    const std::vector<ModuleEntry> modules = named_modules(Transformer(c, 1));
    auto entry = [&](const std::string& name) -> const ModuleEntry& {
        for (const ModuleEntry& e : modules)
            if (e.name == name) return e;
        FAIL("no module " << name);
        return modules[0];
    };
    CHECK(entry("").stack.empty());
    CHECK(entry("").layer == -1);
    CHECK(entry("positional").stack == "positional");
    CHECK(entry("positional").layer == -1);
    const ModuleEntry& layer = entry("decoder.layers.1");
    CHECK(layer.stack == "decoder");
    CHECK(layer.layer == 1);
    CHECK(layer.layer_name == "decoder.layers.1");
    const ModuleEntry& cross = entry("decoder.layers.1.multihead_attn");
    CHECK(cross.stack == "decoder");
    CHECK(cross.layer == 1);
    CHECK(cross.layer_name == "decoder.layers.1");
    CHECK(cross.role == "cross-attention");
    CHECK(entry("encoder.layers.0.ff").layer_name == "encoder.layers.0");
    c.norm = NormPosition::Pre;  // the stack's final norm lies in the stack, in no layer
    const std::vector<ModuleEntry> pre = named_modules(Transformer(c, 1));
    const auto norm = std::find_if(pre.begin(), pre.end(), [](const ModuleEntry& e) { return e.name == "encoder.norm"; });
    REQUIRE(norm != pre.end());
    CHECK(norm->stack == "encoder");
    CHECK(norm->layer == -1);
    CHECK(norm->layer_name.empty());
}

TEST_CASE("unique_parameters: each storage once, under its first name", "[nn]") {
    ModelConfig c = small_config();
    c.tie = Tying::All;
    Transformer model(c);
    const ParamList all = model.parameters();
    const ParamList unique = unique_parameters(all);
    REQUIRE(unique.size() == all.size() - 2);  // tgt_embed.weight and generator.weight are src_embed.weight
    std::set<std::string> names;
    std::int64_t values = 0;
    for (const NamedTensor& p : unique) {
        names.insert(p.name);
        values += p.tensor.numel();
    }
    CHECK(names.count("src_embed.weight") == 1);
    CHECK(names.count("tgt_embed.weight") == 0);
    CHECK(names.count("generator.weight") == 0);
    CHECK(values == model.parameter_count());
    CHECK(unique_parameters({{"a", Tensor()}, {"b", all[0].tensor}, {"c", all[0].tensor}}).size() == 1);
}

TEST_CASE("masks: key padding and causal", "[nn]") {
    const real inf = std::numeric_limits<real>::infinity();
    Tensor kpm = key_padding_mask({5, 6, 0, 7, 0, 0}, 2, 3, 0);
    CHECK(kpm.shape() == Shape{2, 1, 1, 3});
    CHECK(kpm.to_vector() == std::vector<real>{0, 0, -inf, 0, -inf, -inf});
    Tensor causal = causal_mask(3);
    CHECK(causal.to_vector() == std::vector<real>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0});
    Tensor both = causal_padding_mask({1, 5, 0}, 1, 3, 0);
    CHECK(both.to_vector() == std::vector<real>{0, -inf, -inf, 0, 0, -inf, 0, 0, -inf});
}

TEST_CASE("sinusoidal positional encoding matches the paper's formula", "[nn]") {
    PositionalEncoding pe(PositionalKind::Sinusoidal, 50, 8);
    const real* t = pe.table.data();
    CHECK(t[0] == Approx(0.0));                                     // sin(0)
    CHECK(t[1] == Approx(1.0));                                     // cos(0)
    CHECK(t[8 + 0] == Approx(std::sin(1.0)));                       // pos 1, i = 0
    CHECK(t[8 + 1] == Approx(std::cos(1.0)));
    CHECK(t[7 * 8 + 2] == Approx(std::sin(7.0 / std::pow(10000.0, 2.0 / 8))));  // pos 7, dim 2
    CHECK(t[7 * 8 + 5] == Approx(std::cos(7.0 / std::pow(10000.0, 4.0 / 8))));  // pos 7, dim 5
    Tensor x = Tensor::zeros({1, 60, 8});
    CHECK_THROWS_WITH(pe.forward(x), Catch::Contains("max_len 50"));
}

TEST_CASE("embedding is scaled by sqrt(C) and the padding row starts at zero", "[nn]") {
    Embedding e(10, 16, 0);
    Rng rng(3);
    e.init(rng);
    for (int c = 0; c < 16; ++c) CHECK(e.weight.data()[c] == 0);
    Tensor y = e.forward({4}, 1, 1);
    CHECK(y.data()[3] == Approx(e.weight.data()[4 * 16 + 3] * 4.0));
}

TEST_CASE("attention weights on request: rows sum to one, masked keys get zero", "[nn]") {
    MultiHeadAttention attn(16, 4, 0);
    Rng rng(5);
    attn.init(rng);
    const std::vector<std::int32_t> ids = {4, 5, 6, 4, 0, 0};
    Tensor x = Tensor::full({2, 3, 16}, 0.1);
    Recorder probes;
    Pass pass;
    pass.observer = &probes;
    attn.forward(x, x, key_padding_mask(ids, 2, 3, 0), pass);
    const Tensor& weights = probes.first("weights");
    REQUIRE(weights.shape() == Shape{2, 4, 3, 3});
    const real* w = weights.data();
    for (int r = 0; r < 2 * 4 * 3; ++r) CHECK(w[r * 3] + w[r * 3 + 1] + w[r * 3 + 2] == Approx(1.0));
    for (int r = 4 * 3; r < 2 * 4 * 3; ++r) {  // batch row 1: keys 1 and 2 are padding
        CHECK(w[r * 3 + 1] == 0);
        CHECK(w[r * 3 + 2] == 0);
    }
}

TEST_CASE("head gates: xi = 0 removes a head, dL/dxi is the head importance", "[nn]") {
    MultiHeadAttention attn(16, 4, 0);
    Rng rng(7);
    attn.init(rng);
    Tensor x = Tensor::empty({1, 5, 16});
    for (int i = 0; i < x.numel(); ++i) x.data()[i] = real(std::sin(0.37 * i));
    Tensor full = attn.forward(x, x, Tensor(), Pass{});
    attn.gate.data()[2] = 0;
    Tensor masked = attn.forward(x, x, Tensor(), Pass{});
    double diff = 0;
    for (int i = 0; i < full.numel(); ++i) diff += std::fabs(full.data()[i] - masked.data()[i]);
    CHECK(diff > 1e-3);  // removing a head changes the output
    // Gate as a tape tensor: its gradient equals the directional derivative (finite difference).
    attn.gate = Tensor::full({1, 4, 1, 1}, 1).set_requires_grad(true);
    Tensor loss = sum_all(attn.forward(x, x, Tensor(), Pass{}));
    backward(loss);
    const real importance = attn.gate.grad()[1];
    NoGradGuard no_grad;
    attn.gate.data()[1] = real(1.01);
    const double up = sum_all(attn.forward(x, x, Tensor(), Pass{})).item();
    attn.gate.data()[1] = real(0.99);
    const double down = sum_all(attn.forward(x, x, Tensor(), Pass{})).item();
    CHECK(importance == Approx((up - down) / 0.02).epsilon(1e-3));
}

TEST_CASE("overfitting one batch: model + label-smoothed loss + Adam + Noam + clipping", "[nn][train]") {
    ModelConfig c = small_config();
    c.d_model = 32;
    c.ffn = 64;
    Transformer model(c, 42);
    Adam adam(model.parameters());
    Schedule noam;
    noam.kind = ScheduleKind::Noam;
    noam.lr = 1.0;
    noam.warmup = 40;
    noam.d_model = c.d_model;
    // Three sentences (source + EOS; BOS + target; target + EOS), right-padded.
    const std::int64_t B = 3, S = 6, T = 6;
    const std::vector<std::int32_t> src = {5, 6, 7, 8, 9, 2, 10, 11, 12, 2, 0, 0, 13, 14, 2, 0, 0, 0};
    const std::vector<std::int32_t> dec_in = {1, 15, 16, 17, 18, 19, 1, 4, 5, 6, 0, 0, 1, 7, 8, 0, 0, 0};
    const std::vector<std::int32_t> target = {15, 16, 17, 18, 19, 2, 4, 5, 6, 2, 0, 0, 7, 8, 2, 0, 0, 0};
    const double eps = 0.1, V = double(c.tgt_vocab);
    // The smoothed loss cannot fall below the entropy of the smoothed target distribution.
    const double on = 1 - eps + eps / V, off = eps / V;
    const double floor = -(on * std::log(on) + (V - 1) * off * std::log(off));
    Rng dropout_rng(1);
    LossReport report;
    int step = 0;
    for (step = 1; step <= 400; ++step) {
        Tensor loss = sequence_loss(model.forward(src, B, S, dec_in, T, Pass{&dropout_rng}), target, 0, real(eps), &report);
        adam.zero_grad();
        backward(loss);
        clip_grad_norm(adam.params(), 1.0);
        adam.step(noam.lr_at(step));
        if (report.nll < 0.1 && report.loss < floor + 0.1) break;
    }
    INFO("stopped at step " << step << ": loss " << report.loss << " (floor " << floor << "), nll " << report.nll);
    CHECK(report.nll < 0.1);
    CHECK(report.loss < floor + 0.1);
    CHECK(step <= 400);
}

TEST_CASE("decoding with a cache is the training forward: decode_step equals decode on the whole prefix", "[nn][decode]") {
    // decode_step runs the same DecoderLayer::forward and MultiHeadAttention::forward as decode, with the
    // key/value caches: positions fed a few at a time (three at once, then one by one, past the cache's
    // first capacity of 16) give decode's hidden states, for both norm positions and every tying, also after
    // the rows are reordered as beam search does. Only the rounding of the products may differ.
    for (NormPosition norm : {NormPosition::Post, NormPosition::Pre})
        for (Tying tie : {Tying::None, Tying::Decoder, Tying::All}) {
            INFO(to_string(norm) << "-norm, tie " << to_string(tie));
            ModelConfig c = small_config();
            c.norm = norm;
            c.tie = tie;
            Transformer model(c, 17);
            model.decoder[0].self_attn.gate.data()[1] = real(0.5);  // the head gates take part too
            model.decoder[1].multihead_attn.gate.data()[2] = real(0.25);
            NoGradGuard no_grad;
            const std::int64_t B = 3, S = 5, T = 20, C = c.d_model;
            const std::vector<std::int32_t> src = {4, 5, 6, 7, 2, 8, 9, 2, 0, 0, 10, 2, 0, 0, 0};
            Rng rng(23);
            std::vector<std::int32_t> dec_in(B * T);  // BOS, then words: the cache has no padding mask
            for (std::int64_t i = 0; i < B * T; ++i) dec_in[i] = i % T == 0 ? 1 : std::int32_t(3 + rng.below(17));
            const Tensor memory = model.encode(src, B, S, Pass{});                             // (B, S, C)
            const Tensor full = model.decode(dec_in, B, T, memory, src, S, Pass{});           // (B, T, C)

            DecoderCache cache;
            Tensor memory_mask = key_padding_mask(src, B, S, c.pad_id);  // (B, 1, 1, S)
            std::vector<std::int64_t> row_of = {0, 1, 2};                // cache row -> batch row of `full`
            double worst = 0, scale = 0;
            for (std::int64_t t = 0; t < T;) {
                if (t == 11) {  // reorder, copy and drop rows, as beam search does: rows (2, 0, 0)
                    const std::vector<std::int64_t> from = {2, 0, 0};
                    for (DecoderLayerCache& layer : cache.layers) {
                        layer.self_attn.select_rows(from);
                        layer.multihead_attn.select_rows(from);
                    }
                    memory_mask = gather_rows(memory_mask, from);
                    row_of = {row_of[2], row_of[0], row_of[0]};
                }
                const std::int64_t n = t == 0 ? 3 : 1;  // positions fed by this call
                std::vector<std::int32_t> ids;
                for (std::int64_t b : row_of)
                    for (std::int64_t i = 0; i < n; ++i) ids.push_back(dec_in[b * T + t + i]);
                const Tensor got = model.decode_step(ids, B, n, memory, memory_mask, cache);  // (B, n, C)
                REQUIRE(got.shape() == Shape{B, n, C});
                for (std::int64_t r = 0; r < B; ++r)
                    for (std::int64_t i = 0; i < n; ++i)
                        for (std::int64_t j = 0; j < C; ++j) {
                            const double want = full.data()[(row_of[r] * T + t + i) * C + j];
                            const double have = got.data()[(r * n + i) * C + j];
                            worst = std::max(worst, std::fabs(have - want));
                            scale = std::max(scale, std::fabs(want));
                        }
                t += n;
                CHECK(cache.position() == t);
            }
            CHECK(scale > 0.5);
            CHECK(worst <= 1e-5 * scale);
            CHECK(cache.layers[0].self_attn.capacity() == 32);  // grew once, from 16
            CHECK(cache.layers[0].multihead_attn.length == S);  // the memory, projected once
        }
}

TEST_CASE("a key/value cache is for inference only and reads its own mask", "[nn][decode]") {
    MultiHeadAttention attn(16, 4, 0);
    Rng rng(5);
    attn.init(rng);
    Tensor x = Tensor::full({2, 1, 16}, 0.1);
    KVCache cache;
    CHECK_THROWS_WITH(attn.forward(x, x, Tensor(), Pass{}, &cache), Catch::Contains("NoGradGuard"));
    NoGradGuard no_grad;
    CHECK_THROWS_WITH(attn.forward(x, x, causal_mask(1), Pass{}, &cache), Catch::Contains("masks by position"));
    attn.forward(x, x, Tensor(), Pass{}, &cache);
    CHECK(cache.length == 1);
    Tensor three = Tensor::full({3, 1, 16}, 0.1);
    CHECK_THROWS_WITH(attn.forward(three, three, Tensor(), Pass{}, &cache), Catch::Contains("select_rows"));
}

TEST_CASE("attention as one op: the tape holds attention_heads where it applies, the composed ops elsewhere", "[nn]") {
    MultiHeadAttention attn(16, 4, real(0.2));
    Rng init(3);
    attn.init(init);
    Tensor x = random_tensor({2, 5, 16}, 4, -1, 1, true);
    auto ops_recorded = [&](Pass pass) {
        tape().clear();
        Rng rng(9);
        pass.dropout_rng = &rng;
        attn.forward(x, x, causal_mask(5), pass);
        std::set<std::string> ops;
        for (const TapeRecord& r : tape().records()) ops.insert(r.op);
        tape().clear();
        return ops;
    };
    Pass fused;
    fused.fuse_attention = true;
    CHECK(ops_recorded(fused).count("attention_heads") == 1);
    CHECK(ops_recorded(fused).count("slice_heads") == 0);
    CHECK(ops_recorded(Pass{}).count("slice_heads") == 1);  // a reader of the tape sees the textbook's steps
    Recorder probes;
    Pass observed = fused;
    observed.observer = &probes;  // someone listens to the probes: composed, whose steps they name
    CHECK(ops_recorded(observed).count("attention_heads") == 0);
    attn.gate = Tensor::full({1, 4, 1, 1}, 1).set_requires_grad(true);  // a head study: composed
    CHECK(ops_recorded(fused).count("attention_heads") == 0);
}

TEST_CASE("attention_heads refuses heads that do not fit and masks that do not broadcast", "[nn]") {
    Rng rng(1);
    Tensor qkv = Tensor::zeros({2, 3, 12}), q = Tensor::zeros({2, 3, 4});
    CHECK_THROWS_WITH(attention_heads(qkv, 0, qkv, 4, 9, 2, 2, Tensor(), 0, rng),
                      Catch::Contains("attention_heads") && Catch::Contains("do not fit"));
    CHECK_THROWS_WITH(attention_heads(q, 0, Tensor::zeros({3, 4, 8}), 0, 4, 2, 2, Tensor(), 0, rng),
                      Catch::Contains("(B, Tq, W)"));
    CHECK_THROWS_WITH(attention_heads(qkv, 0, qkv, 4, 8, 2, 2, Tensor::zeros({1, 1, 3, 4}), 0, rng),
                      Catch::Contains("attention_heads") && Catch::Contains("(1, 1, 3, 4) do not broadcast"));
}

TEST_CASE("probes: the forward reports its steps in the lessons' order, with their shapes", "[nn][probes]") {
    Transformer model(small_config(), 3);
    const std::vector<std::int32_t> src = {4, 5, 6, 2}, dec_in = {1, 7, 8};  // (1, 4), (1, 3)
    Recorder probes;
    Pass pass;
    pass.observer = &probes;
    NoGradGuard no_grad;
    const Tensor logits = model.forward(src, 1, 4, dec_in, 3, pass);
    std::vector<std::string> names;
    for (const auto& s : probes.seen) names.push_back(s.name);
    const std::vector<std::string> attention = {"q", "k", "v", "scores", "mask", "weights", "context", "merge", "out_proj"};
    std::vector<std::string> layer = {"qkv"};
    layer.insert(layer.end(), attention.begin(), attention.end());
    layer.push_back("add_norm");
    const std::vector<std::string> ffn = {"ffn_hidden", "ffn_out", "add_norm"};
    std::vector<std::string> expected = {"embed", "scale", "positional"};
    for (int l = 0; l < 2; ++l) {
        expected.insert(expected.end(), layer.begin(), layer.end());
        expected.insert(expected.end(), ffn.begin(), ffn.end());
    }
    expected.push_back("memory");
    expected.insert(expected.end(), {"embed", "scale", "positional"});
    for (int l = 0; l < 2; ++l) {
        expected.insert(expected.end(), layer.begin(), layer.end());
        expected.insert(expected.end(), {"q_proj", "kv_proj"});
        expected.insert(expected.end(), attention.begin(), attention.end());
        expected.push_back("add_norm");
        expected.insert(expected.end(), ffn.begin(), ffn.end());
    }
    expected.push_back("logits");
    CHECK(names == expected);
    // The probes are the forward's own tensors: the last is the logits it returns.
    CHECK(probes.seen.back().value.same_storage(logits));
    for (const auto& s : probes.seen)
        if (s.name == "scores" && s.type == "MultiHeadAttention") CHECK(s.shape.rank == 4);
    // The model names its sections as it enters them, with the input each runs over.
    using Sections = std::vector<std::pair<std::string, Input>>;
    CHECK(probes.sections == Sections{{"encoder", Input::Source}, {"decoder", Input::Target}, {"output", Input::Target}});
    REQUIRE(probes.seen[probes.seen.size() - 9].name == "weights");
    CHECK(probes.seen[probes.seen.size() - 9].shape == Shape{1, 4, 3, 4});  // cross-attention weights (B, H, T, S)
}

TEST_CASE("probes cost nothing when nobody listens: the same ops, the same numbers, attention fused", "[nn][probes]") {
    Transformer model(small_config(), 5);
    const std::vector<std::int32_t> src = {4, 5, 6, 2, 9, 3}, dec_in = {1, 7, 8, 10};  // (2, 3), (2, 2)
    auto run = [&](Pass pass, std::vector<std::string>& ops) {
        tape().clear();
        Rng rng(11);
        pass.dropout_rng = &rng;
        Tensor logits = model.forward(src, 2, 3, dec_in, 2, pass);
        ops.clear();
        for (const TapeRecord& r : tape().records()) ops.push_back(r.op);
        std::vector<real> out = logits.to_vector();
        tape().clear();
        return out;
    };
    std::vector<std::string> plain_ops, observed_ops, fused_ops;
    Recorder probes;
    Pass observed;
    observed.observer = &probes;
    const std::vector<real> plain = run(Pass{}, plain_ops);
    const std::vector<real> seen = run(observed, observed_ops);
    // Listening adds no op to the tape and changes no value: the probes are what the forward computes anyway.
    CHECK(observed_ops == plain_ops);
    CHECK(seen == plain);
    CHECK_FALSE(probes.seen.empty());
    // Nobody listening to a fused pass: attention runs as one op, as in training.
    Pass fused;
    fused.fuse_attention = true;
    run(fused, fused_ops);
    CHECK(std::count(fused_ops.begin(), fused_ops.end(), "attention_heads") == 6);  // 2 + 2·2 attentions
}
