// The third tier of tests: end to end, a model must learn. The copy task (data/tasks.h, the Annotated
// Transformer's: 10 symbols from 1..10) is generated, a 1+1-layer model is trained for 1000 steps — several
// seconds — and must then copy every one of 500 held-out sequences exactly, by greedy decoding. A bug
// anywhere on the path (data, masks, attention, a gradient, the optimizer, the schedule, decoding) shows up
// here as sequences that come out wrong, even when each part passes its own test.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/run/train.h"
#include "helpers.h"

using namespace tf_test;

TEST_CASE("learns: a 1+1-layer model learns the copy task to exact match in 1000 steps", "[learns][train]") {
    TempDir tmp;
    auto task = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::copy);
    task.valid = task.test = 500;
    tf::write_sequence_task(tmp / "copy", task);

    tf::TrainConfig c;
    c.data.train_src = tmp / "copy/train.src";
    c.data.train_tgt = tmp / "copy/train.tgt";
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
    c.max_steps = 1000;  // exact from 300 (Release) and 700 (sanitizer build, no -march=native) on an AMD EPYC
    c.log_every = 100;
    c.checkpoint_every = 1000;
    c.valid_every = 0;
    c.valid_bleu = false;
    c.threads = 2;
    c.out_dir = tmp / "run";
    std::ostringstream log;
    const int threads = tf::num_threads();
    tf::train(c, log, false);
    tf::set_threads(threads);

    const tf::ModelBundle bundle = tf::load_model_dir(tmp / "run");
    const auto src = split_lines(read_all(tmp / "copy/test.src"));
    const auto hyps = tf::translate_lines(*bundle.model, bundle.tokenizers, src, tf::DecodeOptions{});
    REQUIRE(hyps.size() == 500);
    int exact = 0;
    for (std::size_t i = 0; i < src.size(); ++i) exact += hyps[i] == src[i];
    INFO(log.str());
    CHECK(exact == 500);
}
