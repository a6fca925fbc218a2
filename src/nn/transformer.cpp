// The encoder–decoder Transformer: configuration, layers, stacks and the model, composed from modules.
#include "tapeformer/nn/transformer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

// ---- configuration ---------------------------------------------------------------------------------------

const char* to_string(NormPosition n) { return n == NormPosition::Post ? "post" : "pre"; }
const char* to_string(Activation a) { return a == Activation::ReLU ? "relu" : "gelu"; }
const char* to_string(Tying t) { return t == Tying::None ? "none" : t == Tying::Decoder ? "decoder" : "all"; }
const char* to_string(PositionalKind p) {
    return p == PositionalKind::Sinusoidal ? "sinusoidal" : p == PositionalKind::Learned ? "learned" : "none";
}

NormPosition parse_norm_position(const std::string& s) {
    if (s == "post") return NormPosition::Post;
    if (s == "pre") return NormPosition::Pre;
    throw std::invalid_argument("norm position '" + s + "' is not one of: post, pre");
}
Activation parse_activation(const std::string& s) {
    if (s == "relu") return Activation::ReLU;
    if (s == "gelu") return Activation::GELU;
    throw std::invalid_argument("activation '" + s + "' is not one of: relu, gelu");
}
Tying parse_tying(const std::string& s) {
    if (s == "none") return Tying::None;
    if (s == "decoder") return Tying::Decoder;
    if (s == "all") return Tying::All;
    throw std::invalid_argument("embedding tying '" + s + "' is not one of: none, decoder, all");
}
PositionalKind parse_positional(const std::string& s) {
    if (s == "sinusoidal") return PositionalKind::Sinusoidal;
    if (s == "learned") return PositionalKind::Learned;
    if (s == "none") return PositionalKind::None;
    throw std::invalid_argument("positional encoding '" + s + "' is not one of: sinusoidal, learned, none");
}

const char* to_string(Architecture a) { return a == Architecture::EncoderDecoder ? "encoder-decoder" : "decoder-only"; }

Architecture parse_architecture(const std::string& s) {
    if (s == "encoder-decoder") return Architecture::EncoderDecoder;
    if (s == "decoder-only") return Architecture::DecoderOnly;
    throw std::invalid_argument("architecture '" + s + "' is not one of: encoder-decoder, decoder-only");
}

