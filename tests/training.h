// What the cases that train end to end share: the copy task's training set-up (learns, reference mode, the
// attention variants) and reading a run's training losses back.
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

}  // namespace tf_test
