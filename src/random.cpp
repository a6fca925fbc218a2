// Counter-based random numbers. See random.h.
#include "tapeformer/random.h"

#include <cmath>

TF_NAMESPACE_BEGIN

double Rng::normal() {
    // Box–Muller: two uniforms give one normal; u1 in (0, 1] keeps the log finite.
    double u1 = 1.0 - uniform();
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

TF_NAMESPACE_END
