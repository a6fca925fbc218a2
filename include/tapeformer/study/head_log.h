// The head log of `train --log-heads-every N`: a step watcher (run/train.h) that listens to every N-th
// training step's attention probes and, after its backward, appends one line to DIR/heads.jsonl of what
// measure_training_step (heads.h) reads off that step: per-head batch importance, gradient norms and
// attention entropy, at no extra pass. The training loop knows it only as a StepWatcher.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

#include "tapeformer/run/train.h"
#include "tapeformer/study/heads.h"

TF_NAMESPACE_BEGIN

class HeadLogWatcher : public StepWatcher {
public:
    // Idle unless the run's log_heads_every (its own on --resume, from run.json) is above 0; then opens
    // DIR/heads.jsonl to append (a resumed run has cut it back to its checkpoint's step). Throws
    // std::runtime_error naming the file when it cannot be written.
    void start(const TrainConfig& run) override;
    ForwardObserver* observe(std::int64_t step) override;  // every log_heads_every-th step
    void after_backward(const WatchedStep& step) override;  // writes its line; throws when the write fails

private:
    std::int64_t every_ = 0;  // the run's log_heads_every; 0: idle
    std::string dir_;
    std::ofstream out_;       // DIR/heads.jsonl
    AttentionProbes probes_;  // the watched step's attention weights, for the entropy; emptied after it
};

TF_NAMESPACE_END
