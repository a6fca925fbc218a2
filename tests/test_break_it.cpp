// The parts of the model that can be switched off to watch what each does (ModelConfig's causal_mask,
// score_scaling, positional none, residual, layer_norm): each changes the forward exactly as its equation
// says, is left out of the module walk and the probes where it has nothing to show, is refused where it
// means nothing, and is kept in the weights file's metadata. The gradients of the switched-off forms are
// checked in f64/test_gradcheck.cpp; the CLI's flags, refusals and a saved model in test_cli.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/ops.h"
#include "tapeformer/optim.h"
#include "tapeformer/run/train_step.h"
#include "helpers.h"

using namespace tf;

namespace {

// Every probe of a pass, by name, with the module type that reported it.
struct Probes : ForwardObserver {
    std::vector<std::string> names, types;
    std::vector<Tensor> values;
    void probe(const void*, const char* type, const char* name, const Tensor& value) override {
        names.push_back(name);
        types.push_back(type);
        values.push_back(value);
    }
    bool has(const std::string& name) const {
        for (const std::string& n : names)
            if (n == name) return true;
        return false;
    }
    const Tensor& first(const std::string& name) const {
        for (std::size_t i = 0; i < names.size(); ++i)
            if (names[i] == name) return values[i];
        throw std::logic_error("no probe " + name);
    }
};

ModelConfig small_config() {
    ModelConfig c = tf_test::tiny_model_config(20, 16, 4, 32, 2, 2, 32);  // V, C, H, F, layers, positions
    c.dropout = c.attention_dropout = c.activation_dropout = 0;
    return c;
}

std::set<std::string> module_names(const Transformer& m) {
    std::set<std::string> out;
    for (const ModuleEntry& e : named_modules(m)) out.insert(e.name);
    return out;
}

// The decoder's hidden states (B, T, C) for targets dec_in, in evaluation mode.
Tensor decoder_output(Transformer& model, const std::vector<std::int32_t>& src, const std::vector<std::int32_t>& dec_in) {
    NoGradGuard no_grad;
    const std::int64_t S = std::int64_t(src.size()), T = std::int64_t(dec_in.size());
    const Tensor memory = model.encode(src, 1, S, Pass{});
    return model.decode(dec_in, 1, T, memory, src, S, Pass{});
}

double max_diff_at(const Tensor& a, const Tensor& b, std::int64_t t) {  // (1, T, C) at position t
    const std::int64_t C = a.size(2);
    double d = 0;
    for (std::int64_t j = 0; j < C; ++j) d = std::max(d, std::fabs(double(a.data()[t * C + j]) - double(b.data()[t * C + j])));
    return d;
}

}  // namespace

TEST_CASE("break it: without the causal mask, a decoder position sees the later targets", "[nn][break_it]") {
    // Change the last target token: with the mask, every earlier position's output stays bit for bit; without
    // it, every position's changes.
    const std::vector<std::int32_t> src = {5, 6, 7, 2}, a = {1, 8, 9, 10, 11}, b = {1, 8, 9, 10, 12};
    for (bool causal : {true, false}) {
        INFO("causal_mask " << causal);
        ModelConfig c = small_config();
        c.causal_mask = causal;
        Transformer model(c, 3);
        const Tensor ya = decoder_output(model, src, a), yb = decoder_output(model, src, b);
        for (std::int64_t t = 0; t < 4; ++t) {
            INFO("position " << t);
            if (causal) CHECK(max_diff_at(ya, yb, t) == 0);
            else CHECK(max_diff_at(ya, yb, t) > 1e-4);
        }
        CHECK(max_diff_at(ya, yb, 4) > 1e-4);  // the changed position itself, either way
        // The mask the decoder's self-attention is given: (B, 1, T, T) causal, or (B, 1, 1, T) padding only.
        Probes probes;
        Pass pass;
        pass.observer = &probes;
        NoGradGuard no_grad;
        model.forward(src, 1, 4, a, 5, pass);
        std::vector<Shape> masks;
        for (std::size_t i = 0; i < probes.names.size(); ++i)
            if (probes.names[i] == "mask") masks.push_back(probes.values[i].shape());
        REQUIRE(masks.size() == 6);  // 2 encoder self, 2 × (decoder self, cross)
        CHECK(masks[2] == (causal ? Shape{1, 1, 5, 5} : Shape{1, 1, 1, 5}));
    }
}

