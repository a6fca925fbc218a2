// explain(): one sentence through the model, every intermediate tensor kept as a stage (explain.h).
//
// Each stage is computed with the op the model itself uses at that point, on the model's own parameters;
// after every attention, FFN and layer the module's own forward() runs too (no grad) and must give the same
// numbers, or explain() throws — so when the model changes and this file does not, explain fails loudly
// instead of showing a walkthrough of some other model.
#include "tapeformer/teach/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/data/text.h"
#include "tapeformer/decode.h"
#include "tapeformer/io.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {

std::string value_str(real v) {
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    return fmt("%.4f", double(v));
}

// max |a − b| over two tensors of the same shape.
double max_diff(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
    double m = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(double(a.data()[i]) - double(b.data()[i])));
    return m;
}

// Rows of softmax output (…, N) summing to 1.
StageCheck rows_sum_to_one(const Tensor& p, const char* what) {
    const std::int64_t N = p.shape().last(), R = p.shape().leading();
    double worst = 0;
    for (std::int64_t r = 0; r < R; ++r) {
        double s = 0;
        for (std::int64_t j = 0; j < N; ++j) s += p.data()[r * N + j];
        worst = std::max(worst, std::abs(s - 1));
    }
    return {std::string(what) + " sum to 1: max |sum - 1| = " + fmt("%.1e", worst), worst <= 1e-5};
}

// weights (B, H, Tq, Tk) are exactly 0 wherever the additive mask (B|1, 1, Tq|1, Tk) is −∞.
StageCheck masked_weights_zero(const Tensor& w, const Tensor& mask) {
    const std::int64_t B = w.size(0), H = w.size(1), Tq = w.size(2), Tk = w.size(3);
    const std::int64_t mb = mask.size(0), mq = mask.size(2);
    std::int64_t masked = 0;
    double worst = 0;
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t q = 0; q < Tq; ++q)
                for (std::int64_t k = 0; k < Tk; ++k) {
                    const real m = mask.data()[((mb == 1 ? 0 : b) * mq + (mq == 1 ? 0 : q)) * Tk + k];
                    if (!std::isinf(m)) continue;
                    ++masked;
                    worst = std::max(worst, std::abs(double(w.data()[((b * H + h) * Tq + q) * Tk + k])));
                }
    return {"masked weights are exactly 0: " + std::to_string(masked) + " masked, max |weight| there = " +
                fmt("%g", worst),
            worst == 0};
}

// LayerNorm output y = x̂ · γ + β: each row's x̂ = (y − β) / γ has mean 0 and variance 1 (var/(var + eps),
// a hair under 1).
StageCheck layer_norm_rows(const Tensor& y, const LayerNorm& norm) {
    const std::int64_t C = y.shape().last(), R = y.shape().leading();
    double worst_mean = 0, worst_var = 0;
    for (std::int64_t r = 0; r < R; ++r) {
        double s = 0, s2 = 0;
        std::int64_t n = 0;
        for (std::int64_t c = 0; c < C; ++c) {
            const double g = norm.weight.data()[c];
            if (g == 0) continue;  // a column LayerNorm multiplies by 0 says nothing about x̂
            const double xhat = (double(y.data()[r * C + c]) - double(norm.bias.data()[c])) / g;
            s += xhat, s2 += xhat * xhat, ++n;
        }
        if (n == 0) continue;
        const double mean = s / double(n), var = s2 / double(n) - mean * mean;
        worst_mean = std::max(worst_mean, std::abs(mean));
        worst_var = std::max(worst_var, std::abs(var - 1));
    }
    return {"LayerNorm rows, (y - beta) / gamma: max |mean| = " + fmt("%.1e", worst_mean) + ", max |var - 1| = " +
                fmt("%.1e", worst_var),
            worst_mean <= 1e-3 && worst_var <= 2e-2};
}

// Builds the stages. `part`, `layer`, `block` and the row/column labels apply to the stages added next.
class Walk {
public:
    explicit Walk(Explanation& ex) : ex_(ex) {}

    std::string part = "input", block;
    int layer = -1;
    std::vector<std::string> rows, cols;

    ExplainStage& stage(std::string id, std::string title, std::string letters, std::string where, Tensor value = {}) {
        ExplainStage s;
        s.id = std::move(id), s.part = part, s.layer = layer, s.block = block, s.title = std::move(title);
        s.letters = std::move(letters), s.where = std::move(where), s.value = std::move(value);
        s.rows = rows;
        s.cols = cols;
        s.per_head = s.value.defined() && s.value.rank() == 4;
        ex_.stages.push_back(std::move(s));
        return ex_.stages.back();
    }

