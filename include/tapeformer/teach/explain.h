// `tapeformer explain`: one sentence walked through the model, stage by stage, in the order a textbook
// tells it — text, tokens, ids, embeddings, × √C, + positional encoding, then per layer the fused Q/K/V
// projection, the split into heads, Q Kᵀ/√D, the mask, the softmax, weights × V, the heads merged, the
// out-projection, residual + LayerNorm, the FFN, ..., the decoder with its causal mask and cross-attention,
// the logits, their softmax and the chosen tokens. Every stage keeps its tensor, its shape in letters and
// the file and function that computes it in the model.
//
// The numbers are the model's own: every stage of the model is a probe of its real forward (Pass::observer,
// nn/module.h), reported by the module that computes it, in the order it computes it; the module walk names
// that module ("where"). explain() re-computes nothing, so the walkthrough cannot drift from the model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

// One invariant checked at a stage ("rows sum to 1: max |Σ − 1| = 2.4e-07").
struct StageCheck {
    std::string what;
    bool passed = false;
};

struct ExplainStage {
    std::string id;       // what --stage matches: "embed", "scale", "positional", "qkv", "q", "k", "v", "scores",
                          // "mask", "softmax", "context", "merge", "out_proj", "add_norm", "ffn_hidden", ...
    std::string part;     // "input", "encoder", "decoder", "output"
    int layer = -1;       // the layer of the encoder or decoder; −1 outside the layers
    std::string block;    // "self-attention", "causal self-attention", "cross-attention", "feed-forward", ""
    std::string title;    // what happens, with the equation
    std::string letters;  // the shape in letters: "(B, S, C)"
    std::string where;    // the module that reports it, as the module walk names it: "encoder.layers.0.self_attn
                          // (MultiHeadAttention)"; the file and function for the stages explain adds itself
    Tensor value;         // the stage's tensor (undefined for text stages); on the tape with backward
    bool per_head = false;              // value is (B, H, rows, cols): --head picks a head
    std::vector<std::string> rows;      // labels of the rows of the excerpt (tokens)
    std::vector<std::string> cols;      // labels of the columns (keys), when they are tokens
    std::string text;                   // for text stages (text, tokens, ids, chosen tokens) and notes
    std::vector<StageCheck> checks;     // the invariants of this stage (--check prints them)
    double grad_norm = -1;              // ‖∂L/∂value‖ after backward; −1: no gradient reached it
};

struct ExplainOptions {
    const std::string* target = nullptr;  // the target sentence; nullptr: the model's greedy translation
    bool backward = false;                // run the loss backward and fill grad_norm
};

struct Explanation {
    std::vector<ExplainStage> stages;        // in forward order
    std::vector<std::int32_t> src, dec_in;   // (B, S) and (B, T) with B = 1
    std::vector<std::int32_t> chosen;        // argmax of each decoder position's logits (T)
    bool target_decoded = false;             // the target is the greedy translation
    Tensor logits;                           // (B, T, V)
    double loss = 0;                         // cross-entropy of the target (no smoothing), with backward
    bool checks_passed = true;               // every stage check passed
};

// Runs the model once in evaluation mode (no dropout), listening to its probes. With options.backward,
// records the pass on the tape, runs the cross-entropy of the target backward, fills each stage's grad_norm
// and sets the model's parameter gradients back to zero. Throws std::invalid_argument for an empty or too
// long sentence.
Explanation explain(Transformer& model, const TokenizerPair& tokenizers, const std::string& sentence,
                    const ExplainOptions& options = {});

// What the printout shows.
struct ExplainView {
    int layer = -1;                   // only this layer's stages (−1: every stage)
    int head = -1;                    // only this head of per-head stages (−1: all)
    std::vector<std::string> stages;  // only stages with these ids (empty: all)
    bool values = true;               // the excerpt of the numbers
    bool checks = false;              // the invariants of each stage
    bool backward = false;            // then the gradient norms in the order backward reaches the stages
    std::int64_t rows = 6;            // rows of each matrix printed (0: all; the mask picture: at least 12)
    std::int64_t cols = 8;            // columns of each matrix printed (0: all; the mask picture: at least 12)
};

// Throws std::invalid_argument naming the flag when view.layer, view.head or a stage id does not exist.
void check_view(const Explanation& explanation, const ModelConfig& config, const ExplainView& view);
std::string format_explanation(const Explanation& explanation, const ExplainView& view);

// Every stage id explain() can produce, in first-seen order (for --help and error messages).
std::vector<std::string> explain_stage_ids();

TF_NAMESPACE_END