namespace {
// The shortest text that reads back as exactly `v` ("0.1", not "0.10000000000000001").
std::string shortest(double v) {
    char buf[64];
    for (int digits = 1; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}
}  // namespace

void ModelConfig::validate_settings() const {
    // Each number within its range first: the checks below divide by them.
    auto integer = [](const char* key, std::int64_t v, std::int64_t lo, std::int64_t hi) {
        if (v < lo || v > hi)
            throw std::invalid_argument(std::string("model config: ") + key + " must be an integer in [" + std::to_string(lo) +
                                        ", " + std::to_string(hi) + "], got " + std::to_string(v));
    };
    auto rate = [](const char* key, double p) {
        if (!(p >= 0 && p < 1))
            throw std::invalid_argument(std::string("model config: ") + key + " must be a finite number in [0, 1), got " +
                                        shortest(p));
    };
    integer("src_vocab", src_vocab, 1, kMaxVocab);
    integer("tgt_vocab", tgt_vocab, 1, kMaxVocab);
    integer("d_model", d_model, 1, kMaxDModel);
    integer("heads", heads, 1, kMaxHeads);
    integer("ffn", ffn, 1, kMaxFfn);
    integer("enc_layers", enc_layers, 1, kMaxLayers);
    integer("dec_layers", dec_layers, 1, kMaxLayers);
    rate("dropout", dropout);
    rate("attention_dropout", attention_dropout);
    rate("activation_dropout", activation_dropout);
    integer("max_len", max_len, 1, kMaxPositions);
    integer("window", window, 0, kMaxPositions);
    integer("pad_id", pad_id, 0, kMaxVocab - 1);
    integer("bos_id", bos_id, 0, kMaxVocab - 1);
    integer("eos_id", eos_id, 0, kMaxVocab - 1);
    if (d_model % heads != 0)
        throw std::invalid_argument("model config: d_model " + std::to_string(d_model) + " is not divisible by heads " +
                                    std::to_string(heads));
    for (auto [role, counts, layers] : {std::tuple<char, const std::vector<std::int64_t>*, std::int64_t>{'E', &enc_self_heads, decoder_only() ? 0 : enc_layers},
                                        {'D', &dec_self_heads, dec_layers}, {'A', &cross_heads, decoder_only() ? 0 : dec_layers}}) {
        if (!counts->empty() && std::int64_t(counts->size()) != layers)
            throw std::invalid_argument(std::string("model config: head_counts ") + role + " lists " + std::to_string(counts->size()) +
                                        " layers, but the model has " + std::to_string(layers) + " such attentions");
        for (std::int64_t n : *counts)
            if (n < 1 || n > heads)
                throw std::invalid_argument(std::string("model config: head_counts ") + role + " has a layer of " + std::to_string(n) +
                                            " heads; each keeps 1 to heads (" + std::to_string(heads) + ")");
    }
    if (tie == Tying::All && src_vocab != tgt_vocab)
        throw std::invalid_argument("model config: tie 'all' shares one embedding table, which needs a joint vocabulary, "
                                    "but src_vocab is " + std::to_string(src_vocab) + " and tgt_vocab " + std::to_string(tgt_vocab));
    for (auto [name, id] : {std::pair<const char*, std::int32_t>{"pad_id", pad_id}, {"bos_id", bos_id}, {"eos_id", eos_id}})
        if (id < 0 || id >= std::min(src_vocab, tgt_vocab))
            throw std::invalid_argument(std::string("model config: ") + name + " " + std::to_string(id) + " is outside the vocabulary");
    // The switched-off parts where switching them off means nothing.
    if (!score_scaling && attention != AttentionScore::Dot)
        throw std::invalid_argument("model config: score_scaling false (--no-score-scaling) takes the 1/sqrt(D) out of dot-product "
                                    "scores, but attention is '" + std::string(to_string(attention)) + "', which has none");
    if (attention == AttentionScore::Local && window < 1)
        throw std::invalid_argument("model config: attention 'local' needs a window: --window W (each query sees the keys "
                                    "less than W positions away)");
    if (attention != AttentionScore::Local && window != 0)
        throw std::invalid_argument("model config: window " + std::to_string(window) + " (--window) is for --attention local, "
                                    "but attention is '" + to_string(attention) + "'");
    if (!layer_norm && norm == NormPosition::Pre)
        throw std::invalid_argument("model config: layer_norm false (--no-layer-norm) leaves no LayerNorm for norm 'pre' to place "
                                    "before the sublayers (without LayerNorm post and pre are one model: leave norm at 'post')");
}

void ModelConfig::validate() const {
    validate_settings();
    // Each size is bounded; together they must still fit in memory. The positional table is allocated
    // even when it is not learned.
    const std::int64_t weights = parameter_count() + (positional == PositionalKind::Sinusoidal ? max_len * d_model : 0);
    if (weights > kMaxParameters)
        throw std::invalid_argument("model config: " + std::to_string(weights) + " weights (d_model " + std::to_string(d_model) +
                                    ", ffn " + std::to_string(ffn) + ", vocabularies " + std::to_string(src_vocab) + "/" +
                                    std::to_string(tgt_vocab) + ", max_len " + std::to_string(max_len) + ") exceed the limit of " +
                                    std::to_string(kMaxParameters));
}

std::int64_t ModelConfig::heads_in(char role, std::int64_t layer) const {
    const std::vector<std::int64_t>& counts = role == 'E' ? enc_self_heads : role == 'D' ? dec_self_heads : cross_heads;
    return counts.empty() ? heads : counts.at(std::size_t(layer));
}

std::string ModelConfig::head_counts_text() const {
    std::string text;
    for (auto [role, counts] : {std::pair<char, const std::vector<std::int64_t>*>{'E', &enc_self_heads}, {'D', &dec_self_heads},
                                {'A', &cross_heads}}) {
        if (counts->empty()) continue;
        text += (text.empty() ? "" : ";") + std::string(1, role) + ":";
        for (std::size_t l = 0; l < counts->size(); ++l) text += (l ? "," : "") + std::to_string((*counts)[l]);
    }
    return text;
}

void ModelConfig::set_head_counts(const std::string& text) {
    enc_self_heads.clear();
    dec_self_heads.clear();
    cross_heads.clear();
    auto refuse = [&](const std::string& why) {
        throw std::invalid_argument("must be per-layer head counts such as 'E:4,3;D:4,4;A:1,4' (" + why + "), got '" + text + "'");
    };
    std::size_t at = 0;
    while (at < text.size()) {
        const std::size_t end = std::min(text.find(';', at), text.size());
        const std::string part = text.substr(at, end - at);
        at = end + 1;
        if (part.size() < 3 || part[1] != ':' || std::string("EDA").find(part[0]) == std::string::npos)
            refuse("'" + part + "' is not KIND:n,n,... with KIND E, D or A");
        std::vector<std::int64_t>& counts = part[0] == 'E' ? enc_self_heads : part[0] == 'D' ? dec_self_heads : cross_heads;
        if (!counts.empty()) refuse(std::string(1, part[0]) + " is listed twice");
        std::size_t from = 2;
        while (from <= part.size()) {
            const std::size_t comma = std::min(part.find(',', from), part.size());
            const std::string number = part.substr(from, comma - from);
            if (number.empty() || number.size() > 7 || number.find_first_not_of("0123456789") != std::string::npos)
                refuse("'" + number + "' is not a head count");
            counts.push_back(std::stoll(number));
            from = comma + 1;
        }
    }
}

std::int64_t ModelConfig::parameter_count() const {
    ShapeOnly shapes;  // the model's own constructors, allocating nothing
    return Transformer(*this).parameter_count();
}

namespace {
using ShapeList = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

// The parameters of a shape-only build of the model, in its order.
ShapeList built_shapes(const ModelConfig& c) {
    ShapeOnly shapes;
    ShapeList out;
    for (const NamedTensor& p : Transformer(c).parameters()) {
        const Shape& s = p.tensor.shape();
        out.push_back({p.name, std::vector<std::int64_t>(s.dims.begin(), s.dims.begin() + s.rank)});
    }
    return out;
}

// c with size setting `key` changed a little (and still valid), or nothing when no change is valid.
std::optional<ModelConfig> resized(const ModelConfig& c, const std::string& key) {
    for (int sign : {1, -1}) {
        ModelConfig v = c;
        if (key == "heads") {
            v.heads = c.heads > 1 ? 1 : c.d_model;  // both divide d_model
            v.enc_self_heads.clear(), v.dec_self_heads.clear(), v.cross_heads.clear();
        } else if (key == "d_model") {
            v.d_model += sign * c.heads;  // still divisible by heads
        } else if (key == "ffn") {
            v.ffn += sign;
        } else if (key == "src_vocab" || key == "tgt_vocab") {
            (key == "src_vocab" ? v.src_vocab : v.tgt_vocab) += sign;
            if (c.tie == Tying::All) v.src_vocab = v.tgt_vocab = (key == "src_vocab" ? v.src_vocab : v.tgt_vocab);
        } else if (key == "max_len") {
            v.max_len += sign;
        }
        try {
            v.validate_settings();
            return v;
        } catch (const std::invalid_argument&) {
        }
    }
    return std::nullopt;
}

// c with setting `key` at the value that gives a model the fewest parameters, or nothing when it is there.
std::optional<ModelConfig> plainest(const ModelConfig& c, const std::string& key) {
    ModelConfig v = c;
    bool changed = false;
    auto set = [&](auto& field, auto plain) {
        changed = field != plain;
        field = plain;
    };
    if (key == "attention") {
        set(v.attention, AttentionScore::Dot);
        v.window = 0;  // (a window only with local attention)
    }
    if (key == "output_bias") set(v.output_bias, false);
    if (key == "norm") set(v.norm, NormPosition::Post);
    if (key == "positional") set(v.positional, PositionalKind::Sinusoidal);
    if (key == "layer_norm") {
        set(v.layer_norm, false);
        v.norm = NormPosition::Post;  // the only position without LayerNorm (validate_settings)
    }
    if (key == "enc_layers") set(v.enc_layers, std::int64_t{1});
    if (key == "dec_layers") set(v.dec_layers, std::int64_t{1});
    for (std::vector<std::int64_t>* counts : {&v.enc_self_heads, &v.dec_self_heads, &v.cross_heads})  // per layer: the first
        if (counts->size() > 1 && (key == "enc_layers" ? counts == &v.enc_self_heads : key == "dec_layers" && counts != &v.enc_self_heads))
            counts->resize(1);
    if (key == "arch") set(v.arch, Architecture::EncoderDecoder);
    if (!changed) return std::nullopt;
    return v;
}
}  // namespace

std::vector<ParameterShape> ModelConfig::parameter_shapes() const {
    std::vector<ParameterShape> out;
    for (auto& [name, shape] : built_shapes(*this))
        out.push_back({name, shape, std::vector<std::string>(shape.size()), ""});
    // The setting each extent follows from: the first in this order whose change changes the extent.
    const char* sizes[] = {"heads", "d_model", "ffn", "src_vocab", "tgt_vocab", "max_len"};
    for (const char* key : sizes) {
        const std::optional<ModelConfig> v = resized(*this, key);
        if (!v) continue;
        const ShapeList other = built_shapes(*v);
        const std::map<std::string, std::vector<std::int64_t>> by_name(other.begin(), other.end());
        for (ParameterShape& p : out) {
            auto it = by_name.find(p.name);
            if (it == by_name.end() || it->second.size() != p.shape.size()) continue;
            for (std::size_t d = 0; d < p.shape.size(); ++d)
                if (p.dims_from[d].empty() && it->second[d] != p.shape[d]) p.dims_from[d] = key;
        }
    }
    // An extent no change could move (a setting at both its bounds): the first size setting of its value.
    const std::map<std::string, std::int64_t> value = {{"heads", heads},         {"d_model", d_model},
                                                       {"ffn", ffn},             {"src_vocab", src_vocab},
                                                       {"tgt_vocab", tgt_vocab}, {"max_len", max_len}};
    for (ParameterShape& p : out)
        for (std::size_t d = 0; d < p.shape.size(); ++d)
            for (const char* key : sizes)
                if (p.dims_from[d].empty() && value.at(key) == p.shape[d]) p.dims_from[d] = key;
    for (ParameterShape& p : out)
        for (std::string& from : p.dims_from)
            if (from.empty()) from = "d_model";
    // The setting that gives the model a parameter: the first in this order whose plainest value takes it away.
    for (const char* key : {"attention", "output_bias", "norm", "positional", "layer_norm", "enc_layers", "dec_layers", "arch"}) {
        const std::optional<ModelConfig> v = plainest(*this, key);
        if (!v) continue;
        std::set<std::string> kept;
        for (auto& [name, shape] : built_shapes(*v)) kept.insert(name);
        for (ParameterShape& p : out)
            if (p.exists_because.empty() && !kept.count(p.name)) p.exists_because = key;
    }
    return out;
}

// ---- layers ------------------------------------------------------------------------------------------------

namespace {
// A layer's LayerNorm, or an undefined one (no parameters, left out of the walk) without layer_norm.
LayerNorm layer_norm_of(const ModelConfig& c) { return c.layer_norm ? LayerNorm(c.d_model) : LayerNorm(); }
}  // namespace

EncoderLayer::EncoderLayer(const ModelConfig& c, std::int64_t layer)
    : self_attn(c.d_model, c.heads_in('E', layer), real(c.attention_dropout), c.attention, c.score_scaling, c.window,
                c.head_width()),
      ff(c.d_model, c.ffn, c.activation, real(c.activation_dropout)),
      norm1(layer_norm_of(c)), norm2(layer_norm_of(c)), dropout_p(real(c.dropout)), norm(c.norm),
      residual(c.residual), layer_norm(c.layer_norm) {}

namespace {
// The sublayer connection around `sublayer` (a function of the sublayer's input), each form reporting its
// output:
//   post-norm:             LN(x + dropout(sublayer(x)))   one fused op (add_dropout_layer_norm in ops.h),
//                                                        reported by the LayerNorm as "add_norm"
//   pre-norm:              x + dropout(sublayer(LN(x)))   LN(x) reported as "norm", the sum by the layer as
//                                                        "residual"
//   no residual:           the same without "x +": LN(dropout(sublayer(x))) ("norm") or
//                          dropout(sublayer(LN(x))) (no probe: the next sublayer's "norm" shows it)
//   no LayerNorm:          x + dropout(sublayer(x))       ("residual"; post and pre are the same model)
//   neither:               dropout(sublayer(x))           (no probe)
template <class Layer, class Sublayer>
Tensor sublayer_connection(const Layer* layer, const LayerNorm& norm, const Tensor& x, const Sublayer& sublayer,
                           const Pass& pass) {
    const real p = layer->dropout_p;
    const bool post = layer->norm == NormPosition::Post, ln = layer->layer_norm;
    Tensor in = x;
    if (ln && !post) {
        in = norm.forward(x);  // (B, T, C)
        pass.probe(&norm, "norm", in);
    }
    Tensor out = sublayer(in);  // (B, T, C)
    // Pass::let_values_go: the values no later step of the forward reads, and backward either does not read
    // or computes again from what it keeps (a norm's output: Tensor::drop_values); recorded outputs only (a
    // leaf is a tensor no op on the tape made)
    const bool let_go = pass.may_drop_values();
    if (ln && post && layer->residual) {
        Tensor y = add_dropout_layer_norm(x, out, p, pass, norm.weight, norm.bias, norm.eps);  // (B, T, C)
        pass.probe(&norm, "add_norm", y);
        if (let_go && y.recomputable()) {  // the norm's record kept x + dropout(out)
            let_go_of(pass, out, y);                         // nothing reads it again, not even the norm's backward
            Tensor input = x;
            if (input.recomputable()) input.drop_values();   // an earlier norm's output: computed again when read
        }
        return y;
    }
    Tensor y = dropout(out, p, pass);  // (B, T, C)
    let_go_of(pass, out, y);           // dropout's backward reads its draws only
    if (let_go && !in.same_storage(x) && in.recomputable()) in.drop_values();  // pre-norm: LN(x), computed again from x
    if (layer->residual) {
        const Tensor dropped = y;
        y = add(x, dropped);  // (B, T, C)
        pass.probe(layer, "residual", y);
        let_go_of(pass, dropped, y);  // add's backward reads neither operand (x is the caller's, and LN's input)
    } else if (ln && post) {
        y = norm.forward(y);  // (B, T, C)
        pass.probe(&norm, "norm", y);
    }
    return y;
}
}  // namespace

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& mask, const Pass& pass) {
    Tensor h = sublayer_connection(this, norm1, x, [&](const Tensor& in) { return self_attn.forward(in, in, mask, pass); }, pass);
    return sublayer_connection(this, norm2, h, [&](const Tensor& in) { return ff.forward(in, pass); }, pass);
}

