// The training loop: read a parallel corpus, build or load the tokenizer, batch by token budget, train
// with label-smoothed cross-entropy, validate, checkpoint, resume exactly.
//
//   for each batch:  logits = model(src, dec_in)            forward, recorded on the tape
//                    loss   = CE_ε(logits, target)          label-smoothed, pad ignored
//                    zero_grad; backward(loss)              the tape in reverse
//                    clip ‖g‖ to max_norm; optimizer.step(lr(step))     one step: train_step.h
//
// The CLI (`tapeformer train`) only fills a TrainConfig (train_settings.h: the settings, their checks and
// run.json) and calls train(), with the step watchers (below) of the studies that look at training from
// above, such as the head log.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tapeformer/run/train_settings.h"

TF_NAMESPACE_BEGIN

// Why a run stopped: the first stopping rule it reached, or a signal.
enum class StopReason { none, max_steps, epochs, time_budget, interrupted };
const char* to_string(StopReason reason);  // the log line's words: "max steps", "epochs", "time budget", "interrupted"

struct TrainResult {
    std::int64_t steps = 0;
    double train_seconds = 0;
    double last_loss = 0;
    double best_valid_bleu = -1;   // −1 when not measured
    double best_valid_loss = -1;
    StopReason stop_reason = StopReason::none;
    // SIGINT/SIGTERM: a checkpoint was saved once training had started, --resume continues.
    bool interrupted() const { return stop_reason == StopReason::interrupted; }
};

struct Batch;  // data/batch.h

// What a watcher is shown of one step it watches, after the backward and before clipping: the parameters'
// gradients are those of this batch's loss (the mean over its target tokens, label-smoothed, dropout on),
// the weights those its forward used.
struct WatchedStep {
    std::int64_t step;           // 1-based, as in metrics.jsonl
    std::int64_t epoch;          // 1-based, as in metrics.jsonl
    const Batch& batch;
    const LossReport& report;    // the step's loss, nll and target tokens
    Transformer& model;
};

// A study that looks at some training steps from above the loop, which knows it only as this (the head
// log of `train --log-heads-every`, HeadLogWatcher, is one). Before each step's forward the loop asks
// every watcher whether it watches that step; one that does listens to the forward's probes (its observer
// goes into Pass::observer) and is shown the step after the backward. A watcher changes no number the
// training computes.
class StepWatcher {
public:
    virtual ~StepWatcher() = default;
    // Once, after the run has read and checked its inputs, when it starts writing to its directory: the
    // run's settings (on --resume its own, from run.json), out_dir among them.
    virtual void start(const TrainConfig& run) = 0;
    // Before step `step`'s forward (1-based): the observer that listens to it, or nullptr when this step
    // is not watched.
    virtual ForwardObserver* observe(std::int64_t step) = 0;
    // After the backward of a step that observe() watched.
    virtual void after_backward(const WatchedStep& step) = 0;
};

// Trains as configured, logging to `log` (a live progress bar when `log` is a terminal's stderr, plain
// lines otherwise), and showing the steps they ask for to `watchers` (not owned; none by default).
// Started as the ranks of an MPI job (distributed.h), every rank calls it and they train one model on
// the micro-batches of each global batch (train_step.h); rank 0 alone logs, validates, runs the watchers
// and writes the run's files. A rank that another's bad input stopped throws AnotherRankFailed.
// Throws std::runtime_error / std::invalid_argument with one readable line on bad input or a non-finite
// loss; whatever checkpoint was written last stays intact.
TrainResult train(TrainConfig config, std::ostream& log, bool progress_bar,
                  const std::vector<StepWatcher*>& watchers = {});

// Whether `name`, a path relative to a run directory ("model.safetensors", "checkpoints/step-N.safetensors"),
// is one of the files training writes there: the files no other command's output may replace.
bool is_run_file(const std::string& name);

TF_NAMESPACE_END
