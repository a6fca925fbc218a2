// `tapeformer bench attention`: one self-attention's forward + backward, timed and its memory counted, for
// the lesson on efficient attention (docs/lesson-efficient-attention.md). The module is the model's own
// (nn/attention.h), run as training runs it (Pass::fuse_attention, so dot uses attention_heads; local uses
// band_attention, which computes only the (T, W) band).
#include "tapeformer/bench/attention_bench.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/nn/linear.h"
#include "tapeformer/ops.h"
#include "tapeformer/pool.h"
#include "tapeformer/random.h"

TF_NAMESPACE_BEGIN

void BenchAttentionOptions::validate() const {
    auto at_least = [](const char* flag, std::int64_t v, std::int64_t lo) {
        if (v < lo) throw std::invalid_argument(std::string(flag) + ": must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
    };
    at_least("--length", length, 1);
    at_least("--batch", batch, 1);
    at_least("--d-model", d_model, 1);
    at_least("--heads", heads, 1);
    at_least("--reps", reps, 1);
    if (d_model % heads != 0)
        throw std::invalid_argument("--d-model " + std::to_string(d_model) + " is not divisible by --heads " + std::to_string(heads));
    if (kind == AttentionScore::Local) at_least("--window", window, 1);
    if (length > 65536) throw std::invalid_argument("--length: at most 65536, got " + std::to_string(length));
}

namespace {
// CPU time of all threads: what the pass costs even where the wall clock is shared with other jobs.
double process_cpu_ms() {
    struct timespec ts {};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * double(ts.tv_sec) + 1e-6 * double(ts.tv_nsec);
}
}  // namespace

BenchAttentionResult bench_attention(const BenchAttentionOptions& o) {
    o.validate();
    using Clock = std::chrono::steady_clock;
    const std::int64_t B = o.batch, T = o.length, C = o.d_model;
    MultiHeadAttention attn(C, o.heads, real(0), o.kind, true, o.kind == AttentionScore::Local ? o.window : 0);
    Rng rng(o.seed);
    attn.init(rng);
    Tensor x = Tensor::empty({B, T, C});  // (B, T, C)
    init_normal(x, rng, 1.0);
    x.set_requires_grad(true);
    const Tensor mask = o.causal ? causal_mask(T) : Tensor();  // (1, 1, T, T) or none
    Pass pass;
    pass.fuse_attention = true;

    BenchAttentionResult res;
    res.options = o;
    res.mask_mb = mask.defined() ? double(mask.numel()) * sizeof(real) / (1024.0 * 1024.0) : 0;
    std::vector<double> total, forward, cpu;
    std::size_t peak = 0;
    for (std::int64_t rep = 0; rep <= o.reps; ++rep) {  // rep 0 untimed: the pool fills, caches warm
        pool_reset_peak();
        const std::size_t before = pool_stats().bytes_in_use;
        const double c0 = process_cpu_ms();
        const auto t0 = Clock::now();
        Tensor loss = sum_all(attn.forward(x, x, mask, pass));  // (B, T, C) -> ()
        const auto t1 = Clock::now();
        backward(loss);
        const auto t2 = Clock::now();
        const double c2 = process_cpu_ms();
        peak = std::max(peak, pool_stats().peak_bytes_in_use - before);
        if (rep == 0) continue;
        forward.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        total.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
        cpu.push_back(c2 - c0);
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    res.ms_median = median(total);
    res.ms_min = *std::min_element(total.begin(), total.end());
    res.forward_ms_median = median(forward);
    res.cpu_ms_median = median(cpu);
    res.peak_mb = double(peak) / (1024.0 * 1024.0);
    return res;
}

std::string BenchAttentionResult::to_text() const {
    char buf[360];
    std::snprintf(buf, sizeof buf,
                  "attention %s%s  T %lld  B %lld  C %lld  H %lld%s: forward+backward %.2f ms CPU, %.2f ms wall (medians of %lld; "
                  "wall min %.2f), forward %.2f ms wall, peak tensor memory %.1f MiB (+ mask %.1f MiB)",
                  to_string(options.kind), options.causal ? " causal" : "", static_cast<long long>(options.length),
                  static_cast<long long>(options.batch), static_cast<long long>(options.d_model),
                  static_cast<long long>(options.heads),
                  options.kind == AttentionScore::Local ? (" W " + std::to_string(options.window)).c_str() : "", cpu_ms_median, ms_median,
                  static_cast<long long>(options.reps), ms_min, forward_ms_median, peak_mb, mask_mb);
    return buf;
}

TF_NAMESPACE_END
