// The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017), with PyTorch's
// nn.Transformer parameter names so that checkpoints load into an equivalent PyTorch model.
//
//   encoder layer (post-norm):  x = LN₁(x + Dropout(SelfAttn(x)));  x = LN₂(x + Dropout(FFN(x)))
//   decoder layer (post-norm):  x = LN₁(x + Dropout(CausalSelfAttn(x)))
//                               x = LN₂(x + Dropout(CrossAttn(x, memory)))
//                               x = LN₃(x + Dropout(FFN(x)))
//   pre-norm instead computes x = x + Dropout(Sublayer(LN(x))) and ends each stack with a LayerNorm.
//   Without residual connections (ModelConfig::residual) the "x +" goes; without LayerNorm (layer_norm) the
//   LN goes (and its parameters), leaving x + Dropout(Sublayer(x)); without either, Dropout(Sublayer(x)).
//   logits = decoder output @ generatorᵀ  (+ generator_bias with output_bias)
//
// The decoder-only model (ModelConfig::arch, a GPT-style language model) is the same decoder without its
// encoder: token embedding + positions, N decoder layers whose cross-attention sublayer is left out
// (x = LN₁(x + Dropout(CausalSelfAttn(x)));  x = LN₂(x + Dropout(FFN(x)))), the final norm (pre-norm) and
// the generator; it reads dec_in = BOS + tokens and is trained to predict target = tokens + EOS.
//
// Batch conventions: source = tokens + EOS; decoder input = BOS + tokens; target = tokens + EOS; rows are
// right-padded with pad_id, and padded keys are masked out of every attention.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tapeformer/nn/attention.h"
#include "tapeformer/nn/embedding.h"
#include "tapeformer/nn/feed_forward.h"
#include "tapeformer/nn/layer_norm.h"

TF_NAMESPACE_BEGIN

enum class NormPosition { Post, Pre };
enum class Tying { None, Decoder, All };
enum class Architecture { EncoderDecoder, DecoderOnly };  // the paper's model, or its decoder alone (GPT)

// A parameter as a configuration predicts it, without allocating it: what a weights file's tensors are
// checked against before a model is built from the file's metadata.
struct ParameterShape {
    std::string name;                    // as Transformer::parameters() names it
    std::vector<std::int64_t> shape;
    std::vector<std::string> dims_from;  // the setting (metadata key) each extent follows from: "d_model", ...
    std::string exists_because;          // the setting that gives the model this parameter ("" = every model has it)
};

struct ModelConfig {
    Architecture arch = Architecture::EncoderDecoder;  // DecoderOnly: no encoder, no cross-attention; src_vocab
                                                       // and enc_layers are then unused (src_vocab = tgt_vocab)
    std::int64_t src_vocab = 8000;    // V of the source side (with the special tokens)
    std::int64_t tgt_vocab = 8000;    // V of the target side; must equal src_vocab when tie == All
    std::int64_t d_model = 256;       // C: width of every token's vector
    std::int64_t heads = 4;           // H: attention heads; D = C / H must be whole
    std::int64_t ffn = 1024;          // F: inner width of the feed-forward network
    std::int64_t enc_layers = 3;      // encoder layers
    std::int64_t dec_layers = 3;      // decoder layers
    double dropout = 0.1;             // after embeddings and on every sublayer's output
    double attention_dropout = 0.1;   // on attention weights (PyTorch's layers use `dropout` here too)
    double activation_dropout = 0.1;  // inside the FFN, after the activation (PyTorch: `dropout` too)
    NormPosition norm = NormPosition::Post;  // the paper's layout; Pre trains more stably when deep
    Activation activation = Activation::ReLU;
    Tying tie = Tying::None;          // None; Decoder: target embedding = output projection; All: one table
    PositionalKind positional = PositionalKind::Sinusoidal;
    AttentionScore attention = AttentionScore::Dot;  // how queries score keys (the paper: Dot)
    std::int64_t window = 0;          // W: local attention's window (attention Local only, then >= 1; 0 = none)
    bool output_bias = false;         // logits = x Wᵀ + b instead of x Wᵀ (PyTorch's nn.Linear has the b)
    // Parts of the paper's model that can be switched off to watch what each does ("break it"): every one
    // is on by default, and a model without one is still a model (trained, saved, loaded, decoded).
    bool causal_mask = true;          // decoder self-attention: position t sees targets 0..t only
    bool score_scaling = true;        // dot-product scores Q Kᵀ / √D (off: Q Kᵀ); dot scoring only
    bool residual = true;             // every sublayer's output added to its input (x + Sublayer(x))
    bool layer_norm = true;           // the LayerNorms (off: none at all, so post and pre are the same; post only)
    std::int64_t max_len = 256;       // longest sequence the positional table covers
    // Heads per layer of a model whose heads were removed (heads prune --save): one count per layer of each
    // attention, in [1, heads]; empty: `heads` in every layer. The head width D stays d_model / heads.
    std::vector<std::int64_t> enc_self_heads, dec_self_heads, cross_heads;
    std::int32_t pad_id = 0, bos_id = 1, eos_id = 2;

