// Do heads specialise? `heads similarity` measures, per attention (kind and layer), how alike its heads are —
// in what they attend to, in the gradients that reach them, and in their weights — within one model and
// between models (checkpoints of one run, or runs with other seeds). Heads are named as in heads.h.
//
// For heads i, j of one attention:
//   attention maps   JS_ij = mean over non-pad queries q of JS(a_i(q), a_j(q)) over the keys q sees, where
//                    JS(p, r) = ½ KL(p‖m) + ½ KL(r‖m), m = (p + r)/2, in nats: 0 iff equal, at most ln 2
//   gate gradients   r_ij = Pearson correlation of the series g_h(b, t) = ∂L/∂ξ_{b,h,t} over the non-pad
//                    queries (L the token-summed NLL). Every head of a layer gets the same upstream ∂L/∂y, so
//                    raw weight-gradient slices differ mostly by each head's basis; ξ's gradient does not
//   subspaces        overlap_ij = ‖U_iᵀ U_j‖²_F / D, U_h an orthonormal basis (C, D) of the row space of W_q^h,
//                    W_k^h or W_v^h (D, C), or of the column space of W_o^h (C, D): 1 for the same subspace,
//                    0 for orthogonal ones, D/C on average for random ones (the chance level)
//   basis-free       cos_ij = ⟨A_i, A_j⟩_F / (‖A_i‖_F ‖A_j‖_F) of W_QK^h = W_q^hᵀ W_k^h (C, C), the bilinear form
//                    of the scores (x_q W_QK x_kᵀ/√D, biases apart), and of W_OV^h = W_o^h W_v^h (C, C), what the
//                    head writes for what it reads. W_q^h → R W_q^h, W_k^h → R⁻ᵀ W_k^h leaves W_QK unchanged,
//                    so only these two products say whether heads compute the same thing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/data/batch.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

// ½ KL(p‖m) + ½ KL(q‖m), m = (p + q)/2, over n outcomes, in nats. Symmetric, in [0, ln 2].
double jensen_shannon(const real* p, const real* q, std::int64_t n);

// An orthonormal basis, as rows, of the span of the r rows (r, C) of `rows`, by modified Gram–Schmidt in
// double precision; a row whose remainder is below 1e-9 of its own norm adds nothing. Returns (rank, C).
std::vector<double> orthonormal_rows(const std::vector<double>& rows, std::int64_t C);

// ‖U Vᵀ‖²_F / min(rank U, rank V) for orthonormal row bases U (ru, C) and V (rv, C): the mean squared cosine
// of the principal angles between the two subspaces. 1 when one contains the other, 0 when orthogonal; NaN
// when either is {0}.
double subspace_overlap(const std::vector<double>& U, const std::vector<double>& V, std::int64_t C);

// Pairwise measures between the H heads of one attention, or between head i of one model (row) and head
// j of another (column). Each matrix is (H, H), row-major; NaN where a measure is undefined (a head whose
// gate gradient is constant, a zero weight) or not measured (the data measures of two models whose
// tokenizers split the sample differently).
struct LayerSimilarity {
    HeadKind kind = HeadKind::E;
    int layer = 0;
    std::int64_t queries = 0;                            // non-pad queries the data measures are over
    std::vector<double> js;                              // attention maps, Jensen–Shannon, nats
    std::vector<double> grad_corr;                       // Pearson r of the per-token gate gradients
    std::vector<double> overlap_q, overlap_k, overlap_v, overlap_o;  // subspaces, ‖U_iᵀU_j‖²_F / D
    std::vector<double> cos_qk, cos_ov;                  // W_QK^h and W_OV^h, Frobenius cosine
};

struct SimilarityTable {
    std::string name;                    // the model ("runs/toy"), or "runs/a vs runs/b" across models
    std::vector<LayerSimilarity> layers;  // E layers, then D, then A
};

struct SimilarityOptions {
    std::int64_t batch_tokens = 4096;  // B · max(S, T) per batch; batches are cut in file order
};

struct SimilarityReport {
    std::vector<SimilarityTable> models;  // one per model: heads of an attention against each other
    std::vector<SimilarityTable> across;  // model 0 (rows) against model k (columns), k = 1, 2, ...
    bool across_data = false;             // the data measures across models were taken (same tokens)
    std::int64_t pairs = 0;               // sentence pairs of the sample (of model 0)
    std::int64_t C = 0, H = 0, D = 0;
    double chance_overlap() const { return C ? double(D) / double(C) : 0; }  // D/C
};

// Measures every attention of every model: the weights directly, the data measures over `examples[k]`
// (the sample encoded with model k's tokenizers) in one teacher-forced pass per batch, dropout off. All
// models must have the same shape (d_model, heads, layers): throws std::invalid_argument naming the first
// that differs. The data measures across models are taken only where every model's examples are equal.
// The models' gates are left as they were; their parameter gradients are overwritten.
SimilarityReport head_similarity(const std::vector<Transformer*>& models, const std::vector<std::string>& names,
                                 const std::vector<std::vector<Example>>& examples, const SimilarityOptions& options);

// The mean of a matrix's entries off the diagonal (i ≠ j), or on it; NaN entries are skipped.
double mean_off_diagonal(const std::vector<double>& m, std::int64_t H);
double mean_diagonal(const std::vector<double>& m, std::int64_t H);

std::string similarity_json(const SimilarityReport& report);    // every matrix, with per-layer means
std::string similarity_tables(const SimilarityReport& report);  // per model, then per pair of models

TF_NAMESPACE_END