void EncoderLayer::visit(ModuleWalk& walk) const {
    walk.child("self_attn", self_attn, "self-attention");
    walk.child("ff", ff, "feed-forward", /*flat=*/true);
    if (!layer_norm) return;
    walk.child("norm1", norm1);
    walk.child("norm2", norm2);
}

void EncoderLayer::init(Rng& rng) {
    self_attn.init(rng);
    ff.init(rng);
}

DecoderLayer::DecoderLayer(const ModelConfig& c, std::int64_t layer)
    : self_attn(c.d_model, c.heads_in('D', layer), real(c.attention_dropout), c.attention, c.score_scaling, c.window,
                c.head_width()),
      multihead_attn(c.decoder_only() ? MultiHeadAttention()
                                      : MultiHeadAttention(c.d_model, c.heads_in('A', layer), real(c.attention_dropout),
                                                           c.attention, c.score_scaling, c.window, c.head_width())),
      ff(c.d_model, c.ffn, c.activation, real(c.activation_dropout)),
      norm1(layer_norm_of(c)), norm2(layer_norm_of(c)), norm3(c.decoder_only() ? LayerNorm() : layer_norm_of(c)),
      dropout_p(real(c.dropout)), norm(c.norm), residual(c.residual), layer_norm(c.layer_norm), causal(c.causal_mask),
      cross(!c.decoder_only()) {}

