// Finite-difference gradient checks and the suite of primitive-op checks behind `tapeformer gradcheck`.
#include "tapeformer/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include "tapeformer/autograd.h"
#include "tapeformer/gradcheck_cli.h"
#include "tapeformer/ops.h"
#include "tapeformer/random.h"

TF_NAMESPACE_BEGIN

Tensor random_tensor(const Shape& shape, std::uint64_t seed, double lo, double hi, bool requires_grad) {
    Tensor t = Tensor::empty(shape);
    real* p = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = real(lo + (hi - lo) * uniform01(seed, std::uint64_t(i)));
    t.set_requires_grad(requires_grad);
    return t;
}

namespace {

// L = Σ_i y_i r_i, evaluated without recording.
double projected(const GradcheckFn& f, const std::vector<Tensor>& inputs, const std::vector<double>& r) {
    NoGradGuard no_grad;
    Tensor y = f(inputs);
    const real* p = y.data();
    double total = 0;
    for (std::size_t i = 0; i < r.size(); ++i) total += double(p[i]) * r[i];
    return total;
}

// The first few input shapes, then a count: block checks have dozens of parameter inputs.
std::string shapes_of(const std::vector<Tensor>& inputs) {
    std::string s;
    const std::size_t shown = inputs.size() <= 4 ? inputs.size() : 2;
    for (std::size_t i = 0; i < shown; ++i) s += (s.empty() ? "" : " ") + inputs[i].shape().str();
    if (shown < inputs.size()) {
        std::int64_t values = 0;
        for (std::size_t i = shown; i < inputs.size(); ++i) values += inputs[i].numel();
        s += " + " + std::to_string(inputs.size() - shown) + " more (" + std::to_string(values) + " values)";
    }
    return s;
}

}  // namespace

GradcheckResult gradcheck(const std::string& name, const GradcheckFn& f, std::vector<Tensor> inputs,
                          const GradcheckOptions& options) {
    const bool is_double = sizeof(real) == sizeof(double);
    const GradcheckOptions defaults;
    const double h = (!is_double && options.step == defaults.step) ? 1e-2 : options.step;
    const double tol = (!is_double && options.tolerance == defaults.tolerance) ? 1e-2 : options.tolerance;

    GradcheckResult result;
    result.name = name;
    result.shapes = shapes_of(inputs);
    tape().clear();
    for (Tensor& t : inputs) t.zero_grad();

    // Analytic: one recorded forward and a backward seeded with r.
    Tensor y = f(inputs);
    std::vector<double> r(y.numel());
    std::vector<real> upstream(y.numel());
    for (std::size_t i = 0; i < r.size(); ++i) upstream[i] = real(r[i] = 2 * uniform01(options.seed ^ 0xC0FFEE, i) - 1);
    backward(y, upstream);

    // Numeric: central differences, one element at a time.
    bool finite = true;
    for (Tensor& t : inputs) {
        if (!t.requires_grad()) continue;
        const std::vector<real> analytic = t.grad_vector();
        double max_abs = 0, max_num = 0;
        real* x = t.data();
        const std::int64_t n = t.numel();
        const std::int64_t stride = options.max_per_input > 0 && n > options.max_per_input ? n / options.max_per_input : 1;
        for (std::int64_t i = 0; i < n; i += stride) {
            const real saved = x[i];
            x[i] = real(saved + h);
            const double plus = projected(f, inputs, r);
            x[i] = real(saved - h);
            const double minus = projected(f, inputs, r);
            x[i] = saved;
            const double numeric = (plus - minus) / (2 * h);
            const double err = std::fabs(double(analytic[i]) - numeric);
            if (!std::isfinite(err)) finite = false;
            max_abs = std::max(max_abs, err);
            max_num = std::max(max_num, std::fabs(numeric));
            ++result.checked;
        }
        result.max_abs_error = std::max(result.max_abs_error, max_abs);
        result.max_rel_error = std::max(result.max_rel_error, max_abs / std::max(max_num, 1e-12));
    }
    result.passed = finite && result.checked > 0 && result.max_rel_error <= tol;
    return result;
}