    // The range of each number, so that an edited file cannot ask for terabytes: sizes from 1, ids from 0,
    // dropouts in [0, 1). validate() checks them; the flags and the weights file's metadata
    // (model_settings.h) show and parse them.
    static constexpr std::int64_t kMaxVocab = 1000000;     // src_vocab, tgt_vocab; ids below it
    static constexpr std::int64_t kMaxDModel = 16384;
    static constexpr std::int64_t kMaxHeads = 1024;
    static constexpr std::int64_t kMaxFfn = 262144;
    static constexpr std::int64_t kMaxLayers = 64;         // enc_layers, dec_layers
    static constexpr std::int64_t kMaxPositions = 65536;   // max_len
    static constexpr std::int64_t kMaxParameters = 1000000000;   // 4 GB of float32 weights

    bool decoder_only() const { return arch == Architecture::DecoderOnly; }
    std::int64_t head_width() const { return d_model / heads; }  // D
    // The heads of layer `layer`'s attention of role 'E' (encoder self-attention), 'D' (decoder
    // self-attention) or 'A' (cross-attention): `heads` unless some were removed.
    std::int64_t heads_in(char role, std::int64_t layer) const;
    bool heads_removed() const { return !enc_self_heads.empty() || !dec_self_heads.empty() || !cross_heads.empty(); }
    // The per-layer head counts as the weights file's metadata stores them, "E:4,3,4;D:4,4,4;A:1,4,4" ("" when
    // no head was removed), and back; a malformed text throws std::invalid_argument saying what is expected.
    std::string head_counts_text() const;
    void set_head_counts(const std::string& text);
    // Throws std::invalid_argument naming the offending setting(s), before anything is allocated.
    void validate() const;
    // validate() but for the bound on the total size, which needs a shape-only build of the model (whose
    // constructor runs this instead).
    void validate_settings() const;
    // Weights this configuration allocates (a tied table counted once): the parameters of a shape-only
    // build of the model (ShapeOnly, tensor.h), so nothing is allocated.
    std::int64_t parameter_count() const;
    // Every parameter Transformer(*this).parameters() lists, in its order, from a shape-only build; which
    // setting each extent follows from and which setting gives the model the parameter are found by
    // building it again with that setting changed.
    std::vector<ParameterShape> parameter_shapes() const;
};

const char* to_string(NormPosition n);
const char* to_string(Activation a);
const char* to_string(Tying t);
const char* to_string(PositionalKind p);
const char* to_string(Architecture a);
NormPosition parse_norm_position(const std::string& s);
Activation parse_activation(const std::string& s);
Tying parse_tying(const std::string& s);
PositionalKind parse_positional(const std::string& s);
Architecture parse_architecture(const std::string& s);

struct EncoderLayer {
    static constexpr const char* kType = "EncoderLayer";
    MultiHeadAttention self_attn;
    FeedForward ff;  // linear1, linear2
    LayerNorm norm1, norm2;  // undefined (and not in the walk) without layer_norm
    real dropout_p = 0;
    NormPosition norm = NormPosition::Post;
    bool residual = true, layer_norm = true;  // ModelConfig's switches

