// A caching allocator for tensor buffers. Freed buffers are kept by size and handed out again, so the
// second and later training steps allocate (almost) nothing from the system. Sizes are rounded up to at
// most 1/8 more, and a request takes the smallest cached buffer up to twice its size, so batches of
// different lengths share buffers. What the pool holds, in use and cached, stays within the peak in use
// and a seventh of the swing below it (the peak minus the least in use since: what a training step
// allocates and frees): a request the cache cannot serve first gives the least recently freed buffers
// back to the system. Once it has given back a block of 2 MiB or more, later blocks that large are mapped in
// huge pages (where the kernel offers them), so that the ones a step keeps asking for cost few page faults.
#pragma once
#include <cstddef>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

real* pool_alloc(std::size_t n);              // n values, 64-byte aligned, uninitialised
void pool_free(real* p);                      // a buffer from pool_alloc (nullptr: nothing)
void pool_release_cached();                   // return every cached (unused) buffer to the system
void pool_reset_peak();                       // the peaks := what is in use now (and the cache's bound with it)
// For tests: while on, every buffer handed out is filled with NaN, so that code which reads a value it never
// wrote (an op that assumes a zeroed gradient buffer) shows up in its results.
void pool_poison(bool on);

struct PoolStats {
    std::size_t bytes_in_use = 0;             // capacities of the buffers handed out (≥ what was asked)
    std::size_t bytes_cached = 0;
    std::size_t peak_bytes_in_use = 0;
    // What the tensors asked for, without the rounding and the cache's larger buffers (a request may be served
    // by one up to twice its size): the memory a computation needs, whatever the cache held before it.
    std::size_t bytes_asked = 0;
    std::size_t peak_bytes_asked = 0;
    std::size_t system_allocations = 0;       // how often the pool had to ask the system
};
PoolStats pool_stats();

TF_NAMESPACE_END
