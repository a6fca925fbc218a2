// The training loop end to end, on tiny models and a few hundred lines of the toy corpus: exact resume,
// refusing to overwrite a run, bad input (one readable line each), a loss that blows up, SIGTERM/SIGINT,
// checkpoint rotation, the config.toml round trip and the shape of metrics.jsonl. Each case trains for a
// handful of steps, single-threaded so that runs are bit-reproducible; every run writes to its own
// temporary directory, removed at the end.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tapeformer/model_settings.h"
#include "tapeformer/blas.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/safetensors.h"
#include "tapeformer/run/train.h"
#include "tapeformer/study/head_log.h"
#include "helpers.h"
#include "training.h"

namespace fs = std::filesystem;
using nlohmann::json;

using namespace tf_test;

namespace {

// The first `n` lines of data/toy/<name>.
std::vector<std::string> toy_lines(const std::string& name, std::size_t n) {
    const auto all = split_lines(read_all(std::string(TF_SOURCE_DIR) + "/data/toy/" + name));
    REQUIRE(all.size() >= n);
    return {all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n)};
}

// A small parallel corpus in a temp dir: the first lines of the toy training and validation sets.
struct Corpus {
    TempDir tmp;
    std::string train_src = tmp / "train.src", train_tgt = tmp / "train.tgt";
    std::string valid_src = tmp / "valid.src", valid_tgt = tmp / "valid.tgt";
    explicit Corpus(std::size_t train_lines = 150, std::size_t valid_lines = 40) {
        write_all(train_src, join_lines(toy_lines("train.src", train_lines)));
        write_all(train_tgt, join_lines(toy_lines("train.tgt", train_lines)));
        write_all(valid_src, join_lines(toy_lines("valid.src", valid_lines)));
        write_all(valid_tgt, join_lines(toy_lines("valid.tgt", valid_lines)));
    }
};

// A model small enough to train a step in milliseconds; dropout on, so that resuming must also restore
// the dropout generator. No validation data unless a test adds it.
tf::TrainConfig tiny_config(const Corpus& corpus, const std::string& out_dir) {
    tf::TrainConfig c;
    c.data.train_src = corpus.train_src;
    c.data.train_tgt = corpus.train_tgt;
    c.data.tokenizer = tf::TokenizerKind::word;
    c.data.vocab_size = 0;
    c.data.max_len = 40;
    c.data.batch_tokens = 400;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.ffn = 32;
    c.model.enc_layers = c.model.dec_layers = 1;
    c.model.dropout = c.model.attention_dropout = c.model.activation_dropout = 0.1;
    c.model.max_len = 64;
    c.optim.schedule.kind = tf::ScheduleKind::Noam;
    c.optim.schedule.lr = 2.0;
    c.optim.schedule.warmup = 4;
    c.out_dir = out_dir;
    c.seed = 5;
    c.threads = 1;
    c.max_steps = 4;
    c.log_every = 1;
    c.valid_every = 0;
    c.checkpoint_every = 1000;
    c.keep = 3;
    c.valid_bleu = false;
    return c;
}

// A --resume of the run in `dir`, on one thread: its settings come from the run's run.json; a case sets only
// what a resume may change (the stopping rule, the log and checkpoint intervals).
tf::TrainConfig resume_config(const std::string& dir) {
    tf::TrainConfig r;
    r.out_dir = dir;
    r.resume = true;
    r.threads = 1;
    return r;
}
// The same, up to step `max_steps`.
tf::TrainConfig resume_config(const std::string& dir, std::int64_t max_steps) {
    tf::TrainConfig r = resume_config(dir);
    r.max_steps = max_steps;
    return r;
}

// tiny_config's run, validated on the corpus's validation pairs every `every` steps (0: at each epoch's
// end), with greedy BLEU over the first `bleu_sentences` of them; without BLEU when 0 (the best model is
// then the one of lowest validation loss).
tf::TrainConfig validated_config(const Corpus& corpus, const std::string& out_dir, std::int64_t every,
                                 std::int64_t bleu_sentences) {
    tf::TrainConfig c = tiny_config(corpus, out_dir);
    c.data.valid_src = corpus.valid_src;
    c.data.valid_tgt = corpus.valid_tgt;
    c.valid_every = every;
    c.valid_bleu = bleu_sentences > 0;
    c.valid_bleu_sentences = bleu_sentences;
    return c;
}

// Runs train() as `tapeformer train` does (with the head-log watcher), its log captured; returns the log.
std::string train_quietly(const tf::TrainConfig& c, tf::TrainResult* result = nullptr) {
    ThreadsGuard threads;
    std::ostringstream log;
    tf::HeadLogWatcher head_log;
    tf::TrainResult r = tf::train(c, log, /*progress_bar=*/false, {&head_log});
    if (result) *result = r;
    return log.str();
}

