// HeadLogWatcher: the step watcher behind `train --log-heads-every`. See head_log.h.
#include "tapeformer/study/head_log.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

TF_NAMESPACE_BEGIN

void HeadLogWatcher::start(const TrainConfig& run) {
    every_ = run.log_heads_every;
    if (!every_) return;
    dir_ = run.out_dir;
    const std::string path = (std::filesystem::path(dir_) / "heads.jsonl").string();
    out_.open(path, std::ios::app);
    if (!out_) throw std::runtime_error("cannot write '" + path + "'");
}

ForwardObserver* HeadLogWatcher::observe(std::int64_t step) {
    if (!every_ || step % every_ != 0) return nullptr;
    probes_ = AttentionProbes();
    return &probes_;
}

// One heads.jsonl line: what measure_training_step (heads.h) reads off this step's gradients and weights.
void HeadLogWatcher::after_backward(const WatchedStep& s) {
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadStats& h : measure_training_step(s.model, s.batch, probes_))
        heads.push_back({{"head", h.id.str()}, {"importance", h.importance}, {"importance_raw", h.importance_raw},
                         {"importance_signed_raw", h.importance_signed_raw}, {"grad_wq", h.grad_wq}, {"grad_wk", h.grad_wk}, {"grad_wv", h.grad_wv}, {"grad_wo", h.grad_wo},
                         {"entropy", h.entropy}, {"entropy_normalised", h.entropy_normalised}});
    probes_ = AttentionProbes();  // the step's attention weights are not kept past it
    const nlohmann::json j = {{"step", s.step}, {"epoch", s.epoch}, {"tokens", s.report.tokens},
                              {"loss", s.report.loss},
                              {"measured", "this training step's batch, dropout and label smoothing on; importance = "
                                           "|<W_o^h, dL/dW_o^h>| of the mean loss, before clipping; importance_signed_raw = "
                                           "<W_o^h, dL/dW_o^h> with its sign"},
                              {"heads", heads}};
    out_ << j.dump() << "\n";
    out_.flush();
    if (!out_) throw std::runtime_error("cannot write '" + dir_ + "/heads.jsonl' (is the disk full?)");
}

TF_NAMESPACE_END