    EncoderLayer() = default;
    explicit EncoderLayer(const ModelConfig& c, std::int64_t layer = 0);  // layer: which head count (heads_in) it has
    // x (B, S, C), mask (B, 1, 1, S) -> (B, S, C). Probes, after each sublayer: "add_norm" (post-norm, from
    // the LayerNorm that made it), "residual" (pre-norm, or no LayerNorm) or, without a residual, "norm"
    // (post-norm) or nothing; and "norm" before it (pre-norm: the sublayer's input).
    Tensor forward(const Tensor& x, const Tensor& mask, const Pass& pass);
    void visit(ModuleWalk& walk) const;  // self_attn, ff (linear1, linear2), norm1, norm2 (with layer_norm)
    void init(Rng& rng);
};

// The key/value caches of one decoder layer's two attentions, for decoding one position at a time.
struct DecoderLayerCache {
    KVCache self_attn;       // the target positions fed so far
    KVCache multihead_attn;  // the memory (encoder output), projected on the first call
};

// The decoder's state between calls of Transformer::decode_step: one cache per decoder layer.
struct DecoderCache {
    std::vector<DecoderLayerCache> layers;
    std::int64_t position() const { return layers.empty() ? 0 : layers[0].self_attn.length; }  // positions fed
};

struct DecoderLayer {
    static constexpr const char* kType = "DecoderLayer";
    MultiHeadAttention self_attn;       // causal (unless the model's causal_mask is off)
    MultiHeadAttention multihead_attn;  // cross-attention over the encoder output; none in a decoder-only model
    FeedForward ff;
    // norm1 before/after self-attention, norm2 cross-attention's, norm3 the FFN's; a decoder-only layer has
    // no cross-attention and its FFN's norm is norm2 (norm3 undefined). Undefined (and not in the walk)
    // without layer_norm.
    LayerNorm norm1, norm2, norm3;
    real dropout_p = 0;
    NormPosition norm = NormPosition::Post;
    bool residual = true, layer_norm = true;  // ModelConfig's switches
    bool causal = true;  // the model's causal_mask (which Transformer::decode builds): names self_attn's role
    bool cross = true;   // has cross-attention (false in a decoder-only model: memory is then never read)

    DecoderLayer() = default;
    explicit DecoderLayer(const ModelConfig& c, std::int64_t layer = 0);  // layer: which head counts (heads_in) it has
    // x (B, T, C), memory (B, S, C), self_mask (B, 1, T, T), memory_mask (B, 1, 1, S) -> (B, T, C)
    // (without cross-attention, memory and memory_mask are undefined tensors)
    // With a cache (decoding, under NoGradGuard): x holds the T positions after those already cached,
    // self_mask must be undefined (the cache masks by position) and memory is read on the first call only.
    // Probes as EncoderLayer's.
    Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& self_mask, const Tensor& memory_mask,
                   const Pass& pass, DecoderLayerCache* cache = nullptr);
    void visit(ModuleWalk& walk) const;  // self_attn, multihead_attn (cross), ff (linear1, linear2), norm1..3 (with layer_norm)
    void init(Rng& rng);
};

class Transformer {
public:
    static constexpr const char* kType = "Transformer";
    ModelConfig config;
    Embedding src_embed, tgt_embed;  // tgt_embed shares src_embed's table when tie == All; decoder-only: no src_embed
    PositionalEncoding positional;
    std::vector<EncoderLayer> encoder;
    std::vector<DecoderLayer> decoder;
    LayerNorm encoder_norm, decoder_norm;  // pre-norm only
    Tensor generator;       // (V_tgt, C); the target embedding's table when tied
    Tensor generator_bias;  // (V_tgt), only with config.output_bias

    // Validates the config, allocates and initialises every parameter from `seed` (inside a ShapeOnly scope:
    // allocates nothing, and gives every parameter its shape).
    explicit Transformer(const ModelConfig& config, std::uint64_t seed = 1);
    Transformer(const Transformer&) = delete;
    Transformer& operator=(const Transformer&) = delete;