// The message train() throws, or "" when it returns.
std::string train_error(const tf::TrainConfig& c) {
    ThreadsGuard threads;
    std::ostringstream log;
    try {
        tf::train(c, log, false);
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

std::vector<json> read_metrics(const std::string& dir) {
    std::vector<json> out;
    for (const auto& line : split_lines(read_all(dir + "/metrics.jsonl"))) out.push_back(json::parse(line));
    return out;
}

std::vector<json> of_type(const std::vector<json>& metrics, const std::string& type) {
    std::vector<json> out;
    for (const auto& m : metrics)
        if (m.at("type") == type) out.push_back(m);
    return out;
}

json read_state(const std::string& dir) { return json::parse(read_all(dir + "/state.json")); }

std::string checkpoint_name(std::int64_t step) {
    char name[64];
    std::snprintf(name, sizeof name, "checkpoints/step-%08lld.safetensors", static_cast<long long>(step));
    return name;
}

// ---- the executable --------------------------------------------------------------------------------------

struct CliRun {
    int status = -1;  // exit status; -1 when it did not exit normally
    std::string err;
    std::vector<std::string> err_lines() const { return split_lines(err); }
    std::string last_err_line() const {
        const auto lines = err_lines();
        return lines.empty() ? "" : lines.back();
    }
};

// `tapeformer --threads 1 <args>` (args already quoted), stdout discarded, stderr captured.
CliRun run_quiet(const TempDir& scratch, const std::string& args) {
    const std::string err = scratch / "cli.stderr";
    const std::string command =
        shell_quote(TF_CLI) + " --threads 1 " + args + " </dev/null >/dev/null 2>" + shell_quote(err);
    const int raw = std::system(command.c_str());
    CliRun r;
    r.status = (raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1;
    r.err = read_all(err);
    return r;
}

CliRun run_train(const TempDir& scratch, const std::string& args) { return run_quiet(scratch, "train " + args); }

// `tapeformer train --resume` of the run in `out`, whose last checkpoint is step n, two steps on: it resumes
// from step n, and metrics.jsonl then holds steps 1 .. n + 2 once each (a killed run's lines past its
// checkpoint rewound).
void check_resumes_two_steps_on(const TempDir& tmp, const std::string& out, std::int64_t n) {
    const CliRun resumed = run_train(tmp, "--resume --max-steps " + std::to_string(n + 2) + " --out " + shell_quote(out));
    INFO("resume stderr: " << resumed.err);
    CHECK(resumed.status == 0);
    CHECK_THAT(resumed.err, Catch::Contains("(step " + std::to_string(n) + ","));
    const auto after = of_type(read_metrics(out), "train");
    REQUIRE(after.size() == static_cast<std::size_t>(n + 2));
    for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i].at("step") == static_cast<std::int64_t>(i + 1));
    CHECK(read_state(out).at("step") == n + 2);
}

// The usual flags of a tiny CLI run on `corpus` into `out` (no stopping rule: callers add it).
std::string tiny_flags(const Corpus& corpus, const std::string& out,
                       const std::string& width = "--d-model 16 --heads 2") {
    return "--train-src " + shell_quote(corpus.train_src) + " --train-tgt " + shell_quote(corpus.train_tgt) + " " +
           width + " --tokenizer word --vocab-size 0 --ffn 32 --layers 1 --batch-tokens 400"
           " --max-len 40 --warmup 4 --lr 2 --log-every 1 --no-valid-bleu --out " +
           shell_quote(out);
}

// A refused run: non-zero exit and exactly one line on stderr, "tapeformer: ..." containing `what`.
void check_refused(const CliRun& r, const std::string& what) {
    INFO("stderr: " << r.err);
    CHECK(r.status > 0);
    CHECK(r.err_lines().size() == 1);
    CHECK(r.err.rfind("tapeformer: ", 0) == 0);
    CHECK_THAT(r.err, Catch::Contains(what));
}

// A run that failed after it started logging: non-zero exit, the last stderr line is the error.
void check_failed_late(const CliRun& r, const std::string& what) {
    INFO("stderr: " << r.err);
    CHECK(r.status > 0);
    CHECK(r.last_err_line().rfind("tapeformer: error: ", 0) == 0);
    CHECK_THAT(r.last_err_line(), Catch::Contains(what));
}

// A CLI run into `out` that must succeed with `steps` logged steps: their metrics.jsonl entries.
std::vector<json> train_ok(const TempDir& scratch, const std::string& args, const std::string& out, std::size_t steps) {
    const CliRun r = run_train(scratch, args);
    INFO(r.err);
    REQUIRE(r.status == 0);
    auto logged = of_type(read_metrics(out), "train");
    REQUIRE(logged.size() == steps);
    return logged;
}

// A child `tapeformer` process, killed and reaped at scope exit if a test gave up on it.
struct Child {
    pid_t pid = -1;
    Child(const std::vector<std::string>& args, const std::string& stderr_path) {
        std::vector<char*> argv;
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        pid = ::fork();
        if (pid < 0) throw std::runtime_error("fork failed");
        if (pid == 0) {  // only async-signal-safe calls until exec
            const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            const int null = ::open("/dev/null", O_RDWR);
            if (err < 0 || null < 0) ::_exit(127);
            ::dup2(null, 0);
            ::dup2(null, 1);
            ::dup2(err, 2);
            sigset_t none;
            sigemptyset(&none);
            ::sigprocmask(SIG_SETMASK, &none, nullptr);
            ::signal(SIGINT, SIG_DFL);
            ::signal(SIGTERM, SIG_DFL);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
    }
    // The exit status, or -1 (and the child killed) when it has not exited within `timeout`.
    int wait_exit(std::chrono::seconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return -1;
    }
    ~Child() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    }
};


// argv of a tiny CLI training run into `out` that goes on until it is stopped (for the signal tests).
std::vector<std::string> endless_train_args(const Corpus& corpus, const std::string& out,
                                            const std::vector<std::string>& extra) {
    std::vector<std::string> args = {TF_CLI, "--threads", "1", "train",
                                     "--train-src", corpus.train_src, "--train-tgt", corpus.train_tgt,
                                     "--tokenizer", "word", "--d-model", "16", "--heads", "2", "--ffn", "32",
                                     "--layers", "1", "--batch-tokens", "400", "--max-len", "40",
                                     "--max-steps", "100000", "--log-every", "1", "--no-valid-bleu", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

// Waits (at most a minute) until the run in `out` has logged `steps` lines of metrics.
// Until metrics.jsonl holds `steps` training lines (validation lines, such as step 0's, do not count).
void wait_for_steps(const std::string& out, std::size_t steps) {
    const auto train_lines = [&] {
        std::size_t n = 0;
        for (const std::string& line : split_lines(read_all(out + "/metrics.jsonl"))) n += line.find("\"type\":\"train\"") != std::string::npos;
        return n;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (train_lines() < steps && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(train_lines() >= steps);
}

}  // namespace

// ---- 1. exact resume -------------------------------------------------------------------------------------

TEST_CASE("train: 4 steps then --resume to 8 equals 8 steps in one go, bit for bit", "[train]") {
    // valid_every 0: no validation data; 2: validations at the same steps in both runs (the split run's
    // final validation at step 4 is the scheduled one); 3: the split run validates at step 4 only, which
    // must not change training (but may change which weights are the best).
    const int valid_every = GENERATE(0, 2, 3);
    INFO("valid_every " << valid_every);
    Corpus corpus(180, 20);  // 6 batches per epoch: step 4 is inside the first epoch, step 8 in the second
    TempDir tmp;
    const std::string straight = tmp / "straight", split = tmp / "split";

    tf::TrainConfig c = valid_every ? validated_config(corpus, straight, valid_every, 3) : tiny_config(corpus, straight);
    c.max_steps = 8;
    train_quietly(c);

    c.out_dir = split;
    c.max_steps = 4;
    train_quietly(c);
    CHECK(read_state(split).at("step") == 4);
    const auto stop =
        json::parse(tf::load_safetensors(split + "/" + checkpoint_name(4)).metadata.at("tapeformer.train_state"));
    CHECK(stop.at("epoch") == 0);
    CHECK(stop.at("batch_in_epoch") == 4);  // resuming must continue inside the epoch's batch order
    tf::TrainConfig resume = resume_config(split, 8);
    tf::TrainResult result;
    const std::string log = train_quietly(resume, &result);
    CHECK_THAT(log, Catch::Contains("resuming from") && Catch::Contains("(step 4,"));
    CHECK(result.steps == 8);

    const auto a = of_type(read_metrics(straight), "train"), b = of_type(read_metrics(split), "train");
    REQUIRE(a.size() == 8);
    REQUIRE(b.size() == 8);
    CHECK(a.back().at("epoch").get<int>() >= 2);  // the 8 steps cross an epoch boundary
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(b[i].at("step") == static_cast<int>(i + 1));
        for (const char* key : {"step", "epoch", "loss", "nll", "ppl", "lr", "grad_norm"})
            CHECK(a[i].at(key).get<double>() == b[i].at(key).get<double>());
        CHECK(a[i].at("loss").dump() == b[i].at("loss").dump());  // the same decimal text, too
    }

    // The weights, and in the last checkpoint the optimizer's moments, are the same numbers.
    const std::string last = read_state(straight).at("last");
    CHECK(last == checkpoint_name(8));
    CHECK(read_state(split).at("last") == last);
    const tf::SafetensorsFile x = tf::load_safetensors(straight + "/" + last);
    const tf::SafetensorsFile y = tf::load_safetensors(split + "/" + last);
    REQUIRE(x.tensors.size() == y.tensors.size());
    std::size_t optimizer_tensors = 0;
    for (const auto& [name, entry] : x.tensors) {
        INFO(name);
        REQUIRE(y.tensors.count(name) == 1);
        CHECK(entry.shape == y.tensors.at(name).shape);
        CHECK(entry.values == y.tensors.at(name).values);
        optimizer_tensors += name.rfind("optim.", 0) == 0;
    }
    CHECK(optimizer_tensors > 0);
    if (valid_every != 3) {
        // The same validations, so the same best model (the last weights without validation data).
        CHECK(same_weights_file(straight + "/model.safetensors", split + "/model.safetensors"));
        const auto va = of_type(read_metrics(straight), "valid"), vb = of_type(read_metrics(split), "valid");
        REQUIRE(va.size() == vb.size());
        CHECK(va.size() == (valid_every ? 5u : 0u));  // step 0's, before training, and 4 of the run's
        for (std::size_t i = 0; i < va.size(); ++i)
            for (const char* key : {"step", "valid_loss", "valid_ppl", "valid_bleu", "best"}) {
                REQUIRE(va[i].contains(key) == vb[i].contains(key));
                if (va[i].contains(key)) CHECK(va[i].at(key) == vb[i].at(key));
            }
        CHECK(read_state(straight).at("best_step") == read_state(split).at("best_step"));
    }
}

TEST_CASE("train: --cooldown brings the logged lr down linearly over the run's last fraction, and a resume "
          "continues it bit for bit", "[train]") {
    Corpus corpus(180, 20);
    TempDir tmp;
    const std::string plain = tmp / "plain", cooled = tmp / "cooled", resumed = tmp / "resumed";
    tf::TrainConfig c = tiny_config(corpus, plain);
    c.max_steps = 8;
    c.checkpoint_every = 4;
    train_quietly(c);
    c.out_dir = cooled;
    c.optim.cooldown = 0.5;
    train_quietly(c);

    // Step s runs with (s − 1)/8 of the run done: the factor is 1 up to step 5, then (1 − (s − 1)/8)/0.5.
    const auto a = of_type(read_metrics(plain), "train"), b = of_type(read_metrics(cooled), "train");
    REQUIRE(a.size() == 8);
    REQUIRE(b.size() == 8);
    const double factor[8] = {1, 1, 1, 1, 1, 0.75, 0.5, 0.25};
    for (std::size_t i = 0; i < 8; ++i) {
        INFO("step " << i + 1);
        CHECK(b[i].at("lr").get<double>() == Approx(a[i].at("lr").get<double>() * factor[i]).epsilon(1e-12));
        if (i < 5) CHECK(b[i].at("loss") == a[i].at("loss"));  // the same steps until the cooldown starts
    }
    CHECK(b[7].at("loss") != a[7].at("loss"));

    // From the step-4 checkpoint, with the later one gone, the resumed run cools down as the whole run did.
    fs::copy(cooled, resumed, fs::copy_options::recursive);
    fs::remove(resumed + "/" + checkpoint_name(8));
    fs::remove(resumed + "/state.json");
    train_quietly(resume_config(resumed, 8));
    const auto r = of_type(read_metrics(resumed), "train");
    REQUIRE(r.size() == 8);
    for (std::size_t i = 0; i < 8; ++i) {
        INFO("step " << i + 1);
        for (const char* key : {"lr", "loss", "grad_norm"}) CHECK(r[i].at(key) == b[i].at(key));
    }
    CHECK(same_weights_file(cooled + "/model.safetensors", resumed + "/model.safetensors"));
}

TEST_CASE("train: with --time-budget, --cooldown follows the clock: each step's lr is the schedule's times the "
          "factor of the training time before it", "[train]") {
    Corpus corpus(180, 20);
    TempDir tmp;
    tf::TrainConfig c = tiny_config(corpus, tmp / "run");
    c.max_steps = 0;
    c.time_budget_minutes = 0.05;  // 3 s: steps of a few ms, a few hundred on a loaded machine or under ASan
    c.optim.cooldown = 0.5;
    c.checkpoint_every = 1000000;
    train_quietly(c);

    const double budget = c.time_budget_minutes * 60;
    tf::Schedule schedule = c.optim.schedule;
    schedule.d_model = c.model.d_model;
    const auto lines = of_type(read_metrics(c.out_dir), "train");
    REQUIRE(lines.size() >= 4);
    double before = 0, last_factor = 1;  // training seconds before the step
    std::size_t cooled = 0;
    for (const auto& line : lines) {
        const std::int64_t step = line.at("step").get<std::int64_t>();
        INFO("step " << step << ", " << before << " s before it");
        last_factor = tf::cooldown_factor(before / budget, c.optim.cooldown);
        CHECK(line.at("lr").get<double>() == Approx(schedule.lr_at(step) * last_factor).epsilon(1e-12));
        cooled += last_factor < 1;
        before = line.at("elapsed").get<double>();
    }
    CHECK(before >= budget);
    CHECK(cooled > 0);
    CHECK(cooled < lines.size());  // the first half of the budget at the schedule's own rate
    CHECK(last_factor < 0.25);     // the last step started in the budget's last eighth
}

TEST_CASE("train: 1, 2 and 3 threads give the same losses and weights, and --resume may change --threads",
          "[train][determinism]") {
    // A model large enough that every threaded path runs split (gemm tiles, layer norm's row blocks,
    // attention's batched products and softmax, the loss rows: loops of kParallelGrain = 2^17 element
    // operations and more, e.g. (3000 positions, 128) activations, (B, 8, T, T) attention weights).
    // Same run: straight on 1 and on 2 threads; 3 steps on 2 threads, then --resume to 6 on 3 threads.
    Corpus corpus(400, 20);
    TempDir tmp;
    tf::TrainConfig c = tiny_config(corpus, tmp / "one");
    c.model.d_model = 128;
    c.model.heads = 8;
    c.model.ffn = 256;
    c.data.batch_tokens = 3000;
    c.max_steps = 6;
    train_quietly(c);
    c.out_dir = tmp / "two";
    c.threads = 2;
    train_quietly(c);
    c.out_dir = tmp / "split";
    c.max_steps = 3;
    train_quietly(c);
    tf::TrainConfig resume = resume_config(tmp / "split", 6);
    resume.threads = 3;
    train_quietly(resume);

    const auto one = of_type(read_metrics(tmp / "one"), "train");
    REQUIRE(one.size() == 6);
    for (const std::string run : {"two", "split"}) {
        INFO(run);
        const auto other = of_type(read_metrics(tmp / run), "train");
        REQUIRE(other.size() == one.size());
        for (std::size_t i = 0; i < one.size(); ++i)
            for (const char* key : {"loss", "nll", "grad_norm"}) CHECK(one[i].at(key).dump() == other[i].at(key).dump());
        const tf::SafetensorsFile x = tf::load_safetensors(tmp / "one" + "/" + checkpoint_name(6));
        const tf::SafetensorsFile y = tf::load_safetensors(tmp / run + "/" + checkpoint_name(6));
        REQUIRE(x.tensors.size() == y.tensors.size());
        for (const auto& [name, entry] : x.tensors) {
            INFO(name);
            CHECK(entry.values == y.tensors.at(name).values);
        }
    }
}

// ---- 2. refusing to overwrite ----------------------------------------------------------------------------

TEST_CASE("train: a second run into the same --out is refused without --resume or --force", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run";
    const CliRun first = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 2");
    INFO(first.err);
    REQUIRE(first.status == 0);
    const std::string weights = read_all(out + "/model.safetensors"), run_json = read_all(out + "/run.json");
    const std::string metrics = read_all(out + "/metrics.jsonl"), state = read_all(out + "/state.json");
    REQUIRE(!weights.empty());

    const CliRun again = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 3 --seed 9");
    check_refused(again, "--resume");
    CHECK_THAT(again.err, Catch::Contains("--force") && Catch::Contains(out));
    CHECK((read_all(out + "/model.safetensors") == weights));
    CHECK(read_all(out + "/run.json") == run_json);
    CHECK(read_all(out + "/metrics.jsonl") == metrics);
    CHECK(read_all(out + "/state.json") == state);

    // --force starts over: a new run.json (seed 9), metrics of this run only, other weights.
    const CliRun forced = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 3 --seed 9 --force");
    INFO(forced.err);
    REQUIRE(forced.status == 0);
    CHECK(json::parse(read_all(out + "/run.json")).at("seed") == 9);
    const auto steps = of_type(read_metrics(out), "train");
    REQUIRE(steps.size() == 3);
    CHECK(steps.front().at("step") == 1);
    CHECK((read_all(out + "/model.safetensors") != weights));
    CHECK(read_state(out).at("kept") == json::array({checkpoint_name(3)}));
    CHECK(!fs::exists(out + "/" + checkpoint_name(2)));
}

// ---- 3. bad input ----------------------------------------------------------------------------------------

TEST_CASE("train: bad data files are one line on stderr naming the file", "[train]") {
    Corpus corpus(50);
    TempDir tmp;
    const std::string out = tmp / "run";
    auto flags = [&](const std::string& src, const std::string& tgt) {
        return "--train-src " + shell_quote(src) + " --train-tgt " + shell_quote(tgt) +
               " --tokenizer word --d-model 16 --heads 2 --ffn 32 --layers 1 --batch-tokens 400 --max-len 40"
               " --max-steps 2 --no-valid-bleu --out " + shell_quote(out);
    };

    SECTION("line counts differ: both files, both counts") {
        auto tgt = toy_lines("train.tgt", 49);
        write_all(tmp / "short.tgt", join_lines(tgt));
        const CliRun r = run_train(tmp, flags(corpus.train_src, tmp / "short.tgt"));
        check_refused(r, corpus.train_src);
        CHECK_THAT(r.err, Catch::Contains(tmp / "short.tgt") && Catch::Contains("has 50 lines") &&
                              Catch::Contains("has 49"));
        // The library says the same.
        tf::TrainConfig c = tiny_config(corpus, tmp / "lib");
        c.data.train_tgt = tmp / "short.tgt";
        const std::string e = train_error(c);
        CHECK_THAT(e, Catch::Contains(corpus.train_src) && Catch::Contains(tmp / "short.tgt") &&
                          Catch::Contains("has 50 lines") && Catch::Contains("has 49"));
        CHECK(e.find('\n') == std::string::npos);
    }
    SECTION("a missing file") {
        const CliRun r = run_train(tmp, flags(corpus.train_src, tmp / "nowhere.tgt"));
        check_refused(r, tmp / "nowhere.tgt");
    }
    SECTION("invalid UTF-8: file and line") {
        auto src = toy_lines("train.src", 50);
        src[6] += " \xC3\x28 bad";
        write_all(tmp / "bad.src", join_lines(src));
        const CliRun r = run_train(tmp, flags(tmp / "bad.src", corpus.train_tgt));
        check_refused(r, tmp / "bad.src:7:");
        CHECK_THAT(r.err, Catch::Contains("UTF-8"));
    }
    CHECK(!fs::exists(out + "/model.safetensors"));
    CHECK(!fs::exists(out + "/run.json"));
}

TEST_CASE("train: bad settings are one line on stderr naming the setting", "[train]") {
    Corpus corpus(50);
    TempDir tmp;
    const std::string base = tiny_flags(corpus, tmp / "run");

    SECTION("an unknown preset") {
        check_refused(run_train(tmp, base + " --max-steps 2 --preset nonesuch"), "nonesuch");
    }
    SECTION("an unknown flag") {
        check_refused(run_train(tmp, base + " --max-steps 2 --warp-speed 9"), "--warp-speed");
    }
    SECTION("--dropout 1.5") {
        const CliRun r = run_train(tmp, base + " --max-steps 2 --dropout 1.5");
        check_refused(r, "--dropout");
        CHECK_THAT(r.err, Catch::Contains("1.5"));
    }
    SECTION("--heads 3 with --d-model 32: both numbers") {
        const CliRun r = run_train(tmp, tiny_flags(corpus, tmp / "run", "--d-model 32 --heads 3") + " --max-steps 2");
        check_refused(r, "32");
        CHECK_THAT(r.err, Catch::Contains("heads 3"));
    }
    SECTION("no stopping rule") {
        check_refused(run_train(tmp, base), "--max-steps");
        tf::TrainConfig c = tiny_config(corpus, tmp / "lib");
        c.max_steps = 0;
        CHECK_THAT(train_error(c), Catch::Contains("--max-steps") && Catch::Contains("--epochs"));
    }
    SECTION("--tie all with --separate-vocab") {
        const CliRun r = run_train(tmp, base + " --max-steps 2 --tie all --separate-vocab");
        check_refused(r, "--tie all");
        CHECK_THAT(r.err, Catch::Contains("--joint-vocab"));
    }
    SECTION("--resume on an empty directory") {
        fs::create_directories(tmp / "empty");
        const CliRun r = run_train(tmp, "--resume --max-steps 2 --out " + shell_quote(tmp / "empty"));
        check_refused(r, "run.json");
        CHECK_THAT(r.err, Catch::Contains(tmp / "empty"));
    }
    CHECK(!fs::exists(tmp / "run/run.json"));
}

TEST_CASE("train: --resume refuses a damaged run directory, naming the file", "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    const CliRun first = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 3 --checkpoint-every 1 --keep 2");
    INFO(first.err);
    REQUIRE(first.status == 0);
    const std::string last = read_state(out).at("last");
    REQUIRE(last == checkpoint_name(3));
    const std::string path = out + "/" + last;
    const std::string bytes = read_all(path);
    const std::string resume = "--resume --max-steps 5 --out " + shell_quote(out);

    SECTION("intact: a plain --resume continues to the run's own stopping rule (here: already reached)") {
        const std::string metrics = read_all(out + "/metrics.jsonl");
        const CliRun r = run_train(tmp, "--resume --out " + shell_quote(out));
        INFO(r.err);
        CHECK(r.status == 0);
        CHECK_THAT(r.err, Catch::Contains("(step 3,") && Catch::Contains("already reached its stopping rule at step 3"));
        CHECK(read_all(out + "/metrics.jsonl") == metrics);
        CHECK((read_all(path) == bytes));
    }
    SECTION("the last checkpoint cut short: refused, naming the older kept one") {
        write_all(path, bytes.substr(0, bytes.size() / 2));
        const CliRun r = run_train(tmp, resume);
        check_failed_late(r, path);
        CHECK_THAT(r.last_err_line(), Catch::Contains("continues from " + checkpoint_name(2)));
    }
    SECTION("a flipped byte in the last checkpoint: the checksum") {
        std::string bad = bytes;
        bad[bad.size() - 5] = static_cast<char>(bad[bad.size() - 5] ^ 0x10);
        write_all(path, bad);
        const CliRun r = run_train(tmp, resume);
        check_failed_late(r, path);
        CHECK_THAT(r.last_err_line(), Catch::Contains("checksum"));
    }
    // A state rewritten with its checksum recomputed (a program that knows the format): only its values tell.
    auto rewrite_state = [&](const std::string& key, const std::string& value) {
        tf::SafetensorsFile file = tf::load_safetensors(path);
        std::vector<tf::NamedTensor> tensors;
        for (const auto& [name, entry] : file.tensors) tensors.push_back({name, file.tensor(name)});
        json state = json::parse(file.metadata.at("tapeformer.train_state"));
        state[key] = json::parse(value);
        file.metadata["tapeformer.train_state"] = state.dump();
        tf::save_safetensors(path, tensors, file.metadata, /*with_checksum=*/true);
    };
    SECTION("the last checkpoint's training state at another step than its name: refused") {
        rewrite_state("step", "7");
        const CliRun r = run_train(tmp, resume);
        check_failed_late(r, path + ": its training state is at step 7, not at the step its name gives (3)");
    }
    SECTION("the last checkpoint's training state past the end of an epoch: refused") {
        rewrite_state("batch_in_epoch", "9999");
        const CliRun r = run_train(tmp, resume);
        check_failed_late(r, path + ": its training state is at batch 9999 of an epoch, but the run's training data gives");
    }
    SECTION("the last checkpoint's best step after its step: refused") {
        rewrite_state("best_step", "4");
        const CliRun r = run_train(tmp, resume);
        check_failed_late(r, path + ": training state is malformed: best_step 4 is not -1 or a step up to step 3");
    }
    SECTION("every listed checkpoint deleted: refused, saying how to start over") {
        fs::remove_all(out + "/checkpoints");
        const CliRun r = run_train(tmp, resume);
        check_failed_late(r, "none of the checkpoints listed in");
        CHECK_THAT(r.last_err_line(), Catch::Contains("--force"));
    }
    SECTION("run.json of another format version") {
        std::string run_json = read_all(out + "/run.json");
        const std::string key = "\"format\": " + std::to_string(tf::kCheckpointFormat);
        const auto at = run_json.find(key);
        REQUIRE(at != std::string::npos);
        run_json.replace(at, key.size(), "\"format\": 99");
        write_all(out + "/run.json", run_json);
        const CliRun r = run_train(tmp, resume);
        check_refused(r, out + "/run.json");
        CHECK_THAT(r.err, Catch::Contains("format 99"));
    }
    // Nothing was trained on top of the run.
    CHECK(read_state(out).at("step") == 3);
    CHECK(of_type(read_metrics(out), "train").size() == 3);
}

TEST_CASE("train: with the damaged last checkpoint deleted, --resume continues from the older kept one", "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    const auto losses = train_ok(tmp, tiny_flags(corpus, out) + " --max-steps 3 --checkpoint-every 1 --keep 2", out, 3);
    fs::remove(out + "/" + checkpoint_name(3));

    const CliRun r = run_train(tmp, "--resume --max-steps 4 --out " + shell_quote(out));
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("resuming from the newest kept one, " + checkpoint_name(2)));
    CHECK_THAT(r.err, Catch::Contains("(step 2,"));
    const auto after = of_type(read_metrics(out), "train");
    REQUIRE(after.size() == 4);
    CHECK(after[2].at("loss") == losses[2].at("loss"));  // step 3 again, the same as the first time
    const json state = read_state(out);
    CHECK(state.at("last") == checkpoint_name(4));
    CHECK(state.at("kept") == json({checkpoint_name(3), checkpoint_name(4)}));
}

TEST_CASE("train: a run stopped before its first checkpoint is refused without --resume, and --resume starts it over",
          "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    const auto losses = train_ok(tmp, tiny_flags(corpus, out) + " --max-steps 3", out, 3);
    // What a crash at step 2 leaves: the settings, the tokenizer, two lines of metrics, no checkpoint.
    fs::remove_all(out + "/checkpoints");
    fs::remove(out + "/state.json");
    fs::remove(out + "/model.safetensors");
    const auto lines = split_lines(read_all(out + "/metrics.jsonl"));
    write_all(out + "/metrics.jsonl", join_lines({lines[0], lines[1]}));

    check_refused(run_train(tmp, tiny_flags(corpus, out) + " --max-steps 3"), "--resume");
    const CliRun r = run_train(tmp, "--resume --out " + shell_quote(out));
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("starting it from step 0"));
    const auto after = of_type(read_metrics(out), "train");
    REQUIRE(after.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(after[i].at("loss") == losses[i].at("loss"));
    CHECK(read_state(out).at("step") == 3);
    CHECK_NOTHROW(tf::load_model_dir(out));
}

TEST_CASE("train: empty pairs are skipped and over-long pairs filtered, both counted in the log", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    auto src = toy_lines("train.src", 60), tgt = toy_lines("train.tgt", 60);
    src[3] = "";          // one side empty
    src[10] = tgt[10] = "   ";  // both sides blank after trimming
    std::string long_line;
    for (int i = 0; i < 45; ++i) long_line += "the cat ";
    src[20] = long_line;  // 90 tokens > --max-len 40
    tgt[30] = long_line;
    tgt[31] = long_line;
    write_all(corpus.train_src, join_lines(src));
    write_all(corpus.train_tgt, join_lines(tgt));

    tf::TrainConfig c = tiny_config(corpus, tmp / "run");
    c.max_steps = 1;
    const std::string log = train_quietly(c);
    CHECK_THAT(log, Catch::Contains("kept 55 of 60 pairs (skipped 2 empty pairs, filtered 3 over-long pairs)"));

    // The CLI prints the same summary on stderr.
    const CliRun r = run_train(tmp, tiny_flags(corpus, tmp / "cli") + " --max-steps 1");
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("skipped 2 empty pairs") && Catch::Contains("filtered 3 over-long pairs"));
}

