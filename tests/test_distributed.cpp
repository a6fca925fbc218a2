// Data-parallel training over MPI (distributed.h, train_step.h): `mpirun -np R tapeformer train --accumulate R`
// against one process with --accumulate R, weights and optimizer state compared bit for bit (dropout on);
// resuming with another number of ranks; a rank that cannot read its data; a rank killed mid-run. Each case
// runs the CLI under mpirun on loopback, one thread per rank; skipped where tapeformer is built without MPI.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tapeformer/run/checkpoint.h"
#include "tapeformer/safetensors.h"
#include "helpers.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace tf_test;

namespace {

// Whether this case cannot run here: tapeformer built without MPI, or mpirun missing.
bool mpi_missing() {
#ifdef TF_MPIRUN
    return tool_missing(TF_MPIRUN, "the MPI cases run tapeformer under mpirun (install openmpi-bin libopenmpi-dev)");
#else
    if (const char* required = std::getenv("TAPEFORMER_REQUIRE_TOOLS"); required && *required && std::string(required) != "0")
        FAIL("tapeformer was built without MPI, and TAPEFORMER_REQUIRE_TOOLS is set (scripts/test.sh): install libopenmpi-dev");
    skipped("tapeformer was built without MPI (install libopenmpi-dev openmpi-bin and reconfigure)");
    return true;
#endif
}

// `mpirun -np R` on this machine only: as root (CI), more ranks than cores allowed.
std::string mpirun(int ranks) {
#ifdef TF_MPIRUN
    return shell_quote(TF_MPIRUN) + " --oversubscribe --allow-run-as-root -np " + std::to_string(ranks) + " ";
#else
    (void)ranks;
    return "false ";
#endif
}

// The first 60 pairs of data/toy/valid in `dir`: with --batch-tokens 120, a few batches per epoch, so that
// a few steps cross an epoch's end and its shorter last global batch.
struct SmallCorpus {
    std::string src, tgt;
    explicit SmallCorpus(const TempDir& dir) {
        const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
        for (const char* side : {"src", "tgt"}) {
            const std::vector<std::string> lines = split_lines(read_all(toy + "valid." + side));
            const std::string path = dir / (std::string("small.") + side);
            write_all(path, join_lines(std::vector<std::string>(lines.begin(), lines.begin() + 60)));
            (std::string(side) == "src" ? src : tgt) = path;
        }
    }
};

// A tiny model with dropout on, validated every 3 steps (on rank 0), checkpointed every 2.
std::string train_flags(const SmallCorpus& data, int accumulate, int steps, const std::string& out) {
    return "train --train-src " + shell_quote(data.src) + " --train-tgt " + shell_quote(data.tgt) + " --valid-src " +
           shell_quote(data.src) + " --valid-tgt " + shell_quote(data.tgt) +
           " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --layers 1 --dropout 0.1 --batch-tokens 120"
           " --valid-every 3 --checkpoint-every 2 --log-every 1 --accumulate " +
           std::to_string(accumulate) + " --max-steps " + std::to_string(steps) + " --out " + shell_quote(out);
}

// How many times a job printed `text` (a message, a note), wherever mpirun's merging of the ranks' output
// put it: each rank hands over whole lines, but mpirun's stdout and stderr share the log.
std::size_t occurrences(const std::string& log, const std::string& text) {
    std::size_t count = 0;
    for (std::size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
    return count;
}

// Runs `command` in a shell; its exit status (−1: killed by a signal), its stdout and stderr in `log`.
int run(const std::string& command, const std::string& log) {
    const int raw = std::system((command + " >" + shell_quote(log) + " 2>&1").c_str());
    return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

std::string cli() { return shell_quote(TF_CLI) + " --threads 1 "; }

// Every tensor of two safetensors files (weights; in a checkpoint also the optimizer's moments) bit for bit.
void check_same_tensors(const std::string& a, const std::string& b) {
    INFO(a << " against " << b);
    const tf::SafetensorsFile x = tf::load_safetensors(a), y = tf::load_safetensors(b);
    REQUIRE(x.tensors.size() == y.tensors.size());
    for (const auto& [name, entry] : x.tensors) {
        INFO(name);
        REQUIRE(y.tensors.count(name) == 1);
        CHECK(entry.shape == y.tensors.at(name).shape);
        const std::vector<float>& u = entry.values;
        const std::vector<float>& v = y.tensors.at(name).values;
        REQUIRE(u.size() == v.size());
        CHECK(std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0);
    }
}

// The train lines of DIR/metrics.jsonl.
std::vector<json> train_lines(const std::string& dir) {
    std::vector<json> lines;
    for (const std::string& line : split_lines(read_all(dir + "/metrics.jsonl")))
        if (!line.empty() && json::parse(line).at("type") == "train") lines.push_back(json::parse(line));
    return lines;
}

}  // namespace

TEST_CASE("mpi: mpirun -np R train gives one process's --accumulate R weights, bit for bit", "[mpi][cli]") {
    if (mpi_missing()) return;
    const int R = GENERATE(2, 3);
    INFO(R << " ranks");
    TempDir tmp;
    const SmallCorpus data(tmp);
    const std::string one = tmp / "one", job = tmp / "job";
    const int steps = 7;
    REQUIRE(run(cli() + train_flags(data, R, steps, one), tmp / "one.log") == 0);
    const std::string log = read_all(tmp / "one.log");
    INFO(log);
    REQUIRE(run(mpirun(R) + cli() + train_flags(data, R, steps, job), tmp / "job.log") == 0);
    const std::string job_log = read_all(tmp / "job.log");
    INFO(job_log);
    CHECK_THAT(job_log, Catch::Contains("reduce") && Catch::Contains("ms/step"));
    CHECK_THAT(job_log, !Catch::Contains("odls_base_sigkill_timeout"));  // a toy step and checkpoint: well within 1 s
    check_same_tensors(one + "/" + tf::checkpoint_name(steps), job + "/" + tf::checkpoint_name(steps));
    check_same_tensors(one + "/model.safetensors", job + "/model.safetensors");
    const std::vector<json> a = train_lines(one), b = train_lines(job);
    REQUIRE(a.size() == std::size_t(steps));
    REQUIRE(b.size() == a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i + 1);
        for (const char* key : {"step", "epoch", "loss", "nll", "grad_norm", "tokens_per_step"})
            CHECK(a[i].at(key).get<double>() == b[i].at(key).get<double>());
        CHECK(b[i].contains("reduce_ms"));
    }
    CHECK(a.back().at("epoch").get<int>() > 1);  // the steps crossed an epoch's end (its shorter global batch)
}

TEST_CASE("mpi: a run of 2 ranks resumed by 1 process or 3 ranks equals the uninterrupted run, bit for bit", "[mpi][cli]") {
    if (mpi_missing()) return;
    const int resume_ranks = GENERATE(1, 3);
    INFO("resumed by " << resume_ranks);
    TempDir tmp;
    const SmallCorpus data(tmp);
    const std::string straight = tmp / "straight", split = tmp / "split";
    REQUIRE(run(cli() + train_flags(data, 3, 6, straight), tmp / "straight.log") == 0);
    // --accumulate 3 on 2 ranks: rank 0 computes micro-batches 0 and 2, rank 1 micro-batch 1.
    REQUIRE(run(mpirun(2) + cli() + train_flags(data, 3, 4, split), tmp / "split.log") == 0);
    // (--seed: a setting --resume ignores, which the job notes once, not once per rank)
    const std::string resume = cli() + "train --out " + shell_quote(split) + " --resume --max-steps 6 --seed 9";
    const int status = run(resume_ranks > 1 ? mpirun(resume_ranks) + resume : resume, tmp / "resume.log");
    const std::string resume_log = read_all(tmp / "resume.log");
    INFO(resume_log);
    REQUIRE(status == 0);
    CHECK(occurrences(resume_log, "ignored: --seed") == 1);
    check_same_tensors(straight + "/" + tf::checkpoint_name(6), split + "/" + tf::checkpoint_name(6));
}

TEST_CASE("mpi: a rank that cannot read its data ends the job with one message, before anything is written", "[mpi][cli]") {
    if (mpi_missing()) return;
    TempDir tmp;
    const SmallCorpus data(tmp);
    const std::string out = tmp / "run", missing = tmp / "missing.src";
    SmallCorpus gone = data;
    gone.src = missing;
    // MPMD: rank 0 reads the data, rank 1 is given a file that is not there.
    const std::string command = mpirun(1) + cli() + train_flags(data, 2, 4, out) + " : -np 1 " + cli() + train_flags(gone, 2, 4, out);
    const int status = run(command, tmp / "job.log");
    const std::string log = read_all(tmp / "job.log");
    INFO(log);
    CHECK(status != 0);
    CHECK(occurrences(log, "tapeformer: error:") == 1);
    CHECK_THAT(log, Catch::Contains("missing.src"));
    CHECK_FALSE(fs::exists(out));  // rank 0 read its inputs, but wrote nothing
}

TEST_CASE("mpi: --accumulate below the number of ranks is refused, with one message", "[mpi][cli]") {
    if (mpi_missing()) return;
    TempDir tmp;
    const SmallCorpus data(tmp);
    const int status = run(mpirun(2) + cli() + train_flags(data, 1, 4, tmp / "run"), tmp / "job.log");
    const std::string log = read_all(tmp / "job.log");
    INFO(log);
    CHECK(status != 0);
    CHECK_THAT(log, Catch::Contains("--accumulate 1 under mpirun -np 2"));
    CHECK(occurrences(log, "tapeformer: error:") == 1);
}

namespace {

// The processes whose parent is `parent`.
std::vector<pid_t> children_of(pid_t parent) {
    std::vector<pid_t> out;
    for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat(entry.path() / "stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        // pid (comm) state ppid ...: the command may hold spaces, so read after its closing parenthesis.
        std::istringstream rest(line.substr(line.rfind(')') + 2));
        char state;
        pid_t ppid = 0;
        if (rest >> state >> ppid && ppid == parent) out.push_back(pid_t(std::stol(name)));
    }
    return out;
}

// The MPI rank of process `pid` (from its environment), −1 when it has none.
int rank_of(pid_t pid) {
    const std::string env = read_all("/proc/" + std::to_string(pid) + "/environ");
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    for (std::size_t at = 0; at < env.size(); at = env.find('\0', at) + 1) {
        if (env.compare(at, key.size(), key) == 0) return std::atoi(env.c_str() + at + key.size());
        if (env.find('\0', at) == std::string::npos) break;
    }
    return -1;
}

}  // namespace

namespace {

// A job of 2 ranks training in the background for at most a minute (--time-budget 1) into tmp/run, once it
// has written two checkpoints; whatever happens, nothing of it outlives the case. `mpirun_options` go to mpirun.
struct BackgroundJob {
    pid_t job = -1;  // mpirun
    std::string out;
    BackgroundJob(const TempDir& tmp, const SmallCorpus& data, const std::string& mpirun_options = "") : out(tmp / "run") {
        const std::string command =
            mpirun(2) + mpirun_options + " " + cli() + train_flags(data, 2, 1000000, out) + " --time-budget 1";
        const std::string launch = "(" + command + " >" + shell_quote(tmp / "job.log") + " 2>&1 & echo $! >" +
                                   shell_quote(tmp / "pid") + ")";
        REQUIRE(std::system(launch.c_str()) == 0);
        job = pid_t(std::stol(read_all(tmp / "pid")));
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (tf::checkpoints_on_disk(out).size() < 2 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        REQUIRE(tf::checkpoints_on_disk(out).size() >= 2);
    }
    ~BackgroundJob() {
        for (pid_t child : children_of(job)) ::kill(child, SIGKILL);
        ::kill(job, SIGKILL);
    }
    bool ended_within(int seconds) const {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
        while (::kill(job, 0) == 0 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return ::kill(job, 0) != 0;
    }
};

}  // namespace

// After Ctrl-C, mpirun (OpenMPI 4.1) sleeps odls_base_sigkill_timeout seconds without reading the ranks'
// output, sends SIGTERM, sleeps as long again and sends SIGKILL (README). The ranks log a line a step and
// fill their pipes within the first sleep: they go on training all the same (run/held_lines.h), stop at
// the SIGTERM, and rank 0 saves within the second sleep — 5 s here, so that a loaded machine's slow write
// is not what the case measures.
TEST_CASE("mpi: Ctrl-C on mpirun stops every rank at one step, rank 0 saves, and the run resumes", "[mpi][cli]") {
    if (mpi_missing()) return;
    TempDir tmp;
    const SmallCorpus data(tmp);
    const BackgroundJob background(tmp, data, "--mca odls_base_sigkill_timeout 5");
    REQUIRE(::kill(background.job, SIGINT) == 0);
    CHECK(background.ended_within(30));
    const std::string log = read_all(tmp / "job.log");
    INFO(log);
    const std::string said = "interrupted at step ";
    const std::size_t at = log.find(said);
    REQUIRE(at != std::string::npos);
    CHECK_THAT(log.substr(at), Catch::Contains("checkpoint saved. Resume with"));
    const std::vector<std::string> kept = tf::checkpoints_on_disk(background.out);
    REQUIRE_FALSE(kept.empty());
    CHECK(kept.back() == tf::checkpoint_name(std::stoll(log.substr(at + said.size()))));  // saved at that step
    const std::int64_t last = tf::checkpoint_step(kept.back());
    const int status = run(cli() + "train --out " + shell_quote(background.out) + " --resume --max-steps " +
                               std::to_string(last + 2) + " --time-budget 0",
                           tmp / "resume.log");
    INFO(read_all(tmp / "resume.log"));
    CHECK(status == 0);
    CHECK_THAT(read_all(tmp / "resume.log"), Catch::Contains("resuming from") && Catch::Contains(kept.back()));
}

TEST_CASE("mpi: rank 0 says once when mpirun's kill timeout leaves Ctrl-C no time to save", "[mpi][cli]") {
    if (mpi_missing()) return;
    TempDir tmp;
    const SmallCorpus data(tmp);
    // A timeout of 0 s: no step and checkpoint fit in it. (It matters to mpirun only when it ends a job.)
    REQUIRE(run(mpirun(2) + "--mca odls_base_sigkill_timeout 0 " + cli() + train_flags(data, 2, 6, tmp / "job"),
                tmp / "job.log") == 0);
    const std::string log = read_all(tmp / "job.log");
    INFO(log);
    CHECK(occurrences(log, "note: on Ctrl-C mpirun gives the ranks odls_base_sigkill_timeout = 0 s") == 1);
    CHECK_THAT(log, Catch::Contains("start mpirun with --mca odls_base_sigkill_timeout 5"));
}

TEST_CASE("mpi: kill -9 of one rank ends the job, and the last complete checkpoint resumes", "[mpi][cli]") {
    if (mpi_missing()) return;
    TempDir tmp;
    const SmallCorpus data(tmp);
    const BackgroundJob background(tmp, data);
    const pid_t job = background.job;
    const std::string out = background.out;
    pid_t rank1 = -1;
    for (pid_t child : children_of(job))
        if (rank_of(child) == 1) rank1 = child;
    REQUIRE(rank1 > 0);
    REQUIRE(::kill(rank1, SIGKILL) == 0);
    CHECK(background.ended_within(30));  // mpirun ended the whole job
    INFO(read_all(tmp / "job.log"));
    // One process continues from the last complete checkpoint, two steps further.
    const std::vector<std::string> kept = tf::checkpoints_on_disk(out);
    REQUIRE_FALSE(kept.empty());
    const std::int64_t last = tf::checkpoint_step(kept.back());
    const int status = run(cli() + "train --out " + shell_quote(out) + " --resume --max-steps " + std::to_string(last + 4) +
                               " --time-budget 0",
                           tmp / "resume.log");
    INFO(read_all(tmp / "resume.log"));
    CHECK(status == 0);
    CHECK(tf::checkpoints_on_disk(out).back() == tf::checkpoint_name(last + 4));
}