TEST_CASE("break it: without score scaling, the scores are Q Kᵀ exactly", "[nn][break_it]") {
    for (bool scaled : {true, false}) {
        INFO("score_scaling " << scaled);
        ModelConfig c = small_config();
        c.score_scaling = scaled;
        Transformer model(c, 4);
        Probes probes;
        Pass pass;
        pass.observer = &probes;
        NoGradGuard no_grad;
        model.forward({5, 6, 7, 2}, 1, 4, {1, 8, 9}, 3, pass);
        const Tensor &q = probes.first("q"), &k = probes.first("k"), &scores = probes.first("scores");  // (1, H, S, D), (1, H, S, S)
        const Tensor qk = matmul(q, k, false, true);  // (1, H, S, S)
        const double D = double(q.size(3));
        double worst = 0;
        for (std::int64_t i = 0; i < qk.numel(); ++i) {
            const double want = double(qk.data()[i]) / (scaled ? std::sqrt(D) : 1.0);
            worst = std::max(worst, std::fabs(double(scores.data()[i]) - want));
        }
        if (scaled) CHECK(worst <= 1e-6);
        else CHECK(worst == 0);  // the same product, nothing divided
    }
    // Additive scoring has no 1/√D to leave out.
    ModelConfig c = small_config();
    c.attention = AttentionScore::Additive;
    c.score_scaling = false;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("score_scaling") && Catch::Contains("additive"));
}

TEST_CASE("break it: without positions, the encoder is permutation-equivariant", "[nn][break_it]") {
    // Permuting the source permutes the memory the same way, row for row; with sinusoidal positions it does
    // not. The positional module is gone from the walk and from the probes.
    const std::vector<std::int32_t> src = {5, 6, 7, 8, 2}, perm = {8, 6, 5, 7, 2};
    const std::vector<std::int64_t> where = {3, 1, 0, 2, 4};  // perm[i] = src[where[i]]
    for (PositionalKind kind : {PositionalKind::Sinusoidal, PositionalKind::None}) {
        INFO("positional " << to_string(kind));
        ModelConfig c = small_config();
        c.positional = kind;
        Transformer model(c, 5);
        NoGradGuard no_grad;
        Probes probes;
        Pass pass;
        pass.observer = &probes;
        const Tensor m1 = model.encode(src, 1, 5, pass), m2 = model.encode(perm, 1, 5, Pass{});  // (1, S, C)
        double worst = 0;
        for (std::int64_t i = 0; i < 5; ++i)
            for (std::int64_t j = 0; j < c.d_model; ++j)
                worst = std::max(worst, std::fabs(double(m2.data()[i * c.d_model + j]) - double(m1.data()[where[i] * c.d_model + j])));
        if (kind == PositionalKind::None) {
            CHECK(worst <= 1e-5);
            CHECK_FALSE(probes.has("positional"));
            CHECK(module_names(model).count("positional") == 0);
        } else {
            CHECK(worst > 1e-3);
            CHECK(probes.has("positional"));
            CHECK(module_names(model).count("positional") == 1);
        }
    }
    CHECK(parse_positional("none") == PositionalKind::None);
    CHECK_THROWS_WITH(parse_positional("rotary"), Catch::Contains("sinusoidal, learned, none"));
}