Tensor DecoderLayer::forward(const Tensor& x, const Tensor& memory, const Tensor& self_mask, const Tensor& memory_mask,
                             const Pass& pass, DecoderLayerCache* cache) {
    KVCache* self_cache = cache ? &cache->self_attn : nullptr;
    KVCache* memory_cache = cache ? &cache->multihead_attn : nullptr;
    Tensor h = sublayer_connection(this, norm1, x, [&](const Tensor& in) {
        return self_attn.forward(in, in, self_mask, pass, self_cache);
    }, pass);
    if (!cross)  // decoder-only: the FFN follows self-attention, with the second norm
        return sublayer_connection(this, norm2, h, [&](const Tensor& in) { return ff.forward(in, pass); }, pass);
    h = sublayer_connection(this, norm2, h, [&](const Tensor& in) {
        return multihead_attn.forward(in, memory, memory_mask, pass, memory_cache);
    }, pass);
    return sublayer_connection(this, norm3, h, [&](const Tensor& in) { return ff.forward(in, pass); }, pass);
}

void DecoderLayer::visit(ModuleWalk& walk) const {
    walk.child("self_attn", self_attn, causal ? "causal self-attention" : "self-attention, no causal mask");
    if (cross) walk.child("multihead_attn", multihead_attn, "cross-attention");
    walk.child("ff", ff, "feed-forward", /*flat=*/true);
    if (!layer_norm) return;
    walk.child("norm1", norm1);
    walk.child("norm2", norm2);
    if (cross) walk.child("norm3", norm3);
}

