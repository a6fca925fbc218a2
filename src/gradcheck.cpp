// Finite-difference gradient checks (gradcheck.h). The suites of checks that `tapeformer gradcheck` runs
// live above the model, in src/gradcheck_suite/.
#include "tapeformer/gradcheck.h"

#include <algorithm>
#include <cmath>

#include "tapeformer/autograd.h"
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
    result.step = h, result.tolerance = tol;
    if (options.keep_elements)
        for (const Tensor& t : inputs) result.input_shapes.push_back(t.shape());
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
    for (std::size_t k = 0; k < inputs.size(); ++k) {
        Tensor& t = inputs[k];
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
            if (options.keep_elements) result.elements.push_back({k, i, double(analytic[i]), numeric});
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

TF_NAMESPACE_END
