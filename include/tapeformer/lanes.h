// Row arithmetic that vectorises and gives the same bits on every run and thread count: exp_fast and the
// fixed-lane reductions lane_sum / lane_max. Shared by the ops (softmax, cross_entropy) and decoding's
// per-row log-sum-exp (src/decode.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// e^x as plain arithmetic, so that loops calling it vectorise (std::exp is a libm call, which GCC only
// vectorises under -ffast-math; the selects below vectorise without AVX-512 only under -fno-trapping-math,
// which CMakeLists.txt sets). float: x = n·ln2 + r with |r| ≤ ln2/2, e^r from the degree-6 polynomial of
// Cephes' expf, 2^n written into the exponent bits. Within 2 ulp of std::exp on [−87, 88], 0 below −87 (so
// e^−∞ = 0, as masked keys need); meant for x ≤ 88 (every caller passes x − max ≤ 0). The float64 build,
// which exists for exact gradient checks, keeps std::exp.
inline float exp_fast(float x) {
    const float shifter = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits
    const float xc = std::min(std::max(x, -87.0f), 88.0f);
    const float t = xc * 1.44269504088896341f + shifter;            // n = round(x / ln2), in t's low bits
    const float n = t - shifter;
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;   // x − n·ln2, ln2 in two parts (Cody–Waite)
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e_r = p * r * r + r + 1.0f;                         // e^r
    // Unsigned arithmetic: a NaN input (a diverged loss) gives garbage bits, which must not be undefined
    // behaviour; the result is NaN anyway through e_r.
    std::uint32_t bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23;  // minus the bits of `shifter` leaves n; + 127 is the exponent bias
    float two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.0f ? 0.0f : e_r * two_n;
}
[[maybe_unused]] inline double exp_fast(double x) { return std::exp(x); }

// Reductions along one row, kept in kLanes interleaved partial results that are combined at the end. The
// fixed-width inner loops vectorise (GCC does not reorder a plain floating-point sum by itself, and its
// `omp simd reduction` code for cross_entropy's long double-precision sums ran 5× slower), and the order of
// the additions — hence the result — is the same on every run and for every thread count.
constexpr std::int64_t kLanes = 16;

template <class F>
real lane_sum(std::int64_t n, F f) {  // Σ_j f(j) for j in [0, n)
    real part[kLanes] = {};
    std::int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (std::int64_t l = 0; l < kLanes; ++l) part[l] += f(j + l);
    real total = 0;
    for (std::int64_t l = 0; l < kLanes; ++l) total += part[l];
    for (; j < n; ++j) total += f(j);
    return total;
}

// Σ_j f(j) and Σ_j g(j) in one pass over the row: each sum's bits are lane_sum's. g(j) is called before
// f(j), so f may overwrite the value that g reads (cross_entropy keeps e^(x − max) over x).
template <class F, class G>
void lane_sum2(std::int64_t n, F f, G g, real& f_total, real& g_total) {
    real fpart[kLanes] = {}, gpart[kLanes] = {};
    std::int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (std::int64_t l = 0; l < kLanes; ++l) {
            gpart[l] += g(j + l);
            fpart[l] += f(j + l);
        }
    f_total = 0;
    g_total = 0;
    for (std::int64_t l = 0; l < kLanes; ++l) {
        f_total += fpart[l];
        g_total += gpart[l];
    }
    for (; j < n; ++j) {
        g_total += g(j);
        f_total += f(j);
    }
}

inline real lane_max(const real* x, std::int64_t n) {  // max_j x[j]; −∞ for n = 0
    real part[kLanes];
    std::fill(part, part + kLanes, -std::numeric_limits<real>::infinity());
    std::int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (std::int64_t l = 0; l < kLanes; ++l) part[l] = std::max(part[l], x[j + l]);
    real mx = part[0];
    for (std::int64_t l = 1; l < kLanes; ++l) mx = std::max(mx, part[l]);
    for (; j < n; ++j) mx = std::max(mx, x[j]);
    return mx;
}

TF_NAMESPACE_END