void DecoderLayer::init(Rng& rng) {
    self_attn.init(rng);
    if (cross) multihead_attn.init(rng);
    ff.init(rng);
}

// ---- the model ---------------------------------------------------------------------------------------------

namespace {
const ModelConfig& validated(const ModelConfig& c) {
    if (ShapeOnly::active()) c.validate_settings();  // validate()'s size bound is itself a shape-only build
    else c.validate();
    return c;
}
}  // namespace

Transformer::Transformer(const ModelConfig& c, std::uint64_t seed)
    : config(validated(c)),
      src_embed(c.decoder_only() ? Embedding() : Embedding(c.src_vocab, c.d_model, c.pad_id)),
      positional(c.positional, c.max_len, c.d_model) {
    Rng rng(seed);
    if (!c.decoder_only()) src_embed.init(rng);
    if (c.tie == Tying::All && !c.decoder_only()) {
        tgt_embed = src_embed;  // the same table (Tensor handles alias)
    } else {
        tgt_embed = Embedding(c.tgt_vocab, c.d_model, c.pad_id);
        tgt_embed.init(rng);
    }
    if (c.positional == PositionalKind::Learned) init_normal(positional.table, rng, 0.02);
    for (std::int64_t i = 0; i < (c.decoder_only() ? 0 : c.enc_layers); ++i) {
        encoder.emplace_back(c, i);
        encoder.back().init(rng);
    }
    for (std::int64_t i = 0; i < c.dec_layers; ++i) {
        decoder.emplace_back(c, i);
        decoder.back().init(rng);
    }
    if (c.norm == NormPosition::Pre) {
        if (!c.decoder_only()) encoder_norm = LayerNorm(c.d_model);
        decoder_norm = LayerNorm(c.d_model);
    }
    if (c.tie == Tying::None) {
        generator = make_param({c.tgt_vocab, c.d_model});
        init_xavier_uniform(generator, rng);
    } else {
        generator = tgt_embed.weight;
    }
    if (c.output_bias) generator_bias = make_param({c.tgt_vocab});  // zeros
}

