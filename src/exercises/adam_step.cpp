// Exercise adam_step: one step of Adam (Kingma & Ba 2015) as PyTorch takes it, on n parameters.
//   m ← β1·m + (1 − β1)·g,   v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// Checked step after step against the library's Adam (src/optim.cpp), which keeps m, v and t itself.
#include "tapeformer/optim.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

using AdamStep = void (*)(double* p, const double* g, double* m, double* v, long n, long t, double lr, double beta1,
                          double beta2, double eps);

struct Run {
    long n = 5, steps = 1;
    double lr = 0.01, grad_scale = 1;
    AdamOptions options;
    std::uint64_t seed = 1;
};

std::string grade(AdamStep student, const Run& r) {
    Rng rng(r.seed);
    const std::vector<double> start = uniform_values(rng, std::size_t(r.n), -1, 1);
    Tensor P = Tensor::from(start, {r.n});
    P.set_requires_grad(true);
    Adam library({{"p", P}}, r.options);
    std::vector<double> p = start, m(std::size_t(r.n), 0.0), v(std::size_t(r.n), 0.0);
    for (long t = 1; t <= r.steps; ++t) {
        std::vector<double> g = uniform_values(rng, std::size_t(r.n), -r.grad_scale, r.grad_scale);
        if (t == 1) g[0] = 0;  // one gradient exactly 0 at the first step
        std::copy(g.begin(), g.end(), P.grad());
        library.step(r.lr);
        student(p.data(), g.data(), m.data(), v.data(), r.n, t, r.lr, r.options.beta1, r.options.beta2, r.options.eps);
        const std::string wrong = compare("p", P.to_vector(), p, 1, 1e-10, 1e-13);
        if (!wrong.empty()) return "after step t = " + std::to_string(t) + ":\n" + wrong;
    }
    return "";
}

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<AdamStep>(fn);
    return {
        {"the first step (t = 1): bias correction makes it about lr in size", [=] { return grade(student, Run{}); }},
        {"10 steps with the paper's betas (0.9, 0.98) and eps 1e-9",
         [=] {
             Run r;
             r.steps = 10, r.n = 8, r.seed = 2;
             return grade(student, r);
         }},
        {"10 steps with PyTorch's defaults (0.9, 0.999, eps 1e-8) and lr 0.001",
         [=] {
             Run r;
             r.steps = 10, r.seed = 3, r.lr = 0.001;
             r.options.beta2 = 0.999, r.options.eps = 1e-8;
             return grade(student, r);
         }},
        {"gradients of size 1e6: the step size does not grow with them", [=] {
             Run r;
             r.steps = 3, r.seed = 4, r.grad_scale = 1e6;
             return grade(student, r);
         }},
        {"a large eps (0.1): eps is added to sqrt(v) after its bias correction",
         [=] {
             Run r;
             r.steps = 4, r.seed = 5, r.grad_scale = 0.01;
             r.options.eps = 0.1;
             return grade(student, r);
         }},
    };
}

}  // namespace

GradedExercise adam_step_exercise() {
    return {"adam_step", "one Adam step on n parameters, updating p, m and v in place (t counts steps from 1)",
            "extern \"C\" void adam_step(double* p, const double* g, double* m, double* v, long n, long t, double lr, "
            "double beta1, double beta2, double eps);",
            cases};
}

TF_NAMESPACE_END