// ---- 4. non-finite loss ----------------------------------------------------------------------------------

TEST_CASE("train: a loss that blows up stops training, names the step, and leaves the checkpoint usable",
          "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.optim.optimizer = "sgd";
    c.optim.schedule.kind = tf::ScheduleKind::Constant;
    c.optim.schedule.lr = 1000;  // the largest --lr accepted
    c.optim.schedule.warmup = 0;
    c.optim.clip = 0;
    c.max_steps = 50;
    c.checkpoint_every = 1;

    const std::string error = train_error(c);
    INFO(error);
    REQUIRE_THAT(error, Catch::Contains("non-finite"));
    const json state = read_state(out);
    const std::int64_t saved = state.at("step");
    REQUIRE(saved >= 1);
    CHECK(saved < 50);
    const std::string at_step = "at step " + std::to_string(saved + 1);
    CHECK_THAT(error, Catch::Contains(at_step) && Catch::Contains("--check-nan"));
    CHECK(error.find('\n') == std::string::npos);
    CHECK(state.at("last") == checkpoint_name(saved));

    // The checkpoint of the step before is intact: it loads into a model of the run's settings.
    const std::string path = out + "/" + state.at("last").get<std::string>();
    const tf::SafetensorsFile file = tf::load_safetensors(path);
    tf::Transformer model(tf::model_config_from_metadata(file.metadata));
    tf::Sgd sgd(model.parameters(), tf::SgdOptions{});
    CHECK(tf::load_training_checkpoint(path, model, sgd).step == saved);
    CHECK_NOTHROW(tf::load_model_dir(out));

    SECTION("--check-nan names the op") {
        tf::TrainConfig d = c;
        d.out_dir = tmp / "checked";
        d.check_nan = true;
        const std::string checked = train_error(d);
        INFO(checked);
        CHECK_THAT(checked, Catch::Contains(at_step));
        CHECK((checked.find("produced by op #") != std::string::npos ||
               checked.find("backward of op '") != std::string::npos));
    }
    SECTION("resuming from the checkpoint (with the run's own stopping rule) trains up to the same blow-up") {
        tf::TrainConfig r = resume_config(out);
        CHECK(train_error(r) == error);
        CHECK(read_state(out).at("step") == saved);
        CHECK(of_type(read_metrics(out), "train").size() == static_cast<std::size_t>(saved));
    }
}

// ---- 5. SIGTERM / SIGINT ---------------------------------------------------------------------------------

TEST_CASE("train: SIGTERM and SIGINT save a checkpoint, exit 130, and --resume continues", "[train]") {
    const int sig = GENERATE(SIGTERM, SIGINT);
    INFO("signal " << sig);
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run", err = tmp / "child.stderr";
    Child child(endless_train_args(corpus, out, {}), err);
    wait_for_steps(out, 2);  // the signal handlers are installed by then
    REQUIRE(::kill(child.pid, sig) == 0);
    const int status = child.wait_exit(std::chrono::seconds(60));
    const std::string log = read_all(err);
    INFO("stderr: " << log);
    CHECK(status == 130);
    CHECK_THAT(log, Catch::Contains("--resume"));

    const json state = read_state(out);
    const std::int64_t n = state.at("step");
    CHECK(n >= 2);
    CHECK(state.at("last") == checkpoint_name(n));
    CHECK(fs::exists(out + "/" + checkpoint_name(n)));
    CHECK_THAT(log, Catch::Contains("interrupted at step " + std::to_string(n)));
    const auto before = of_type(read_metrics(out), "train");
    REQUIRE(!before.empty());
    CHECK(before.back().at("step") == n);

    check_resumes_two_steps_on(tmp, out, n);
}

TEST_CASE("train: after SIGKILL, --resume continues from the last complete checkpoint", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run", err = tmp / "child.stderr";
    Child child(endless_train_args(corpus, out, {"--checkpoint-every", "3"}), err);
    wait_for_steps(out, 5);
    REQUIRE(::kill(child.pid, SIGKILL) == 0);
    child.wait_exit(std::chrono::seconds(60));

    // metrics.jsonl may run ahead of the last checkpoint; resuming rewinds it to the checkpoint's step.
    const std::int64_t c = read_state(out).at("step");
    CHECK(c >= 3);
    CHECK(c % 3 == 0);
    check_resumes_two_steps_on(tmp, out, c);
}

// Which of process `pid`'s threads take SIGINT or SIGTERM (do not block both): their names, from /proc.
static std::vector<std::string> threads_taking_interrupts(pid_t pid) {
    const std::uint64_t interrupts = (std::uint64_t(1) << (SIGINT - 1)) | (std::uint64_t(1) << (SIGTERM - 1));
    std::vector<std::string> names;
    for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
        std::string name;
        std::uint64_t blocked = 0;
        for (const std::string& line : split_lines(read_all(task.path() / "status"))) {
            if (line.rfind("Name:", 0) == 0) name = line.substr(line.find_first_not_of(" \t", 5));
            if (line.rfind("SigBlk:", 0) == 0) blocked = std::stoull(line.substr(7), nullptr, 16);
        }
        if ((blocked & interrupts) != interrupts) names.push_back(name);
    }
    return names;
}

// oneDNN 2.x's JIT sgemm runs with the stack pointer in a heap buffer: a signal handler run on a computing
// thread wrote its frame there, and 6 SIGTERMs in 300 (toy runs, release build) ended in heap corruption.
TEST_CASE("train: SIGINT and SIGTERM reach only the run's signal thread, never a thread that computes", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run";
    std::vector<std::string> args = endless_train_args(corpus, out, {});
    *(std::find(args.begin(), args.end(), "--threads") + 1) = "2";
    Child child(args, tmp / "child.stderr");
    wait_for_steps(out, 2);
    const fs::directory_iterator tasks("/proc/" + std::to_string(child.pid) + "/task");
    CHECK(std::distance(fs::begin(tasks), fs::end(tasks)) >= 3);  // the main thread, OpenMP's second one, the signal thread
    const std::vector<std::string> takers = threads_taking_interrupts(child.pid);
    CHECK(takers == std::vector<std::string>{"tf-signals"});
    REQUIRE(::kill(child.pid, SIGTERM) == 0);
    CHECK(child.wait_exit(std::chrono::seconds(60)) == 130);
}

TEST_CASE("train: after a run, the calling thread and its OpenMP threads take SIGINT and SIGTERM again", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    tf::TrainConfig c = tiny_config(corpus, tmp / "run");
    c.threads = 2;
    train_quietly(c);
    sigset_t interrupts;
    sigemptyset(&interrupts);
    sigaddset(&interrupts, SIGINT);
    sigaddset(&interrupts, SIGTERM);
    int blocked = 0;
#pragma omp parallel num_threads(2) reduction(+ : blocked)
    {
        sigset_t mine;
        pthread_sigmask(SIG_BLOCK, nullptr, &mine);
        blocked += sigismember(&mine, SIGINT) + sigismember(&mine, SIGTERM);
    }
    CHECK(blocked == 0);
}

// ---- 6. checkpoint rotation ------------------------------------------------------------------------------

TEST_CASE("train: --keep 2 keeps the two newest step checkpoints and lists them in state.json", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.max_steps = 5;
    c.checkpoint_every = 1;
    c.keep = 2;
    tf::TrainResult result;
    train_quietly(c, &result);
    CHECK(result.steps == 5);
    CHECK(result.stop_reason == tf::StopReason::max_steps);

    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
        files.push_back("checkpoints/" + e.path().filename().string());
    std::sort(files.begin(), files.end());
    CHECK(files == std::vector<std::string>{checkpoint_name(4), checkpoint_name(5)});
    const json state = read_state(out);
    CHECK(state.at("kept") == json(files));
    CHECK(state.at("last") == checkpoint_name(5));
    CHECK(state.at("step") == 5);
    CHECK(fs::exists(out + "/model.safetensors"));
    CHECK(fs::exists(out + "/run.json"));
    CHECK(fs::exists(out + "/vocab.txt"));
    CHECK_NOTHROW(tf::load_model_dir(out));
}

// ---- 7. config.toml round trip ---------------------------------------------------------------------------

