// When a loop is worth splitting across threads. The elementwise and row-by-row kernels (ops, the
// optimizers' elementwise passes, decoding's rows) ask the same question with the same threshold, so they
// behave alike as the problem size grows. Not every parallel loop asks it: the matrix products decide in
// gemm_group (blas.cpp: any product of 2^18 multiply-adds and more, or a batch of small ones above this
// grain), bf16 rounding opens a region from 2^16 values, the optimizers split their parameter pieces when
// there are more than 8, and decoding runs its groups of sentences side by side whenever there are several.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// Only parallelise loops with at least this many element operations: below it, waking the threads costs
// more than they save. Used as `#pragma omp parallel for if (work >= kParallelGrain)`.
// A parallel region costs about 43 µs when the other threads sleep between regions (OMP_WAIT_POLICY=passive,
// and libgomp's default on these 2-core VMs behaves alike), about 1 µs when they spin; a pass over 2^16
// floats takes 10-40 µs on one core. At 2^14 the 64-row steps of greedy decoding opened 118 regions a step
// and spent 5 ms of 7 waking threads; at 2^17 they open 40, and a batch decodes in 111 ms instead of 145
// (AMD EPYC Zen 4, 2 threads, `bench train --steps 0 --eval-greedy`; commit 0cf2637), while a training step
// is unchanged.
constexpr std::int64_t kParallelGrain = 1 << 17;

// How many columns of a (rows, cols) matrix one thread sums down all the rows (a bias gradient from dy, in
// affine_backward's jobs and in bf16's rounding pass): a band a thread, at least 512 columns, a multiple of
// 16. Each column still adds its rows in order, so the sums do not depend on the width; wide bands let a
// thread stream long runs of each row, where 512-column bands of the output layer's (1280, 8000) dy took
// twice as long (bench/README.md, 2026-11-29).
inline std::int64_t column_band_width(std::int64_t cols) {
    const std::int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    return std::max<std::int64_t>(512, ((cols + threads - 1) / threads + 15) / 16 * 16);
}

TF_NAMESPACE_END
