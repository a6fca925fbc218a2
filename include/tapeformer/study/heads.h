// Studying attention heads: which heads matter, how gradients reach them, what they attend to.
//
// Heads are named KIND:layer:head, 0-based, with E = encoder self-attention, D = decoder self-attention,
// A = encoder–decoder (cross) attention. Every attention multiplies head h's output by a gate ξ_h
// (nn/attention.h); the study gives each head a gate per query position, all 1, so that autograd's
// gradient of the gate is the head's importance at that position (Michel et al. 2019):
//   ∂L/∂ξ_{b,h,t} = ⟨o_{b,h,t}, ∂L/∂o_{b,h,t}⟩      o_{b,h,t}: head h's output at query t, before the merge
// and the importance of a head is
//   token:     I_h = (1/N_q) Σ_{b,t} |∂L/∂ξ_{b,h,t}|        (Michel et al.'s definition)
//   sentence:  I_h = (1/B_total) Σ_b |Σ_t ∂L/∂ξ_{b,h,t}|     (one gate per sentence: Hugging Face's head_mask)
//   batch:     I_h = (1/batches) Σ_batches |Σ_{b,t} ∂L/∂ξ_{b,h,t}| (one gate per batch: = ⟨W_o^h, ∂L/∂W_o^h⟩_F)
// with L the token-summed NLL (or the label-smoothed loss) and N_q the non-pad query positions of that
// attention: source tokens for E, target tokens for D and A.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/data/batch.h"
#include "tapeformer/decode.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/study/head_ids.h"

TF_NAMESPACE_BEGIN

enum class Granularity { token, sentence, batch };
Granularity parse_granularity(const std::string& name);  // throws, listing the valid names
const char* to_string(Granularity g);

// ---- the pass every study is built on ------------------------------------------------------------------

// What the attention modules show of one forward pass, to a study that listens (Pass::observer): each
// one's probes "weights" (B, H, Tq, Tk) and "context" (B, H, Tq, D: each head's Σ_j a_ij v_j before its
// gate). The tensors are the pass's own; the modules keep nothing.
class AttentionProbes : public ForwardObserver {
public:
    struct Seen {
        Tensor weights, context;
    };
    void probe(const void* module, const char* type, const char* name, const Tensor& value) override;
    // What `m` reported; throws std::logic_error when the pass did not run it.
    const Seen& of(const MultiHeadAttention& m) const;

private:
    std::map<const void*, Seen> seen_;
};

// Consecutive examples in file order, as indices, while B · max(S, T) stays within `budget` (S = source +
// EOS, T = BOS + target).
std::vector<std::vector<std::int64_t>> file_order_batches(const std::vector<Example>& examples, std::int64_t budget);

// One attention during gated_pass: its gate ξ (B, H, Tq, 1) of that batch, whose gradient after the pass is
// ∂L/∂ξ_{b,h,t} = ⟨o_{b,h,t}, ∂L/∂o_{b,h,t}⟩ for every head and query (padded queries included: read only
// t < the row's length).
struct GatedAttention {
    HeadKind kind;
    int layer;
    MultiHeadAttention* module;
    Tensor saved_gate;           // (1, H, 1, 1): the model's gate, put back after the pass
    Tensor gate;                 // ξ (B, H, Tq, 1) = the model's gate at every query, with its gradient
    Tensor weights;              // (B, H, Tq, Tk): the pass's attention weights (its probe "weights")
    Tensor context;              // (B, H, Tq, D): each head's output before its gate (its probe "context")
};

// One teacher-forced pass over `batch` with dropout off and gradients on: every attention's gate becomes a
// per-query ξ that requires grad, and the attentions' probes give their weights; backward of the loss
// summed over the batch's target tokens (label smoothing ε, 0 for the NLL), which is also written to *loss.
// Parameter gradients accumulate (+=). Returns the attentions, E layers, then D, then A; the model's gates
// are restored.
std::vector<GatedAttention> gated_pass(Transformer& model, const Batch& batch, real label_smoothing, double* loss = nullptr);

// One sentence pair's share of the study (`heads --per-sentence`): every head's gate gradient at each of its
// query tokens, ∂L/∂ξ_{h,t}. The loss is a sum over the pairs and no pair's forward reads another's, so these
// are the gradients of this pair's own loss, whatever batch it was in. Its importances at the three
// granularities follow: token Σ_t |g_t| / N_q, sentence |Σ_t g_t|, signed Σ_t g_t.
struct SentenceHeads {
    const Example* example = nullptr;  // the pair: its tokens and its line in the files
    std::vector<HeadId> heads;         // E layers, then D, then A, as HeadReport
    // [head][t]: queries t are the source tokens + EOS for E, BOS + the target tokens for D and A
    std::vector<std::vector<double>> gate_grad;
};

// Which token ids are punctuation, per side (the keys' tokens: source for E and A, target for D): a piece
// is punctuation when, without SentencePiece's word-start mark "▁", it is not empty and every byte of it is
// ASCII punctuation (".", ",", "?!", ...). For the attention statistics' punctuation share.
struct PunctuationIds {
    std::vector<bool> source, target;  // by id; empty: no id counts
};
PunctuationIds punctuation_ids(const TokenizerPair& tokenizers);

// Attention by relative offset j − i (self-attention): offsets −kOffsetReach … kOffsetReach, the two ends
// pooling every offset beyond them.
constexpr int kOffsetReach = 8;

