// What the cases that train end to end share: the copy task's training set-up (learns, reference mode, the
// attention variants), reading a run's training losses back, and comparing two runs' weights.
//
// copy_task_config: 1+1 layers, C 32, H 2, F 64, word tokens, batches of 100 sequences of 10 + EOS,
// Noam schedule with lr 1 and warmup 200, no dropout, no validation, 2 threads, a log line every 100 steps
// and one checkpoint at the end. A case sets what it varies on the result.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tapeformer/run/train_settings.h"
#include "tapeformer/safetensors.h"
#include "helpers.h"

namespace tf_test {

inline tf::TrainConfig copy_task_config(const std::string& copy_dir, const std::string& out_dir, std::int64_t steps) {
    tf::TrainConfig c;
    c.data.train_src = copy_dir + "/train.src";
    c.data.train_tgt = copy_dir + "/train.tgt";
    c.data.tokenizer = tf::TokenizerKind::word;
    c.data.vocab_size = 0;
    c.data.max_len = 12;
    c.data.batch_tokens = 1100;  // 100 sequences of 10 + EOS
    c.model.d_model = 32;
    c.model.heads = 2;
    c.model.ffn = 64;
    c.model.enc_layers = c.model.dec_layers = 1;
    c.model.tie = tf::Tying::All;
    c.model.dropout = c.model.attention_dropout = c.model.activation_dropout = 0;
    c.optim.schedule.kind = tf::ScheduleKind::Noam;
    c.optim.schedule.lr = 1.0;
    c.optim.schedule.warmup = 200;
    c.max_steps = steps;
    c.log_every = 100;
    c.checkpoint_every = steps;
    c.valid_every = 0;
    c.valid_bleu = false;
    c.threads = 2;
    c.out_dir = out_dir;
    return c;
}

// The "loss" of each "train" line of DIR/metrics.jsonl, in order.
inline std::vector<double> train_losses(const std::string& dir) {
    std::vector<double> losses;
    for (const std::string& line : split_lines(read_all(dir + "/metrics.jsonl"))) {
        const nlohmann::json m = nlohmann::json::parse(line);
        if (m.at("type") == "train") losses.push_back(m.at("loss").get<double>());
    }
    return losses;
}

// Two weights files of two runs hold the same tensors and metadata, but for the run id each run has.
inline bool same_weights_file(const std::string& a, const std::string& b) {
    tf::SafetensorsFile x = tf::load_safetensors(a), y = tf::load_safetensors(b);
    for (auto* f : {&x, &y})
        for (const char* key : {"tapeformer.run_id", tf::kSafetensorsChecksumKey}) f->metadata.erase(key);
    if (x.metadata != y.metadata || x.tensors.size() != y.tensors.size()) return false;
    for (const auto& [name, entry] : x.tensors)
        if (!y.tensors.count(name) || y.tensors.at(name).shape != entry.shape || y.tensors.at(name).values != entry.values)
            return false;
    return true;
}

}  // namespace tf_test