    // The stage just added must equal what the module computes; the check is kept on the stage.
    void must_match(const Tensor& module_out, const std::string& module) {
        ExplainStage& s = ex_.stages.back();
        const double d = max_diff(s.value, module_out);
        s.checks.push_back({"equals " + module + ": max |difference| = " + fmt("%g", d), d <= 1e-5});
        if (!(d <= 1e-5))
            throw std::logic_error("explain: stage '" + s.id + "' differs from " + module + " by " + fmt("%g", d) +
                                   "; src/teach/explain.cpp no longer follows the model");
    }

    // Attention (B, Tq, C) over key_value (B, Tk, C), stage by stage, as MultiHeadAttention::forward and
    // attend compute it. `self`: query and key_value are the same tensor (one fused projection).
    Tensor attention(MultiHeadAttention& a, const Tensor& query, const Tensor& key_value, const Tensor& mask,
                     bool self, const std::vector<std::string>& keys, const char* tq) {
        const std::int64_t C = a.C, H = a.H;
        const std::string q_rows = std::string("(B, ") + tq + ", C)";
        const std::string kv = self ? tq : "S";
        const std::string heads = std::string("(B, H, ") + tq + ", D)", kv_heads = "(B, H, " + kv + ", D)";
        const char* at = "src/nn/attention.cpp MultiHeadAttention::forward";
        Tensor q, k, v;
        if (self) {
            Tensor qkv = linear(query, a.in_proj_weight, a.in_proj_bias);  // (B, Tq, 3C)
            stage("qkv", "fused projection [Q K V] = x W_inᵀ + b_in, W_in (3C, C) = [W_q; W_k; W_v]",
                std::string("(B, ") + tq + ", 3C)", std::string(at) + " -> linear (src/nn/linear.cpp) -> affine (src/fused_ops.cpp)", qkv);
            q = slice_heads(qkv, 0, C, H);          // (B, H, Tq, D)
            k = slice_heads(qkv, C, 2 * C, H);      // (B, H, Tq, D)
            v = slice_heads(qkv, 2 * C, 3 * C, H);  // (B, H, Tq, D)
            split_checks(qkv, {q, k, v}, {0, C, 2 * C});
        } else {
            Tensor qp = linear(query, a.in_proj_weight.rows(0, C), a.in_proj_bias.rows(0, C));  // (B, T, C)
            stage("q_proj", "Q = x W_qᵀ + b_q from the decoder, W_q = rows [0, C) of W_in", q_rows,
                "src/nn/attention.cpp MultiHeadAttention::project_q -> linear", qp);
            Tensor kvp = linear(key_value, a.in_proj_weight.rows(C, 3 * C), a.in_proj_bias.rows(C, 3 * C));  // (B, S, 2C)
            const std::vector<std::string> saved_rows = rows;
            rows = keys;
            stage("kv_proj", "[K V] = memory [W_k; W_v]ᵀ + b from the encoder output, rows [C, 3C) of W_in", "(B, S, 2C)",
                "src/nn/attention.cpp MultiHeadAttention::project_kv -> linear", kvp);
            rows = saved_rows;
            q = split_heads(qp, H);                // (B, H, T, D)
            k = slice_heads(kvp, 0, C, H);         // (B, H, S, D)
            v = slice_heads(kvp, C, 2 * C, H);     // (B, H, S, D)
        }
        const std::string split = std::string("columns viewed as (B, ") + tq + ", H, D), axes 1 and 2 swapped: ";
        stage("q", "Q split into heads: " + split + "(B, H, " + tq + ", D), D = C / H", heads,
            "src/fused_ops.cpp slice_heads (split_heads, src/nn/attention.cpp)", q);
        const std::vector<std::string> saved_rows = rows;
        rows = keys;
        stage("k", "K split into heads the same way", kv_heads, "src/fused_ops.cpp slice_heads", k);
        stage("v", "V split into heads the same way", kv_heads, "src/fused_ops.cpp slice_heads", v);
        rows = saved_rows;
        cols = keys;
        // scores = Q Kᵀ / √D: (B, H, Tq, D) @ (B, H, Tk, D)ᵀ -> (B, H, Tq, Tk); or additive v·tanh(q_i + k_j)
        const bool additive = a.score == AttentionScore::Additive;
        Tensor scores = additive ? additive_scores(q, k, a.score_v) : matmul(q, k, false, true, real(1) / std::sqrt(real(a.D)));
        if (additive)
            stage("scores", "scores = v_h · tanh(q_i + k_j), additive scoring (v (H, D) = score_v)",
                  std::string("(B, H, ") + tq + ", " + kv + ")",
                  "src/nn/attention.cpp MultiHeadAttention::attend -> additive_scores (src/ops.cpp)", scores);
        else
            stage("scores", "scores = Q Kᵀ / √D (1/√D = " + fmt("%.4f", 1 / std::sqrt(double(a.D))) + ")",
                  std::string("(B, H, ") + tq + ", " + kv + ")",
                  "src/nn/attention.cpp MultiHeadAttention::attend -> matmul (src/ops.cpp), 1/√D as its alpha", scores);
        {
            NoGradGuard display;  // what softmax sees; the model adds the mask inside softmax
            ExplainStage& m = stage("mask", std::string(self && tq[0] == 'T' ? "causal + padding" : "padding") +
                                             " mask added: 0 keeps a key, -inf drops it",
                                  std::string("(B, H, ") + tq + ", " + kv + ")",
                                  std::string("src/nn/attention.cpp ") +
                                      (self && tq[0] == 'T' ? "causal_padding_mask" : "key_padding_mask") +
                                      ", added inside softmax (src/ops.cpp)",
                                  add(scores, mask));
            m.text = mask_picture(mask, rows, keys);
        }
        Tensor weights = softmax(scores, mask);  // (B, H, Tq, Tk)
        ExplainStage& w = stage("softmax", "attention weights = softmax over the keys", std::string("(B, H, ") + tq + ", " + kv + ")",
                              "src/ops.cpp softmax, called by MultiHeadAttention::attend", weights);
        w.checks.push_back(rows_sum_to_one(weights, "attention rows"));
        w.checks.push_back(masked_weights_zero(weights, mask));
        cols.clear();
        Tensor context = matmul(weights, v);  // (B, H, Tq, Tk) @ (B, H, Tk, D) -> (B, H, Tq, D)
        stage("context", "each head's output = weights × V", heads, "MultiHeadAttention::attend -> matmul (src/ops.cpp)", context);
        if (a.gate.requires_grad() || !all_ones(a.gate)) {
            context = mul(context, a.gate);  // (B, H, Tq, D) · ξ (1, H, 1, 1)
            stage("gate", "head gates ξ_h · head_h (a head set to 0 is masked)", heads, "MultiHeadAttention::attend -> mul", context);
        }
        Tensor merged = merge_heads(context);  // (B, H, Tq, D) -> (B, Tq, H, D) -> (B, Tq, C)
        stage("merge", "heads merged: (B, H, " + std::string(tq) + ", D) transposed to (B, " + tq + ", H, D), viewed as " + q_rows,
            q_rows, "src/nn/attention.cpp merge_heads -> permute (src/ops.cpp)", merged);
        Tensor out = a.out_proj.forward(merged);  // (B, Tq, C) @ W_oᵀ + b_o
        stage("out_proj", "out-projection: merged W_oᵀ + b_o, W_o (C, C)", q_rows,
            "MultiHeadAttention::attend -> out_proj, Linear::forward (src/nn/linear.cpp)", out);
        NoGradGuard check;
        must_match(a.forward(query, key_value, mask, Pass{}), "MultiHeadAttention::forward");
        return out;
    }