struct HeadStudyOptions {
    std::int64_t batch_tokens = 4096;   // B · max(S, T) per batch; batches are cut in file order
    Granularity granularity = Granularity::token;
    bool smoothed = false;              // the label-smoothed loss instead of the plain NLL
    double label_smoothing = 0.1;       // ε when smoothed
    bool normalise = true;              // divide importances by their L2 norm over each (kind, layer)
    PunctuationIds punctuation;         // for punctuation_share; empty: it stays 0
    // Voita et al.'s rare-token measure counts only sentences whose rarest token is not among this many
    // most frequent token types of the studied side (their 500, in a 60k-type corpus); 0: every sentence.
    std::int64_t rare_outside_top = 0;
    // When set, called once per pair, in file order, as the batches are done (heads --per-sentence).
    std::function<void(const SentenceHeads&)> per_sentence;
};

struct HeadStats {
    HeadId id;
    double importance = 0;      // normalised per (kind, layer) unless the options say raw
    double importance_raw = 0;  // before normalisation
    // The same sum without the absolute value: Σ ∂L/∂ξ_h over every query token, divided by importance_raw's
    // N. Its sign says which way opening the head a little further would move the loss (negative: down).
    // In training logs, the signed ⟨W_o^h, ∂L/∂W_o^h⟩_F.
    double importance_signed_raw = 0;
    bool masked = false;        // the head's gate was 0: importance is then |∂L/∂ξ_h| at ξ_h = 0, what
                                // opening the closed head would change to first order, not what it contributes
    // ‖∂L/∂·‖₂ of the head's own slices: its D rows of W_q, W_k, W_v (and biases) in the fused (3C, C)
    // in-projection, its D columns of the out-projection W_o.
    double grad_wq = 0, grad_wk = 0, grad_wv = 0, grad_wo = 0, grad_bq = 0, grad_bk = 0, grad_bv = 0;
    // Over non-pad queries (all means are per query):
    double entropy = 0;             // −Σ_j a_ij ln a_ij, nats
    double entropy_normalised = 0;  // entropy / ln(visible keys), over queries that see at least 2 keys
    double confidence = 0;          // max_j a_ij over keys that are not EOS (Voita et al. 2019)
    double eos_share = 0;           // Σ over EOS keys of a_ij (E, A: the source's EOS; D: always 0)
    double bos_share = 0;           // Σ over BOS keys (D: the decoder's first input; E, A: 0)
    // Self-attention only (E, D): Σ_j a_ij |i − j|; the most frequent offset argmax_j a_ij − i and the share
    // of queries whose argmax has it (≥ 0.9: a positional head, Voita et al.'s rule).
    double mean_distance = 0;
    int argmax_offset = 0;
    double argmax_offset_share = 0;
    // ‖Σ_j a_ij v_j W_o^h‖: the norm of what the head adds to the query's output (Kobayashi et al. 2020),
    // mean over queries; a head with large weights on small vectors contributes little.
    double value_norm = 0;
    // What the keys hold, over the whole data (study_heads; 0 in training logs). Per query, means over queries:
    double punctuation_share = 0;   // Σ over punctuation keys (options.punctuation) of a_ij
    // A sentence's rarest keys hold its least frequent token, counted over the studied pairs' side the keys
    // come from (EOS and BOS are never rare; ties all count; the decoder's among the keys it sees). Over the
    // queries that have such a key (and whose sentence passes options.rare_outside_top):
    double rare_share = 0;          // Σ over the rarest keys of a_ij
    double rare_argmax_share = 0;   // share of queries whose largest weight is on a rarest key (Voita et al. 2019)
    double rare_chance = 0;         // what uniform attention would give both: mean of rarest keys / visible keys
    std::int64_t rare_queries = 0;  // the queries these are over
    // Self-attention (E, D): mean over queries of Σ_{j − i = k} a_ij for k = −kOffsetReach … kOffsetReach at
    // index k + kOffsetReach, the ends pooling the offsets beyond; empty for A.
    std::vector<double> attention_by_offset;
};

struct HeadReport {
    std::vector<HeadStats> heads;     // E layers, then D, then A; heads in order within a layer
    std::int64_t pairs = 0, batches = 0;
    std::int64_t src_tokens = 0, tgt_tokens = 0;  // N_q of E, and of D and A
    double loss = 0;                  // the loss the gradients are of, summed over target tokens
    HeadStudyOptions options;
};

// The pairs a study reads, encoded as the model reads them (too long ones left out and counted): a
// decoder-only model reads the target side alone, BOS + tokens, as in training (give it the text as both
// sides). Throws std::invalid_argument when no pair is left, with the corpus statistics.
EncodedCorpus study_pairs(const Transformer& model, const TokenizerPair& tokenizers, const ParallelText& text);

// Runs the model over the pairs (dropout off), accumulating over all batches. The model's gates are left
// as they were (masked heads stay masked and are measured as such).
HeadReport study_heads(Transformer& model, const std::vector<Example>& examples, const HeadStudyOptions& options);

// During training (`train --log-heads-every N`), at no extra pass: from the gradients that a training step's
// backward left, before clipping, and the attention probes its forward showed to `probes`. Importance is
// the batch form through the identity ∂L/∂ξ_h = ⟨W_o^h, ∂L/∂W_o^h⟩_F, of the step's own loss (label-smoothed,
// mean over the batch's target tokens, dropout on); importance_raw is left unnormalised and `importance`
// normalised per layer. Gradient norms and attention statistics as in study_heads.
std::vector<HeadStats> measure_training_step(Transformer& model, const Batch& batch, const AttentionProbes& probes);

TF_NAMESPACE_END