TEST_CASE("train: --config DIR/config.toml repeats the run", "[train]") {
    Corpus corpus(80, 20);
    TempDir tmp;
    const std::string first = tmp / "first", second = tmp / "second";
    const std::string flags =
        "--train-src " + shell_quote(corpus.train_src) + " --train-tgt " + shell_quote(corpus.train_tgt) +
        " --valid-src " + shell_quote(corpus.valid_src) + " --valid-tgt " + shell_quote(corpus.valid_tgt) +
        " --tokenizer word --vocab-size 0 --separate-vocab --max-len 30 --batch-tokens 350"
        " --d-model 16 --heads 4 --ffn 24 --enc-layers 1 --dec-layers 1 --dropout 0.05 --attention-dropout 0"
        " --norm pre --activation gelu --tie decoder --positional learned --max-positions 48"
        " --optimizer adamw --weight-decay 0.01 --beta2 0.99 --clip 0.5 --label-smoothing 0.05"
        " --schedule cosine --lr 0.003 --warmup 1 --min-lr 0.0001 --seed 7 --max-steps 3"
        " --log-every 1 --valid-every 3 --checkpoint-every 2 --keep 1 --valid-bleu --valid-bleu-sentences 4"
        " --out " + shell_quote(first);
    const CliRun a = run_train(tmp, flags);
    INFO(a.err);
    REQUIRE(a.status == 0);
    REQUIRE(fs::exists(first + "/config.toml"));

    const std::string config = shell_quote(first + "/config.toml");
    const CliRun b = run_train(tmp, "--config " + config + " --out " + shell_quote(second));
    INFO(b.err);
    REQUIRE(b.status == 0);
    // The same settings and data; a run of its own (another run id).
    json first_run = json::parse(read_all(first + "/run.json")), second_run = json::parse(read_all(second + "/run.json"));
    CHECK(first_run.at("run_id") != second_run.at("run_id"));
    first_run.erase("run_id");
    second_run.erase("run_id");
    CHECK(second_run == first_run);
    CHECK(read_all(second + "/config.toml") == read_all(first + "/config.toml"));
    const json run = json::parse(read_all(first + "/run.json"));
    CHECK(run.at("optim").at("optimizer") == "adamw");
    CHECK(run.at("seed") == 7);
    // The same settings and seed, single-threaded: the same losses.
    const auto x = read_metrics(first), y = read_metrics(second);
    REQUIRE(x.size() == y.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        for (const char* key : {"loss", "valid_loss", "valid_bleu"})
            if (x[i].contains(key)) CHECK(x[i].at(key) == y[i].at(key));

    // Command-line options win over the file.
    const CliRun c = run_train(tmp, "--config " + config + " --seed 8 --out " + shell_quote(tmp / "third"));
    INFO(c.err);
    REQUIRE(c.status == 0);
    CHECK(json::parse(read_all(tmp / "third/run.json")).at("seed") == 8);
}

// ---- 8. metrics.jsonl ------------------------------------------------------------------------------------

TEST_CASE("train: metrics.jsonl holds one JSON object per line with the documented keys", "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    const bool bleu = GENERATE(true, false);
    INFO("valid_bleu " << bleu);
    tf::TrainConfig c = validated_config(corpus, tmp / "run", 2, bleu ? 5 : 0);
    c.max_steps = 4;
    c.log_every = 2;
    tf::TrainResult result;
    train_quietly(c, &result);

    const auto lines = split_lines(read_all(tmp / "run/metrics.jsonl"));
    REQUIRE(lines.size() == 5);
    std::vector<std::pair<std::string, std::int64_t>> seen;
    double best_loss = std::numeric_limits<double>::infinity(), best_bleu = -1;
    for (const auto& line : lines) {
        INFO(line);
        json j;
        REQUIRE_NOTHROW(j = json::parse(line));
        REQUIRE(j.is_object());
        seen.emplace_back(j.at("type").get<std::string>(), j.at("step").get<std::int64_t>());
        if (j.at("type") == "train") {
            for (const char* key : {"step", "epoch", "loss", "nll", "ppl", "lr", "grad_norm", "tok_per_s", "elapsed"}) {
                INFO(key);
                REQUIRE(j.contains(key));
                CHECK(std::isfinite(j.at(key).get<double>()));
            }
            CHECK(j.at("ppl").get<double>() == Approx(std::exp(j.at("nll").get<double>())));
            // The logged rate is the schedule's at that step, and the smoothed loss is at least the
            // smoothed loss of a perfect prediction, ε·ln((V−1)/ε)-ish > 0: both fail if logged wrongly.
            tf::Schedule schedule = c.optim.schedule;
            schedule.d_model = c.model.d_model;
            CHECK(j.at("lr").get<double>() == Approx(schedule.lr_at(j.at("step").get<std::int64_t>())).epsilon(1e-9));
            CHECK(j.at("loss").get<double>() > j.at("nll").get<double>() * (1 - c.optim.label_smoothing));
        } else {
            REQUIRE(j.at("type") == "valid");
            for (const char* key : {"valid_loss", "valid_ppl"}) {
                INFO(key);
                REQUIRE(j.contains(key));
                CHECK(std::isfinite(j.at(key).get<double>()));
            }
            CHECK(j.at("valid_ppl").get<double>() == Approx(std::exp(j.at("valid_nll").get<double>())));
            if (j.at("step") == 0) {
                // Before training: a loss only, of a model that knows nothing, whose nll is about ln V
                // (every one of the V target tokens about equally likely). It decodes nothing and chooses
                // no best model.
                const double ln_v = std::log(double(tf::load_model_dir(tmp / "run").model->config.tgt_vocab));
                CHECK(j.at("valid_nll").get<double>() == Approx(ln_v).epsilon(0.05));
                CHECK(j.at("epoch") == 1);
                for (const char* key : {"valid_bleu", "valid_exact", "best"}) CHECK(!j.contains(key));
                continue;
            }
            CHECK(j.contains("valid_bleu") == bleu);
            CHECK(j.contains("valid_exact") == bleu);  // of the same greedy translations
            if (bleu) CHECK((j.at("valid_exact").get<double>() >= 0 && j.at("valid_exact").get<double>() <= 1));
            best_loss = std::min(best_loss, j.at("valid_loss").get<double>());
            if (bleu) best_bleu = std::max(best_bleu, j.at("valid_bleu").get<double>());
        }
    }
    using P = std::pair<std::string, std::int64_t>;
    CHECK(seen == std::vector<P>{P{"valid", 0}, P{"train", 2}, P{"valid", 2}, P{"train", 4}, P{"valid", 4}});
    // The result reports the best of what the run's validations logged (lowest loss; highest BLEU, or −1 when
    // not measured); step 0's is not one of them.
    CHECK(result.best_valid_loss == Approx(best_loss).epsilon(1e-12));
    CHECK(result.best_valid_bleu == Approx(best_bleu).epsilon(1e-12));
}

// ---- 9. runs that are never lost or silently wrong -------------------------------------------------------

namespace {

// Every file under `dir` (relative path -> bytes), to check that a refused command changed nothing. Not
// train.lock: it holds the pid of the last process that locked the directory, a refused one included.
std::map<std::string, std::string> snapshot(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file() && e.path().filename() != "train.lock")
            files[fs::relative(e.path(), dir).string()] = read_all(e.path().string());
    return files;
}

// The pid of a process that has exited (and been reaped): nobody runs under it now.
pid_t dead_pid() {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    REQUIRE(pid > 0);
    ::waitpid(pid, nullptr, 0);
    return pid;
}

// Changes fields of the TrainState stored in a checkpoint: what the checkpoint held at an earlier moment.
void rewrite_train_state(const std::string& path, const json& changes) {
    tf::SafetensorsFile file = tf::load_safetensors(path);
    json state = json::parse(file.metadata.at("tapeformer.train_state"));
    state.update(changes);
    file.metadata["tapeformer.train_state"] = state.dump();
    file.metadata.erase(tf::kSafetensorsChecksumKey);
    std::vector<tf::NamedTensor> tensors;
    for (const auto& [name, entry] : file.tensors) tensors.push_back({name, file.tensor(name)});
    tf::save_safetensors(path, tensors, file.metadata, /*with_checksum=*/true);
}

// Removes the last line of DIR/metrics.jsonl, which must be of `type`.
void drop_last_metrics_line(const std::string& dir, const std::string& type) {
    auto lines = split_lines(read_all(dir + "/metrics.jsonl"));
    REQUIRE(json::parse(lines.back()).at("type") == type);
    lines.pop_back();
    write_all(dir + "/metrics.jsonl", join_lines(lines));
}

// metrics.jsonl without the timing fields, which differ from run to run.
std::vector<json> metrics_without_timing(const std::string& dir) {
    auto metrics = read_metrics(dir);
    for (json& m : metrics) {
        m.erase("tok_per_s");
        m.erase("elapsed");
    }
    return metrics;
}

}  // namespace

TEST_CASE("train: a run with validation that starts over from step 0 logs step 0's validation once", "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    const std::string straight = tmp / "straight", restarted = tmp / "restarted";
    tf::TrainConfig c = validated_config(corpus, straight, 2, 0);
    c.checkpoint_every = 3;
    c.max_steps = 4;
    train_quietly(c);
    const auto lines = split_lines(read_all(straight + "/metrics.jsonl"));
    REQUIRE(lines.size() >= 4);
    CHECK(json::parse(lines[0]).at("step") == 0);  // the validation before training comes first

    // What a crash at step 2 leaves: step 0's validation, the lines of steps 1 and 2, no checkpoint.
    fs::copy(straight, restarted, fs::copy_options::recursive);
    fs::remove_all(restarted + "/checkpoints");
    fs::remove(restarted + "/state.json");
    fs::remove(restarted + "/model.safetensors");
    write_all(restarted + "/metrics.jsonl", join_lines({lines[0], lines[1], lines[2], lines[3]}));
    tf::TrainConfig resume = resume_config(restarted);
    train_quietly(resume);
    // Started over: the same lines as the straight run, step 0's validation among them once.
    const auto a = metrics_without_timing(straight), b = metrics_without_timing(restarted);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
}

TEST_CASE("train: a disk that fills up at a checkpoint ends the run with one line, leaves no partial file, and "
          "--resume gives the uninterrupted run", "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string straight = tmp / "straight", full = tmp / "full";
    train_ok(tmp, tiny_flags(corpus, straight) + " --max-steps 2 --checkpoint-every 1", straight, 2);
    // The disk "fills" at 20-40 KB per file (ulimit -f counts 512- or 1024-byte blocks, by shell): the tokenizer
    // and run.json fit, the first checkpoint (about 290 KB) does not. write() then fails as on a full disk
    // (EFBIG instead of ENOSPC; SIGXFSZ ignored, as a full disk sends no signal), on the same path.
    const std::string err = tmp / "full.stderr";
    const std::string command = "trap '' XFSZ; ulimit -f 40; " + shell_quote(TF_CLI) + " --threads 1 train " +
                                tiny_flags(corpus, full) + " --max-steps 2 --checkpoint-every 1 </dev/null >/dev/null 2>" +
                                shell_quote(err);
    const int raw = std::system(command.c_str());
    const std::string log = read_all(err);
    INFO("stderr: " << log);
    REQUIRE(WIFEXITED(raw));
    CHECK(WEXITSTATUS(raw) == 1);
    const auto lines = split_lines(log);
    REQUIRE_FALSE(lines.empty());
    CHECK_THAT(lines.back(), Catch::StartsWith("tapeformer: error: cannot write '" + full + "/" + checkpoint_name(1) + "'"));
    CHECK_THAT(lines.back(), Catch::Contains("File too large"));
    for (const auto& entry : fs::recursive_directory_iterator(full))
        CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
    CHECK_FALSE(fs::exists(full + "/state.json"));

    // With room again, --resume starts the run that never reached its first checkpoint over: the same run.
    const CliRun r = run_train(tmp, "--resume --out " + shell_quote(full));
    INFO("resumed: " << r.err);
    REQUIRE(r.status == 0);
    const auto a = metrics_without_timing(straight), b = metrics_without_timing(full);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
    CHECK(same_weights_file(straight + "/model.safetensors", full + "/model.safetensors"));
}

TEST_CASE("train: --force checks every input before deleting, and deletes only the files training wrote", "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    train_ok(tmp, tiny_flags(corpus, out) + " --max-steps 2 --checkpoint-every 1", out, 2);
    write_all(out + "/my-notes.txt", "mine\n");
    write_all(out + "/checkpoints/my-best.safetensors", "mine too\n");
    const auto before = snapshot(out);

    SECTION("a typo in --train-src: refused, naming it; nothing deleted") {
        std::string flags = tiny_flags(corpus, out);
        flags.replace(flags.find(shell_quote(corpus.train_src)), shell_quote(corpus.train_src).size(),
                      shell_quote(tmp / "trian.src"));
        check_refused(run_train(tmp, flags + " --max-steps 3 --force"), tmp / "trian.src");
        CHECK(snapshot(out) == before);
    }
    SECTION("a missing --valid-tgt: refused, nothing deleted") {
        const CliRun r = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 3 --force --valid-src " +
                                            shell_quote(corpus.valid_src) + " --valid-tgt " + shell_quote(tmp / "nope.tgt"));
        check_refused(r, tmp / "nope.tgt");
        CHECK(snapshot(out) == before);
    }
    SECTION("--force with --resume contradict each other: refused, nothing deleted") {
        check_refused(run_train(tmp, "--resume --force --max-steps 3 --out " + shell_quote(out)), "--force");
        CHECK(snapshot(out) == before);
    }
    SECTION("a user's file of a name a run writes, in a directory without a run: refused without --force") {
        TempDir other;
        write_all(other / "config.toml", "# my settings\n");
        const CliRun r = run_train(tmp, tiny_flags(corpus, other.str()) + " --max-steps 1");
        check_refused(r, "config.toml");
        CHECK_THAT(r.err, Catch::Contains("--force"));
        CHECK(snapshot(other.str()) == std::map<std::string, std::string>{{"config.toml", "# my settings\n"}});
    }
    SECTION("a good --force run replaces the run's files and keeps the user's") {
        const CliRun r = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 1 --force");
        INFO(r.err);
        REQUIRE(r.status == 0);
        CHECK(read_all(out + "/my-notes.txt") == "mine\n");
        CHECK(read_all(out + "/checkpoints/my-best.safetensors") == "mine too\n");
        CHECK(!fs::exists(out + "/" + checkpoint_name(2)));
        CHECK(tf::checkpoints_on_disk(out) == std::vector<std::string>{checkpoint_name(1)});
        CHECK(of_type(read_metrics(out), "train").size() == 1);
    }
}

TEST_CASE("train: a second train into a directory in use is refused, naming the running one's pid", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run", err = tmp / "child.stderr";
    Child child(endless_train_args(corpus, out, {"--checkpoint-every", "2"}), err);
    wait_for_steps(out, 3);
    const std::string pid = "pid " + std::to_string(child.pid);

    const CliRun resumed = run_train(tmp, "--resume --max-steps 5 --out " + shell_quote(out));
    check_refused(resumed, pid);
    CHECK_THAT(resumed.err, Catch::Contains(out));
    const CliRun forced = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 1 --force");
    check_refused(forced, pid);
    CHECK(fs::exists(out + "/run.json"));  // --force deleted nothing under the running process

    // The first run never noticed: it stops cleanly, and afterwards the directory is free again.
    REQUIRE(::kill(child.pid, SIGTERM) == 0);
    CHECK(child.wait_exit(std::chrono::seconds(60)) == 130);
    const std::int64_t n = read_state(out).at("step");
    const CliRun after = run_train(tmp, "--resume --max-steps " + std::to_string(n + 1) + " --out " + shell_quote(out));
    INFO(after.err);
    CHECK(after.status == 0);
}