    // FFN(x) = W₂ act(W₁ x + b₁) + b₂, as FeedForward::forward computes it (no dropout: evaluation).
    Tensor feed_forward(const FeedForward& ff, const Tensor& x, const char* tq) {
        const std::string act = ff.activation == Activation::ReLU ? "relu" : "gelu";
        Tensor h = ff.linear1.forward(x);                                     // (B, Tq, F)
        h = ff.activation == Activation::ReLU ? relu(h) : gelu(h);            // (B, Tq, F)
        stage("ffn_hidden", "FFN inner layer " + act + "(x W_1ᵀ + b_1), W_1 (F, C)", std::string("(B, ") + tq + ", F)",
            "src/nn/feed_forward.cpp FeedForward::forward (linear1, " + act + ")", h);
        Tensor out = ff.linear2.forward(h);  // (B, Tq, C)
        stage("ffn_out", "FFN output h W_2ᵀ + b_2, W_2 (C, F)", std::string("(B, ") + tq + ", C)",
            "src/nn/feed_forward.cpp FeedForward::forward (linear2)", out);
        NoGradGuard check;
        must_match(ff.forward(x, Pass{}), "FeedForward::forward");
        return out;
    }

    // A sublayer's residual: post-norm LN(x + sublayer), pre-norm x + sublayer (its input was normalised).
    Tensor residual(const Tensor& x, const Tensor& sub, const LayerNorm& norm, bool post, const std::string& layer_fn,
                    const char* tq, const std::string& what) {
        if (post) {
            Tensor y = add_layer_norm(x, sub, norm.weight, norm.bias, norm.eps);  // (B, Tq, C)
            ExplainStage& s = stage("add_norm", "residual + LayerNorm: LN(x + " + what + ")", std::string("(B, ") + tq + ", C)",
                                  "src/nn/transformer.cpp " + layer_fn + " -> add_norm -> add_layer_norm (src/fused_ops.cpp); " +
                                      "in training add_dropout_layer_norm, the sublayer's dropout in the same op", y);
            s.checks.push_back(layer_norm_rows(y, norm));
            return y;
        }
        Tensor y = add(x, sub);  // (B, Tq, C)
        stage("residual", "residual: x + " + what + " (pre-norm: the sublayer saw LN(x))", std::string("(B, ") + tq + ", C)",
            "src/nn/transformer.cpp " + layer_fn + " -> add (src/ops.cpp)", y);
        return y;
    }

