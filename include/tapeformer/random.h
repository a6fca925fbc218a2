// Counter-based random numbers: value i of a stream is a hash of (seed, i), so any element can be drawn
// independently. Initialisation and dropout masks are therefore the same whatever the thread count or
// the order in which threads reach the elements, and the whole generator state is two integers, which a
// checkpoint stores for an exact resume.
#pragma once
#include <cstdint>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// SplitMix64 (Steele, Lea & Flood, 2014): a 64-bit counter advanced by the golden-ratio increment and
// pushed through this finaliser, a good 64-bit mix that is cheap enough to run per element.
constexpr std::uint64_t kSplitMix64Increment = 0x9E3779B97F4A7C15ULL;
inline std::uint64_t splitmix64_mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// SplitMix64 as a sequential generator: state += increment, then mix. Used where a plain stream of
// integers is all that is needed (the toy corpus generator).
class SplitMix64 {
public:
    explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
    std::uint64_t next() { return splitmix64_mix(state_ += kSplitMix64Increment); }

private:
    std::uint64_t state_;
};

// Value `counter` of stream `seed`: SplitMix64's finaliser applied to a mix of the two.
inline std::uint64_t hash64(std::uint64_t seed, std::uint64_t counter) {
    return splitmix64_mix(seed * kSplitMix64Increment + counter + 0x632BE59BD9B4E019ULL);
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