void Transformer::visit(ModuleWalk& walk) const {
    if (config.decoder_only()) {  // no source side: one token table, one stack
        walk.child("embed", tgt_embed);
        if (config.positional != PositionalKind::None) walk.child("positional", positional);
        walk.layers("decoder", decoder);
        if (config.norm == NormPosition::Pre) walk.child("decoder.norm", decoder_norm);
        walk.parameter("generator.weight", generator);  // the token table when tied
        walk.parameter("generator.bias", generator_bias);
        return;
    }
    walk.child("src_embed", src_embed);
    walk.child("tgt_embed", tgt_embed);  // src_embed's table when tie == All
    if (config.positional != PositionalKind::None) walk.child("positional", positional);
    walk.layers("encoder", encoder);
    if (config.norm == NormPosition::Pre) walk.child("encoder.norm", encoder_norm);
    walk.layers("decoder", decoder);
    if (config.norm == NormPosition::Pre) walk.child("decoder.norm", decoder_norm);
    walk.parameter("generator.weight", generator);  // the target embedding's table when tied
    walk.parameter("generator.bias", generator_bias);  // with output_bias only (undefined otherwise: left out)
}

ParamList Transformer::parameters() const { return named_parameters(*this); }

std::int64_t Transformer::parameter_count() const {
    std::int64_t n = 0;
    for (const auto& p : unique_parameters(parameters())) n += p.tensor.numel();
    return n;
}