    Tensor pre_norm(const Tensor& x, const LayerNorm& norm, const std::string& where, const char* tq) {
        Tensor y = norm.forward(x);  // (B, Tq, C)
        ExplainStage& s = stage("norm", "LayerNorm before the sublayer (pre-norm)", std::string("(B, ") + tq + ", C)",
                              "src/nn/transformer.cpp " + where + " -> LayerNorm::forward (src/nn/layer_norm.cpp)", y);
        s.checks.push_back(layer_norm_rows(y, norm));
        return y;
    }

private:
    static bool all_ones(const Tensor& t) {
        for (std::int64_t i = 0; i < t.numel(); ++i)
            if (t.data()[i] != real(1)) return false;
        return true;
    }

        // The mask as a picture: one row per query (or one row for all queries), "0" keeps, "-inf" drops.
    static std::string mask_picture(const Tensor& mask, const std::vector<std::string>& queries,
                                    const std::vector<std::string>& keys) {
        const std::int64_t mq = mask.size(2), Tk = mask.size(3);
        std::ostringstream o;
        o << "mask " << mask.shape().str() << (mq == 1 ? ", the same for every query:" : ", row = query, column = key:") << "\n";
        o << "        ";
        for (std::int64_t k = 0; k < std::min<std::int64_t>(Tk, 12); ++k) o << pad(keys.size() > std::size_t(k) ? keys[k] : "", 6);
        o << "\n";
        for (std::int64_t q = 0; q < std::min<std::int64_t>(mq, 12); ++q) {
            o << pad(mq == 1 ? "all" : (queries.size() > std::size_t(q) ? queries[q] : ""), 8);
            for (std::int64_t k = 0; k < std::min<std::int64_t>(Tk, 12); ++k) o << pad(std::isinf(mask.data()[q * Tk + k]) ? "-inf" : "0", 6);
            o << "\n";
        }
        return o.str();
    }

    static std::string pad(const std::string& s, std::size_t w) {
        std::string t = s.size() > w - 1 ? s.substr(0, w - 1) : s;
        return t + std::string(w - t.size(), ' ');
    }

