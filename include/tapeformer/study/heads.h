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

TF_NAMESPACE_BEGIN

enum class HeadKind { E, D, A };

struct HeadId {
    HeadKind kind = HeadKind::E;
    int layer = 0, head = 0;
    std::string str() const;  // "E:0:1"
    bool operator==(const HeadId& o) const { return kind == o.kind && layer == o.layer && head == o.head; }
};

char to_char(HeadKind kind);             // 'E', 'D', 'A'
const char* describe(HeadKind kind);     // "encoder self-attention", ...

// "E:0:1,A:2:3" -> heads. Throws std::invalid_argument naming the item and what is wrong (a malformed
// spec, or a kind, layer or head that `config`'s model lacks).
std::vector<HeadId> parse_head_list(const std::string& spec, const ModelConfig& config);

// "E,A" -> kinds. Throws std::invalid_argument naming the item when it is not E, D or A.
std::vector<HeadKind> parse_head_kinds(const std::string& spec);

// The attention module of a kind and layer.
MultiHeadAttention& attention_of(Transformer& model, HeadKind kind, int layer);

// Sets each listed head's gate to 0 (and every other gate to 1). Masking every head of a layer leaves
// that attention's output equal to its out-projection bias: the layer then passes no information
// between positions, which is a valid (if drastic) experiment, not an error.
void mask_heads(Transformer& model, const std::vector<HeadId>& heads);

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

struct HeadStudyOptions {
    std::int64_t batch_tokens = 4096;   // B · max(S, T) per batch; batches are cut in file order
    Granularity granularity = Granularity::token;
    bool smoothed = false;              // the label-smoothed loss instead of the plain NLL
    double label_smoothing = 0.1;       // ε when smoothed
    bool normalise = true;              // divide importances by their L2 norm over each (kind, layer)
};

struct HeadStats {
    HeadId id;
    double importance = 0;      // normalised per (kind, layer) unless the options say raw
    double importance_raw = 0;  // before normalisation
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
};

struct HeadReport {
    std::vector<HeadStats> heads;     // E layers, then D, then A; heads in order within a layer
    std::int64_t pairs = 0, batches = 0;
    std::int64_t src_tokens = 0, tgt_tokens = 0;  // N_q of E, and of D and A
    double loss = 0;                  // the loss the gradients are of, summed over target tokens
    HeadStudyOptions options;
};

// Runs the model over the pairs (dropout off), accumulating over all batches. The model's gates are left
// as they were (masked heads stay masked and are measured as such).
HeadReport study_heads(Transformer& model, const std::vector<Example>& examples, const HeadStudyOptions& options);

// During training (`train --log-heads-every N`), at no extra pass: from the gradients that a training step's
// backward left, before clipping, and the attention probes its forward showed to `probes`. Importance is
// the batch form through the identity ∂L/∂ξ_h = ⟨W_o^h, ∂L/∂W_o^h⟩_F, of the step's own loss (label-smoothed,
// mean over the batch's target tokens, dropout on); importance_raw is left unnormalised and `importance`
// normalised per layer. Gradient norms and attention statistics as in study_heads.
std::vector<HeadStats> measure_training_step(Transformer& model, const Batch& batch, const AttentionProbes& probes);

// The line pairs with both sides non-empty, trimmed. Throws std::invalid_argument starting with `what` when
// the counts differ or no pair is left.
std::pair<std::vector<std::string>, std::vector<std::string>> scorable_pairs(const std::vector<std::string>& src,
                                                                             const std::vector<std::string>& ref,
                                                                             const char* what);

// ---- ablation: what each head is worth to translation quality -------------------------------------------

// sacreBLEU's paired bootstrap resampling (`--paired-bs`, Koehn 2004): `samples` resamples of the sentences
// with replacement, the same for both systems; p = (1 + #{resamples whose |BLEU_sys − BLEU_base| minus the
// mean of those differences exceeds the real |difference|}) / (samples + 1). `base` and `system` are
// per-sentence BLEU statistics (corpus_bleu of one line each). The resamples are drawn from tapeformer's
// counter-based generator with `seed`, so p-values equal sacreBLEU's in distribution, not digit for digit.
// Two systems with the same corpus BLEU get p = 1.
double paired_bootstrap_p_value(const std::vector<BleuScore>& base, const std::vector<BleuScore>& system, int samples,
                                std::uint64_t seed);

