// A training run's directory (run_directory.h): its files, state.json, the lock, stale temporaries.
#include "run/run_directory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "run/json_integer.h"
#include "tapeformer/io.h"
#include "tapeformer/run/train.h"

TF_NAMESPACE_BEGIN

namespace fs = std::filesystem;

namespace {

// The files a training run writes in its directory, besides checkpoints/step-N.safetensors. --force deletes
// these and nothing else: a user's own files in the directory (or in checkpoints/) stay.
const char* const kRunFiles[] = {"run.json",  "config.toml",     "state.json",      "model.safetensors",
                                 "metrics.jsonl", "heads.jsonl", "vocab.txt", "spm.model", "src.vocab.txt",
                                 "src.spm.model", "tgt.vocab.txt", "tgt.spm.model"};
const char* kLockFile = "train.lock";

// A write_file_atomic temporary ("<file>.tmp.<pid>") of one of the run's files, and the pid; 0 otherwise.
pid_t temp_file_pid(const std::string& name, bool in_checkpoints) {
    const std::size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) return 0;
    const std::string base = name.substr(0, at), digits = name.substr(at + 5);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
    const bool ours = in_checkpoints ? checkpoint_step("checkpoints/" + base) >= 0
                                     : std::find_if(std::begin(kRunFiles), std::end(kRunFiles),
                                                    [&](const char* f) { return base == f; }) != std::end(kRunFiles);
    return ours ? static_cast<pid_t>(std::stol(digits)) : 0;
}

}  // namespace

void truncate_metrics(const std::string& path, std::int64_t step) {
    std::ifstream in(path);
    if (!in) return;
    std::string kept, line;
    while (std::getline(in, line)) {
        try {
            const auto j = nlohmann::json::parse(line);
            if (json_integer<std::int64_t>(j.at("step"), "step") <= step) kept += line + "\n";
        } catch (const std::exception&) {
            // a line cut short by a crash: drop it
        }
    }
    write_file_atomic(path, kept);
}

Manifest read_manifest(const std::string& dir) {
    const std::string path = (fs::path(dir) / "state.json").string();
    Manifest m;
    try {
        const auto j = nlohmann::json::parse(read_file(path));
        const int format = json_integer<int>(j.at("format"), "format");
        if (format != kCheckpointFormat)
            throw std::runtime_error("written by another version of tapeformer (format " + std::to_string(format) + ")");
        m.last = j.at("last").get<std::string>();
        m.kept = j.at("kept").get<std::vector<std::string>>();
        for (const std::string& name : m.kept)
            if (checkpoint_step(name) < 0)
                throw std::runtime_error("'" + name + "' is not a checkpoint name of a run (expected checkpoints/step-N.safetensors)");
        if (!m.last.empty() && checkpoint_step(m.last) < 0)
            throw std::runtime_error("'" + m.last + "' is not a checkpoint name of a run (expected checkpoints/step-N.safetensors)");
        if (!m.kept.empty() && m.last != m.kept.back())
            throw std::runtime_error("'last' is '" + m.last + "' but the newest kept checkpoint is '" + m.kept.back() + "'");
    } catch (const std::exception& e) {
        throw std::runtime_error(path + ": " + e.what() +
                                 " (delete it and --resume continues from the newest checkpoint on disk)");
    }
    return m;
}

void write_manifest(const std::string& dir, const Manifest& m, const TrainState& s) {
    nlohmann::json j = {{"format", kCheckpointFormat}, {"last", m.last}, {"kept", m.kept}, {"step", s.step},
                        {"best_step", s.best_step}, {"best_score", s.best_score}};
    write_file_atomic((fs::path(dir) / "state.json").string(), j.dump(2) + "\n");
}

bool holds_run(const std::string& dir) {
    std::error_code ec;
    for (const char* f : {"run.json", "state.json", "model.safetensors", "metrics.jsonl"})
        if (fs::exists(fs::path(dir) / f, ec)) return true;
    return !checkpoints_on_disk(dir).empty();
}

std::string first_run_file_in(const std::string& dir) {
    std::error_code ec;
    for (const char* f : kRunFiles)
        if (fs::exists(fs::path(dir) / f, ec)) return f;
    return "";
}

void remove_run_files(const std::string& dir) {
    std::error_code ec;
    for (const char* f : kRunFiles) fs::remove(fs::path(dir) / f, ec);
    for (const std::string& name : checkpoints_on_disk(dir)) fs::remove(fs::path(dir) / name, ec);
}

int remove_stale_temp_files(const std::string& dir) {
    int removed = 0;
    for (const bool in_checkpoints : {false, true}) {
        const fs::path where = in_checkpoints ? fs::path(dir) / "checkpoints" : fs::path(dir);
        std::error_code ec;
        std::vector<fs::path> stale;
        for (fs::directory_iterator it(where, ec), end; !ec && it != end; it.increment(ec)) {
            const pid_t pid = temp_file_pid(it->path().filename().string(), in_checkpoints);
            if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(it->path());
        }
        for (const fs::path& f : stale) removed += fs::remove(f, ec) ? 1 : 0;
    }
    return removed;
}

RunLock::~RunLock() {
    if (fd_ >= 0) ::close(fd_);
}

void RunLock::acquire(const std::string& dir) {
    const std::string path = (fs::path(dir) / kLockFile).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        ::close(fd);
        if (err != EWOULDBLOCK) throw std::runtime_error("cannot lock '" + path + "': " + std::strerror(err));
        std::string holder;
        try {
            holder = read_file(path);
        } catch (const std::exception&) {
        }
        while (!holder.empty() && std::isspace(static_cast<unsigned char>(holder.back()))) holder.pop_back();
        throw std::runtime_error("'" + dir + "' is in use by another tapeformer train (pid " +
                                 (holder.empty() ? std::string("unknown") : holder) + ", which holds " + path +
                                 "): wait for it to finish or stop it, or choose another --out");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        const int err = errno;
        ::close(fd);
        throw std::runtime_error("cannot write '" + path + "': " + std::strerror(err));
    }
    fd_ = fd;
}

bool is_run_file(const std::string& name) {
    return name == kLockFile || checkpoint_step(name) >= 0 ||
           std::find_if(std::begin(kRunFiles), std::end(kRunFiles), [&](const char* f) { return name == f; }) != std::end(kRunFiles);
}

TF_NAMESPACE_END
