// Attention's cost against sequence length: the library side of `tapeformer bench attention`.
//
// One self-attention module (dot, linear or local, nn/attention.h) on random (B, T, C) input: the time of
// forward + backward of sum(out), and the most tensor memory (pool.h) that pass needed beyond what existed
// before it (input, weights and mask). For docs/lesson-efficient-attention.md.
#pragma once
#include <cstdint>
#include <string>

#include "tapeformer/config.h"
#include "tapeformer/nn/attention.h"

TF_NAMESPACE_BEGIN

struct BenchAttentionOptions {
    AttentionScore kind = AttentionScore::Dot;  // dot, linear or local (additive works too, slowly)
    std::int64_t length = 1024;  // T, positions of the sequence
    std::int64_t batch = 1;      // B
    std::int64_t d_model = 64;   // C
    std::int64_t heads = 4;      // H (D = C / H)
    std::int64_t window = 64;    // W, for local
    bool causal = true;          // the decoder's self-attention (causal mask); false: the encoder's (no mask)
    std::int64_t reps = 3;       // timed passes after one untimed; the median is reported
    std::uint64_t seed = 0;

    void validate() const;  // throws std::invalid_argument naming the flag
};

struct BenchAttentionResult {
    BenchAttentionOptions options;
    double ms_median = 0, ms_min = 0;  // forward + backward, wall clock
    double forward_ms_median = 0;      // forward alone
    double cpu_ms_median = 0;          // forward + backward, CPU time of the process (all threads)
    double peak_mb = 0;                // tensor memory a forward + backward needed beyond what existed before
    double mask_mb = 0;                // the mask given to the module (built before, not in peak_mb)
    std::string to_text() const;       // one line: kind, T, times, memory
};

BenchAttentionResult bench_attention(const BenchAttentionOptions& o);

TF_NAMESPACE_END