TEST_CASE("train: --resume without state.json continues from the newest checkpoint on disk, never from step 0",
          "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    tf::TrainConfig c = tiny_config(corpus, tmp / "straight");
    c.max_steps = 6;
    c.checkpoint_every = 2;
    train_quietly(c);
    const auto straight = of_type(read_metrics(tmp / "straight"), "train");
    const std::string out = tmp / "run";
    c.out_dir = out;
    c.max_steps = 4;
    train_quietly(c);
    tf::TrainConfig resume = resume_config(out, 6);

    SECTION("state.json missing, or listing no checkpoint: the newest on disk, with a note") {
        if (GENERATE(true, false)) fs::remove(out + "/state.json");
        else write_all(out + "/state.json", R"({"format": 1, "last": "", "kept": []})");
        const std::string log = train_quietly(resume);
        CHECK_THAT(log, Catch::Contains("resuming from the newest checkpoint on disk, " + checkpoint_name(4)));
        CHECK_THAT(log, Catch::Contains("(step 4,"));
        const auto after = of_type(read_metrics(out), "train");
        REQUIRE(after.size() == straight.size());
        for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i].at("loss") == straight[i].at("loss"));
        CHECK(read_state(out).at("last") == checkpoint_name(6));
    }
    SECTION("no checkpoint on disk either, but metrics past the first one: refused, naming the fix") {
        fs::remove(out + "/state.json");
        for (const auto& name : tf::checkpoints_on_disk(out)) fs::remove(out + "/" + name);
        const auto before = snapshot(out);
        const std::string e = train_error(resume);
        CHECK_THAT(e, Catch::Contains("metrics.jsonl records step 4") && Catch::Contains("--force"));
        CHECK(snapshot(out) == before);
    }
}

TEST_CASE("train: a resumed run whose last step is a checkpoint ends exactly as the uninterrupted run", "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    const std::string straight = tmp / "straight", split = tmp / "split";
    tf::TrainConfig c = validated_config(corpus, straight, 3, 3);  // validations at 3 and (the final one) at 4
    c.checkpoint_every = 2;
    c.max_steps = 4;
    train_quietly(c);

    // What a kill right after the checkpoint at step 2 leaves: that checkpoint is the last one.
    fs::copy(straight, split, fs::copy_options::recursive);
    fs::remove(split + "/" + checkpoint_name(4));
    tf::TrainConfig resume = resume_config(split);
    const std::string log = train_quietly(resume);
    CHECK_THAT(log, Catch::Contains("(step 2,"));
    CHECK_THAT(log, !Catch::Contains("already reached"));

    const auto a = metrics_without_timing(straight), b = metrics_without_timing(split);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
    CHECK(same_weights_file(straight + "/model.safetensors", split + "/model.safetensors"));
    const json sa = read_state(straight), sb = read_state(split);
    for (const char* key : {"last", "kept", "step", "best_step", "best_score"}) CHECK(sa.at(key) == sb.at(key));
}

TEST_CASE("train: with --log-every 3, a run resumed between two metrics lines writes the same lines as the "
          "uninterrupted run (the log window is in the checkpoint)",
          "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    const std::string straight = tmp / "straight", split = tmp / "split";
    tf::TrainConfig c = tiny_config(corpus, straight);
    c.log_every = 3;         // lines at 3, 6 and (the run's end) 8
    c.checkpoint_every = 2;  // checkpoints at 2, 4, 6, 8: those at 2 and 4 fall inside a window
    c.keep = 10;
    c.max_steps = 8;
    train_quietly(c);

    // What a kill right after the checkpoint at step 4 leaves; then the same after the one at step 2.
    for (const std::int64_t last : {4, 2}) {
        INFO("resumed from step " << last);
        fs::remove_all(split);
        fs::copy(straight, split, fs::copy_options::recursive);
        for (std::int64_t step = last + 2; step <= 8; step += 2) fs::remove(split + "/" + checkpoint_name(step));
        tf::TrainConfig resume = resume_config(split);
        const std::string log = train_quietly(resume);
        CHECK_THAT(log, Catch::Contains("(step " + std::to_string(last) + ","));
        const auto a = metrics_without_timing(straight), b = metrics_without_timing(split);
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
        CHECK(same_weights_file(straight + "/model.safetensors", split + "/model.safetensors"));
    }
}

TEST_CASE("train: with --log-every 3, SIGTERM between two metrics lines writes no partial line, and --resume "
          "ends as the uninterrupted run",
          "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const std::string out = tmp / "run", err = tmp / "child.stderr", straight = tmp / "straight";
    std::vector<std::string> args = endless_train_args(corpus, out, {"--total-steps", "100000"});
    *(std::find(args.begin(), args.end(), "--log-every") + 1) = "3";
    // The signal lands on a step of its own choosing; one between two lines is what this test is about.
    std::int64_t n = 0;
    for (int attempt = 0; attempt < 8 && n % 3 == 0; ++attempt) {
        fs::remove_all(out);
        Child child(args, err);
        wait_for_steps(out, 1);  // step 3: the signal handlers are installed by then
        REQUIRE(::kill(child.pid, SIGTERM) == 0);
        REQUIRE(child.wait_exit(std::chrono::seconds(60)) == 130);
        n = read_state(out).at("step");
    }
    INFO("interrupted at step " << n);
    if (n % 3 == 0) {
        WARN("eight signals all landed on a log step; the partial-window path was not exercised");
        return;
    }
    for (const json& line : of_type(read_metrics(out), "train")) CHECK(line.at("step").get<std::int64_t>() % 3 == 0);

    const std::string until = std::to_string(n - n % 3 + 7);  // past the next line, ending between two
    const CliRun resumed = run_train(tmp, "--resume --max-steps " + until + " --out " + shell_quote(out));
    INFO("resume stderr: " << resumed.err);
    REQUIRE(resumed.status == 0);
    // The same run in one go: endless_train_args with --max-steps as the resumed run has it.
    args = endless_train_args(corpus, straight, {"--total-steps", "100000"});
    *(std::find(args.begin(), args.end(), "--log-every") + 1) = "3";
    *(std::find(args.begin(), args.end(), "--max-steps") + 1) = until;
    Child whole(args, tmp / "whole.stderr");
    REQUIRE(whole.wait_exit(std::chrono::seconds(120)) == 0);
    const auto a = metrics_without_timing(straight), b = metrics_without_timing(out);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
    CHECK(same_weights_file(straight + "/model.safetensors", out + "/model.safetensors"));
}

TEST_CASE("train: a run killed during its final validation owes it: --resume validates and ends as the whole run",
          "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    const std::string straight = tmp / "straight", killed = tmp / "killed";
    tf::TrainConfig c = validated_config(corpus, straight, 3, 3);
    c.checkpoint_every = 2;
    c.max_steps = 4;
    train_quietly(c);

    // What a kill during the final validation at step 4 leaves: the checkpoint written at step 4 before it
    // (its last validation and best score those of step 3), and no metrics line of the final validation.
    fs::copy(straight, killed, fs::copy_options::recursive);
    const auto valid = of_type(read_metrics(straight), "valid");
    REQUIRE(valid.size() == 3);  // steps 0 (before training), 3 and 4
    rewrite_train_state(killed + "/" + checkpoint_name(4),
                        {{"valid_step", 3}, {"best_step", 3}, {"best_score", valid[1].at("valid_bleu")}});
    drop_last_metrics_line(killed, "valid");

    tf::TrainConfig resume = resume_config(killed);
    const std::string log = train_quietly(resume);
    CHECK_THAT(log, Catch::Contains("valid @ step 4") && !Catch::Contains("already reached"));
    const auto a = metrics_without_timing(straight), b = metrics_without_timing(killed);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
    CHECK(same_weights_file(straight + "/model.safetensors", killed + "/model.safetensors"));
    CHECK(read_state(killed).at("best_step") == read_state(straight).at("best_step"));

    // Now the run is complete: another --resume has nothing to do and changes nothing.
    const auto before = snapshot(killed);
    CHECK_THAT(train_quietly(resume), Catch::Contains("already reached its stopping rule at step 4"));
    CHECK(snapshot(killed) == before);
}

TEST_CASE("train: a run killed at an epoch's last batch, just after its checkpoint, ends the epoch when resumed",
          "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    tf::TrainConfig c = validated_config(corpus, tmp / "epoch", 0, 0);  // validation at the end of each epoch
    c.max_steps = 0;
    c.epochs = 1;
    train_quietly(c);
    const std::int64_t n = read_state(tmp / "epoch").at("step");  // batches per epoch

    const std::string straight = tmp / "straight", killed = tmp / "killed";
    c.out_dir = straight;
    c.epochs = 0;
    c.max_steps = n;  // stops at the epoch's last batch: the epoch ends, and is validated, all the same
    c.checkpoint_every = 1;
    train_quietly(c);
    const json saved = json::parse(
        tf::load_safetensors(straight + "/" + checkpoint_name(n)).metadata.at("tapeformer.train_state"));
    CHECK(saved.at("epoch") == 1);  // the checkpoint holds the end of the epoch and its validation
    CHECK(saved.at("valid_step") == n);

    // What a kill right after the checkpoint at step n, before the epoch ended, leaves.
    fs::copy(straight, killed, fs::copy_options::recursive);
    rewrite_train_state(killed + "/" + checkpoint_name(n),
                        {{"epoch", 0}, {"batch_in_epoch", n}, {"valid_step", -1}, {"best_step", -1}, {"best_score", 0}});
    drop_last_metrics_line(killed, "valid");
    tf::TrainConfig resume = resume_config(killed);
    train_quietly(resume);
    const auto a = metrics_without_timing(straight), b = metrics_without_timing(killed);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
    CHECK(same_weights_file(straight + "/model.safetensors", killed + "/model.safetensors"));
    CHECK(read_state(killed).at("best_step") == n);
}

TEST_CASE("train: a run killed before its first validation leaves a model that translate can use", "[train]") {
    Corpus corpus(100, 20);
    TempDir tmp;
    const std::string out = tmp / "run", err = tmp / "child.stderr";
    Child child(endless_train_args(corpus, out,
                                   {"--valid-src", corpus.valid_src, "--valid-tgt", corpus.valid_tgt, "--valid-every",
                                    "1000", "--checkpoint-every", "2"}),
                err);
    wait_for_steps(out, 3);  // the checkpoint at step 2 is complete; only step 0's loss-only validation has run
    REQUIRE(::kill(child.pid, SIGKILL) == 0);
    child.wait_exit(std::chrono::seconds(60));
    REQUIRE(!tf::checkpoints_on_disk(out).empty());
    CHECK(fs::exists(out + "/model.safetensors"));
    const std::string translate = "translate --model " + shell_quote(out) + " --input " + shell_quote(corpus.valid_src) +
                                  " --output " + shell_quote(tmp / "out.txt");
    const CliRun r = run_quiet(tmp, translate);
    INFO(r.err);
    CHECK(r.status == 0);

    SECTION("without model.safetensors (a run of an older version), translate uses the newest checkpoint") {
        fs::remove(out + "/model.safetensors");
        const CliRun fallback = run_quiet(tmp, translate);
        INFO(fallback.err);
        CHECK(fallback.status == 0);
        CHECK_THAT(fallback.err, Catch::Contains("note") && Catch::Contains(tf::checkpoints_on_disk(out).back()));
        CHECK(split_lines(read_all(tmp / "out.txt")).size() == 20);
    }
}

TEST_CASE("train: leftovers of killed writes are removed, a live writer's and a user's files stay", "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.max_steps = 2;
    c.checkpoint_every = 1;
    c.keep = 1;
    train_quietly(c);
    // A kill between state.json and pruning leaves an older checkpoint that state.json no longer lists.
    fs::copy_file(out + "/" + checkpoint_name(2), out + "/" + checkpoint_name(1));
    const std::string dead = std::to_string(dead_pid()), alive = std::to_string(::getppid());  // not ours: train() writes
    const std::string stale_checkpoint = out + "/" + checkpoint_name(3) + ".tmp." + dead;
    const std::string stale_state = out + "/state.json.tmp." + dead;
    const std::string live = out + "/model.safetensors.tmp." + alive;
    const std::string users = out + "/notes.txt.tmp." + dead;
    for (const auto& f : {stale_checkpoint, stale_state, live, users}) write_all(f, "partial");

    tf::TrainConfig resume = resume_config(out, 3);
    const std::string log = train_quietly(resume);
    CHECK_THAT(log, Catch::Contains("removed 2 temporary files"));
    CHECK(!fs::exists(stale_checkpoint));
    CHECK(!fs::exists(stale_state));
    CHECK(fs::exists(live));
    CHECK(fs::exists(users));
    CHECK(tf::checkpoints_on_disk(out) == std::vector<std::string>{checkpoint_name(3)});
}

TEST_CASE("train: --resume applies --keep, --checkpoint-every, --valid-every and --log-every, and names what it "
          "ignores", "[train]") {
    Corpus corpus(100);
    TempDir tmp;
    const auto straight = train_ok(tmp, tiny_flags(corpus, tmp / "straight") + " --max-steps 6", tmp / "straight", 6);
    const std::string out = tmp / "run";
    const std::string valid = " --valid-src " + shell_quote(corpus.valid_src) + " --valid-tgt " + shell_quote(corpus.valid_tgt);
    train_ok(tmp, tiny_flags(corpus, out) + valid + " --valid-every 100 --max-steps 2 --checkpoint-every 1", out, 2);

    const CliRun r = run_train(tmp, "--resume --max-steps 6 --log-every 2 --valid-every 2 --checkpoint-every 3 --keep 1"
                                    " --seed 9 --valid-bleu-sentences 5 --out " + shell_quote(out));
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("ignored: --seed --valid-bleu-sentences\n"));
    const auto logged = of_type(read_metrics(out), "train");
    REQUIRE(logged.size() == 4);
    CHECK(logged[2].at("step") == 4);
    CHECK(logged[3].at("step") == 6);
    CHECK(logged[3].at("grad_norm") == straight[5].at("grad_norm"));  // the same step 6: the seed did not change
    CHECK(tf::checkpoints_on_disk(out) == std::vector<std::string>{checkpoint_name(6)});  // --keep 1 at 3 and 6
    CHECK(read_state(out).at("kept") == json::array({checkpoint_name(6)}));
    std::vector<std::int64_t> validated;
    for (const json& v : of_type(read_metrics(out), "valid")) validated.push_back(v.at("step"));
    CHECK(validated == std::vector<std::int64_t>{0, 2, 4, 6});  // before training, the run's final one at 2, then --valid-every 2

    // The changes stay in run.json for later resumes; the settings that cannot change, and the stopping
    // rule (extended per call), are as they were.
    const json run = json::parse(read_all(out + "/run.json"));
    CHECK(run.at("every") == json({{"log", 2}, {"valid", 2}, {"checkpoint", 3}, {"keep", 1}, {"keep_every", 0}, {"heads", 0}}));
    CHECK(run.at("seed") == 1);
    CHECK(run.at("stop").at("max_steps") == 2);
    const std::string before = read_all(out + "/run.json");
    const CliRun again = run_train(tmp, "--resume --max-steps 7 --out " + shell_quote(out));
    INFO(again.err);
    CHECK(again.status == 0);
    CHECK(tf::checkpoints_on_disk(out) == std::vector<std::string>{checkpoint_name(7)});
    CHECK(read_all(out + "/run.json") == before);
}

