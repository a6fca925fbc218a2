// Where outputs go and what a failed write does (io.h's rule, cli/commands.h's checks): a device, a FIFO
// or a link given as an output is written, never replaced; an output is never one of the command's inputs
// nor a file of its model directory; a dataset is replaced only with --force; and every command whose
// results cannot reach standard output (a full disk, a closed pipe) exits non-zero with the system's reason.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tapeformer/run/checkpoint.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/io.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

// `tapeformer <args>` with stdin from /dev/null and stdout to `out` (a shell redirection target).
Run run_redirected(const TempDir& tmp, const std::string& args, const std::string& out = "") {
    const std::string out_file = out.empty() ? tmp / "run.stdout" : out, err = tmp / "run.stderr";
    const std::string command = shell_quote(TF_CLI) + " --threads 1 " + args + " </dev/null >" + shell_quote(out_file) +
                                " 2>" + shell_quote(err);
    const int raw = std::system(command.c_str());
    Run r;
    r.status = (raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1;
    if (out.empty()) r.out = read_all(out_file);
    r.err = read_all(err);
    return r;
}

// `tapeformer <args>` with stdout a pipe whose reading end is already closed: every write fails (EPIPE).
Run run_cli_closed_pipe(const TempDir& tmp, const std::string& args) {
    const std::string err = tmp / "run.stderr";
    int p[2];
    REQUIRE(::pipe(p) == 0);
    ::close(p[0]);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(p[1], STDOUT_FILENO);
        ::close(p[1]);
        const std::string command = "exec " + shell_quote(TF_CLI) + " --threads 1 " + args + " </dev/null 2>" + shell_quote(err);
        ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(p[1]);
    int raw = 0;
    REQUIRE(::waitpid(pid, &raw, 0) == pid);
    Run r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.err = read_all(err);
    return r;
}

// A refused run: non-zero exit, one line on stderr containing `what`.
void check_refused(const Run& r, const std::string& what) {
    INFO("stderr: " << r.err);
    CHECK(r.status > 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains(what));
}

const std::vector<std::string> kSources = {"the dog sees a cat", "a big house", "a dog"};
const std::vector<std::string> kTargets = {"lo karo videt la kata", "la grando domo", "lo karo"};

// A tiny untrained model directory (model.safetensors and vocab.txt), and its sentences as files.
struct Model {
    TempDir tmp{"outputs"};
    std::string dir = tmp / "model", src = tmp / "src.txt", tgt = tmp / "tgt.txt";
    Model() {
        tf::TokenizerOptions options;
        options.kind = tf::TokenizerKind::word;
        options.joint = true;
        const tf::TokenizerPair tokenizers = tf::TokenizerPair::train(kSources, kTargets, options);
        tf::ModelConfig c;
        c.src_vocab = c.tgt_vocab = tokenizers.source->vocab_size();
        c.d_model = 8, c.heads = 2, c.ffn = 16, c.enc_layers = c.dec_layers = 1, c.max_len = 16;
        tf::Transformer model(c, /*seed=*/3);
        fs::create_directories(dir);
        tf::save_model_weights((fs::path(dir) / "model.safetensors").string(), model, tf::tokenizer_hash(tokenizers));
        tokenizers.save(dir);
        write_all(src, join_lines(kSources));
        write_all(tgt, join_lines(kTargets));
    }
    std::string m() const { return " --model " + shell_quote(dir); }
};

// A character device like /dev/null (1:3) at `path`; false where this process may not make one.
bool make_null_device(const std::string& path) { return ::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0; }

mode_t file_type(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 ? st.st_mode & S_IFMT : 0;
}

// Reads a FIFO to its end on another thread (opening it waits for the writer, as `cat fifo` would).
struct FifoReader {
    std::string got;
    std::thread thread;
    explicit FifoReader(const std::string& path)
        : thread([this, path] {
              const int fd = ::open(path.c_str(), O_RDONLY);
              if (fd < 0) return;
              char buffer[4096];
              for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) got.append(buffer, static_cast<std::size_t>(n));
              ::close(fd);
          }) {}
    std::string wait() {
        thread.join();
        return got;
    }
};

}  // namespace

