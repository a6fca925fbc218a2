// Ctrl-C and SIGTERM during a training run: the first ends the run at the next safe point, a second one at
// once. Private to run/: only the trainer installs it.
#pragma once
#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// The SIGINT or SIGTERM received since the current SignalScope was made; 0 when none.
int interrupt_signal();

// Installs the handler for the run, and makes sure it never runs on a thread that computes. oneDNN 2.x's JIT
// sgemm (jit_avx512_common_gemm_f32, behind some fp32 matmuls) points the stack pointer into a heap buffer
// while it runs, so a handler run on that thread writes its frame into the heap (oneDNN issue #4845, fixed
// in 3.x; Debian 12 has 2.6.3): 6 SIGTERMs in 300 during toy training runs ended in "corrupted size vs.
// prev_size" or a segfault. So the calling thread and every thread of its OpenMP team (`threads`) block
// SIGINT and SIGTERM (threads they start inherit that), and one thread that only waits, "tf-signals",
// takes them. The destructor restores the previous handlers and masks.
class SignalScope {
public:
    // announce: the first signal prints a one-line note on stderr (not on an MPI job's ranks but rank 0).
    explicit SignalScope(int threads, bool announce = true);
    ~SignalScope();
    SignalScope(const SignalScope&) = delete;
    SignalScope& operator=(const SignalScope&) = delete;

private:
    int threads_;
    sigset_t caller_mask_;
    void (*old_int_)(int) = SIG_DFL;
    void (*old_term_)(int) = SIG_DFL;
    std::mutex mutex_;
    std::condition_variable done_;
    bool finished_ = false;
    std::thread receiver_;
};

TF_NAMESPACE_END