    void split_checks(const Tensor& qkv, const std::vector<Tensor>& parts, const std::vector<std::int64_t>& offsets) {
        // Q[b, h, t, d] = qkv[b, t, offset + h·D + d]: the split moves numbers, it computes none.
        ExplainStage& s = ex_.stages.back();
        const std::int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2);
        bool same = true;
        for (std::size_t p = 0; p < parts.size(); ++p) {
            const Tensor& x = parts[p];
            const std::int64_t H = x.size(1), D = x.size(3);
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t t = 0; t < T; ++t)
                        for (std::int64_t d = 0; d < D; ++d)
                            same = same && x.data()[((b * H + h) * T + t) * D + d] == qkv.data()[(b * T + t) * W + offsets[p] + h * D + d];
        }
        s.checks.push_back({"Q[b,h,t,d] = qkv[b,t,h*D+d] (and K, V from C and 2C): the split copies, computes nothing", same});
    }

    Explanation& ex_;
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
    if (options.target) {
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
    const bool post = c.norm == NormPosition::Post;
    Walk w(ex);

    // ---- input: text -> tokens -> ids ----
    w.stage("text", "the sentence", "", "apps/cli/explain_command.cpp (as given, trimmed)").text = "\"" + line + "\"";
    std::vector<std::string> pieces = src_tok.pieces(line);
    pieces.push_back(src_tok.id_to_piece(c.eos_id));
    w.stage("tokens", "tokens, then </s> ends the source", "", tokenizer_where(src_tok, "pieces")).text = joined(pieces, " | ");
    std::string ids;
    for (std::int32_t id : ex.src) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    w.stage("ids", "token ids (B, S) = (1, " + std::to_string(S) + ")", "(B, S)",
          tokenizer_where(src_tok, "encode") + ", then </s> (id " + std::to_string(c.eos_id) + ")").text = "[" + ids + "]";

    // ---- the encoder ----
    w.part = "encoder";
    w.rows = src_pieces;
    const Tensor src_mask = key_padding_mask(ex.src, B, S, c.pad_id);  // (B, 1, 1, S)
    auto embed = [&](const Embedding& e, const std::vector<std::int32_t>& id, std::int64_t L, const char* tl) {
        const std::string l = std::string("(B, ") + tl + ", C)";
        Tensor x = embedding(e.weight, id, {B, L}, e.padding_idx);  // (B, L, C)
        w.stage("embed", "embeddings: row id of the table E (V, C)", l,
              "src/ops.cpp embedding, called by Embedding::forward (src/nn/embedding.cpp)", x);
        if (e.scale != real(1)) {
            x = scale(x, e.scale);  // (B, L, C)
            w.stage("scale", "× √C = " + fmt("%.4f", double(e.scale)) + ", so embeddings and positions are on one scale", l,
                  "src/nn/embedding.cpp Embedding::forward -> scale (src/ops.cpp)", x);
        }
        {
            NoGradGuard check;
            w.must_match(e.forward(id, B, L), "Embedding::forward");
        }
        x = model.positional.forward(x);  // (B, L, C) + PE (L, C)
        w.stage("positional",
              c.positional == PositionalKind::Sinusoidal ? "+ positional encoding PE[pos, 2i] = sin(pos/10000^(2i/C)), PE[pos, 2i+1] = cos(...)"
                                                         : "+ learned positional embedding P[pos]",
              l, "src/nn/embedding.cpp PositionalEncoding::forward", x);
        return x;
    };
    Tensor x = embed(model.src_embed, ex.src, S, "S");  // (B, S, C)
    for (std::size_t l = 0; l < model.encoder.size(); ++l) {
        EncoderLayer& L = model.encoder[l];
        const Tensor in = x;
        w.layer = int(l);
        w.block = "self-attention";
        const Tensor n1 = post ? x : w.pre_norm(x, L.norm1, "EncoderLayer::forward", "S");
        Tensor h = w.residual(x, w.attention(L.self_attn, n1, n1, src_mask, true, src_pieces, "S"), L.norm1, post,
                              "EncoderLayer::forward", "S", "SelfAttn(x)");
        w.block = "feed-forward";
        const Tensor n2 = post ? h : w.pre_norm(h, L.norm2, "EncoderLayer::forward", "S");
        x = w.residual(h, w.feed_forward(L.ff, n2, "S"), L.norm2, post, "EncoderLayer::forward", "S", "FFN(x)");
        NoGradGuard check;
        w.must_match(L.forward(in, src_mask, Pass{}), "EncoderLayer::forward");
    }
    w.layer = -1, w.block.clear();
    if (!post) {
        x = model.encoder_norm.forward(x);
        ExplainStage& s = w.stage("final_norm", "the encoder's final LayerNorm (pre-norm)", "(B, S, C)",
                                "src/nn/transformer.cpp Transformer::encode -> LayerNorm::forward", x);
        s.checks.push_back(layer_norm_rows(x, model.encoder_norm));
    }
    const Tensor memory = x;  // (B, S, C)

    // ---- the decoder ----
    w.part = "decoder";
    w.rows = dec_pieces;
    const Tensor self_mask = causal_padding_mask(ex.dec_in, B, T, c.pad_id);  // (B, 1, T, T)
    x = embed(model.tgt_embed, ex.dec_in, T, "T");                              // (B, T, C)
    for (std::size_t l = 0; l < model.decoder.size(); ++l) {
        DecoderLayer& L = model.decoder[l];
        const Tensor in = x;
        w.layer = int(l);
        w.block = "causal self-attention";
        const Tensor n1 = post ? x : w.pre_norm(x, L.norm1, "DecoderLayer::forward", "T");
        Tensor h = w.residual(x, w.attention(L.self_attn, n1, n1, self_mask, true, dec_pieces, "T"), L.norm1, post,
                              "DecoderLayer::forward", "T", "CausalSelfAttn(x)");
        w.block = "cross-attention";
        const Tensor n2 = post ? h : w.pre_norm(h, L.norm2, "DecoderLayer::forward", "T");
        h = w.residual(h, w.attention(L.multihead_attn, n2, memory, src_mask, false, src_pieces, "T"), L.norm2, post,
                       "DecoderLayer::forward", "T", "CrossAttn(x, memory)");
        w.block = "feed-forward";
        const Tensor n3 = post ? h : w.pre_norm(h, L.norm3, "DecoderLayer::forward", "T");
        x = w.residual(h, w.feed_forward(L.ff, n3, "T"), L.norm3, post, "DecoderLayer::forward", "T", "FFN(x)");
        NoGradGuard check;
        w.must_match(L.forward(in, memory, self_mask, src_mask, Pass{}), "DecoderLayer::forward");
    }
    w.layer = -1, w.block.clear();
    if (!post) {
        x = model.decoder_norm.forward(x);
        ExplainStage& s = w.stage("final_norm", "the decoder's final LayerNorm (pre-norm)", "(B, T, C)",
                                "src/nn/transformer.cpp Transformer::decode -> LayerNorm::forward", x);
        s.checks.push_back(layer_norm_rows(x, model.decoder_norm));
    }

    // ---- the output: logits -> probabilities -> the chosen token ----
    w.part = "output";
    ex.logits = model.project(x);  // (B, T, C) @ (V, C)ᵀ -> (B, T, V)
    w.stage("logits", "logits = hidden × generatorᵀ, generator (V, C)" +
                        std::string(c.tie == Tying::None ? "" : " (the target embedding table: tied)"),
          "(B, T, V)", "src/nn/transformer.cpp Transformer::project -> matmul (src/ops.cpp)", ex.logits);
    {
        NoGradGuard display;
        Tensor probs = softmax(ex.logits);  // (B, T, V)
        ExplainStage& p = w.stage("probs", "p(next token) = softmax over the vocabulary", "(B, T, V)",
                                "src/ops.cpp softmax (greedy decoding ranks the same numbers, src/decode.cpp)", probs);
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
        w.stage("chosen", "the chosen token: argmax over V at each position (pad and <s> never chosen)", "(B, T)",
              "src/decode.cpp row_stats, as greedy_search picks").text = text;
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

// ---- the printout ---------------------------------------------------------------------------------------------

namespace {

bool shown(const ExplainStage& s, const ExplainView& v) {
    if (v.layer >= 0 && s.layer != v.layer) return false;
    if (!v.stages.empty() && std::find(v.stages.begin(), v.stages.end(), s.id) == v.stages.end()) return false;
    return true;
}

std::string label(const std::vector<std::string>& labels, std::int64_t i, std::size_t width) {
    std::string s = std::size_t(i) < labels.size() ? labels[i] : std::to_string(i);
    if (s.size() > width) s = s.substr(0, width);
    return s + std::string(width - s.size(), ' ');
}

// The first rows × columns of a (rows, cols) matrix at `base`.
void matrix_excerpt(std::ostringstream& o, const real* base, std::int64_t R, std::int64_t K, const ExplainStage& s,
                    const std::string& indent) {
    constexpr std::int64_t kRows = 6, kCols = 8;
    if (!s.cols.empty()) {
        o << indent << std::string(10, ' ');
        for (std::int64_t k = 0; k < std::min(K, kCols); ++k) {
            std::string c = std::size_t(k) < s.cols.size() ? s.cols[k] : std::to_string(k);
            if (c.size() > 9) c = c.substr(0, 9);
            o << " " << std::string(9 - c.size(), ' ') << c;  // right-aligned over the numbers
        }
        o << "\n";
    }
    for (std::int64_t r = 0; r < std::min(R, kRows); ++r) {
        o << indent << label(s.rows, r, 10);
        for (std::int64_t k = 0; k < std::min(K, kCols); ++k) {
            const std::string v = value_str(base[r * K + k]);
            o << " " << std::string(9 - std::min<std::size_t>(9, v.size()), ' ') << v;
        }
        if (K > kCols) o << "  … (" << K << " columns)";
        o << "\n";
    }
    if (R > kRows) o << indent << "… (" << R << " rows)\n";
}

void values(std::ostringstream& o, const ExplainStage& s, const ExplainView& v) {
    const Tensor& t = s.value;
    if (t.rank() == 3) {
        matrix_excerpt(o, t.data(), t.size(1), t.size(2), s, "      ");
    } else if (t.rank() == 4) {
        const std::int64_t H = t.size(1), R = t.size(2), K = t.size(3);
        for (std::int64_t h = 0; h < H; ++h) {
            if (v.head >= 0 && h != v.head) continue;
            o << "      head " << h << ":\n";
            matrix_excerpt(o, t.data() + h * R * K, R, K, s, "        ");
        }
    }
}

}  // namespace

void check_view(const Explanation& ex, const ModelConfig& c, const ExplainView& v) {
    const std::int64_t layers = std::max(c.enc_layers, c.dec_layers);
    if (v.layer < -1 || v.layer >= layers)
        throw std::invalid_argument("--layer: the model has layers 0.." + std::to_string(layers - 1) + ", got " + std::to_string(v.layer));
    if (v.head < -1 || v.head >= c.heads)
        throw std::invalid_argument("--head: the model has heads 0.." + std::to_string(c.heads - 1) + ", got " + std::to_string(v.head));
    const std::vector<std::string> ids = explain_stage_ids();
    for (const std::string& id : v.stages)
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
            std::string present;
            for (const ExplainStage& s : ex.stages)
                if (present.find(" " + s.id + ",") == std::string::npos) present += " " + s.id + ",";
            throw std::invalid_argument("--stage: no stage '" + id + "'; this model's stages are" + present.substr(0, present.size() - 1));
        }
}

std::string format_explanation(const Explanation& ex, const ExplainView& v) {
    std::ostringstream o;
    std::string heading;
    int n = 0;
    for (const ExplainStage& s : ex.stages) {
        ++n;
        if (!shown(s, v)) continue;
        std::string h = s.part + (s.layer >= 0 ? " layer " + std::to_string(s.layer) : "") + (s.block.empty() ? "" : ", " + s.block);
        if (h != heading) {
            o << "\n== " << h << " ==\n";
            heading = h;
        }
        o << "[" << n << "] " << s.id << ": " << s.title;
        if (s.value.defined()) o << "   " << s.letters << " = " << s.value.shape().str();
        else if (!s.letters.empty()) o << "   " << s.letters;
        o << "\n      computed in " << s.where << "\n";
        if (!s.text.empty() && (v.values || !s.value.defined())) {
            std::istringstream lines(s.text);
            for (std::string line; std::getline(lines, line);) o << "      " << line << "\n";
        }
        if (v.values && s.value.defined()) values(o, s, v);
        if (v.checks)
            for (const StageCheck& k : s.checks) o << "      check " << (k.passed ? "ok  " : "FAIL") << "  " << k.what << "\n";
    }
    if (v.backward) {
        o << "\n== backward: loss = cross-entropy of the target = " << fmt("%.4f", ex.loss)
          << "; gradient norms in the order backward reaches the stages ==\n";
        for (std::size_t i = ex.stages.size(); i-- > 0;) {
            const ExplainStage& s = ex.stages[i];
            if (!s.value.defined() || !shown(s, v)) continue;
            std::string where = s.part + (s.layer >= 0 ? " layer " + std::to_string(s.layer) : "") + (s.block.empty() ? "" : " " + s.block);
            char buf[256];
            const std::string index = "[" + std::to_string(i + 1) + "]";
            std::snprintf(buf, sizeof buf, "%-5s %-10s %-38s ", index.c_str(), s.id.c_str(), where.c_str());
            o << buf << (s.grad_norm >= 0 ? "|dL/dx| = " + fmt("%.4e", s.grad_norm) : "no gradient (not on the loss's path)") << "\n";
        }
    }
    return o.str();
}

TF_NAMESPACE_END
