// The ops only a head study uses: the Hard-Concrete gates of the L0 head-pruning study (heads_l0.cpp), one
// per attention head. Training, decoding and the other studies never call them.
#include "tapeformer/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ops_kernels.h"

TF_NAMESPACE_BEGIN

// ---- stochastic gates (L0 regularisation) ------------------------------------------------------------------

namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

void check_stretch(const char* op, real beta, real l, real r) {
    if (!(beta > 0) || !(l < 0) || !(r > 1))
        fail(op, "needs temperature > 0 and a stretch l < 0, r > 1, got temperature " + std::to_string(beta) + ", (" +
                     std::to_string(l) + ", " + std::to_string(r) + ")");
}

}  // namespace

Tensor hard_concrete(const Tensor& log_alpha, real beta, real l, real r, Rng& rng, bool training) {
    require_defined("hard_concrete", log_alpha, "log_alpha");
    check_stretch("hard_concrete", beta, l, r);
    const std::int64_t n = log_alpha.numel();
    const std::uint64_t seed = rng.seed, base = training ? rng.reserve(static_cast<std::uint64_t>(n)) : 0;
    Tensor out = Tensor::empty(log_alpha.shape());
    std::vector<real> dz(static_cast<std::size_t>(n));  // ∂z/∂log α, 0 where z is clamped to 0 or 1
    const real* a = log_alpha.data();
    for (std::int64_t i = 0; i < n; ++i) {
        // s = σ((ln u − ln(1 − u) + log α) / β) with u ~ U(0, 1) when training, s = σ(log α) otherwise
        double s, ds;
        if (training) {
            const double u = std::min(std::max(uniform01(seed, base + std::uint64_t(i)), 1e-12), 1 - 1e-12);
            s = sigmoid((std::log(u) - std::log1p(-u) + double(a[i])) / double(beta));
            ds = s * (1 - s) / double(beta);
        } else {
            s = sigmoid(double(a[i]));
            ds = s * (1 - s);
        }
        const double stretched = s * double(r - l) + double(l);  // s̄ = s (r − l) + l, then z = min(1, max(0, s̄))
        out.data()[i] = real(std::min(1.0, std::max(0.0, stretched)));
        dz[std::size_t(i)] = stretched > 0 && stretched < 1 ? real(ds * double(r - l)) : real(0);
    }
    if (!needs_grad({&log_alpha})) return out;
    return record("hard_concrete", out, {log_alpha}, [dz = std::move(dz)](Tensor& z, std::vector<Tensor>& in) {
        const real* g = z.grad();
        real* da = in[0].grad();
        for (std::size_t i = 0; i < dz.size(); ++i) da[i] += g[i] * dz[i];
    });
}

Tensor hard_concrete_open(const Tensor& log_alpha, real beta, real l, real r) {
    require_defined("hard_concrete_open", log_alpha, "log_alpha");
    check_stretch("hard_concrete_open", beta, l, r);
    // P(z > 0) = P(s̄ > 0) = σ(log α − β ln(−l / r))
    const double shift = double(beta) * std::log(-double(l) / double(r));
    const std::int64_t n = log_alpha.numel();
    Tensor out = Tensor::empty(log_alpha.shape());
    for (std::int64_t i = 0; i < n; ++i) out.data()[i] = real(sigmoid(double(log_alpha.data()[i]) - shift));
    if (!needs_grad({&log_alpha})) return out;
    return record("hard_concrete_open", out, {log_alpha}, [](Tensor& p, std::vector<Tensor>& in) {
        const real *g = p.grad(), *y = p.data();
        real* da = in[0].grad();
        for (std::int64_t i = 0; i < p.numel(); ++i) da[i] += g[i] * y[i] * (1 - y[i]);  // σ' = σ (1 − σ)
    });
}

TF_NAMESPACE_END