// ---- io.h: the one rule every output obeys -------------------------------------------------------------------

TEST_CASE("outputs: a character device is written through, never replaced by a regular file", "[outputs][io]") {
    TempDir tmp;
    const std::string dev = tmp / "null";
    if (!make_null_device(dev)) {
        WARN("skipped: mknod of a character device is not permitted here (" << std::strerror(errno) << ")");
        return;
    }
    tf::write_file_atomic(dev, "into the device\n");
    CHECK(file_type(dev) == S_IFCHR);
    const Run r = run_redirected(tmp, "tape --dot " + shell_quote(dev));
    INFO("stderr: " << r.err);
    CHECK(r.status == 0);
    CHECK(file_type(dev) == S_IFCHR);
    for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("outputs: /dev/full as an output fails with the system's reason, and stays a device", "[outputs][io]") {
    CHECK_THROWS_WITH(tf::write_file_atomic("/dev/full", "x"), Catch::Contains("/dev/full") && Catch::Contains("No space left on device"));
    CHECK(file_type("/dev/full") == S_IFCHR);
    TempDir tmp;
    const Run r = run_redirected(tmp, "tape --dot /dev/full");
    check_refused(r, "No space left on device");
    CHECK(file_type("/dev/full") == S_IFCHR);
}

TEST_CASE("outputs: a FIFO is written through to its reader, never replaced", "[outputs][io]") {
    TempDir tmp;
    const std::string fifo = tmp / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    {
        FifoReader reader(fifo);
        tf::write_file_atomic(fifo, "through the pipe\n");
        CHECK(reader.wait() == "through the pipe\n");
    }
    CHECK(file_type(fifo) == S_IFIFO);
    FifoReader reader(fifo);
    const Run r = run_redirected(tmp, "tape --dot " + shell_quote(fifo));
    const std::string got = reader.wait();
    INFO("stderr: " << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(got, Catch::StartsWith("digraph"));
    CHECK(file_type(fifo) == S_IFIFO);
}

TEST_CASE("outputs: a symbolic link is followed, its target replaced atomically with its mode kept", "[outputs][io]") {
    TempDir tmp;
    fs::create_directories(tmp / "real");
    const std::string target = tmp / "real/out.dot", link = tmp / "link.dot";
    write_all(target, "old\n");
    REQUIRE(::chmod(target.c_str(), 0640) == 0);
    fs::create_symlink("real/out.dot", link);  // relative: resolved from the link's directory

    tf::write_file_atomic(link, "new\n");
    CHECK(file_type(link) == S_IFLNK);
    CHECK(read_all(target) == "new\n");
    struct stat st {};
    REQUIRE(::stat(target.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0640);
    CHECK(tf::output_target(link) == tmp / "real/out.dot");

    SECTION("through the CLI") {
        const Run r = run_redirected(tmp, "tape --dot " + shell_quote(link));
        INFO("stderr: " << r.err);
        CHECK(r.status == 0);
        CHECK(file_type(link) == S_IFLNK);
        CHECK_THAT(read_all(target), Catch::StartsWith("digraph"));
    }
    SECTION("a link to a missing file creates that file") {
        const std::string dangling = tmp / "dangling";
        fs::create_symlink(tmp / "real/new.txt", dangling);
        tf::write_file_atomic(dangling, "made\n");
        CHECK(file_type(dangling) == S_IFLNK);
        CHECK(read_all(tmp / "real/new.txt") == "made\n");
    }
    SECTION("a loop of links is refused") {
        fs::create_symlink(tmp / "b", tmp / "a");
        fs::create_symlink(tmp / "a", tmp / "b");
        CHECK_THROWS_WITH(tf::write_file_atomic(tmp / "a", "x"), Catch::Contains("symbolic links"));
    }
}

TEST_CASE("outputs: a directory or a socket is refused, '-' is standard output", "[outputs][io]") {
    TempDir tmp;
    CHECK_THROWS_WITH(tf::write_file_atomic(tmp.str(), "x"), Catch::Contains("directory"));
    const std::string sock = tmp / "sock";
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(sock.size() < sizeof addr.sun_path);
    std::strcpy(addr.sun_path, sock.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    CHECK_THROWS_WITH(tf::write_file_atomic(sock, "x"), Catch::Contains("socket"));
    check_refused(run_redirected(tmp, "tape --dot " + shell_quote(sock)), "socket");
    CHECK(file_type(sock) == S_IFSOCK);
    ::close(fd);

    const Run r = run_redirected(tmp, "tape --dot -");
    INFO("stderr: " << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::StartsWith("tape: ") && Catch::Contains("digraph"));
    CHECK(!fs::exists(tmp / "-"));

    // /dev/stdout on a pipe: a chain of links ending in "pipe:[N]", which only the kernel can follow.
    const std::string piped = tmp / "piped.txt";
    const std::string command = shell_quote(TF_CLI) + " --threads 1 tape --dot /dev/stdout 2>" + shell_quote(tmp / "err") +
                                " | cat >" + shell_quote(piped);
    REQUIRE(std::system(command.c_str()) == 0);
    INFO("stderr: " << read_all(tmp / "err"));
    CHECK(read_all(tmp / "err").empty());
    CHECK_THAT(read_all(piped), Catch::StartsWith("tape: ") && Catch::Contains("digraph"));
}

// ---- an output is never an input -----------------------------------------------------------------------------

TEST_CASE("outputs: an output may not replace an input or a file of the model directory", "[outputs][cli]") {
    Model f;
    const std::string weights = f.dir + "/model.safetensors", vocab = f.dir + "/vocab.txt";
    const std::string weights_before = read_all(weights), vocab_before = read_all(vocab), tgt_before = read_all(f.tgt);
    REQUIRE(!vocab_before.empty());
    const std::string link = f.tmp / "ref-link.txt";
    fs::create_symlink(f.tgt, link);
    const std::string hard = f.tmp / "ref-hard.txt";
    fs::create_hard_link(f.tgt, hard);

    // eval --output-hyp REF: the reference, under its own name, a link to it or a hard link of it.
    for (const std::string& out : {f.tgt, link, hard})
        check_refused(run_redirected(f.tmp, "eval" + f.m() + " --src " + shell_quote(f.src) + " --ref " + shell_quote(f.tgt) +
                                         " --output-hyp " + shell_quote(out)),
                      "is the input '" + f.tgt + "'");
    check_refused(run_redirected(f.tmp, "report" + f.m() + " --out " + shell_quote(weights)), "model.safetensors of the model directory");
    check_refused(run_redirected(f.tmp, "attention" + f.m() + " --src 'a dog' --html " + shell_quote(vocab)),
                  "vocab.txt of the model directory");
    check_refused(run_redirected(f.tmp, "translate" + f.m() + " --input " + shell_quote(f.src) + " --output " + shell_quote(f.src)),
                  "is the input");
    check_refused(run_redirected(f.tmp, "tape" + f.m() + " --src 'a dog' --tgt 'lo karo' --dot " + shell_quote(f.dir + "/run.json")),
                  "run.json of the model directory");
    check_refused(run_redirected(f.tmp, "heads ablate" + f.m() + " --src " + shell_quote(f.src) + " --ref " + shell_quote(f.tgt) +
                                     " --json " + shell_quote(f.src)),
                  "is the input");
    CHECK(read_all(weights) == weights_before);
    CHECK(read_all(vocab) == vocab_before);
    CHECK(read_all(f.tgt) == tgt_before);
    CHECK(read_all(f.src) == join_lines(kSources));

    // A file of the directory that training does not write is the user's to replace (report's default).
    const Run ok = run_redirected(f.tmp, "attention" + f.m() + " --src 'a dog' --tgt 'lo karo' --json " + shell_quote(f.dir + "/attention.json"));
    INFO("stderr: " << ok.err);
    CHECK(ok.status == 0);
}

TEST_CASE("outputs: average --out may not replace a model it averages", "[outputs][cli]") {
    Model f;
    const std::string weights = f.dir + "/model.safetensors", vocab = f.dir + "/vocab.txt";
    const std::string weights_before = read_all(weights), vocab_before = read_all(vocab);
    const std::string link = f.tmp / "model-link";
    fs::create_directory_symlink(f.dir, link);
    // A model directory (here one without run.json, as an earlier average is) among --checkpoints, as --out
    // under its own name or through a link: --force replaces an earlier average, never an input.
    for (const std::string& out : {f.dir, link})
        check_refused(run_redirected(f.tmp, "average --checkpoints " + shell_quote(f.dir) + " --out " + shell_quote(out) + " --force"),
                      "model.safetensors of the model directory '" + f.dir + "'");
    CHECK(read_all(weights) == weights_before);
    CHECK(read_all(vocab) == vocab_before);

    // Another directory is written.
    const std::string elsewhere = f.tmp / "avg";
    const Run ok = run_redirected(f.tmp, "average --checkpoints " + shell_quote(f.dir) + " --out " + shell_quote(elsewhere));
    INFO("stderr: " << ok.err);
    CHECK(ok.status == 0);
    CHECK(fs::exists(elsewhere + "/model.safetensors"));
}

TEST_CASE("outputs: data toy replaces an existing dataset only with --force", "[outputs][cli]") {
    TempDir tmp;
    const std::string dir = tmp / "toy";
    REQUIRE(run_redirected(tmp, "data toy --out " + shell_quote(dir) + " --train 5 --valid 2 --test 2").status == 0);
    const std::string before = read_all(dir + "/train.src");
    check_refused(run_redirected(tmp, "data toy --out " + shell_quote(dir) + " --train 7 --seed 2"), "already holds train.src");
    CHECK(read_all(dir + "/train.src") == before);
    check_refused(run_redirected(tmp, "data copy --out " + shell_quote(dir) + " --train 3"), "--force");
    CHECK(read_all(dir + "/train.src") == before);
    const Run forced = run_redirected(tmp, "data toy --out " + shell_quote(dir) + " --train 7 --valid 2 --test 2 --seed 2 --force");
    INFO("stderr: " << forced.err);
    CHECK(forced.status == 0);
    CHECK(split_lines(read_all(dir + "/train.src")).size() == 7);
}

// ---- every write failure is seen -----------------------------------------------------------------------------

TEST_CASE("outputs: every command that prints exits non-zero when standard output is full or a closed pipe", "[outputs][cli]") {
    Model f;
    const std::string s = shell_quote(f.src), t = shell_quote(f.tgt);
    const std::vector<std::string> commands = {
        "attention" + f.m() + " --src 'a dog' --tgt 'lo karo'",  // the JSON to stdout
        "summary --init",
        "tape",
        "explain --init 'a b c'",
        "heads" + f.m() + " --src " + s + " --tgt " + t + " --out " + shell_quote(f.tmp / "heads"),
        "heads ablate" + f.m() + " --src " + s + " --ref " + t,
        "gradcheck --list",
        "data toy --out " + shell_quote(f.tmp / "toy") + " --force",
        "data copy --out " + shell_quote(f.tmp / "copy") + " --force --train 3 --valid 1 --test 1",
        "translate" + f.m() + " --input " + s,
        "encode" + f.m() + " --input " + s,
        "eval" + f.m() + " --src " + s + " --ref " + t,
    };
    for (const std::string& command : commands) {
        INFO("tapeformer " << command);
        const Run full = run_redirected(f.tmp, command, "/dev/full");
        check_refused(full, "No space left on device");
        const Run closed = run_cli_closed_pipe(f.tmp, command);
        check_refused(closed, "Broken pipe");  // translate checks each piece as it streams, with the same words
    }
}