std::vector<GradcheckResult> check_primitive_ops(std::uint64_t seed) {
    std::vector<GradcheckResult> out;
    std::uint64_t k = seed * 1000;  // a fresh seed for every random tensor
    auto rnd = [&](const Shape& s, double lo = -1, double hi = 1) { return random_tensor(s, ++k, lo, hi); };
    auto check = [&](const std::string& name, const GradcheckFn& f, std::vector<Tensor> in) {
        out.push_back(gradcheck(name, f, std::move(in), GradcheckOptions{1e-6, 1e-6, seed}));
    };
    // For inputs big enough to take an op's threaded or BLAS path: 64 elements of each input, spread out.
    auto check_sampled = [&](const std::string& name, const GradcheckFn& f, std::vector<Tensor> in) {
        out.push_back(gradcheck(name, f, std::move(in), GradcheckOptions{1e-6, 1e-6, seed, 64}));
    };
    const real inf = std::numeric_limits<real>::infinity();

    check("add", [](auto& x) { return add(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({2, 3, 4})});
    check("add (bias broadcast)", [](auto& x) { return add(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({4})});
    check("add (both broadcast)", [](auto& x) { return add(x[0], x[1]); }, {rnd({2, 1, 3, 4}), rnd({1, 5, 1, 4})});
    check("sub", [](auto& x) { return sub(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({3, 1})});
    check("sub (table broadcast (T,C))", [](auto& x) { return sub(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({3, 4})});
    check("mul (row broadcast (1,C))", [](auto& x) { return mul(x[0], x[1]); }, {rnd({1, 4}), rnd({2, 3, 4})});
    check_sampled("add (bias broadcast, split by columns)", [](auto& x) { return add(x[0], x[1]); },
                  {rnd({4, 32, 130}), rnd({130})});
    check("mul", [](auto& x) { return mul(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({2, 3, 4})});
    check("mul (head gate)", [](auto& x) { return mul(x[0], x[1]); }, {rnd({2, 3, 4, 5}), rnd({1, 3, 1, 1})});
    check("div", [](auto& x) { return div(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({2, 1, 4}, 0.5, 1.5)});
    check("scale", [](auto& x) { return scale(x[0], real(-0.7)); }, {rnd({3, 5})});

    check("matmul A B", [](auto& x) { return matmul(x[0], x[1]); }, {rnd({3, 4}), rnd({4, 5})});
    check("matmul A^T B", [](auto& x) { return matmul(x[0], x[1], true, false); }, {rnd({4, 3}), rnd({4, 5})});
    check("matmul A B^T", [](auto& x) { return matmul(x[0], x[1], false, true); }, {rnd({3, 4}), rnd({5, 4})});
    check("matmul A^T B^T", [](auto& x) { return matmul(x[0], x[1], true, true); }, {rnd({4, 3}), rnd({5, 4})});
    check("matmul batched 3-D", [](auto& x) { return matmul(x[0], x[1]); }, {rnd({2, 3, 4}), rnd({2, 4, 5})});
    check("matmul batched 4-D Q K^T", [](auto& x) { return matmul(x[0], x[1], false, true); },
          {rnd({2, 2, 3, 4}), rnd({2, 2, 5, 4})});
    check("matmul batched 4-D A^T B", [](auto& x) { return matmul(x[0], x[1], true, false); },
          {rnd({2, 2, 4, 3}), rnd({2, 2, 4, 5})});
    check("matmul (B,T,C) x W^T (linear)", [](auto& x) { return matmul(x[0], x[1], false, true); },
          {rnd({2, 3, 4}), rnd({5, 4})});
    // Many small batched products are split across threads: every transpose combination, with α.
    check("matmul batched 4-D A B alpha", [](auto& x) { return matmul(x[0], x[1], false, false, real(0.3)); },
          {rnd({2, 2, 3, 4}), rnd({2, 2, 4, 5})});
    check("matmul batched 4-D Q K^T alpha", [](auto& x) { return matmul(x[0], x[1], false, true, real(-0.5)); },
          {rnd({2, 2, 3, 4}), rnd({2, 2, 5, 4})});
    check("matmul batched 3-D A^T B^T", [](auto& x) { return matmul(x[0], x[1], true, true); },
          {rnd({3, 4, 3}), rnd({3, 5, 4})});
    check("matmul alpha (A B^T, 2-D)", [](auto& x) { return matmul(x[0], x[1], false, true, real(0.125)); },
          {rnd({3, 4}), rnd({5, 4})});
    // Large batched products run one after another, each split by rows (gemm_rows).
    check_sampled("matmul batched large (BLAS per product)", [](auto& x) { return matmul(x[0], x[1], false, true, real(0.5)); },
                  {rnd({2, 40, 80}), rnd({2, 90, 80})});
    check("affine x W^T + b", [](auto& x) { return affine(x[0], x[1], x[2]); }, {rnd({2, 3, 4}), rnd({5, 4}), rnd({5})});
    check("affine without bias", [](auto& x) { return affine(x[0], x[1], Tensor()); }, {rnd({3, 4}), rnd({5, 4})});
    check_sampled("affine (bias gradient split by columns)", [](auto& x) { return affine(x[0], x[1], x[2]); },
                  {rnd({4, 64, 8}), rnd({130, 8}), rnd({130})});

    check("reshape", [](auto& x) { return mul(reshape(x[0], {3, 8}), x[1]); }, {rnd({2, 3, 4}), rnd({3, 8})});
    check("permute (0,2,1,3)", [](auto& x) { return permute(x[0], {0, 2, 1, 3}); }, {rnd({2, 3, 4, 5})});
    check("permute (2,0,1)", [](auto& x) { return permute(x[0], {2, 0, 1}); }, {rnd({2, 3, 4})});
    check("transpose (-1,-2)", [](auto& x) { return transpose(x[0], -1, -2); }, {rnd({2, 3, 4})});
    check("concat_last", [](auto& x) { return concat_last({x[0], x[1], x[2]}); },
          {rnd({2, 3, 2}), rnd({2, 3, 4}), rnd({2, 3, 1})});
    check("slice_last", [](auto& x) { return slice_last(x[0], 2, 5); }, {rnd({2, 3, 6})});
    check("slice_heads (B,T,W)[..., 4:10] -> (B,2,T,3)", [](auto& x) { return slice_heads(x[0], 4, 10, 2); },
          {rnd({2, 3, 12})});

    check("sum axis 1", [](auto& x) { return sum(x[0], 1); }, {rnd({2, 3, 4})});
    check("sum axis -1 keepdim", [](auto& x) { return sum(x[0], -1, true); }, {rnd({2, 3, 4})});
    check("mean axis 0", [](auto& x) { return mean(x[0], 0); }, {rnd({2, 3, 4})});
    check("sum_all", [](auto& x) { return sum_all(x[0]); }, {rnd({2, 3, 4})});

    check("relu", [](auto& x) { return relu(x[0]); }, {rnd({3, 7})});
    check("gelu", [](auto& x) { return gelu(x[0]); }, {rnd({3, 7}, -3, 3)});

    check("softmax", [](auto& x) { return softmax(x[0]); }, {rnd({2, 3, 6}, -2, 2)});
    {
        // A key padding mask (B, 1, 1, S): the last two keys of batch row 1 are padding.
        Tensor key_mask = Tensor::zeros({2, 1, 1, 5});
        key_mask.data()[5 + 3] = key_mask.data()[5 + 4] = -inf;
        check("softmax + key padding mask", [key_mask](auto& x) { return softmax(x[0], key_mask); },
              {rnd({2, 2, 3, 5}, -2, 2)});
        // A causal mask (T, T): position t sees keys 0..t.
        Tensor causal = Tensor::zeros({4, 4});
        for (int t = 0; t < 4; ++t)
            for (int s = t + 1; s < 4; ++s) causal.data()[t * 4 + s] = -inf;
        check("softmax + causal mask", [causal](auto& x) { return softmax(x[0], causal); }, {rnd({2, 2, 4, 4}, -2, 2)});
    }
    check("log_softmax", [](auto& x) { return log_softmax(x[0]); }, {rnd({3, 7}, -2, 2)});
    check("layer_norm", [](auto& x) { return layer_norm(x[0], x[1], x[2]); },
          {rnd({2, 3, 6}, -2, 2), rnd({6}, 0.5, 1.5), rnd({6})});
    check("add_layer_norm", [](auto& x) { return add_layer_norm(x[0], x[1], x[2], x[3]); },
          {rnd({2, 3, 6}, -2, 2), rnd({2, 3, 6}, -1, 1), rnd({6}, 0.5, 1.5), rnd({6})});
    check_sampled("add_layer_norm (rows split across threads)", [](auto& x) { return add_layer_norm(x[0], x[1], x[2], x[3]); },
                  {rnd({4, 64, 70}, -2, 2), rnd({4, 64, 70}, -1, 1), rnd({70}, 0.5, 1.5), rnd({70})});
    check("dropout p=0.3", [](auto& x) { Rng rng(7); return dropout(x[0], real(0.3), rng); }, {rnd({4, 6})});
    {
        std::vector<std::int32_t> ids = {3, 0, 1, 3, 4, 0};  // 0 is padding: its row gets no gradient
        check("embedding", [ids](auto& x) { return embedding(x[0], ids, {2, 3}); }, {rnd({5, 4})});
        // With padding_idx the pad row gets no gradient, which is only the true derivative when padded
        // positions do not reach the output — as in the model, where masks cut them off. Zero them here.
        Tensor keep = Tensor::from({1, 0, 1, 1, 1, 0}, {2, 3, 1});
        check("embedding (pad 0, padded positions masked)",
              [ids, keep](auto& x) { return mul(embedding(x[0], ids, {2, 3}, 0), keep); }, {rnd({5, 4})});
        // Enough ids × columns for backward to split the columns across threads; ids repeat.
        std::vector<std::int32_t> many(130);
        for (std::size_t i = 0; i < many.size(); ++i) many[i] = std::int32_t((i * 5) % 7);
        check_sampled("embedding (wide, columns split)", [many](auto& x) { return embedding(x[0], many, {2, 65}); },
                      {rnd({7, 130})});
        std::vector<std::int32_t> target = {2, 0, 4, 1, 0, 3};  // 0 is the ignored index
        check("cross_entropy (eps 0.1, ignore 0)", [target](auto& x) { return cross_entropy(x[0], target, 0, real(0.1)); },
              {rnd({6, 5}, -2, 2)});
        check("cross_entropy (eps 0)", [target](auto& x) { return cross_entropy(x[0], target, -1, real(0)); },
              {rnd({6, 5}, -2, 2)});
    }
    return out;
}

std::vector<GradcheckResult> check_model_blocks(std::uint64_t seed);  // src/nn/gradcheck_blocks.cpp

std::vector<GradcheckResult> check_everything(std::uint64_t seed) {
    std::vector<GradcheckResult> all = check_primitive_ops(seed);
    std::vector<GradcheckResult> blocks = check_model_blocks(seed);
    all.insert(all.end(), blocks.begin(), blocks.end());
    return all;
}

std::string format_gradcheck_table(const std::vector<GradcheckResult>& results, bool color) {
    std::size_t wn = 2, ws = 6;
    for (const auto& r : results) {
        wn = std::max(wn, r.name.size());
        ws = std::max(ws, r.shapes.size());
    }
    std::string out;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%-*s  %-*s  %12s  %12s  %s\n", int(wn), "op", int(ws), "shapes", "max abs err",
                  "max rel err", "result");
    out += buf;
    out += std::string(wn + ws + 12 + 12 + 6 + 8, '-') + "\n";
    int failed = 0;
    for (const auto& r : results) {
        const char* verdict = r.passed ? (color ? "\033[32mPASS\033[0m" : "PASS") : (color ? "\033[31mFAIL\033[0m" : "FAIL");
        std::snprintf(buf, sizeof buf, "%-*s  %-*s  %12.2e  %12.2e  %s\n", int(wn), r.name.c_str(), int(ws), r.shapes.c_str(),
                      r.max_abs_error, r.max_rel_error, verdict);
        out += buf;
        failed += !r.passed;
    }
    std::snprintf(buf, sizeof buf, "%zu checks: %zu passed, %d failed (%s, central differences; a check fails when "
                                   "max|analytic - numeric| / max|numeric| > %.0e)\n",
                  results.size(), results.size() - failed, failed, sizeof(real) == 8 ? "float64" : "float32",
                  sizeof(real) == 8 ? 1e-6 : 1e-2);
    out += buf;
    return out;
}

#ifdef TAPEFORMER_F64
int run_gradcheck_cli(const GradcheckCliOptions& options) {
    std::vector<GradcheckResult> all = check_everything(options.seed), picked;
    for (auto& r : all)
        if (options.filter.empty() || r.name.find(options.filter) != std::string::npos) picked.push_back(r);
    if (options.list_only) {
        for (auto& r : picked) std::cout << r.name << "\n";
        return 0;
    }
    std::cout << format_gradcheck_table(picked, options.color);
    int failed = 0;
    for (auto& r : picked) failed += !r.passed;
    return failed;
}
#endif

TF_NAMESPACE_END
