// The training loop: read a parallel corpus, build or load the tokenizer, batch by token budget, train
// with label-smoothed cross-entropy, validate, checkpoint, resume exactly.
//
//   for each batch:  logits = model(src, dec_in)            forward, recorded on the tape
//                    loss   = CE_ε(logits, target)          label-smoothed, pad ignored
//                    zero_grad; backward(loss)              the tape in reverse
//                    clip ‖g‖ to max_norm; optimizer.step(lr(step))
//
// The CLI (`tapeformer train`) only fills a TrainConfig (train_settings.h: the settings, their checks and
// run.json) and calls train().
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>

#include "tapeformer/run/train_settings.h"

TF_NAMESPACE_BEGIN

struct TrainResult {
    std::int64_t steps = 0;
    double train_seconds = 0;
    double last_loss = 0;
    double best_valid_bleu = -1;   // −1 when not measured
    double best_valid_loss = -1;
    std::string stop_reason;       // "max steps", "epochs", "time budget", "interrupted"
    bool interrupted = false;      // SIGINT/SIGTERM: a checkpoint was saved, --resume continues
};

// Trains as configured, logging to `log` (a live progress bar when `log` is a terminal's stderr, plain
// lines otherwise). Throws std::runtime_error / std::invalid_argument with one readable line on bad
// input or a non-finite loss; whatever checkpoint was written last stays intact.
TrainResult train(TrainConfig config, std::ostream& log, bool progress_bar);

// Whether `name`, a path relative to a run directory ("model.safetensors", "checkpoints/step-N.safetensors"),
// is one of the files training writes there: the files no other command's output may replace.
bool is_run_file(const std::string& name);

TF_NAMESPACE_END
