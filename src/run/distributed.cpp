// The communicators of distributed.h: one process, and (TAPEFORMER_MPI) the ranks of an MPI job. The only
// file that includes mpi.h.
#include "tapeformer/run/distributed.h"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "run/held_lines.h"

#ifdef TAPEFORMER_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: OpenMPI's C++ bindings, deprecated, do not compile warning-free
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

TF_NAMESPACE_BEGIN

AnotherRankFailed::AnotherRankFailed(int rank)
    : std::runtime_error("rank " + std::to_string(rank) + " could not start the run (its error is above)"), failed_rank(rank) {}

namespace {

// The number of ranks a launcher says it started, 0 when none did (a plain `tapeformer`).
int launched_ranks() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
        if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
    return 0;
}

class OneProcess : public Communicator {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void all_gather(const float* mine, std::int64_t count, float* all) override {
        std::memcpy(all, mine, std::size_t(count) * sizeof(float));
    }
    void all_gather(const double* mine, std::int64_t count, double* all) override {
        std::memcpy(all, mine, std::size_t(count) * sizeof(double));
    }
    void all_to_all(const float* mine, std::int64_t count, float* all) override {
        std::memcpy(all, mine, std::size_t(count) * sizeof(float));
    }
    std::int64_t min(std::int64_t value) override { return value; }
    std::int64_t max(std::int64_t value) override { return value; }
    std::int64_t from_rank0(std::int64_t value) override { return value; }
};

#ifdef TAPEFORMER_MPI
// The consoles of an MPI job's rank (HeldLines over stderr and stdout). Never freed: std::cerr and std::cout
// may still write and flush after static objects are destroyed.
HeldLines* console(int fd) {
    static HeldLines* const err = new HeldLines(STDERR_FILENO);
    static HeldLines* const out = new HeldLines(STDOUT_FILENO);
    return fd == STDERR_FILENO ? err : out;
}

// The lines still held go (or are counted) before the process ends.
void finish_lines() {
    console(STDOUT_FILENO)->finish();
    console(STDERR_FILENO)->finish();
}

// MPI_COMM_WORLD. Only this process's main thread calls MPI (OpenMP's threads never do): FUNNELED.
class MpiWorld : public Communicator {
public:
    MpiWorld() {
        int provided = 0;
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        if (size_ > 1) whole_lines();
        std::atexit([] {
            finish_lines();
            int finalized = 0;
            MPI_Finalized(&finalized);
            if (!finalized) MPI_Finalize();
        });
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void all_gather(const float* mine, std::int64_t count, float* all) override {
        MPI_Allgather(mine, int_count(count), MPI_FLOAT, all, int_count(count), MPI_FLOAT, MPI_COMM_WORLD);
    }
    void all_gather(const double* mine, std::int64_t count, double* all) override {
        MPI_Allgather(mine, int_count(count), MPI_DOUBLE, all, int_count(count), MPI_DOUBLE, MPI_COMM_WORLD);
    }
    void all_to_all(const float* mine, std::int64_t count, float* all) override {
        MPI_Alltoall(mine, int_count(count), MPI_FLOAT, all, int_count(count), MPI_FLOAT, MPI_COMM_WORLD);
    }
    std::int64_t min(std::int64_t value) override { return reduce(value, MPI_MIN); }
    std::int64_t max(std::int64_t value) override { return reduce(value, MPI_MAX); }
    std::int64_t from_rank0(std::int64_t value) override {
        MPI_Bcast(&value, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
        return value;
    }

private:
    // mpirun merges the ranks' output as it reads it: an unbuffered stderr sends a line in pieces (one write
    // per <<), and another rank's line can land between them. Line buffering hands each line over in one write;
    // std::cerr and std::cout hand theirs to HeldLines, which also keeps a rank from blocking on a pipe that
    // mpirun stopped reading (held_lines.h).
    static void whole_lines() {
        std::setvbuf(stderr, nullptr, _IOLBF, BUFSIZ);
        std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
        std::cerr.unsetf(std::ios::unitbuf);  // (unitbuf would flush after every <<)
        std::cerr.rdbuf(console(STDERR_FILENO));
        std::cout.rdbuf(console(STDOUT_FILENO));
    }

    static int int_count(std::int64_t count) {
        if (count > INT_MAX) throw std::logic_error("MPI: more than INT_MAX values in one call (bucket them)");
        return int(count);
    }
    static std::int64_t reduce(std::int64_t value, MPI_Op op) {
        std::int64_t out = 0;
        MPI_Allreduce(&value, &out, 1, MPI_INT64_T, op, MPI_COMM_WORLD);
        return out;
    }
    int rank_ = 0, size_ = 1;
};
#endif

std::unique_ptr<Communicator> make_world() {
    const int ranks = launched_ranks();
#ifdef TAPEFORMER_MPI
    if (ranks > 0) return std::make_unique<MpiWorld>();
#else
    if (ranks > 1)
        throw std::runtime_error("started as one of " + std::to_string(ranks) + " MPI ranks, but this tapeformer was built "
                                 "without MPI (install libopenmpi-dev and rebuild with -DTAPEFORMER_MPI=ON)");
#endif
    return std::make_unique<OneProcess>();
}

}  // namespace

Communicator& world() {
    static const std::unique_ptr<Communicator> w = make_world();
    return *w;
}

double mpirun_kill_timeout_seconds() {
    const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
    if (!v || !*v) return 1;
    char* end = nullptr;
    const double seconds = std::strtod(v, &end);
    return end != v && seconds >= 0 ? seconds : 1;
}

namespace {
bool ending_together = false;
}  // namespace

void job_ends_on_every_rank() { ending_together = true; }

void end_job_after_error(int exit_code) {
    if (ending_together) return;
#ifdef TAPEFORMER_MPI
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    int size = 1;
    if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) {
        finish_lines();
        MPI_Abort(MPI_COMM_WORLD, exit_code);
    }
#else
    (void)exit_code;
#endif
}

TF_NAMESPACE_END
