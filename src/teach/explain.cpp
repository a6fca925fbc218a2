// explain(): one sentence through the model, every stage a probe of the real forward (explain.h).
//
// explain() listens to Transformer::forward (Pass::observer, nn/module.h) and keeps what each module reports
// as a stage: the numbers are the model's own, in the order it computed them. The model names its sections
// (encoder, decoder, output) as it enters them; the module walk names the module behind each probe, its
// layer and its role in the layer; the table below says what each probe is, keyed by the probe's name. So
// this file describes no layer of the model and cannot drift from it. The invariants checked at the stages
// are in explain_checks.cpp, the printout in explain_view.cpp.
#include "tapeformer/teach/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/data/text.h"
#include "tapeformer/decode.h"
#include "tapeformer/io.h"
#include "tapeformer/ops.h"
#include "explain_checks.h"

TF_NAMESPACE_BEGIN

namespace {

// What each probe is as a stage: the id --stage matches, the title, the shape in letters. Tq stands for the
// queries' length (S over the source, T over the target), Tk for the keys' (S when they come from the memory).
struct StageKind {
    const char* probe;
    const char* id;
    const char* title;
    const char* letters;
};
const StageKind kStages[] = {
    {"embed", "embed", "embeddings: row id of the table E (V, C)", "(B, Tq, C)"},
    {"scale", "scale", "× √C", "(B, Tq, C)"},
    {"positional", "positional", "+ positional encoding", "(B, Tq, C)"},
    {"norm", "norm", "LayerNorm before the sublayer (pre-norm)", "(B, Tq, C)"},
    {"qkv", "qkv", "fused projection [Q K V] = x W_inᵀ + b_in, W_in (3C, C) = [W_q; W_k; W_v]", "(B, Tq, 3C)"},
    {"q_proj", "q_proj", "Q = x W_qᵀ + b_q from the decoder, W_q = rows [0, C) of W_in", "(B, Tq, C)"},
    {"kv_proj", "kv_proj", "[K V] = memory [W_k; W_v]ᵀ + b from the encoder output, rows [C, 3C) of W_in", "(B, Tk, 2C)"},
    {"q", "q", "Q split into heads: columns viewed as (B, Tq, H, D), axes 1 and 2 swapped: (B, H, Tq, D), D = C / H", "(B, H, Tq, D)"},
    {"k", "k", "K split into heads the same way", "(B, H, Tk, D)"},
    {"v", "v", "V split into heads the same way", "(B, H, Tk, D)"},
    {"scores", "scores", "scores", "(B, H, Tq, Tk)"},
    {"mask", "mask", "mask added: 0 keeps a key, -inf drops it", "(B, 1, Tq, Tk)"},
    {"weights", "softmax", "attention weights = softmax(scores + mask) over the keys", "(B, H, Tq, Tk)"},
    {"context", "context", "each head's output = weights × V", "(B, H, Tq, D)"},
    {"gate", "gate", "head gates ξ_h · head_h (a head set to 0 is masked)", "(B, H, Tq, D)"},
    {"merge", "merge", "heads merged: (B, H, Tq, D) transposed to (B, Tq, H, D), viewed as (B, Tq, C)", "(B, Tq, C)"},
    {"out_proj", "out_proj", "out-projection: merged W_oᵀ + b_o, W_o (C, C)", "(B, Tq, C)"},
    {"add_norm", "add_norm", "residual + LayerNorm: LN(x + sublayer(x)); in training the sublayer's dropout is in the same op",
     "(B, Tq, C)"},
    {"residual", "residual", "residual: x + sublayer(LN(x)) (pre-norm: the sublayer saw LN(x))", "(B, Tq, C)"},
    {"ffn_hidden", "ffn_hidden", "FFN inner layer act(x W_1ᵀ + b_1), W_1 (F, C)", "(B, Tq, F)"},
    {"ffn_out", "ffn_out", "FFN output h W_2ᵀ + b_2, W_2 (C, F)", "(B, Tq, C)"},
    {"final_norm", "final_norm", "the stack's final LayerNorm (pre-norm)", "(B, Tq, C)"},
    {"logits", "logits", "logits = hidden × generatorᵀ, generator (V, C)", "(B, Tq, V)"},
};

std::string replaced(std::string s, const std::string& from, const std::string& to) {
    for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
    return s;
}

// Listens to one forward pass and keeps each probe as a stage, in the section of the model that reports it
// (ForwardObserver::section): its name is the stage's part, its input gives the rows' tokens and the letter
// of their length (S for the source, T for the target); cross-attention's keys are the source's.
class StageRecorder : public ForwardObserver {
public:
    StageRecorder(Explanation& ex, const Transformer& model, const std::vector<std::string>& src_pieces,
                  const std::vector<std::string>& dec_pieces)
        : ex_(ex), config_(model.config), walk_(model), src_(src_pieces), dec_(dec_pieces) {}

