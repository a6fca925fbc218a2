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
#include "training.h"
#include "helpers.h"

using namespace tf_test;

TEST_CASE("learns: a 1+1-layer model learns the copy task to exact match in 1000 steps", "[learns][train]") {
    TempDir tmp;
    auto task = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::copy);
    task.valid = task.test = 500;
    tf::write_sequence_task(tmp / "copy", task);

    // Exact from 300 steps (Release) and 700 (sanitizer build, no -march=native) on an AMD EPYC.
    const tf::TrainConfig c = tf_test::copy_task_config(tmp / "copy", tmp / "run", 1000);
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