namespace {
// ids must hold B · T values: the (B, T) batch, row after row. (The embedding op range-checks each id.)
void check_ids(const char* what, const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T) {
    if (static_cast<std::int64_t>(ids.size()) != B * T)
        throw std::invalid_argument(std::string(what) + ": " + std::to_string(ids.size()) + " ids for a (" + std::to_string(B) +
                                    ", " + std::to_string(T) + ") batch");
}
}  // namespace

Tensor Transformer::encode(const std::vector<std::int32_t>& src, std::int64_t B, std::int64_t S, const Pass& pass) {
    check_ids("encode", src, B, S);
    if (config.decoder_only()) throw std::logic_error("encode: a decoder-only model has no encoder");
    pass.section("encoder", Input::Source);
    const Tensor mask = key_padding_mask(src, B, S, config.pad_id);  // (B, 1, 1, S)
    Tensor x = embed(src_embed, src, B, S, 0, pass);  // (B, S, C)
    for (auto& layer : encoder) x = layer.forward(x, mask, pass);
    if (config.norm == NormPosition::Pre) {
        x = encoder_norm.forward(x);  // (B, S, C)
        pass.probe(&encoder_norm, "final_norm", x);
    }
    pass.probe(this, "memory", x);
    return x;
}

Tensor Transformer::decode(const std::vector<std::int32_t>& dec_in, std::int64_t B, std::int64_t T, const Tensor& memory,
                           const std::vector<std::int32_t>& src, std::int64_t S, const Pass& pass) {
    check_ids("decode", dec_in, B, T);
    check_ids("decode (source)", src, B, S);
    const Tensor self_mask = config.causal_mask ? causal_padding_mask(dec_in, B, T, config.pad_id)  // (B, 1, T, T)
                                                : key_padding_mask(dec_in, B, T, config.pad_id);    // (B, 1, 1, T)
    const Tensor memory_mask = key_padding_mask(src, B, S, config.pad_id);      // (B, 1, 1, S)
    return decoder_stack(dec_in, B, T, memory, self_mask, memory_mask, pass, nullptr);
}

Tensor Transformer::decode_only(const std::vector<std::int32_t>& tokens, std::int64_t B, std::int64_t T, const Pass& pass) {
    check_ids("decode_only", tokens, B, T);
    if (!config.decoder_only()) throw std::logic_error("decode_only: the model has an encoder (use decode)");
    const Tensor self_mask = config.causal_mask ? causal_padding_mask(tokens, B, T, config.pad_id)  // (B, 1, T, T)
                                                : key_padding_mask(tokens, B, T, config.pad_id);    // (B, 1, 1, T)
    return decoder_stack(tokens, B, T, Tensor(), self_mask, Tensor(), pass, nullptr);  // (B, T, C)
}