    // The module walk (module.h): src_embed, tgt_embed, positional (unless none), encoder.layers.<i>, encoder.norm
    // (pre-norm), decoder.layers.<i>, decoder.norm (pre-norm), then the parameters generator.weight and
    // generator.bias (with output_bias). Decoder-only: embed (the token table), positional, decoder.layers.<i>,
    // decoder.norm (pre-norm), generator.weight, generator.bias.
    void visit(ModuleWalk& walk) const;
    // Every parameter under its PyTorch name, in the walk's order. With tying, the shared tensor appears
    // under each of its names (optimizers and savers handle the sharing).
    ParamList parameters() const;
    std::int64_t parameter_count() const;  // distinct values (a shared table counted once)

    // Probes: the embeddings' and the layers' (see each module), "final_norm" (pre-norm, from the stack's
    // LayerNorm), "memory" (the encoder's output, from the model), "logits" (from the model).
    // src (B, S) -> memory (B, S, C)
    Tensor encode(const std::vector<std::int32_t>& src, std::int64_t B, std::int64_t S, const Pass& pass);
    // dec_in (B, T), memory (B, S, C), src (B, S) for the memory mask -> hidden (B, T, C)
    Tensor decode(const std::vector<std::int32_t>& dec_in, std::int64_t B, std::int64_t T, const Tensor& memory,
                  const std::vector<std::int32_t>& src, std::int64_t S, const Pass& pass);
    // The decoder-only model's stack: tokens (B, T) -> hidden (B, T, C), causal self-attention only.
    Tensor decode_only(const std::vector<std::int32_t>& tokens, std::int64_t B, std::int64_t T, const Pass& pass);
    // The same decoder with a cache, a few positions (usually one) per call, for translation: dec_in (N, T) are
    // each row's next T tokens, at positions cache.position() onwards; memory (N, S, C) is read on the
    // first call only (cross-attention keeps its projection); memory_mask (N, 1, 1, S) -> hidden (N, T, C).
    // A decoder-only model takes undefined memory and memory_mask.
    // Every call runs DecoderLayer::forward, as decode does, in evaluation mode. Needs NoGradGuard. Without
    // the causal mask (config.causal_mask false) too, a position sees only the positions fed so far: the
    // later ones do not exist yet, which is why such a model learns to read a future it never gets.
    Tensor decode_step(const std::vector<std::int32_t>& dec_in, std::int64_t N, std::int64_t T, const Tensor& memory,
                       const Tensor& memory_mask, DecoderCache& cache);
    Tensor project(const Tensor& hidden, const Pass& pass = {}) const;  // (B, T, C) -> logits (B, T, V)
    // The whole model: logits (B, T, V). A decoder-only model reads dec_in alone (src is ignored).
    Tensor forward(const std::vector<std::int32_t>& src, std::int64_t B, std::int64_t S,
                   const std::vector<std::int32_t>& dec_in, std::int64_t T, const Pass& pass);

    // Every attention module under its name ("encoder.layers.0.self_attn", ...), in the walk's order: where
    // the head gates ξ are.
    std::vector<std::pair<std::string, MultiHeadAttention*>> attentions();

private:
    // A stack's input: dropout of the table's rows for ids (B, T) (scaled by √C), plus the positions
    // [start, start + T) unless the model has none -> (B, T, C)
    Tensor embed(const Embedding& table, const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T,
                 std::int64_t start, const Pass& pass) const;
    // The part decode and decode_step share: embedding from position `start` of the cache (0 without),
    // dropout, the decoder layers and (pre-norm) the final norm.
    Tensor decoder_stack(const std::vector<std::int32_t>& dec_in, std::int64_t B, std::int64_t T, const Tensor& memory,
                         const Tensor& self_mask, const Tensor& memory_mask, const Pass& pass, DecoderCache* cache);
};

// What a training or evaluation step reports about the loss.
struct LossReport {
    double loss = 0;          // label-smoothed, mean over non-pad targets: what is minimised
    double nll = 0;           // mean −log p(target) without smoothing
    double ppl = 0;           // exp(nll)
    std::int64_t tokens = 0;  // non-pad target positions
};

// Label-smoothed cross-entropy of logits (B, T, V) against target (B, T), pad positions ignored.
// `consume_logits` and `seed`: see cross_entropy (training passes the model's logits, nothing reads them after,
// and it knows the seed of its backward).
Tensor sequence_loss(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t pad,
                     real label_smoothing, LossReport* report = nullptr, bool consume_logits = false, real seed = 1);

TF_NAMESPACE_END
