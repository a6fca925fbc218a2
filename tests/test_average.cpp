// tapeformer average (average.h): the mean of a run's checkpoints, element by element, written as a model
// directory; checkpoints of different runs are refused, and --out never replaces anything but an average.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tapeformer/run/average.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/optim.h"
#include "tapeformer/safetensors.h"
#include "helpers.h"

namespace fs = std::filesystem;
using namespace tf_test;

namespace {

const std::vector<std::string> kSources = {"the dog sees a cat", "a big house", "the cat runs"};
const std::vector<std::string> kTargets = {"lo karo videt la kata", "la grando domo", "la kata kurat"};

tf::ModelConfig tiny_config(std::int64_t vocab, std::int64_t ffn = 16) {
    return tf_test::tiny_model_config(vocab, 8, 2, ffn, 1, 1, 16);  // V, C, H, F, layers, positions
}

// A run directory as training leaves it: the tokenizer and checkpoints of the given steps, each step's model
// initialised from another seed (as different as checkpoints get).
// With `run_id`, the checkpoints carry it, as training writes them; without, they are of a version before run ids.
tf::TokenizerPair write_run(const std::string& dir, const std::vector<std::int64_t>& steps, std::int64_t ffn = 16,
                            const std::string& run_id = "") {
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    options.joint = true;
    const tf::TokenizerPair tok = tf::TokenizerPair::train(kSources, kTargets, options);
    fs::create_directories(fs::path(dir) / "checkpoints");
    tok.save(dir);
    for (std::int64_t step : steps) {
        tf::Transformer model(tiny_config(tok.source->vocab_size(), ffn), /*seed=*/static_cast<std::uint64_t>(step));
        tf::Adam adam(model.parameters());
        tf::TrainState state;
        state.step = step;
        tf::save_training_checkpoint((fs::path(dir) / tf::checkpoint_name(step)).string(), model, adam, state,
                                     tf::tokenizer_hash(tok), nullptr, tf::RunStamp{run_id, -1, ""});
    }
    write_all(fs::path(dir) / "run.json", "{}");  // a training run's directory, which --out must never be
    return tok;
}

int run_cli(const std::string& args, const std::string& err) {
    const std::string command = shell_quote(TF_CLI) + " --threads 1 " + args + " >/dev/null 2>" + shell_quote(err);
    const int raw = std::system(command.c_str());
    return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

}  // namespace

TEST_CASE("average: the mean of checkpoints, element by element, rounded once from double", "[average]") {
    TempDir tmp;
    const std::string run = tmp / "run";
    write_run(run, {10, 20, 30});
    const std::vector<std::string> paths = tf::newest_checkpoints(run, 2);
    REQUIRE(paths == std::vector<std::string>{run + "/" + tf::checkpoint_name(20), run + "/" + tf::checkpoint_name(30)});

    const tf::ModelBundle mean = tf::average_models(paths);
    const tf::ModelBundle a = tf::load_model_dir(paths[0]), b = tf::load_model_dir(paths[1]);
    const tf::ParamList pm = mean.model->parameters(), pa = a.model->parameters(), pb = b.model->parameters();
    REQUIRE(pm.size() == pa.size());
    std::int64_t compared = 0, differ_from_a = 0;
    for (std::size_t i = 0; i < pm.size(); ++i) {
        INFO(pm[i].name);
        for (std::int64_t j = 0; j < pm[i].tensor.numel(); ++j) {
            const float x = pa[i].tensor.data()[j], y = pb[i].tensor.data()[j];
            CHECK(pm[i].tensor.data()[j] == static_cast<float>((double(x) + double(y)) / 2));
            differ_from_a += x != y;
            ++compared;
        }
    }
    CHECK(compared > 1000);
    CHECK(differ_from_a > compared / 2);  // the two really differ: the mean is not one of them

    CHECK_THROWS_WITH(tf::newest_checkpoints(run, 4), Catch::Contains("holds 3 checkpoints"));
    SECTION("another configuration is refused, naming the checkpoint") {
        write_run(tmp / "other", {40}, /*ffn=*/32);
        const std::string other = tmp / ("other/" + tf::checkpoint_name(40));
        CHECK_THROWS_WITH(tf::average_models({paths[0], other}), Catch::Contains(other) && Catch::Contains("configuration"));
    }
}

TEST_CASE("average: the CLI writes a model directory that translate reads, and never writes over a run or a user's files",
          "[average][cli]") {
    TempDir tmp;
    const std::string run = tmp / "run", err = tmp / "err";
    write_run(run, {10, 20, 30});
    const std::string out = tmp / "avg";
    REQUIRE(run_cli("average --model " + shell_quote(run) + " --last 3 --out " + shell_quote(out), err) == 0);
    CHECK(fs::exists(fs::path(out) / "model.safetensors"));
    CHECK(run_cli("translate --model " + shell_quote(out) + " --input " + shell_quote(write_file(tmp, "in", "a big house\n")),
                  err) == 0);

    auto refused = [&](const std::string& args, const std::string& what) {
        INFO(args);
        CHECK(run_cli(args, err) == 1);
        const std::string e = read_all(err);
        INFO(e);
        CHECK(std::count(e.begin(), e.end(), '\n') == 1);
        CHECK_THAT(e, Catch::Contains(what));
    };
    const std::string model = " --model " + shell_quote(run);
    refused("average" + model + " --last 3 --out " + shell_quote(out), "--force");  // an earlier average: only with --force
    CHECK(run_cli("average" + model + " --last 2 --out " + shell_quote(out) + " --force", err) == 0);
    refused("average" + model + " --out " + shell_quote(run) + " --force", "holds a training run");
    fs::create_directories(tmp / "mine");
    write_all(tmp / "mine/notes.txt", "my notes\n");
    refused("average" + model + " --last 2 --out " + shell_quote(tmp / "mine") + " --force", "left alone");
    CHECK(read_all(tmp / "mine/notes.txt") == "my notes\n");
    refused("average" + model + " --last 9 --out " + shell_quote(tmp / "new"), "holds 3 checkpoints");
    CHECK_FALSE(fs::exists(tmp / "new"));
    refused("average --out " + shell_quote(tmp / "new"), "--model");
}

// ---- a run's files belong to that run (issue 26, section 3) -------------------------------------------------

TEST_CASE("average: checkpoints of different runs with the same shapes are refused unless --mix-runs names the mix",
          "[average]") {
    TempDir tmp;
    const std::string a = tmp / "a", b = tmp / "b", old_a = tmp / "old_a", old_b = tmp / "old_b";
    write_run(a, {10, 20}, 16, "aaaa");
    write_run(b, {30}, 16, "bbbb");
    const std::string a10 = a + "/" + tf::checkpoint_name(10), a20 = a + "/" + tf::checkpoint_name(20);
    const std::string b30 = b + "/" + tf::checkpoint_name(30);
    CHECK(tf::average_models({a10, a20}).stamp.run_id == "aaaa");  // one run: the mean is of that run
    CHECK_THROWS_WITH(tf::average_models({a10, b30}),
                      Catch::Contains(b30) && Catch::Contains("run bbbb") && Catch::Contains("run aaaa") && Catch::Contains("--mix-runs"));
    const tf::ModelBundle mixed = tf::average_models({a10, b30}, /*mix_runs=*/true);
    CHECK(mixed.stamp.run_id.empty());  // of no one run
    CHECK(mixed.stamp.step == -1);

    // Files written before run ids: one run directory is one run; two are two.
    write_run(old_a, {10, 20});
    write_run(old_b, {30});
    CHECK_NOTHROW(tf::average_models({old_a + "/" + tf::checkpoint_name(10), old_a + "/" + tf::checkpoint_name(20)}));
    CHECK_THROWS_WITH(tf::average_models({old_a + "/" + tf::checkpoint_name(10), old_b + "/" + tf::checkpoint_name(30)}),
                      Catch::Contains("no run id") && Catch::Contains("--mix-runs"));
    CHECK_THROWS_WITH(tf::average_models({a10, old_b + "/" + tf::checkpoint_name(30)}), Catch::Contains("--mix-runs"));

    // The CLI: refused with one line naming the flag; with it, written.
    const std::string err = tmp / "err", out = tmp / "avg";
    CHECK(run_cli("average --checkpoints " + shell_quote(a10) + " " + shell_quote(b30) + " --out " + shell_quote(out), err) == 1);
    CHECK_THAT(read_all(err), Catch::Contains("--mix-runs"));
    CHECK_FALSE(fs::exists(out));
    CHECK(run_cli("average --mix-runs --checkpoints " + shell_quote(a10) + " " + shell_quote(b30) + " --out " + shell_quote(out), err) == 0);
    CHECK(tf::load_safetensors(out + "/model.safetensors").metadata.count("tapeformer.run_id") == 0);
}

TEST_CASE("average: the same weights given twice (one file, a copy, a symlink) are refused: they would count twice",
          "[average]") {
    TempDir tmp;
    const std::string a = tmp / "a", copy = tmp / "copy";
    write_run(a, {10, 20}, 16, "aaaa");
    const std::string a10 = a + "/" + tf::checkpoint_name(10), a20 = a + "/" + tf::checkpoint_name(20);
    CHECK_THROWS_WITH(tf::average_models({a10, a20, a10}), Catch::Contains("the same file as " + a10) && Catch::Contains("count twice"));
    fs::create_symlink(a10, tmp / "link.safetensors");
    fs::create_directories(tmp / "links/checkpoints");
    fs::create_symlink(a10, tmp / ("links/" + tf::checkpoint_name(10)));
    fs::copy_file(fs::path(a) / "vocab.txt", tmp / "links/vocab.txt");  // the run's tokenizer (a word vocabulary)
    CHECK_THROWS_WITH(tf::average_models({a10, tmp / ("links/" + tf::checkpoint_name(10))}), Catch::Contains("the same file"));
    // A copy of a run's checkpoint elsewhere is still that run's step 10.
    write_run(copy, {}, 16, "aaaa");
    fs::copy_file(a10, copy + "/" + tf::checkpoint_name(10));
    CHECK_THROWS_WITH(tf::average_models({a10, copy + "/" + tf::checkpoint_name(10)}),
                      Catch::Contains("the same weights as " + a10) && Catch::Contains("run aaaa, step 10"));
    // Even with --mix-runs.
    CHECK_THROWS_WITH(tf::average_models({a10, a10}, /*mix_runs=*/true), Catch::Contains("count twice"));
}
