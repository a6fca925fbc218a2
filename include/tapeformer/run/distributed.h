// The processes that train one model together: one process, or the R ranks of an MPI job
// (`mpirun -np R tapeformer train ...`). Training sees them only as a Communicator: who this process is,
// and the few collective calls data-parallel training needs. MPI stays in distributed.cpp; a build without
// it (TAPEFORMER_MPI off, or libopenmpi-dev missing) has the one-process communicator only.
//
// Every call below is collective: each rank of the job makes the same calls in the same order.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;  // 0 .. size() − 1; rank 0 alone writes the run's files
    virtual int size() const = 0;  // 1: one process, no MPI

    // Every rank's `count` values, concatenated in rank order, into `all` (size() · count values) on
    // every rank: rank q's values at all + q · count. Nothing is added, so nothing depends on the order
    // in which messages arrive.
    virtual void all_gather(const float* mine, std::int64_t count, float* all) = 0;
    virtual void all_gather(const double* mine, std::int64_t count, double* all) = 0;
    // Block q of `mine` (`count` values at mine + q · count) to rank q, for every q; from every rank s its
    // block for this rank, at all + s · count (size() · count values each way).
    virtual void all_to_all(const float* mine, std::int64_t count, float* all) = 0;
    // The smallest / largest of the ranks' values, on every rank.
    virtual std::int64_t min(std::int64_t value) = 0;
    virtual std::int64_t max(std::int64_t value) = 0;
    // Rank 0's value, on every rank.
    virtual std::int64_t from_rank0(std::int64_t value) = 0;
};

// The communicator of this process: the MPI job's world when mpirun (or another MPI launcher: the
// environment holds OMPI_COMM_WORLD_SIZE or PMI_SIZE) started it, MPI initialised on the first call
// (and finalised at exit); otherwise one process, and MPI never initialised. Throws std::runtime_error
// when a launcher started several ranks of a build without MPI.
Communicator& world();

// The seconds mpirun gives an MPI job's ranks between its SIGTERM and its SIGKILL when it ends the job (on
// Ctrl-C, say): OpenMPI's odls_base_sigkill_timeout as mpirun hands it to its ranks (OMPI_MCA_...; set by
// `mpirun --mca odls_base_sigkill_timeout N`), and its default, 1, when not given there.
double mpirun_kill_timeout_seconds();

// A job of several ranks whose ranks may still be waiting in a collective call: after an error that only
// this rank saw, end them all (MPI_Abort) instead of leaving them waiting. Returns where there is none, or
// when the ranks have agreed that the job ends (job_ends_on_every_rank).
void end_job_after_error(int exit_code);
// Every rank knows that the job ends (they agreed on a failure): each exits on its own, none aborts the others.
void job_ends_on_every_rank();

// What a rank throws when another rank could not start the run (it read a bad input): that rank
// reports the error; this one ends without a second message, non-zero.
struct AnotherRankFailed : std::runtime_error {
    explicit AnotherRankFailed(int failed_rank);
    int failed_rank;
};

TF_NAMESPACE_END