TEST_CASE("break it: without LayerNorm the norms and their weights are gone, and without residuals the count stays",
          "[nn][break_it]") {
    const ModelConfig paper = small_config();  // 2 + 2 layers, C 16
    const std::int64_t C = paper.d_model, norms = 2 * paper.enc_layers + 3 * paper.dec_layers;
    ModelConfig no_norm = paper, no_residual = paper;
    no_norm.layer_norm = false;
    no_residual.residual = false;
    CHECK(no_norm.parameter_count() == paper.parameter_count() - norms * 2 * C);  // γ and β of each
    CHECK(no_residual.parameter_count() == paper.parameter_count());
    const Transformer model(no_norm, 1);
    CHECK(model.parameter_count() == no_norm.parameter_count());
    for (const std::string& name : module_names(model)) CHECK(name.find("norm") == std::string::npos);
    for (const NamedTensor& p : model.parameters()) CHECK(p.name.find("norm") == std::string::npos);
    // Pre-norm places LayerNorms; with none there is nothing to place.
    no_norm.norm = NormPosition::Pre;
    CHECK_THROWS_WITH(no_norm.validate(), Catch::Contains("layer_norm") && Catch::Contains("pre"));
}

TEST_CASE("break it: each sublayer connection computes what its equation says", "[nn][break_it]") {
    // An encoder layer rebuilt from its own modules, in evaluation mode, for each form:
    //   paper (post):   h = LN1(x + A(x)),   y = LN2(h + F(h))
    //   no residual:    h = LN1(A(x)),       y = LN2(F(h))
    //   no LayerNorm:   h = x + A(x),        y = h + F(h)
    //   neither:        h = A(x),            y = F(h)
    // and the probes each reports after its sublayers.
    struct Form {
        bool residual, layer_norm;
        std::vector<std::string> probes;  // of the layer's connections, in order
    };
    const std::vector<Form> forms = {{true, true, {"add_norm", "add_norm"}},
                                     {false, true, {"norm", "norm"}},
                                     {true, false, {"residual", "residual"}},
                                     {false, false, {}}};
    for (const Form& form : forms) {
        INFO("residual " << form.residual << ", layer_norm " << form.layer_norm);
        ModelConfig c = small_config();
        c.residual = form.residual;
        c.layer_norm = form.layer_norm;
        EncoderLayer layer(c);
        Rng init(7);
        layer.init(init);
        NoGradGuard no_grad;
        const Tensor x = random_tensor({2, 3, c.d_model}, 8, -1, 1, false);  // (B, S, C)
        const Tensor mask = key_padding_mask({5, 6, 2, 5, 2, 0}, 2, 3, 0);   // (B, 1, 1, S)
        Probes probes;
        Pass pass;
        pass.observer = &probes;
        const Tensor y = layer.forward(x, mask, pass);
        Tensor h = layer.self_attn.forward(x, x, mask, Pass{});
        if (form.residual) h = add(x, h);
        if (form.layer_norm) h = layer.norm1.forward(h);
        Tensor want = layer.ff.forward(h, Pass{});
        if (form.residual) want = add(h, want);
        if (form.layer_norm) want = layer.norm2.forward(want);
        double worst = 0;
        for (std::int64_t i = 0; i < y.numel(); ++i) worst = std::max(worst, std::fabs(double(y.data()[i]) - double(want.data()[i])));
        CHECK(worst <= 1e-5);
        std::vector<std::string> connections;
        for (const std::string& n : probes.names)
            if (n == "add_norm" || n == "norm" || n == "residual") connections.push_back(n);
        CHECK(connections == form.probes);
    }
}

