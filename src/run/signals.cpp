// The training run's signal handling (signals.h): a handler that only records the signal, and the one
// thread that receives it.
#include "run/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

TF_NAMESPACE_BEGIN

namespace {

// The first SIGINT/SIGTERM is acknowledged at once and ends the run at the next safe point (after the
// current step, or after the data preparation, tokenizer training or validation under way), with a
// checkpoint once training has started. A second one ends the process at once, as the signal would.
std::atomic<int> g_signal{0};
std::atomic<bool> g_announce{true};  // false on the ranks of an MPI job but rank 0: one note per job
extern "C" void on_signal(int sig) {
    if (g_signal.exchange(sig) != 0) {  // only async-signal-safe calls here
        std::signal(sig, SIG_DFL);
        std::raise(sig);
        return;
    }
    if (!g_announce.load()) return;
    static const char note[] = "\ntapeformer: interrupted; stopping at the next safe point (again to abort at once)\n";
    const ssize_t ignored = ::write(STDERR_FILENO, note, sizeof note - 1);
    (void)ignored;
}

sigset_t interrupt_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
}

}  // namespace

int interrupt_signal() { return g_signal.load(); }

SignalScope::SignalScope(int threads, bool announce) : threads_(threads) {
    g_signal.store(0);
    g_announce.store(announce);
    const sigset_t interrupts = interrupt_signals();
    pthread_sigmask(SIG_BLOCK, &interrupts, &caller_mask_);
#pragma omp parallel num_threads(threads_)
    pthread_sigmask(SIG_BLOCK, &interrupts, nullptr);
    old_int_ = std::signal(SIGINT, on_signal);
    old_term_ = std::signal(SIGTERM, on_signal);
    receiver_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "tf-signals");
        const sigset_t mine = interrupt_signals();
        pthread_sigmask(SIG_UNBLOCK, &mine, nullptr);
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [this] { return finished_; });
        pthread_sigmask(SIG_BLOCK, &mine, nullptr);  // one that comes now waits for the old handler
    });
}

SignalScope::~SignalScope() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        finished_ = true;
    }
    done_.notify_one();
    receiver_.join();
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
    const sigset_t interrupts = interrupt_signals();
#pragma omp parallel num_threads(threads_)
    pthread_sigmask(SIG_UNBLOCK, &interrupts, nullptr);
    pthread_sigmask(SIG_SETMASK, &caller_mask_, nullptr);  // a signal held back meanwhile arrives here
}

TF_NAMESPACE_END