    void section(const char* name, Input input) override { part_ = name, input_ = input; }

    void probe(const void* module, const char* type, const char* name, const Tensor& value) override {
        const std::string probe = name;
        const StageKind* kind = nullptr;
        for (const StageKind& k : kStages)
            if (probe == k.probe) kind = &k;
        const ModuleEntry* entry = walk_.find(module, type);
        if (!kind || !entry) return;
        Seen& seen = seen_[module];
        if (probe == "kv_proj") seen.cross = true;

        ExplainStage s;
        s.id = kind->id, s.part = part_, s.layer = entry->layer, s.value = value;
        if (s.layer != layer_) block_.clear(), layer_ = s.layer;
        if (!entry->role.empty()) block_ = entry->role;
        if (s.layer >= 0) s.block = block_;
        const Input keys_input = seen.cross ? Input::Source : input_;
        const std::string tq = letter(input_), tk = letter(keys_input);
        const std::vector<std::string>& queries = pieces(input_);
        const std::vector<std::string>& keys = pieces(keys_input);
        s.rows = probe == "k" || probe == "v" || probe == "kv_proj" ? keys : queries;
        if (probe == "scores" || probe == "mask" || probe == "weights") s.cols = keys;
        s.title = kind->title;
        s.letters = kind->letters;
        s.where = entry->name.empty() ? entry->type : entry->name + " (" + entry->type + ")";
        s.per_head = value.rank() == 4;

        if (probe == "scale") s.title += " = " + fmt("%.4f", ratio(value, last_embed_)) + ", so embeddings and positions are on one scale";
        if (probe == "embed") last_embed_ = value;
        if (probe == "positional")
            s.title = config_.positional == PositionalKind::Sinusoidal
                          ? "+ positional encoding PE[pos, 2i] = sin(pos/10000^(2i/C)), PE[pos, 2i+1] = cos(...)"
                          : "+ learned positional embedding P[pos]";
        if (probe == "scores") {
            const std::int64_t D = seen.q.defined() ? seen.q.size(3) : 1;
            s.title = config_.attention == AttentionScore::Additive
                          ? "scores = v_h · tanh(q_i + k_j), additive scoring (v (H, D) = score_v)"
                      : config_.attention == AttentionScore::Linear
                          ? "kernel φ(q_i)·φ(k_j), φ = elu + 1: linear attention (computed for this view only; the pass "
                            "itself forms Σ_j φ(k_j) v_jᵀ)"
                      : config_.score_scaling
                          ? "scores = Q Kᵀ / √D (1/√D = " + fmt("%.4f", 1 / std::sqrt(double(D))) + ")"
                          : "scores = Q Kᵀ, not divided by √D (--no-score-scaling; √D = " + fmt("%.4f", std::sqrt(double(D))) + ")";
        }
        // Post-norm without residual connections reports its LayerNorm as "norm"; without LayerNorm the
        // residual sum is the sublayer's output, as in pre-norm.
        if (probe == "norm" && config_.norm == NormPosition::Post)
            s.title = "LayerNorm of the sublayer's output, no residual (--no-residual): LN(sublayer(x))";
        if (probe == "residual" && !config_.layer_norm)
            s.title = "residual: x + sublayer(x), no LayerNorm (--no-layer-norm)";
        if (probe == "mask") {
            const bool causal = value.size(2) > 1;
            s.title = std::string(causal ? "causal + padding" : "padding") + " " + s.title;
            if (!causal) s.letters = "(B, 1, 1, Tk)";
            seen.mask = value;
        }
        if (probe == "logits" && config_.tie != Tying::None) s.title += " (the target embedding table: tied)";
        s.title = replaced(replaced(s.title, "Tq", tq), "Tk", tk);
        s.letters = replaced(replaced(s.letters, "Tq", tq), "Tk", tk);

        if (probe == "qkv") seen.qkv = value;
        if (probe == "q") seen.q = value;
        if (probe == "k") seen.k = value;
        if (probe == "v" && seen.qkv.defined()) ex_.stages.back().checks.push_back(split_check(seen.qkv, {seen.q, seen.k, value}));
        if (probe == "weights" && config_.attention == AttentionScore::Linear)
            s.title = "attention weights implied by linear attention: φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j') over the keys";
        if (probe == "weights") {
            s.checks.push_back(rows_sum_to_one(value, "attention rows"));
            if (seen.mask.defined()) s.checks.push_back(masked_weights_zero(value, seen.mask));
        }
        if (probe == "add_norm" || probe == "norm" || probe == "final_norm")
            s.checks.push_back(layer_norm_rows(value, parameter(entry->name + ".weight"), parameter(entry->name + ".bias")));
        ex_.stages.push_back(std::move(s));
    }

