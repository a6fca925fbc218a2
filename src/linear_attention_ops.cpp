// The two primitives linear attention (Katharopoulos et al. 2020, nn/attention.cpp) is composed from that
// the other ops do not give: its feature map φ(x) = elu(x) + 1, and the prefix sum along one axis that turns
// Σ_j φ(k_j) v_jᵀ into its causal form Σ_{j≤i}. Forward and backward side by side, as in ops.cpp.
#include "tapeformer/ops.h"

#include <cmath>
#include <string>

#include "ops_kernels.h"

TF_NAMESPACE_BEGIN

// ---- φ(x) = elu(x) + 1 ---------------------------------------------------------------------------------------

Tensor elu_plus_one(const Tensor& a) {
    // φ(x) = x + 1 for x > 0, eˣ otherwise: positive everywhere, so φ(q)·φ(k) > 0 and the normaliser never
    // vanishes; φ'(x) = 1 for x > 0, eˣ otherwise.
    return unary("elu_plus_one", a, [](real x) { return x > 0 ? x + real(1) : std::exp(x); },
                 [](real x) { return x > 0 ? real(1) : std::exp(x); });
}

// ---- prefix sums along an axis --------------------------------------------------------------------------------

Tensor cumsum(const Tensor& a, int axis) {
    require_defined("cumsum", a, "input");
    const int r = a.rank();
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) fail("cumsum", "axis " + std::to_string(axis) + " is outside a tensor of shape " + a.shape().str());
    // a seen as (outer, n, inner): y[o, t, i] = Σ_{s ≤ t} a[o, s, i]
    std::int64_t outer = 1, inner = 1;
    const std::int64_t n = a.size(axis);
    for (int d = 0; d < axis; ++d) outer *= a.size(d);
    for (int d = axis + 1; d < r; ++d) inner *= a.size(d);
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    real* y = out.data();
#pragma omp parallel for schedule(static) if (a.numel() >= kParallelGrain && outer > 1)
    for (std::int64_t o = 0; o < outer; ++o) {
        const std::int64_t base = o * n * inner;
        for (std::int64_t i = 0; i < inner; ++i) y[base + i] = x[base + i];
        for (std::int64_t t = 1; t < n; ++t)
            for (std::int64_t i = 0; i < inner; ++i)
                y[base + t * inner + i] = y[base + (t - 1) * inner + i] + x[base + t * inner + i];
    }
    if (!needs_grad({&a})) return out;
    // ∂L/∂a[o, s, i] = Σ_{t ≥ s} g[o, t, i]: the prefix sum's backward is the suffix sum of the gradient.
    return record("cumsum", out, {a}, [outer, n, inner](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        const GradTarget dst = in[0].grad_target();
#pragma omp parallel for schedule(static) if (y.numel() >= kParallelGrain && outer > 1)
        for (std::int64_t o = 0; o < outer; ++o) {
            std::vector<real> run(static_cast<std::size_t>(inner), real(0));
            const std::int64_t base = o * n * inner;
            for (std::int64_t t = n - 1; t >= 0; --t)
                for (std::int64_t i = 0; i < inner; ++i) {
                    run[i] += g[base + t * inner + i];
                    accumulate(dst, base + t * inner + i, run[i]);
                }
        }
    });
}

TF_NAMESPACE_END