Tensor Transformer::decode_step(const std::vector<std::int32_t>& dec_in, std::int64_t N, std::int64_t T,
                                const Tensor& memory, const Tensor& memory_mask, DecoderCache& cache) {
    check_ids("decode_step", dec_in, N, T);
    cache.layers.resize(decoder.size());
    return decoder_stack(dec_in, N, T, memory, Tensor(), memory_mask, Pass{}, &cache);  // (N, T, C)
}

Tensor Transformer::decoder_stack(const std::vector<std::int32_t>& dec_in, std::int64_t B, std::int64_t T,
                                  const Tensor& memory, const Tensor& self_mask, const Tensor& memory_mask,
                                  const Pass& pass, DecoderCache* cache) {
    const std::int64_t start = cache ? cache->position() : 0;
    pass.section("decoder", Input::Target);
    Tensor x = embed(tgt_embed, dec_in, B, T, start, pass);  // (B, T, C)
    for (std::size_t l = 0; l < decoder.size(); ++l)
        x = decoder[l].forward(x, memory, self_mask, memory_mask, pass, cache ? &cache->layers[l] : nullptr);
    if (config.norm == NormPosition::Pre) {
        x = decoder_norm.forward(x);  // (B, T, C)
        pass.probe(&decoder_norm, "final_norm", x);
    }
    return x;
}

Tensor Transformer::embed(const Embedding& table, const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T,
                         std::int64_t start, const Pass& pass) const {
    const Tensor rows = table.forward(ids, B, T, pass);  // (B, T, C)
    Tensor x = rows;
    if (config.positional != PositionalKind::None) {
        x = positional.forward(rows, start, pass);  // + PE[start .. start + T): (B, T, C)
        let_go_of(pass, rows, x);                   // add's backward reads neither operand
    }
    Tensor y = dropout(x, real(config.dropout), pass);  // (B, T, C)
    let_go_of(pass, x, y);                              // dropout's backward reads its draws only
    return y;
}

Tensor Transformer::project(const Tensor& hidden, const Pass& pass) const {
    pass.section("output", Input::Target);
    Tensor logits = config.output_bias ? affine(hidden, generator, generator_bias)  // (B, T, C) @ (V, C)ᵀ + (V) -> (B, T, V)
                                       : matmul(hidden, generator, false, true);    // (B, T, C) @ (V, C)ᵀ -> (B, T, V)
    pass.probe(this, "logits", logits);
    return logits;
}

Tensor Transformer::forward(const std::vector<std::int32_t>& src, std::int64_t B, std::int64_t S,
                            const std::vector<std::int32_t>& dec_in, std::int64_t T, const Pass& pass) {
    if (config.decoder_only()) return project(decode_only(dec_in, B, T, pass), pass);  // (B, T, V): no encoder
    Tensor memory = encode(src, B, S, pass);
    return project(decode(dec_in, B, T, memory, src, S, pass), pass);
}

std::vector<std::pair<std::string, MultiHeadAttention*>> Transformer::attentions() {
    std::vector<std::pair<std::string, MultiHeadAttention*>> out;
    for (const ModuleEntry& e : named_modules(*this))
        if (e.type == MultiHeadAttention::kType)  // a part of this (non-const) model, met through the const walk
            out.push_back({e.name, const_cast<MultiHeadAttention*>(static_cast<const MultiHeadAttention*>(e.module))});
    return out;
}

Tensor sequence_loss(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t pad,
                     real label_smoothing, LossReport* report, bool consume_logits, real seed) {
    const std::int64_t V = logits.size(-1);
    CrossEntropyStats stats;
    Tensor loss = cross_entropy(logits.reshape({-1, V}), target, pad, label_smoothing, &stats, consume_logits,
                                seed);  // (B·T, V) -> ()
    if (report) {
        report->loss = loss.item();
        report->tokens = stats.count;
        report->nll = stats.count ? stats.nll_sum / double(stats.count) : 0.0;
        report->ppl = std::exp(report->nll);
    }
    return loss;
}

TF_NAMESPACE_END