    // A pre-norm LayerNorm belongs to the sublayer after it.
    void finish() {
        if (config_.norm != NormPosition::Pre) return;
        for (std::size_t i = ex_.stages.size(); i-- > 1;)
            if (ex_.stages[i - 1].id == "norm" && ex_.stages[i - 1].layer == ex_.stages[i].layer)
                ex_.stages[i - 1].block = ex_.stages[i].block;
    }

private:
    struct Seen {
        bool cross = false;  // keys and values from the memory (cross-attention)
        Tensor qkv, q, k, mask;
    };

    static const char* letter(Input input) { return input == Input::Source ? "S" : "T"; }
    const std::vector<std::string>& pieces(Input input) const { return input == Input::Source ? src_ : dec_; }

    static double ratio(const Tensor& scaled, const Tensor& x) {
        for (std::int64_t i = 0; x.defined() && i < x.numel(); ++i)
            if (x.data()[i] != 0) return double(scaled.data()[i]) / double(x.data()[i]);
        return 1;
    }

    const Tensor& parameter(const std::string& name) const {
        for (const NamedTensor& p : walk_.parameters)
            if (p.name == name) return p.tensor;
        throw std::logic_error("explain: the model has no parameter '" + name + "'");
    }

    Explanation& ex_;
    const ModelConfig& config_;
    ModuleWalk walk_;
    const std::vector<std::string>&src_, &dec_;
    std::map<const void*, Seen> seen_;
    Tensor last_embed_;
    std::string part_, block_;
    Input input_ = Input::Source;
    int layer_ = -1;
};

std::string joined(const std::vector<std::string>& v, const std::string& sep) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
    return out;
}

std::string tokenizer_where(const Tokenizer& t, const char* fn) {
    return std::string("src/data/tokenizer.cpp ") + (t.kind() == "word" ? "WordTokenizer::" : "SentencePieceTokenizer::") + fn;
}

}  // namespace

std::vector<std::string> explain_stage_ids() {
    return {"text", "tokens", "ids", "embed", "scale", "positional", "norm", "qkv", "q_proj", "kv_proj", "q", "k", "v",
            "scores", "mask", "softmax", "context", "gate", "merge", "out_proj", "add_norm", "residual", "ffn_hidden",
            "ffn_out", "final_norm", "logits", "probs", "chosen"};
}