TEST_CASE("train: non-finite --time-budget and --clip are refused, naming the flag, so is such a run.json",
          "[train]") {
    Corpus corpus(50);
    TempDir tmp;
    const std::string out = tmp / "run";
    for (const char* flag : {"--time-budget", "--clip", "--lr"}) {
        INFO(flag);
        const CliRun r = run_train(tmp, tiny_flags(corpus, out) + " --max-steps 2 " + flag + " inf");
        check_refused(r, flag);
        CHECK_THAT(r.err, Catch::Contains("finite"));
    }
    CHECK(!fs::exists(out));
    tf::TrainConfig c = tiny_config(corpus, out);
    c.optim.clip = std::numeric_limits<double>::infinity();
    CHECK_THAT(train_error(c), Catch::Contains("--clip must be a finite number"));

    // A run.json whose value was stored as null (by an older version), or edited out of range, is refused,
    // naming the file.
    train_ok(tmp, tiny_flags(corpus, out) + " --max-steps 1", out, 1);
    const json good = json::parse(read_all(out + "/run.json"));
    json run = good;
    run["stop"]["time_budget_minutes"] = nullptr;
    write_all(out + "/run.json", run.dump(2));
    check_refused(run_train(tmp, "--resume --max-steps 2 --out " + shell_quote(out)), out + "/run.json");
    run = good;
    run["every"]["checkpoint"] = 0;
    write_all(out + "/run.json", run.dump(2));
    const CliRun r = run_train(tmp, "--resume --max-steps 2 --out " + shell_quote(out));
    check_refused(r, out + "/run.json");
    CHECK_THAT(r.err, Catch::Contains("--checkpoint-every"));
}

TEST_CASE("train: a state.json naming files other than the run's checkpoints is refused and nothing is deleted",
          "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    train_ok(tmp, tiny_flags(corpus, out) + " --max-steps 2 --checkpoint-every 1", out, 2);
    write_all(tmp / "victim.txt", "precious\n");
    write_all(out + "/notes.txt", "mine\n");
    const std::string bad = GENERATE(std::string("../victim.txt"), std::string("notes.txt"),
                                     std::string("checkpoints/../../victim.txt"), std::string("/etc/passwd"));
    INFO(bad);
    json state = read_state(out);
    state["kept"] = json::array({bad, checkpoint_name(2)});
    write_all(out + "/state.json", state.dump(2));

    const CliRun r = run_train(tmp, "--resume --max-steps 4 --keep 1 --out " + shell_quote(out));
    check_refused(r, out + "/state.json");
    CHECK_THAT(r.err, Catch::Contains(bad));
    CHECK(read_all(tmp / "victim.txt") == "precious\n");
    CHECK(read_all(out + "/notes.txt") == "mine\n");
    CHECK(of_type(read_metrics(out), "train").size() == 2);
}

TEST_CASE("train: --log-heads-every writes heads.jsonl (the same after a resume), --keep-every keeps those checkpoints",
          "[train][heads]") {
    Corpus corpus(180, 20);
    TempDir tmp;
    tf::TrainConfig c = tiny_config(corpus, tmp / "straight");
    c.max_steps = 9;
    c.log_heads_every = 3;
    c.keep_every = 3;
    c.keep = 1;
    c.checkpoint_every = 2;
    train_quietly(c);
    const auto lines = split_lines(read_all(tmp / "straight" + "/heads.jsonl"));
    REQUIRE(lines.size() == 3);
    for (std::size_t i = 0; i < lines.size(); ++i) {
        const json j = json::parse(lines[i]);
        CHECK(j.at("step") == 3 * int(i + 1));
        CHECK_THAT(j.at("measured").get<std::string>(), Catch::Contains("dropout and label smoothing on"));
        REQUIRE(j.at("heads").size() == 6);  // E, D, A × 1 layer × 2 heads
        for (int layer = 0; layer < 3; ++layer) {  // importance normalised over each attention's 2 heads
            const double a = j.at("heads")[2 * layer].at("importance"), b = j.at("heads")[2 * layer + 1].at("importance");
            CHECK(a * a + b * b == Approx(1.0));
        }
        for (const auto& h : j.at("heads"))  // the signed inner product beside its absolute value
            CHECK(std::fabs(h.at("importance_signed_raw").get<double>()) == Approx(h.at("importance_raw").get<double>()));
        CHECK(j.at("heads")[0].at("entropy").get<double>() > 0);
    }
    // --keep 1 rotates the every-2 checkpoints; steps 3, 6 and 9 stay for good.
    for (int step : {3, 6, 9}) CHECK(fs::exists(tmp / "straight" + "/" + checkpoint_name(step)));
    for (int step : {2, 4, 8}) CHECK_FALSE(fs::exists(tmp / "straight" + "/" + checkpoint_name(step)));
    // Every command's --model takes such a checkpoint: its weights, with the run's tokenizers.
    const std::string step3 = tmp / "straight" + "/" + checkpoint_name(3);
    const tf::ModelBundle at3 = tf::load_model_dir(step3);
    CHECK(at3.dir == tmp / "straight");
    const tf::SafetensorsFile file = tf::load_safetensors(step3);
    for (const auto& p : at3.model->parameters()) {
        INFO(p.name);
        CHECK(p.tensor.to_vector() == file.tensors.at(p.name).values);
    }
    CHECK_THROWS_WITH(tf::load_model_dir(tmp / "straight" + "/run.json"), Catch::Contains("DIR/checkpoints/step-N.safetensors"));

    c.out_dir = tmp / "split";
    c.max_steps = 5;
    train_quietly(c);
    tf::TrainConfig resume = resume_config(tmp / "split", 9);
    train_quietly(resume);
    CHECK(read_all(tmp / "split" + "/heads.jsonl") == read_all(tmp / "straight" + "/heads.jsonl"));
}

// A watcher that records what the trainer asks and shows it: it watches every `every`-th step.
struct RecordingWatcher : tf::StepWatcher, tf::ForwardObserver {
    std::int64_t every;
    explicit RecordingWatcher(std::int64_t n) : every(n) {}
    std::vector<std::int64_t> asked, shown, shown_epochs;
    std::vector<std::int64_t> started;  // the run's max_steps at each start()
    std::int64_t probes = 0;            // probes heard since the last shown step
    std::vector<std::int64_t> probes_per_step;
    void start(const tf::TrainConfig& run) override { started.push_back(run.max_steps); }
    tf::ForwardObserver* observe(std::int64_t step) override {
        asked.push_back(step);
        probes = 0;
        return step % every == 0 ? this : nullptr;
    }
    void probe(const void*, const char*, const char*, const tf::Tensor&) override { ++probes; }
    void after_backward(const tf::WatchedStep& s) override {
        shown.push_back(s.step);
        shown_epochs.push_back(s.epoch);
        probes_per_step.push_back(probes);
        CHECK(s.report.tokens > 0);
        CHECK(s.batch.num_tgt_tokens == s.report.tokens);
        // After the backward, before the update: the gradients are there.
        bool any_grad = false;
        for (const auto& p : s.model.parameters()) any_grad = any_grad || p.tensor.has_grad();
        CHECK(any_grad);
    }
};

TEST_CASE("train: step watchers are asked before every step and shown exactly the steps they watch, the same "
          "after a resume, and change no number", "[train][heads]") {
    Corpus corpus(180, 20);
    TempDir tmp;
    tf::TrainConfig c = tiny_config(corpus, tmp / "watched");
    c.max_steps = 7;
    c.checkpoint_every = 3;
    RecordingWatcher thirds(3), halves(2);  // two at once: both hear steps 6's forward
    {
        ThreadsGuard threads;
        std::ostringstream log;
        tf::train(c, log, false, {&thirds, &halves});
    }
    CHECK(thirds.started == std::vector<std::int64_t>{7});
    CHECK(thirds.asked == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7});
    CHECK(thirds.shown == std::vector<std::int64_t>{3, 6});
    CHECK(halves.shown == std::vector<std::int64_t>{2, 4, 6});
    for (const auto& w : {&thirds, &halves}) {
        CHECK(w->shown_epochs.size() == w->shown.size());
        for (std::int64_t e : w->shown_epochs) CHECK(e >= 1);
        for (std::int64_t n : w->probes_per_step) CHECK(n > 0);  // its observer heard the forward
    }
    CHECK(thirds.probes_per_step[1] == halves.probes_per_step[2]);  // step 6: each heard every probe

    // Watching changes no number: the same losses as the unwatched run.
    c.out_dir = tmp / "plain";
    train_quietly(c);
    const auto watched = of_type(read_metrics(tmp / "watched"), "train"), plain = of_type(read_metrics(tmp / "plain"), "train");
    REQUIRE(watched.size() == 7);
    REQUIRE(plain.size() == 7);
    for (std::size_t i = 0; i < watched.size(); ++i) CHECK(watched[i].at("loss") == plain[i].at("loss"));

    // A resumed run asks from the step after its checkpoint on, with the run's settings (run.json's).
    c.out_dir = tmp / "split";
    c.max_steps = 4;  // checkpoints at 3 and at the end, 4
    train_quietly(c);
    tf::TrainConfig resume = resume_config(tmp / "split", 7);
    RecordingWatcher after(3);
    {
        ThreadsGuard threads;
        std::ostringstream log;
        tf::train(resume, log, false, {&after});
    }
    CHECK(after.started == std::vector<std::int64_t>{7});
    CHECK(after.asked == std::vector<std::int64_t>{5, 6, 7});
    CHECK(after.shown == std::vector<std::int64_t>{6});
}

// ---- integrity of what is loaded (issue 8, section 3) ------------------------------------------------------

TEST_CASE("train: validation pairs dropped by --max-len are counted and warned about, none left is an error",
          "[train]") {
    TempDir tmp;
    Corpus corpus(60, 10);
    auto src = toy_lines("valid.src", 10), tgt = toy_lines("valid.tgt", 10);
    std::string long_line;
    for (int i = 0; i < 25; ++i) long_line += "the cat ";  // 50 tokens > --max-len 40
    src[2] = long_line;
    tgt[7] = long_line;
    write_all(corpus.valid_src, join_lines(src));
    write_all(corpus.valid_tgt, join_lines(tgt));

    tf::TrainConfig c = validated_config(corpus, tmp / "run", 2, 0);
    c.max_steps = 2;
    const std::string log = train_quietly(c);
    CHECK_THAT(log, Catch::Contains("validation data: kept 8 of 10 pairs (skipped 0 empty pairs, filtered 2 over-long pairs)"));
    CHECK_THAT(log, Catch::Contains("warning: 2 validation pairs have more than --max-len 40 tokens"));
    CHECK_THAT(log, Catch::Contains("valid @ step 2"));

    // Every validation pair too long: validation could never run, so the run is refused before it writes.
    for (auto& line : src) line = long_line;
    write_all(corpus.valid_src, join_lines(src));
    c.out_dir = tmp / "all-long";
    CHECK_THAT(train_error(c), Catch::Contains("no validation pairs left from '" + corpus.valid_src + "'") &&
                                   Catch::Contains("filtered 10 over-long pairs"));
    CHECK_FALSE(fs::exists(tmp / "all-long/run.json"));
}

TEST_CASE("train: model and checkpoints carry the tokenizer's hash and a checksum over their metadata", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    tf::TrainConfig c = tiny_config(corpus, tmp / "run");
    c.max_steps = 2;
    c.checkpoint_every = 2;
    train_quietly(c);
    for (const std::string file : {"model.safetensors", "checkpoints/step-00000002.safetensors"}) {
        const tf::SafetensorsFile f = tf::load_safetensors(tmp / ("run/" + file));
        CHECK(f.metadata.at("tapeformer.tokenizer") == tf::tokenizer_hash(tf::TokenizerPair::load(tmp / "run")));
        CHECK(f.metadata.count(tf::kSafetensorsChecksumKey) == 1);
    }
    // A setting in the metadata edited in place (same length, so only the checksum can tell): refused.
    const std::string path = tmp / "run/model.safetensors";
    std::string bytes = read_all(path);
    const std::size_t at = bytes.find("\"heads\":\"2\"");
    REQUIRE(at != std::string::npos);
    bytes[at + 9] = '4';
    write_all(path, bytes);
    try {
        tf::load_model_dir(tmp / "run");
        FAIL("an edited header loaded");
    } catch (const std::runtime_error& e) {
        CHECK_THAT(e.what(), Catch::StartsWith(path + ": checksum mismatch"));
    }
}

// ---- signals in every phase (issue 8, section 4) -------------------------------------------------------------

