// Counter-based random numbers: value i of a stream is a hash of (seed, i), so any element can be drawn
// independently. Initialisation and dropout masks are therefore the same whatever the thread count or
// the order in which threads reach the elements, and the whole generator state is two integers, which a
// checkpoint stores for an exact resume.
#pragma once
#include <cstdint>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// SplitMix64's finaliser applied to seed and counter: a good 64-bit mix, cheap enough per element.
inline std::uint64_t hash64(std::uint64_t seed, std::uint64_t counter) {
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + counter + 0x632BE59BD9B4E019ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 (double) or 24 (float) significant bits.
inline double uniform01(std::uint64_t seed, std::uint64_t counter) {
    return double(hash64(seed, counter) >> 11) * 0x1.0p-53;
}

// A stream: (seed, offset). Each draw of n values reserves counters [offset, offset + n).
struct Rng {
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;

    explicit Rng(std::uint64_t s = 0, std::uint64_t o = 0) : seed(s), offset(o) {}
    std::uint64_t reserve(std::uint64_t n) { std::uint64_t o = offset; offset += n; return o; }
    double uniform() { return uniform01(seed, offset++); }
    std::uint64_t below(std::uint64_t n) { return hash64(seed, offset++) % n; }  // slight modulo bias is harmless here
    double normal();  // standard normal (Box–Muller on two counters)
};

TF_NAMESPACE_END
