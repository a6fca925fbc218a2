// The invariants of explain()'s stages (explain_checks.h).
#include "explain_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

StageCheck rows_sum_to_one(const Tensor& p, const char* what) {
    const std::int64_t N = p.shape().last(), R = p.shape().leading();
    double worst = 0;
    for (std::int64_t r = 0; r < R; ++r) {
        double s = 0;
        for (std::int64_t j = 0; j < N; ++j) s += p.data()[r * N + j];
        worst = std::max(worst, std::abs(s - 1));
    }
    return {std::string(what) + " sum to 1: max |sum - 1| = " + fmt("%.1e", worst), worst <= 1e-5};
}

StageCheck masked_weights_zero(const Tensor& w, const Tensor& mask) {
    const std::int64_t B = w.size(0), H = w.size(1), Tq = w.size(2), Tk = w.size(3);
    const std::int64_t mb = mask.size(0), mq = mask.size(2);
    std::int64_t masked = 0;
    double worst = 0;
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t q = 0; q < Tq; ++q)
                for (std::int64_t k = 0; k < Tk; ++k) {
                    const real m = mask.data()[((mb == 1 ? 0 : b) * mq + (mq == 1 ? 0 : q)) * Tk + k];
                    if (!std::isinf(m)) continue;
                    ++masked;
                    worst = std::max(worst, std::abs(double(w.data()[((b * H + h) * Tq + q) * Tk + k])));
                }
    return {"masked weights are exactly 0: " + std::to_string(masked) + " masked, max |weight| there = " +
                fmt("%g", worst),
            worst == 0};
}

StageCheck layer_norm_rows(const Tensor& y, const Tensor& gamma, const Tensor& beta) {
    const std::int64_t C = y.shape().last(), R = y.shape().leading();
    double worst_mean = 0, worst_var = 0;
    for (std::int64_t r = 0; r < R; ++r) {
        double s = 0, s2 = 0;
        std::int64_t n = 0;
        for (std::int64_t c = 0; c < C; ++c) {
            const double g = gamma.data()[c];
            if (g == 0) continue;  // a column LayerNorm multiplies by 0 says nothing about x̂
            const double xhat = (double(y.data()[r * C + c]) - double(beta.data()[c])) / g;
            s += xhat, s2 += xhat * xhat, ++n;
        }
        if (n == 0) continue;
        const double mean = s / double(n), var = s2 / double(n) - mean * mean;
        worst_mean = std::max(worst_mean, std::abs(mean));
        worst_var = std::max(worst_var, std::abs(var - 1));
    }
    return {"LayerNorm rows, (y - beta) / gamma: max |mean| = " + fmt("%.1e", worst_mean) + ", max |var - 1| = " +
                fmt("%.1e", worst_var),
            worst_mean <= 1e-3 && worst_var <= 2e-2};
}

StageCheck split_check(const Tensor& qkv, const std::vector<Tensor>& parts) {
    const std::int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2);
    bool same = true;
    for (std::size_t p = 0; p < parts.size(); ++p) {
        const Tensor& x = parts[p];
        const std::int64_t H = x.size(1), D = x.size(3), offset = std::int64_t(p) * H * D;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t t = 0; t < T; ++t)
                    for (std::int64_t d = 0; d < D; ++d)
                        same = same && x.data()[((b * H + h) * T + t) * D + d] == qkv.data()[(b * T + t) * W + offset + h * D + d];
    }
    return {"Q[b,h,t,d] = qkv[b,t,h*D+d] (and K, V from C and 2C): the split copies, computes nothing", same};
}

TF_NAMESPACE_END