TEST_CASE("train: Ctrl-C while the tokenizer trains ends the run before it writes, a second one aborts at once",
          "[train]") {
    // A corpus whose SentencePiece training takes seconds: random words, so every line adds new pieces.
    TempDir tmp;
    std::string text;
    std::uint32_t x = 12345;
    for (int line = 0; line < 1500; ++line) {
        for (int w = 0; w < 10; ++w) {
            const int len = 3 + static_cast<int>((x = x * 1664525u + 1013904223u) >> 29);
            for (int i = 0; i < len; ++i) text += static_cast<char>('a' + ((x = x * 1664525u + 1013904223u) >> 27) % 26);
            text += w < 9 ? ' ' : '\n';
        }
    }
    const std::string src = tmp / "train.src", tgt = tmp / "train.tgt", out = tmp / "run", err = tmp / "child.stderr";
    write_all(src, text);
    write_all(tgt, text);
    const std::vector<std::string> args = {TF_CLI, "--threads", "1", "train", "--train-src", src, "--train-tgt", tgt,
                                           "--tokenizer", "unigram", "--vocab-size", "1000", "--d-model", "16",
                                           "--heads", "2", "--ffn", "32", "--layers", "1", "--max-steps", "2",
                                           "--out", out};
    Child child(args, err);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (read_all(err).find("training a unigram tokenizer") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE_THAT(read_all(err), Catch::Contains("training a unigram tokenizer"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(::kill(child.pid, SIGINT) == 0);

    SECTION("one Ctrl-C: acknowledged, the tokenizer finishes, the run ends with 130 and writes nothing") {
        const int status = child.wait_exit(std::chrono::seconds(300));
        const std::string log = read_all(err);
        INFO("stderr: " << log);
        CHECK(status == 130);
        CHECK_THAT(log, Catch::Contains("interrupted; stopping at the next safe point"));
        CHECK_THAT(log, Catch::Contains("interrupted before training started; nothing was written"));
        CHECK_FALSE(fs::exists(out + "/run.json"));
        CHECK_FALSE(fs::exists(out + "/spm.model"));
    }
    SECTION("a second Ctrl-C ends the process at once, killed by the signal") {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const auto sent = std::chrono::steady_clock::now();
        REQUIRE(::kill(child.pid, SIGINT) == 0);
        int status = 0;
        pid_t done = 0;
        while ((done = ::waitpid(child.pid, &status, WNOHANG)) == 0 &&
               std::chrono::steady_clock::now() - sent < std::chrono::seconds(10))
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        REQUIRE(done == child.pid);
        child.pid = -1;
        CHECK(std::chrono::steady_clock::now() - sent < std::chrono::seconds(2));
        CHECK(WIFSIGNALED(status));
        CHECK(WTERMSIG(status) == SIGINT);
        CHECK_FALSE(fs::exists(out + "/run.json"));
    }
}

namespace {
// Polls `path` until it holds `marker` (a line the child prints as a phase begins); false after a minute.
bool wait_for_text(const std::string& path, const std::string& marker) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (read_all(path).find(marker) == std::string::npos) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}
}  // namespace

TEST_CASE("train: Ctrl-C during a validation or the final validation ends the run at once with 130, and --resume "
          "ends as the uninterrupted run", "[train]") {
    // 10000 validation pairs, BLEU on all: seconds of validation for a tiny model, so that a signal sent when
    // the child prints "validating at step 2" lands inside it on any machine.
    const std::string phase = GENERATE(std::string("a validation during training"), std::string("the final validation"));
    INFO(phase);
    TempDir tmp;
    const std::string src = tmp / "train.src", tgt = tmp / "train.tgt", vsrc = tmp / "valid.src", vtgt = tmp / "valid.tgt";
    write_all(src, join_lines(toy_lines("valid.src", 1000)));
    write_all(tgt, join_lines(toy_lines("valid.tgt", 1000)));
    write_all(vsrc, join_lines(toy_lines("train.src", 10000)));
    write_all(vtgt, join_lines(toy_lines("train.tgt", 10000)));
    // During training: validations at steps 2 and 4 (the final one). Final: one validation, at step 2.
    const std::vector<std::string> stop = phase == "the final validation"
                                              ? std::vector<std::string>{"--max-steps", "2", "--valid-every", "1000"}
                                              : std::vector<std::string>{"--max-steps", "4", "--valid-every", "2"};
    auto args = [&](const std::string& out) {
        std::vector<std::string> a = {TF_CLI, "--threads", "1", "train", "--train-src", src, "--train-tgt", tgt,
                                      "--valid-src", vsrc, "--valid-tgt", vtgt, "--tokenizer", "word", "--d-model", "32",
                                      "--heads", "2", "--ffn", "64", "--layers", "1", "--log-every", "1", "--out", out};
        a.insert(a.end(), stop.begin(), stop.end());
        return a;
    };
    const std::string out = tmp / "run", err = tmp / "child.stderr";
    Child child(args(out), err);
    REQUIRE(wait_for_text(err, "validating at step 2 "));

    SECTION("one Ctrl-C: acknowledged, the validation ends after its batch, the run exits 130 owing it") {
        REQUIRE(::kill(child.pid, SIGINT) == 0);
        const int status = child.wait_exit(std::chrono::seconds(120));
        const std::string log = read_all(err);
        INFO("stderr: " << log);
        CHECK(status == 130);
        CHECK_THAT(log, Catch::Contains("interrupted; stopping at the next safe point"));
        CHECK_THAT(log, Catch::Contains("validation at step 2 interrupted; a resumed run validates this step first"));
        CHECK_THAT(log, !Catch::Contains("valid @ step"));
        CHECK_THAT(log, Catch::Contains("interrupted at step 2; checkpoint saved"));
        const auto valid = of_type(read_metrics(out), "valid");
        REQUIRE(valid.size() == 1);  // only the one before training
        CHECK(valid[0].at("step") == 0);
        const json state = read_state(out);
        CHECK(state.at("step") == 2);
        CHECK(state.at("last") == checkpoint_name(2));

        // Resumed, it validates step 2 first and ends as the same run without the interruption.
        const std::string straight = tmp / "straight", straight_err = tmp / "straight.stderr";
        Child whole(args(straight), straight_err);
        REQUIRE(whole.wait_exit(std::chrono::seconds(300)) == 0);
        const CliRun resumed = run_train(tmp, "--resume --out " + shell_quote(out));
        INFO("resumed: " << resumed.err);
        CHECK(resumed.status == 0);
        const auto a = metrics_without_timing(straight), b = metrics_without_timing(out);
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
        CHECK(same_weights_file(straight + "/model.safetensors", out + "/model.safetensors"));
    }
    SECTION("a second signal ends the process at once, killed by it") {
        // Both signals pending while the child is stopped, so that no timing decides whether the second comes
        // before the run ends: whichever of the two (one handler) runs second finds the run already
        // interrupted and ends the process at once, killed by its own signal, before any checkpoint.
        REQUIRE(::kill(child.pid, SIGSTOP) == 0);
        REQUIRE(::kill(child.pid, SIGINT) == 0);
        REQUIRE(::kill(child.pid, SIGTERM) == 0);
        REQUIRE(::kill(child.pid, SIGCONT) == 0);
        int status = 0;
        REQUIRE(::waitpid(child.pid, &status, 0) == child.pid);
        child.pid = -1;
        INFO("stderr: " << read_all(err));
        CHECK(WIFSIGNALED(status));
        CHECK((WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM));
        CHECK_THAT(read_all(err), !Catch::Contains("checkpoint saved"));
        CHECK_FALSE(fs::exists(out + "/" + checkpoint_name(2)));
    }
}

TEST_CASE("train: --resume with tokenizer files other than the run's own is refused, naming the checkpoint",
          "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    tf::TrainConfig c = tiny_config(corpus, tmp / "run");
    c.max_steps = 2;
    c.checkpoint_every = 2;
    train_quietly(c);
    auto lines = split_lines(read_all(tmp / "run/vocab.txt"));
    REQUIRE(lines.size() > 6);
    std::swap(lines[4], lines[5]);  // same size: only the stored hash can tell
    write_all(tmp / "run/vocab.txt", join_lines(lines));
    tf::TrainConfig resumed = c;
    resumed.resume = true;
    resumed.max_steps = 4;
    CHECK_THAT(train_error(resumed),
               Catch::Contains(tmp / "run/checkpoints/step-00000002.safetensors") &&
                   Catch::Contains("tokenizer files (vocab.txt / spm.model) are not the ones this checkpoint was trained with"));
}

TEST_CASE("train: --resume with a stopping rule given as 0 lifts that rule (--epochs 0 --max-steps N runs on past the epoch)",
          "[train]") {
    Corpus corpus(80);
    TempDir tmp;
    const std::string out = tmp / "run";
    const CliRun first = run_train(tmp, tiny_flags(corpus, out) + " --epochs 1 --checkpoint-every 1000");
    INFO(first.err);
    REQUIRE(first.status == 0);
    const std::int64_t epoch_steps = read_state(out).at("step");
    REQUIRE(epoch_steps >= 1);

    SECTION("0 alone would leave no stopping rule: refused, nothing changed") {
        const std::string metrics = read_all(out + "/metrics.jsonl");
        check_refused(run_train(tmp, "--resume --epochs 0 --out " + shell_quote(out)), "no stopping rule");
        CHECK(read_all(out + "/metrics.jsonl") == metrics);
    }
    SECTION("with --max-steps beyond the epoch, training goes on to it") {
        const CliRun r = run_train(tmp, "--resume --epochs 0 --max-steps " + std::to_string(epoch_steps + 2) + " --out " +
                                            shell_quote(out));
        INFO(r.err);
        CHECK(r.status == 0);
        CHECK(read_state(out).at("step") == epoch_steps + 2);
        CHECK(of_type(read_metrics(out), "train").size() == static_cast<std::size_t>(epoch_steps + 2));
    }
}

TEST_CASE("train: with --ema, validation scores the weight average, model.safetensors and checkpoints hold it, and "
          "--resume continues it bit for bit",
          "[train]") {
    Corpus corpus(180, 20);
    TempDir tmp;
    const std::string straight = tmp / "straight", split = tmp / "split";
    tf::TrainConfig c = validated_config(corpus, straight, 4, 0);  // best = lowest validation loss
    c.checkpoint_every = 4;
    c.optim.ema = 0.9;
    c.max_steps = 8;
    const std::string log = train_quietly(c);
    CHECK_THAT(log, Catch::Contains("validates a weight average (ema 0.9)") && Catch::Contains("(weight average)"));
    for (const json& v : of_type(read_metrics(straight), "valid")) CHECK(v.at("weights") == "ema");

    // The checkpoint holds weights, optimizer state and the average (tied tables once: this model ties none).
    const tf::SafetensorsFile last = tf::load_safetensors(straight + "/" + checkpoint_name(8));
    std::size_t averaged = 0;
    for (const auto& [name, entry] : last.tensors)
        if (name.rfind("ema.", 0) == 0) {
            ++averaged;
            const std::string param = name.substr(4);
            REQUIRE(last.tensors.count(param) == 1);
            CHECK(entry.shape == last.tensors.at(param).shape);
        }
    CHECK(averaged == tf::Transformer(tf::load_model_dir(straight).model->config).parameters().size());

    // model.safetensors is the average at the best step, not that step's weights.
    const std::int64_t best = read_state(straight).at("best_step");
    REQUIRE((best == 4 || best == 8));
    const tf::SafetensorsFile at_best = tf::load_safetensors(straight + "/" + checkpoint_name(best));
    const tf::SafetensorsFile model = tf::load_safetensors(straight + "/model.safetensors");
    for (const auto& [name, entry] : model.tensors) {
        INFO(name);
        CHECK(entry.values == at_best.tensors.at("ema." + name).values);
        CHECK(entry.values != at_best.tensors.at(name).values);
    }
    // A checkpoint given to translate/eval/heads stands for the averaged weights, too.
    const tf::ModelBundle from_checkpoint = tf::load_model_dir(straight + "/" + checkpoint_name(best));
    for (const tf::NamedTensor& p : from_checkpoint.model->parameters()) {
        INFO(p.name);
        const auto& stored = at_best.tensors.at("ema." + p.name).values;
        CHECK(std::memcmp(stored.data(), p.tensor.data(), stored.size()) == 0);
    }

    // Stopped at step 4 and resumed: the same average, checkpoint and model, bit for bit.
    c.out_dir = split;
    c.max_steps = 4;
    train_quietly(c);
    tf::TrainConfig resume = resume_config(split, 8);
    train_quietly(resume);
    const tf::SafetensorsFile again = tf::load_safetensors(split + "/" + checkpoint_name(8));
    REQUIRE(again.tensors.size() == last.tensors.size());
    for (const auto& [name, entry] : last.tensors) {
        INFO(name);
        CHECK(entry.values == again.tensors.at(name).values);
    }
    CHECK(same_weights_file(straight + "/model.safetensors", split + "/model.safetensors"));

    SECTION("a checkpoint without the average that the run keeps (or the other way round) is refused") {
        json run = json::parse(read_all(split + "/run.json"));
        run["optim"]["ema"] = 0;
        write_all(split + "/run.json", run.dump());
        resume.max_steps = 12;
        CHECK_THAT(train_error(resume), Catch::Contains(checkpoint_name(8)) && Catch::Contains("holds a weight average"));
    }
}

// ---- a run's files belong to that run (issue 26, section 3) ---------------------------------------------------

namespace {

// Rewrites the metadata of a safetensors file with its checksum recomputed, as a program that knows the
// format could: only what the values are checked against can tell. An empty value erases the key.
void rewrite_metadata(const std::string& path, const std::map<std::string, std::string>& edits) {
    tf::SafetensorsFile file = tf::load_safetensors(path);
    std::vector<tf::NamedTensor> tensors;
    for (const auto& [name, entry] : file.tensors) tensors.push_back({name, file.tensor(name)});
    for (const auto& [key, value] : edits) {
        if (value.empty()) file.metadata.erase(key);
        else file.metadata[key] = value;
    }
    file.metadata.erase(tf::kSafetensorsChecksumKey);
    tf::save_safetensors(path, tensors, file.metadata, /*with_checksum=*/true);
}

// The training state of a checkpoint with `edits` (key -> JSON value) applied, checksum recomputed.
void rewrite_train_state(const std::string& path, const std::map<std::string, std::string>& edits) {
    json state = json::parse(tf::load_safetensors(path).metadata.at("tapeformer.train_state"));
    for (const auto& [key, value] : edits) state[key] = json::parse(value);
    rewrite_metadata(path, {{"tapeformer.train_state", state.dump()}});
}

void edit_run_json(const std::string& dir, const std::function<void(json&)>& edit) {
    json run = json::parse(read_all(dir + "/run.json"));
    edit(run);
    write_all(dir + "/run.json", run.dump(2) + "\n");
}

}  // namespace

TEST_CASE("train: each run has its own run id, in run.json, every checkpoint and the model, and records its data files",
          "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    tf::TrainConfig c = tiny_config(corpus, tmp / "a");
    c.max_steps = 2;
    c.checkpoint_every = 1;
    train_quietly(c);
    c.out_dir = tmp / "b";  // the same settings, another run
    train_quietly(c);
    const json a = json::parse(read_all(tmp / "a/run.json")), b = json::parse(read_all(tmp / "b/run.json"));
    const std::string id = a.at("run_id");
    CHECK(id.size() == 32);
    CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(b.at("run_id") != id);
    for (const std::string file : {"model.safetensors", "checkpoints/step-00000001.safetensors", "checkpoints/step-00000002.safetensors"}) {
        INFO(file);
        CHECK(tf::load_safetensors(tmp / ("a/" + file)).metadata.at("tapeformer.run_id") == id);
    }
    CHECK(tf::load_safetensors(tmp / "a/model.safetensors").metadata.at("tapeformer.step") == "2");
    const tf::ModelBundle model = tf::load_model_dir(tmp / "a");
    CHECK(model.stamp.run_id == id);
    CHECK(model.stamp.step == 2);
    // Data files by absolute path, with their size and CRC-32C, as they were at the start.
    CHECK(fs::path(a.at("data").at("train_src").get<std::string>()).is_absolute());
    const json& src = a.at("data_files").at("train_src");
    CHECK(src.at("path") == a.at("data").at("train_src"));
    CHECK(src.at("bytes") == fs::file_size(corpus.train_src));
    CHECK(src.at("crc32c").get<std::string>().rfind("crc32c:", 0) == 0);
    CHECK_FALSE(a.at("data_files").contains("valid_src"));
    // The checkpoint keeps run.json as it was.
    CHECK(json::parse(tf::load_safetensors(tmp / "a/checkpoints/step-00000002.safetensors").metadata.at("tapeformer.run")) == a);
}

TEST_CASE("train: --resume refuses a checkpoint of another run with the same settings, naming both runs", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    tf::TrainConfig c = tiny_config(corpus, tmp / "a");
    c.max_steps = 2;
    c.checkpoint_every = 1;
    train_quietly(c);
    c.out_dir = tmp / "b";
    train_quietly(c);
    const std::string last = tmp / ("a/" + checkpoint_name(2));
    fs::copy_file(tmp / ("b/" + checkpoint_name(2)), last, fs::copy_options::overwrite_existing);
    const std::string a_id = json::parse(read_all(tmp / "a/run.json")).at("run_id");
    const std::string b_id = json::parse(read_all(tmp / "b/run.json")).at("run_id");
    const std::string error = train_error(resume_config(tmp / "a", 4));
    CHECK_THAT(error, Catch::StartsWith(last + ": a checkpoint of another run (run id " + b_id) && Catch::Contains(a_id) &&
                          Catch::Contains("continues from " + checkpoint_name(1)));
    CHECK(read_state(tmp / "a").at("step") == 2);  // nothing trained on top
    // A checkpoint without a run id (of a version before run ids) in a run that has one: refused too.
    rewrite_metadata(last, {{"tapeformer.run_id", ""}});
    CHECK_THAT(train_error(resume_config(tmp / "a", 4)), Catch::Contains("a checkpoint of another run (no run id"));
    // Deleted, the run's own older checkpoint continues it.
    fs::remove(last);
    CHECK(train_error(resume_config(tmp / "a", 4)) == "");
    CHECK(read_state(tmp / "a").at("step") == 4);
}

TEST_CASE("train: --resume refuses a run.json edited after the start (seed, settings, data records), naming the setting",
          "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.max_steps = 2;
    train_quietly(c);
    const std::string run_json = read_all(out + "/run.json"), last = out + "/" + checkpoint_name(2);
    struct Edit {
        std::function<void(json&)> edit;
        std::string message;
    };
    const std::vector<Edit> edits = {
        {[](json& j) { j["seed"] = 6; }, out + "/run.json: seed (--seed) is 6, but " + last + " was trained with 5"},
        {[](json& j) { j["optim"]["label_smoothing"] = 0.2; }, "optim.label_smoothing (--label-smoothing) is 0.2, but"},
        {[](json& j) { j["data"]["max_len"] = 39; }, "data.max_len (--max-len) is 39, but"},
        {[](json& j) { j["data_files"]["train_src"]["crc32c"] = "crc32c:00000000"; },
         "not the file the run started with"},  // the files are checked against run.json first
    };
    for (const Edit& e : edits) {
        INFO(e.message);
        write_all(out + "/run.json", run_json);
        edit_run_json(out, e.edit);
        const std::string error = train_error(resume_config(out, 4));
        CHECK_THAT(error, Catch::Contains(e.message));
    }
    // Changes that decide nothing (where it stops, what it logs and keeps) are allowed, as flags or in run.json.
    write_all(out + "/run.json", run_json);
    edit_run_json(out, [](json& j) { j["every"]["log"] = 2; });
    CHECK(train_error(resume_config(out, 4)) == "");
    CHECK(read_state(out).at("step") == 4);
}

TEST_CASE("train: --resume refuses changed, shuffled or moved data files, naming the file, and a moved file named in run.json "
          "continues the run", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.max_steps = 2;
    train_quietly(c);
    const std::string original = read_all(corpus.train_src);
    SECTION("shuffled: two lines swapped, the same size") {
        auto lines = split_lines(original);
        std::swap(lines[0], lines[1]);
        write_all(corpus.train_src, join_lines(lines));
        REQUIRE(read_all(corpus.train_src).size() == original.size());
        CHECK_THAT(train_error(resume_config(out, 4)),
                   Catch::StartsWith(corpus.train_src + " (--train-src) is not the file the run started with") &&
                       Catch::Contains(std::to_string(original.size()) + " bytes"));
    }
    SECTION("changed: a line added") {
        write_all(corpus.train_tgt, read_all(corpus.train_tgt) + "one more line\n");
        CHECK_THAT(train_error(resume_config(out, 4)), Catch::StartsWith(corpus.train_tgt + " (--train-tgt) is not the file"));
    }
    SECTION("moved: named; set in run.json, the same bytes continue the run") {
        const std::string moved = tmp / "moved.src";
        fs::rename(corpus.train_src, moved);
        CHECK_THAT(train_error(resume_config(out, 4)),
                   Catch::Contains("the run's --train-src, " + corpus.train_src + ", is gone") && Catch::Contains("data.train_src"));
        edit_run_json(out, [&](json& j) { j["data"]["train_src"] = moved; });
        CHECK(train_error(resume_config(out, 4)) == "");
        CHECK(read_state(out).at("step") == 4);
    }
    SECTION("validation data added to run.json: not a file the run started with") {
        edit_run_json(out, [&](json& j) {
            j["data"]["valid_src"] = corpus.valid_src;
            j["data"]["valid_tgt"] = corpus.valid_tgt;
        });
        CHECK_THAT(train_error(resume_config(out, 4)), Catch::Contains("data.valid_src") && Catch::Contains("not a file the run started with"));
    }
    CHECK(of_type(read_metrics(out), "train").size() == (read_state(out).at("step") == 4 ? 4u : 2u));
}

TEST_CASE("train: --resume from another working directory reads the run's own data files (absolute paths in run.json)",
          "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    const std::string out = tmp / "run", elsewhere = tmp / "elsewhere";
    fs::create_directories(elsewhere);
    // Started with relative data paths from the corpus's directory.
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 train ";
    const std::string start = "cd " + shell_quote(fs::path(corpus.train_src).parent_path().string()) + " && " + cli +
                              "--train-src train.src --train-tgt train.tgt --tokenizer word --d-model 16 --heads 2 --ffn 32 "
                              "--layers 1 --batch-tokens 400 --max-len 40 --log-every 1 --no-valid-bleu --max-steps 2 --out " +
                              shell_quote(out) + " >/dev/null 2>&1";
    REQUIRE(std::system(start.c_str()) == 0);
    CHECK(json::parse(read_all(out + "/run.json")).at("data").at("train_src") == corpus.train_src);
    // A file of the same name in the other directory is not the run's.
    write_all(elsewhere + "/train.src", "something else\n");
    const std::string resume = "cd " + shell_quote(elsewhere) + " && " + cli + "--resume --max-steps 4 --out " + shell_quote(out) +
                               " >/dev/null 2>" + shell_quote(tmp / "err");
    const int status = std::system(resume.c_str());
    INFO(read_all(tmp / "err"));
    CHECK(status == 0);
    CHECK(of_type(read_metrics(out), "train").size() == 4);
}

TEST_CASE("train: --resume refuses a training state no run reaches (epoch 10^15, tokens, validations), although its "
          "checksum was recomputed", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.max_steps = 3;
    train_quietly(c);
    const std::string path = out + "/" + checkpoint_name(3), bytes = read_all(path);
    const json state = json::parse(tf::load_safetensors(path).metadata.at("tapeformer.train_state"));
    const std::int64_t epoch = state.at("epoch");
    struct Case {
        std::map<std::string, std::string> edits;
        std::string message;
    };
    const std::vector<Case> cases = {
        {{{"epoch", "1000000000000000"}}, "training state is malformed: epoch 1000000000000000 is past step 3"},
        {{{"epoch", std::to_string(epoch + 1)}}, "which this run does not reach"},
        {{{"target_tokens", "2"}}, "counts 2 target tokens in 3 steps"},
        {{{"target_tokens", "100000"}}, "counts 100000 target tokens in 3 steps of at most 400"},
        {{{"valid_step", "3"}}, "records a validation at step 3 (the run has no validation data)"},
        {{{"valid_step", "2"}, {"best_step", "3"}}, "best_step 3 is after the last validation, valid_step 2"},
        {{{"best_score", "1.5"}}, "has a best score without a validation"},
        {{{"log_window", R"({"loss": 1, "nll": 1, "seconds": 1e9, "tokens": 5, "steps": 1})"}}, "has a log window"},
    };
    for (const Case& k : cases) {
        INFO(k.message);
        write_all(path, bytes);
        rewrite_train_state(path, k.edits);
        CHECK_THAT(train_error(resume_config(out, 5)), Catch::StartsWith(path + ": ") && Catch::Contains(k.message));
    }
    write_all(path, bytes);
    CHECK(train_error(resume_config(out, 5)) == "");  // the state as written resumes
}

TEST_CASE("train: a run started before run ids resumes as before, unchecked, with a note", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    const std::string out = tmp / "run";
    tf::TrainConfig c = tiny_config(corpus, out);
    c.max_steps = 2;
    train_quietly(c);
    // What an older version wrote: no run id, no data records, no run.json in the checkpoint.
    edit_run_json(out, [](json& j) {
        j.erase("run_id");
        j.erase("data_files");
    });
    rewrite_metadata(out + "/" + checkpoint_name(2), {{"tapeformer.run_id", ""}, {"tapeformer.run", ""}});
    rewrite_metadata(out + "/model.safetensors", {{"tapeformer.run_id", ""}, {"tapeformer.step", ""}});
    CHECK(tf::load_model_dir(out).stamp.run_id.empty());  // translate and eval read it as before
    ThreadsGuard threads;
    std::ostringstream log;
    tf::train(resume_config(out, 4), log, false);
    CHECK_THAT(log.str(), Catch::Contains("started before runs had ids"));
    CHECK(read_state(out).at("step") == 4);
    CHECK_FALSE(json::parse(read_all(out + "/run.json")).contains("run_id"));  // it stays a run of no id
}

TEST_CASE("model directory: settings that set no tensor's shape are checked where they can be (special ids against the "
          "tokenizer, heads against d_model, max_len against a learned positional table)", "[train]") {
    TempDir tmp;
    Corpus corpus(60);
    tf::TrainConfig c = tiny_config(corpus, tmp / "run");
    c.max_steps = 1;
    c.model.positional = tf::PositionalKind::Learned;
    train_quietly(c);
    const std::string path = tmp / "run/model.safetensors", bytes = read_all(path);
    const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
        {{{"pad_id", "3"}}, "model setting pad_id is 3, but the tokenizer's <pad> is id 0"},
        {{{"bos_id", "2"}}, "model setting bos_id is 2, but the tokenizer's <s> is id 1"},
        {{{"eos_id", "1"}}, "model setting eos_id is 1, but the tokenizer's </s> is id 2"},
        {{{"heads", "3"}}, "d_model 16 is not divisible by heads 3"},
        {{{"max_len", "80"}}, "model setting max_len 80 does not fit tensor 'positional.weight'"},
    };
    for (const auto& [edits, message] : cases) {
        INFO(message);
        write_all(path, bytes);
        rewrite_metadata(path, edits);
        CHECK_THROWS_WITH(tf::load_model_dir(tmp / "run"), Catch::StartsWith(path + ": ") && Catch::Contains(message));
    }
    write_all(path, bytes);
    CHECK_NOTHROW(tf::load_model_dir(tmp / "run"));
}

// --accumulate 4 over 6 batches per epoch: steps 1, 3, 5 take batches 0-3 of an epoch, steps 2, 4 its
// last 2 (the epoch's shorter last global batch), so 5 steps cross two epoch boundaries. Stopping at step 3
// (inside an epoch) or at step 2 (at an epoch's end) and resuming to 5 must give the uninterrupted run's
// weights, optimizer moments and losses bit for bit; dropout is on (tiny_config), drawn per micro-batch.
TEST_CASE("train: --accumulate 4 resumed mid-run equals the uninterrupted run, bit for bit", "[train][accumulate]") {
    const std::int64_t stop_at = GENERATE(2, 3);
    INFO("stopped at step " << stop_at);
    Corpus corpus(180, 20);  // 6 batches per epoch
    TempDir tmp;
    const std::string straight = tmp / "straight", split = tmp / "split";
    tf::TrainConfig c = tiny_config(corpus, straight);
    c.optim.accumulate = 4;
    c.max_steps = 5;
    const std::string log = train_quietly(c);
    CHECK_THAT(log, Catch::Contains("6 batches per epoch"));

    c.out_dir = split;
    c.max_steps = stop_at;
    train_quietly(c);
    const auto stop =
        json::parse(tf::load_safetensors(split + "/" + checkpoint_name(stop_at)).metadata.at("tapeformer.train_state"));
    // Step 2 took the first epoch's last 2 batches and ended it; step 3 the second epoch's first 4.
    CHECK(stop.at("epoch") == 1);
    CHECK(stop.at("batch_in_epoch") == (stop_at == 3 ? 4 : 0));
    tf::TrainConfig resume = resume_config(split, 5);
    tf::TrainResult result;
    train_quietly(resume, &result);
    CHECK(result.steps == 5);

    const auto a = of_type(read_metrics(straight), "train"), b = of_type(read_metrics(split), "train");
    REQUIRE(a.size() == 5);
    REQUIRE(b.size() == 5);
    CHECK(a.back().at("epoch") == 3);  // steps 1-2 epoch 1, 3-4 epoch 2, 5 epoch 3
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i + 1);
        for (const char* key : {"step", "epoch", "loss", "nll", "lr", "grad_norm", "tokens_per_step"})
            CHECK(a[i].at(key).get<double>() == b[i].at(key).get<double>());
    }
    // A global batch of 4 batches holds more target tokens than one batch of the 400-token budget can.
    CHECK(a[0].at("tokens_per_step").get<double>() > 400);
    const tf::SafetensorsFile x = tf::load_safetensors(straight + "/" + checkpoint_name(5));
    const tf::SafetensorsFile y = tf::load_safetensors(split + "/" + checkpoint_name(5));
    REQUIRE(x.tensors.size() == y.tensors.size());
    for (const auto& [name, entry] : x.tensors) {
        INFO(name);
        REQUIRE(y.tensors.count(name) == 1);
        CHECK(entry.values == y.tensors.at(name).values);
    }
}