Explanation explain(Transformer& model, const TokenizerPair& tokenizers, const std::string& sentence,
                    const ExplainOptions& options) {
    const ModelConfig& c = model.config;
    const std::string line(trim(sentence));
    if (line.empty()) throw std::invalid_argument("explain: the sentence is empty");
    Explanation ex;
    const Tokenizer& src_tok = *tokenizers.source;
    const Tokenizer& tgt_tok = *tokenizers.target;
    ex.src = src_tok.encode(line);
    const auto too_long = [&](const char* side, std::size_t n) {
        if (std::int64_t(n) + 1 > c.max_len)
            throw std::invalid_argument(std::string("explain: the ") + side + " has " + std::to_string(n) +
                                        " tokens; the model covers " + std::to_string(c.max_len - 1) + " (plus </s> or <s>)");
    };
    too_long("sentence", ex.src.size());
    ex.src.push_back(c.eos_id);  // source = tokens + EOS, as in every batch
    const std::int64_t B = 1, S = std::int64_t(ex.src.size());
    std::vector<std::int32_t> tgt;
    if (c.decoder_only()) {  // one sequence: the sentence is the decoder's input (BOS + tokens), nothing decoded
        tgt = options.target ? tgt_tok.encode(trim(*options.target))
                             : std::vector<std::int32_t>(ex.src.begin(), ex.src.end() - 1);
    } else if (options.target) {
        const std::string t(trim(*options.target));
        if (t.empty()) throw std::invalid_argument("explain: the target sentence is empty (leave out --tgt to decode)");
        tgt = tgt_tok.encode(t);
    } else {
        NoGradGuard no_grad;
        tgt = translate_batch(model, ex.src, B, S, DecodeOptions{}).at(0);
        ex.target_decoded = true;
    }
    too_long("target", tgt.size());
    ex.dec_in.push_back(c.bos_id);  // decoder input = BOS + target
    ex.dec_in.insert(ex.dec_in.end(), tgt.begin(), tgt.end());
    const std::int64_t T = std::int64_t(ex.dec_in.size());

    std::vector<std::string> src_pieces, dec_pieces;
    for (std::int32_t id : ex.src) src_pieces.push_back(src_tok.id_to_piece(id));
    for (std::int32_t id : ex.dec_in) dec_pieces.push_back(tgt_tok.id_to_piece(id));

    std::optional<NoGradGuard> no_grad;
    if (!options.backward) no_grad.emplace();
    // A stage explain adds itself, around the forward: the text before it, the probabilities after.
    auto own_stage = [&](const char* part, std::string id, std::string title, std::string letters, std::string where,
                         std::string text, Tensor value = {}) -> ExplainStage& {
        ExplainStage s;
        s.id = std::move(id), s.part = part, s.title = std::move(title), s.letters = std::move(letters);
        s.where = std::move(where), s.text = std::move(text), s.value = std::move(value);
        if (s.part == "output") s.rows = dec_pieces;
        ex.stages.push_back(std::move(s));
        return ex.stages.back();
    };

    // ---- input: text -> tokens -> ids ----
    own_stage("input", "text", "the sentence", "", "apps/cli/explain_command.cpp (as given, trimmed)", "\"" + line + "\"");
    std::vector<std::string> pieces = src_tok.pieces(line);
    pieces.push_back(src_tok.id_to_piece(c.eos_id));
    own_stage("input", "tokens", "tokens, then </s> ends the source", "", tokenizer_where(src_tok, "pieces"), joined(pieces, " | "));
    std::string ids;
    for (std::int32_t id : ex.src) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    own_stage("input", "ids", "token ids (B, S) = (1, " + std::to_string(S) + ")", "(B, S)",
               tokenizer_where(src_tok, "encode") + ", then </s> (id " + std::to_string(c.eos_id) + ")", "[" + ids + "]");

    // ---- the model's forward, every stage reported by the module that computes it ----
    StageRecorder recorder(ex, model, src_pieces, dec_pieces);
    Pass pass;  // evaluation: no dropout
    pass.observer = &recorder;
    ex.logits = model.forward(ex.src, B, S, ex.dec_in, T, pass);  // (B, T, V)
    recorder.finish();

    // ---- the output: probabilities -> the chosen token ----
    {
        NoGradGuard display;
        Tensor probs = softmax(ex.logits);  // (B, T, V)
        ExplainStage& p = own_stage("output", "probs", "p(next token) = softmax over the vocabulary", "(B, T, V)",
                                    "src/ops.cpp softmax (greedy decoding ranks the same numbers, src/decode.cpp)", "", probs);
        p.checks.push_back(rows_sum_to_one(probs, "probability rows"));
        const std::int64_t V = c.tgt_vocab;
        std::string text;
        for (std::int64_t t = 0; t < T; ++t) {
            std::int32_t best = -1;  // the most probable id that may be generated (not pad, not BOS), as greedy picks
            for (std::int32_t v = 0; v < V; ++v) {
                if (v == c.pad_id || v == c.bos_id) continue;
                if (best < 0 || probs.data()[t * V + v] > probs.data()[t * V + best]) best = v;
            }
            ex.chosen.push_back(best);
            text += "after " + dec_pieces[t] + " -> " + tgt_tok.id_to_piece(best) + " (id " + std::to_string(best) +
                    ", p = " + fmt("%.3f", double(probs.data()[t * V + best])) + ")\n";
        }
        own_stage("output", "chosen", "the chosen token: argmax over V at each position (pad and <s> never chosen)", "(B, T)",
                  "src/decode.cpp row_stats, as greedy_search picks", text);
    }

    if (options.backward) {
        // L = cross-entropy of the target (tokens + EOS) under teacher forcing, no label smoothing.
        std::vector<std::int32_t> target(tgt);
        target.push_back(c.eos_id);
        Tensor loss = sequence_loss(ex.logits, target, c.pad_id, 0);
        ex.loss = loss.item();
        backward(loss);
        for (ExplainStage& s : ex.stages) {
            if (!s.value.defined() || !s.value.has_grad()) continue;
            const real* g = static_cast<const Tensor&>(s.value).grad();
            double n2 = 0;
            for (std::int64_t i = 0; i < s.value.numel(); ++i) n2 += double(g[i]) * double(g[i]);
            s.grad_norm = std::sqrt(n2);
        }
        for (auto& p : unique_parameters(model.parameters())) p.tensor.zero_grad();
    }
    for (const ExplainStage& s : ex.stages)
        for (const StageCheck& k : s.checks) ex.checks_passed = ex.checks_passed && k.passed;
    return ex;
}

TF_NAMESPACE_END