TEST_CASE("break it: the switches are kept in the metadata, and files without them load with every part on",
          "[nn][settings][break_it]") {
    ModelConfig c = small_config();
    c.causal_mask = c.score_scaling = c.residual = c.layer_norm = false;
    c.positional = PositionalKind::None;
    std::map<std::string, std::string> m = to_metadata(c);
    CHECK(m.at("causal_mask") == "false");
    CHECK(m.at("score_scaling") == "false");
    CHECK(m.at("residual") == "false");
    CHECK(m.at("layer_norm") == "false");
    CHECK(m.at("positional") == "none");
    const ModelConfig d = model_config_from_metadata(m);
    CHECK(to_metadata(d) == m);
    CHECK(switched_off_parts(d) ==
          std::vector<std::string>{"--positional none", "--no-causal-mask", "--no-score-scaling", "--no-residual", "--no-layer-norm"});
    // A file written before the switches existed.
    for (const char* key : {"causal_mask", "score_scaling", "residual", "layer_norm"}) m.erase(key);
    m["positional"] = "sinusoidal";
    const ModelConfig old = model_config_from_metadata(m);
    CHECK(old.causal_mask);
    CHECK(old.score_scaling);
    CHECK(old.residual);
    CHECK(old.layer_norm);
    CHECK(switched_off_parts(old).empty());
}

TEST_CASE("break it: the shapes a weights file is checked against follow the LayerNorm switch", "[nn][break_it]") {
    // A LayerNorm's weights exist because of layer_norm, and a pre-norm stack's final norm because of norm.
    ModelConfig c = small_config();
    c.norm = NormPosition::Pre;
    for (const ParameterShape& p : c.parameter_shapes()) {
        INFO(p.name);
        if (p.name.rfind("encoder.norm", 0) == 0 || p.name.rfind("decoder.norm", 0) == 0) CHECK(p.exists_because == "norm");
        else if (p.name.find(".norm") != std::string::npos) CHECK(p.exists_because == "layer_norm");
    }
}

TEST_CASE("break it: a deliberately wrong LayerNorm backward is opt-in, scoped, and refused by training", "[nn][break_it]") {
    CHECK(broken_gradient() == BrokenGradient::None);
    Tensor x = random_tensor({3, 6}, 11);
    Tensor gamma = Tensor::full({6}, 1), beta = Tensor::zeros({6});
    auto dx_of = [&] {
        Tensor y = layer_norm(x, gamma, beta);
        Tensor loss = sum_all(mul(y, random_tensor({3, 6}, 12, -1, 1, false)));
        backward(loss);
        std::vector<float> g(x.grad(), x.grad() + x.numel());
        x.zero_grad();
        return g;
    };
    const std::vector<float> right = dx_of();
    std::vector<float> wrong;
    {
        BrokenGradientScope scope(BrokenGradient::LayerNormMean);
        CHECK(broken_gradient() == BrokenGradient::LayerNormMean);
        wrong = dx_of();
    }
    CHECK(broken_gradient() == BrokenGradient::None);
    CHECK(dx_of() == right);  // the scope is over: the derived backward again
    double diff = 0;
    for (std::size_t i = 0; i < right.size(); ++i) diff = std::max(diff, std::fabs(double(right[i]) - double(wrong[i])));
    CHECK(diff > 1e-3);
    CHECK(parse_broken_gradient("layernorm-variance") == BrokenGradient::LayerNormVariance);
    CHECK_THROWS_WITH(parse_broken_gradient("softmax"), Catch::Contains("layernorm-mean"));
    // Training refuses to take a step with it, before the forward.
    Transformer model(small_config(), 1);
    Adam adam(model.parameters(), AdamOptions{});
    Rng rng(2);
    const std::vector<std::int32_t> src = {5, 6, 2}, dec_in = {1, 8, 9}, target = {8, 9, 2};
    StepSettings settings;
    settings.lr = 1e-3;
    BrokenGradientScope scope(BrokenGradient::LayerNormMean);
    CHECK_THROWS_WITH(train_step(StepParts{model, adam, nullptr, &rng}, StepBatch{src, dec_in, target, 1, 3, 3}, settings),
                      Catch::Contains("refusing to train") && Catch::Contains("layernorm-mean"));
    CHECK(tape().records().empty());
}