struct AblationRow {
    std::string what;             // "E:0:1" (that head masked) or "E:0: all but 1" (the others of its layer)
    std::vector<HeadId> masked;
    double bleu = 0, delta = 0;   // BLEU with these heads masked, and minus the unmasked BLEU
    double p_value = 1;
    bool significant = false;     // p < alpha
};

struct AblationReport {
    double base_bleu = 0;
    int samples = 0;
    double alpha = 0.05;
    std::vector<AblationRow> single;       // each head masked alone (Michel et al., table 1)
    std::vector<AblationRow> all_but_one;  // every head of its layer but one masked (Michel et al., table 2)
    int significant_single = 0, significant_all_but_one = 0;
};

// Translates `src_lines` with the unmasked model and with each ablation, scoring each against `ref_lines`
// (same count; empty pairs skipped). The model's gates are restored afterwards. `progress` gets (systems
// done, systems in all).
AblationReport ablate_heads(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src_lines,
                            const std::vector<std::string>& ref_lines, const DecodeOptions& decode,
                            std::int64_t batch_tokens, int samples, double alpha, std::uint64_t seed,
                            const std::function<void(int, int)>& progress = nullptr);

std::string ablation_json(const AblationReport& report);
std::string ablation_table(const AblationReport& report);  // the two tables and "k of N heads significant"

// ---- pruning: quality against the fraction of heads masked ------------------------------------------------

enum class PruneOrder { importance, ablation, entropy, random };
PruneOrder parse_prune_order(const std::string& name);  // throws, listing the valid names
const char* to_string(PruneOrder order);

struct PruneOptions {
    PruneOrder order = PruneOrder::importance;
    double step = 0.1;                 // fraction of the prunable heads masked per step
    std::vector<HeadKind> kinds;       // the heads that may be pruned (empty: E, D and A, ranked jointly)
    bool recompute = false;            // rank again (with the heads masked so far) after every step
    bool keep_one_per_layer = false;   // never mask the last unmasked head of an attention
    double stop_below = 0;             // stop once BLEU < stop_below · the unpruned BLEU (0: go to the end)
    std::uint64_t seed = 1;            // order random
    HeadStudyOptions study;            // how importance is measured (order importance and entropy)
    DecodeOptions decode;
    std::int64_t batch_tokens = 4096;  // for translation and the NLL
};

struct PrunePoint {
    double fraction = 0;           // masked / prunable heads
    std::vector<HeadId> masked;    // in the order they were masked
    double bleu = 0, nll = 0;      // on the evaluation pairs (NLL: mean per target token, teacher-forced)
};

// Ranks the heads on the importance pairs rank_src/rank_ref (not read by order random),
// least important first — importance: normalised importance; ablation: the BLEU lost when that head alone
// is masked; entropy: the highest normalised attention entropy first; random: a seeded shuffle — and
// masks them in steps, scoring BLEU and NLL on the evaluation pairs after each step. The first point is
// the unpruned model. The model's gates are restored afterwards.
std::vector<PrunePoint> prune_heads(Transformer& model, const TokenizerPair& tokenizers,
                                    const std::vector<std::string>& eval_src, const std::vector<std::string>& eval_ref,
                                    const std::vector<std::string>& rank_src, const std::vector<std::string>& rank_ref,
                                    const PruneOptions& options,
                                    const std::function<void(const PrunePoint&)>& on_point = nullptr);

std::string heads_json(const HeadReport& report);   // one object: settings, totals, "heads": [...]
std::string heads_csv(const HeadReport& report);    // one row per head, a header line first
std::string heads_tables(const HeadReport& report); // per kind: layers × heads of importance, then entropy

// One cell of a layers × heads table: a head and its value as text ("0.1234", "closed").
struct HeadCell {
    HeadId id;
    std::string text;
};
// The layers × heads table of `kind` among `cells`, as text: "K = <describe(kind)>: <what>", a header
// "  layer   head 0   head 1 ...", then per layer its cells right-aligned in 9 columns, in the order given.
// Empty when no cell is of `kind`. (heads_tables and heads_l0.h's l0_table print theirs with it.)
std::string layer_head_table(HeadKind kind, const std::string& what, const std::vector<HeadCell>& cells);

TF_NAMESPACE_END
