// `tapeformer report`: one self-contained HTML page (inline SVG and CSS; no script, font or request) about a
// training run, for the classroom: how the loss, perplexity, learning rate, BLEU and per-layer gradient
// norms moved; how heads changed (heads.jsonl); the pruning curve; attention maps of a few validation
// sentences; and pictures of the model's fixed parts — positional encoding, masks, the label-smoothed
// target. A section whose data the run lacks stays in the page and says what is missing and how to get it.
#pragma once
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

struct ReportOptions {
    std::string prune_json;         // a `heads prune --json` file ("" = DIR/prune.json when it exists)
    std::string src, tgt;           // sentences for the attention maps and the pictures of masks and
                                    // smoothing ("" = the run's --valid-src/--valid-tgt when readable)
    int sentences = 3;              // how many of them get attention maps
    int head_snapshots = 6;         // heads.jsonl steps drawn as layer × head heatmaps (evenly spaced)
};

// The report's sections, in page order: each is <section id="ID"> in the page, and with data it holds
// one or more <svg> whose ids begin with "chart-ID"; without data, a <p class="missing"> saying why.
struct ReportSection {
    const char* id;
    const char* title;
};
const std::vector<ReportSection>& report_sections();

// The page for the model directory `dir` (what `tapeformer train` wrote). Reads run.json, metrics.jsonl,
// heads.jsonl, the pruning JSON and the model, whichever exist. Throws std::runtime_error naming the path
// when `dir` is not a directory or holds none of run.json, metrics.jsonl and model.safetensors, or when a
// file given in `options` cannot be read. Lines of metrics.jsonl and heads.jsonl that cannot be drawn (not
// JSON, a NaN or a value of the wrong type) are left out and named in the page and, when `problems` is
// given, there too: "PATH:LINE: what is wrong; line left out" (or "PATH is a directory, not a file").
std::string training_report_html(const std::string& dir, const ReportOptions& options = {},
                                 std::vector<std::string>* problems = nullptr);

TF_NAMESPACE_END
