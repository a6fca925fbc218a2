// When a loop is worth splitting across threads. Every kernel (ops, optimizers, decoding) asks the same
// question with the same threshold, so they all behave alike as the problem size grows.
#pragma once
#include <cstdint>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// Only parallelise loops with at least this many element operations: below it, waking the threads costs
// more than they save. Used as `#pragma omp parallel for if (work >= kParallelGrain)`.
constexpr std::int64_t kParallelGrain = 1 << 14;

TF_NAMESPACE_END
