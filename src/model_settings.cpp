// The model's settings table and the weights file's metadata (model_settings.h).
#include "tapeformer/model_settings.h"

TF_NAMESPACE_BEGIN

namespace {
// ModelConfig's per-layer head counts as one text, "E:4,3,4;D:4,4,4;A:1,4,4" ("" = every layer has `heads`):
// set by heads prune --save, read from the weights file's metadata; no flag.
Setting<ModelConfig> head_counts_setting(const std::string& group) {
    Setting<ModelConfig> s = setting_detail::base<ModelConfig>(
        "", "head_counts", group, "Heads per layer of each attention where some were removed (heads prune --save)", SettingType::Text);
    s.get = [](const ModelConfig& c) { return c.head_counts_text(); };
    s.set = [](ModelConfig& c, const std::string& text) { c.set_head_counts(text); };
    return added_later(s);
}
}  // namespace

// The model's settings, once: the train command's flags and config.toml names (name), the keys of the
// weights file's metadata and run.json (key), and the range each may take. Sizes are bounded so that an
// edited file cannot ask for terabytes (ModelConfig's bounds); validate() checks how they fit together.
const std::vector<Setting<ModelConfig>>& model_settings() {
    using C = ModelConfig;
    const std::string g = "Model";
    static const std::vector<Setting<C>> table = {
        added_later(choice_setting<C>("arch", "arch", g,
                                      "Architecture: encoder-decoder = the paper's translation model; decoder-only = its decoder\n"
                                      "alone (causal self-attention, no cross-attention), a language model of one text (GPT)",
                                      {"encoder-decoder", "decoder-only"}, [](auto& c) -> auto& { return c.arch; },
                                      parse_architecture, [](Architecture a) { return to_string(a); })),
        integer_setting<C>("", "src_vocab", g, "Source vocabulary size V (from the tokenizer)", 1, C::kMaxVocab,
                           [](auto& c) -> auto& { return c.src_vocab; }),
        integer_setting<C>("", "tgt_vocab", g, "Target vocabulary size V (from the tokenizer)", 1, C::kMaxVocab,
                           [](auto& c) -> auto& { return c.tgt_vocab; }),
        integer_setting<C>("d-model", "d_model", g, "Model width C", 1, C::kMaxDModel, [](auto& c) -> auto& { return c.d_model; }),
        integer_setting<C>("heads", "heads", g, "Attention heads H (d-model must be divisible by it)", 1, C::kMaxHeads,
                           [](auto& c) -> auto& { return c.heads; }),
        integer_setting<C>("ffn", "ffn", g, "Feed-forward inner width F", 1, C::kMaxFfn, [](auto& c) -> auto& { return c.ffn; }),
        integer_setting<C>("enc-layers", "enc_layers", g, "Encoder layers", 1, C::kMaxLayers, [](auto& c) -> auto& { return c.enc_layers; }),
        integer_setting<C>("dec-layers", "dec_layers", g, "Decoder layers", 1, C::kMaxLayers, [](auto& c) -> auto& { return c.dec_layers; }),
        real_setting<C>("dropout", "dropout", g, "Dropout on embeddings and sublayer outputs", 0, 1,
                        [](auto& c) -> auto& { return c.dropout; }, false, true),
        real_setting<C>("attention-dropout", "attention_dropout", g, "Dropout on attention weights (default: --dropout)", 0, 1,
                        [](auto& c) -> auto& { return c.attention_dropout; }, false, true),
        real_setting<C>("activation-dropout", "activation_dropout", g, "Dropout inside the FFN (default: --dropout)", 0, 1,
                        [](auto& c) -> auto& { return c.activation_dropout; }, false, true),
        choice_setting<C>("norm", "norm", g, "LayerNorm position (post: the paper's; pre: more stable when deep)", {"post", "pre"},
                          [](auto& c) -> auto& { return c.norm; }, parse_norm_position,
                          [](NormPosition n) { return to_string(n); }),
        choice_setting<C>("activation", "activation", g, "FFN activation", {"relu", "gelu"},
                          [](auto& c) -> auto& { return c.activation; }, parse_activation,
                          [](Activation a) { return to_string(a); }),
        choice_setting<C>("tie", "tie", g, "Embedding tying: decoder = the target embedding is the output layer; all = one table for both\n"
                          "languages and the output (needs --joint-vocab)",
                          {"none", "decoder", "all"}, [](auto& c) -> auto& { return c.tie; }, parse_tying,
                          [](Tying t) { return to_string(t); }),
        choice_setting<C>("positional", "positional", g,
                          "Positional encoding (none: no position signal, to watch a model that cannot tell order)",
                          {"sinusoidal", "learned", "none"},
                          [](auto& c) -> auto& { return c.positional; }, parse_positional,
                          [](PositionalKind p) { return to_string(p); }),
        added_later(choice_setting<C>("attention", "attention", g,
                                      "Attention scoring: dot = the paper's q·k/√D; additive = Bahdanau's v·tanh(W_q q + W_k k);\n"
                                      "linear = φ(q)·φ(k), φ = elu + 1 (Katharopoulos et al.), O(T) in length; local = dot\n"
                                      "in a sliding window of self-attention (needs --window)",
                                      {"dot", "additive", "linear", "local"}, [](auto& c) -> auto& { return c.attention; },
                                      parse_attention_score, [](AttentionScore s) { return to_string(s); })),
        added_later(integer_setting<C>("window", "window", g,
                                       "Local attention's window W: self-attention sees keys less than W positions away\n"
                                       "(with the causal mask, the last W); required by --attention local, refused otherwise",
                                       0, C::kMaxPositions, [](auto& c) -> auto& { return c.window; })),
        added_later(bool_setting<C>("output-bias", "output_bias", g,
                                    "A bias on the output projection (PyTorch's nn.Linear; the paper and fairseq have none)",
                                    "", [](auto& c) -> auto& { return c.output_bias; })),
        // The parts that can be switched off to watch what each does (ModelConfig; validate() refuses the
        // combinations where switching off means nothing).
        added_later(bool_setting<C>("causal-mask", "causal_mask", g,
                                    "The decoder's causal mask: position t sees targets 0..t only (off: it sees the whole\n"
                                    "target in training, which decoding cannot give it)",
                                    "", [](auto& c) -> auto& { return c.causal_mask; })),
        added_later(bool_setting<C>("score-scaling", "score_scaling", g,
                                    "The 1/√D of dot-product scores Q Kᵀ/√D (off: Q Kᵀ; needs --attention dot)", "",
                                    [](auto& c) -> auto& { return c.score_scaling; })),
        added_later(bool_setting<C>("residual", "residual", g,
                                    "Residual connections: each sublayer's output added to its input, x + Sublayer(x)", "",
                                    [](auto& c) -> auto& { return c.residual; })),
        added_later(bool_setting<C>("layer-norm", "layer_norm", g,
                                    "The LayerNorms (off: none, and their weights gone; needs --norm post, the same model\n"
                                    "as pre without them)",
                                    "", [](auto& c) -> auto& { return c.layer_norm; })),
        integer_setting<C>("max-positions", "max_len", g, "Longest sequence the positional table covers", 1, C::kMaxPositions,
                           [](auto& c) -> auto& { return c.max_len; }),
        head_counts_setting(g),
        integer_setting<C>("", "pad_id", g, "Id of the padding token", 0, C::kMaxVocab - 1, [](auto& c) -> auto& { return c.pad_id; }),
        integer_setting<C>("", "bos_id", g, "Id of the begin-of-sentence token", 0, C::kMaxVocab - 1,
                           [](auto& c) -> auto& { return c.bos_id; }),
        integer_setting<C>("", "eos_id", g, "Id of the end-of-sentence token", 0, C::kMaxVocab - 1,
                           [](auto& c) -> auto& { return c.eos_id; }),
    };
    return table;
}

std::map<std::string, std::string> to_metadata(const ModelConfig& c) {
    std::map<std::string, std::string> m;
    for (const Setting<ModelConfig>& s : model_settings()) m[s.key] = s.get(c);
    return m;
}

ModelConfig model_config_from_metadata(const std::map<std::string, std::string>& m) {
    ModelConfig c;
    for (const Setting<ModelConfig>& s : model_settings())
        if (auto it = m.find(s.key); it != m.end()) apply_setting(s, c, it->second, "model metadata: " + s.key);
    return c;
}

std::vector<std::string> switched_off_parts(const ModelConfig& c) {
    const ModelConfig paper;
    std::vector<std::string> off;
    for (const Setting<ModelConfig>& s : model_settings()) {
        // a part that is on by default and off here, or no positions at all
        if (s.type == SettingType::Bool && s.get(paper) == "true" && s.get(c) == "false")
            off.push_back("--" + (s.negation.empty() ? "no-" + s.name : s.negation));
        if (s.key == "positional" && c.positional == PositionalKind::None) off.push_back("--positional none");
    }
    return off;
}

TF_NAMESPACE_END
