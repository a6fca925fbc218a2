// A caching allocator for tensor buffers. Freed buffers are kept in free lists by (rounded) size and
// handed out again, so the second and later training steps allocate nothing from the system: the same
// shapes come back every step. Sizes are rounded up to at most 1/8 more, so batches of slightly
// different lengths share buffers.
#pragma once
#include <cstddef>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

real* pool_alloc(std::size_t n);              // n values, 64-byte aligned, uninitialised
void pool_free(real* p, std::size_t n);       // n: the count given to pool_alloc
void pool_release_cached();                   // return every cached (unused) buffer to the system

struct PoolStats {
    std::size_t bytes_in_use = 0;
    std::size_t bytes_cached = 0;
    std::size_t peak_bytes_in_use = 0;
    std::size_t system_allocations = 0;       // how often the pool had to ask the system
};
PoolStats pool_stats();

TF_NAMESPACE_END
