// A training run's directory: which files are the run's, the manifest of its checkpoints (state.json), the
// lock that keeps a second run out, and the leftovers of killed writes. Private to run/: the trainer uses it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/run/checkpoint.h"

TF_NAMESPACE_BEGIN

// metrics.jsonl (or heads.jsonl): keeps only entries up to `step` (a resumed run continues from there).
void truncate_metrics(const std::string& path, std::int64_t step);

struct Manifest {
    std::string last;                // relative path of the newest checkpoint
    std::vector<std::string> kept;   // oldest first
};

// DIR/state.json. It names the files that pruning deletes, so it may name only this run's own
// checkpoints/step-N.safetensors: anything else (a path outside DIR, a user's file) is refused.
Manifest read_manifest(const std::string& dir);
void write_manifest(const std::string& dir, const Manifest& m, const TrainState& s);

// Whether DIR holds files that mark a run (run.json, state.json, the model, metrics, a checkpoint).
bool holds_run(const std::string& dir);
// The first file of a run's name in DIR (a user's vocab.txt or config.toml counts); "" when none.
std::string first_run_file_in(const std::string& dir);
// Deletes the run's files in DIR (--force), and nothing else: a user's own files stay.
void remove_run_files(const std::string& dir);
// A write killed half-way leaves its temporary file behind; removes those whose writer is gone.
// Returns how many were removed.
int remove_stale_temp_files(const std::string& dir);

// An exclusive flock on DIR/train.lock for as long as the run lives, holding the owner's pid: a second
// `train` into the same directory is refused instead of both writing the same checkpoints. The kernel
// drops the lock when the process dies, however it dies; the file stays (deleting it would race).
class RunLock {
public:
    RunLock() = default;
    RunLock(const RunLock&) = delete;
    RunLock& operator=(const RunLock&) = delete;
    ~RunLock();
    bool held() const { return fd_ >= 0; }
    void acquire(const std::string& dir);  // throws, naming the holder's pid, when another run holds it

private:
    int fd_ = -1;
};

TF_NAMESPACE_END
