// Synthetic sequence tasks for lessons and debugging: a model that learns them shows that attention can
// route information by position. Both are drawn from the counter-based generator of random.h (integer
// arithmetic only, no std:: distributions, whose algorithms differ between standard libraries), so the
// same seed gives the same files byte for byte on every machine.
//   copy     the Annotated Transformer's task: 10 symbols drawn from 1..10, the target equals the source
//   reverse  JoeyNMT's task: integers 0..49, the target is the source reversed; training sequences have
//            1..25 symbols, valid/test ones 1..30, so that a test also measures length generalisation
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

enum class SequenceTask { copy, reverse };

const char* to_string(SequenceTask task);

// What to draw. defaults_for() gives each task's standard sizes; every field may be changed.
struct SequenceTaskOptions {
    SequenceTask task = SequenceTask::reverse;
    std::uint64_t seed = 1;      // same seed, same bytes, on any machine
    int train = 50000;           // pairs in train.{src,tgt}
    int valid = 1000;            // pairs in valid.{src,tgt}
    int test = 1000;             // pairs in test.{src,tgt}
    int symbols = 50;            // symbols are the integers first_symbol .. first_symbol + symbols − 1
    int first_symbol = 0;
    int train_min_len = 1, train_max_len = 25;  // sequence lengths (uniform) in train
    int eval_min_len = 1, eval_max_len = 30;    // and in valid/test

    static SequenceTaskOptions defaults_for(SequenceTask task);
};

struct SequencePair {
    std::string src, tgt;  // symbols separated by single spaces
};

struct SequenceTaskData {
    std::vector<SequencePair> train, valid, test;
};

// Throws std::invalid_argument naming the option when counts or lengths are out of range.
SequenceTaskData generate_sequence_task(const SequenceTaskOptions& opt);

// Generates the task and writes train/valid/test .src/.tgt files (one sequence per line) into `out_dir`,
// creating it if needed; each file is written atomically (io.h). Throws std::runtime_error naming the path.
void write_sequence_task(const std::string& out_dir, const SequenceTaskOptions& opt);

TF_NAMESPACE_END
