// One line of DIR/metrics.jsonl, written by the trainer (train.cpp) and read by the report (report.cpp)
// through this one description: the keys, their types and what a reader may find wrong. Private to the
// library (nlohmann::json in its signatures), like json_integer.h.
//
//   {"type":"train","step":100,"epoch":1,"loss":..,"nll":..,"ppl":..,"lr":..,"grad_norm":..,"tok_per_s":..,
//    "tokens_per_step":..,"reduce_ms":..,                                   (reduce_ms: MPI runs of several ranks)
//    "elapsed":..,"layer_grad_norms":[["encoder.layers.0",0.5],...]}      (layer norms at log steps only)
//   {"type":"valid","step":100,"epoch":1,"valid_loss":..,"valid_nll":..,"valid_ppl":..,"valid_bleu":..,
//    "valid_exact":..,"elapsed":..,"weights":"last"|"ema","best":true|false}
//                                               (valid_bleu and valid_exact with --valid-bleu)
//   The validation at step 0, before training, has the loss only: no valid_bleu, valid_exact or best.
//
// JSON has no NaN: a NaN or infinite number is written as null, and a reader refuses the line.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

struct MetricsLine {
    enum class Type { Train, Valid };
    Type type = Type::Train;
    std::int64_t step = 0;
    std::int64_t epoch = 0;    // 1-based; 0 = absent
    // Numbers a line of an older version may lack: NaN when absent.
    double elapsed = kAbsent;  // training seconds so far
    // Type::Train: the mean over the log window.
    double loss = kAbsent, nll = kAbsent, ppl = kAbsent, lr = kAbsent, grad_norm = kAbsent, tok_per_s = kAbsent;
    double tokens_per_step = kAbsent;  // train lines: mean target tokens of an optimizer step (global batch)
    double reduce_ms = kAbsent;        // train lines of an MPI run: mean ms per step in the ranks' gradient exchange
    std::vector<std::pair<std::string, double>> layer_grad_norms;  // [layer, ‖g‖] before clipping; empty = absent
    // Type::Valid
    double valid_loss = kAbsent, valid_nll = kAbsent, valid_ppl = kAbsent;
    std::optional<double> valid_bleu;   // greedy BLEU, when the run scores it
    std::optional<double> valid_exact;  // of the same greedy translations, the fraction equal to their reference
    std::string weights;                // "last" or "ema": the weights scored ("" = absent)
    std::optional<bool> best;           // whether this validation gave the best model so far

    static constexpr double kAbsent = std::numeric_limits<double>::quiet_NaN();
};

// The line as written (its JSON object; dump() gives the bytes of metrics.jsonl, keys in sorted order).
nlohmann::json to_json(const MetricsLine& m);

// What is wrong with a metrics.jsonl object ("" = nothing): "type" is "train" or "valid", "step" a
// non-negative integer, each number a finite number, layer_grad_norms a list of [layer name, norm] pairs.
// Other keys are not read and not checked.
std::string metrics_line_problem(const nlohmann::json& j);
// The line of an object metrics_line_problem finds nothing wrong with.
MetricsLine metrics_line_from_json(const nlohmann::json& j);

TF_NAMESPACE_END
