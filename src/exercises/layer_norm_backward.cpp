// Exercise layer_norm_backward: LayerNorm's three gradients over each row of n values.
//   x̂ = (x − μ) / √(σ² + ε),  y = γ ⊙ x̂ + β   (σ² the biased variance of the row)
//   dβ = Σ_rows dy,  dγ = Σ_rows dy ⊙ x̂,  dx = (1/√(σ² + ε)) · (g − mean(g) − x̂ · mean(g ⊙ x̂)),  g = dy ⊙ γ
// Checked against the library's layer_norm backward (src/ops.cpp) and central differences of
// L = Σ dy ⊙ y with respect to x and γ.
#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

using LayerNormBackward = void (*)(const double* x, const double* gamma, const double* dy, double eps, double* dx,
                                   double* dgamma, double* dbeta, long rows, long n);

struct Inputs {
    std::vector<double> x, gamma, beta, dy;  // (rows, n), (n), (n), (rows, n)
    long rows, n;
    double eps = 1e-5;
};

double loss_at(const Inputs& in, const std::vector<double>& x, const std::vector<double>& gamma) {
    NoGradGuard no_grad;
    const std::vector<double> y = layer_norm(Tensor::from(x, {in.rows, in.n}), Tensor::from(gamma, {in.n}),
                                             Tensor::from(in.beta, {in.n}), in.eps)
                                      .to_vector();
    double L = 0;
    for (std::size_t i = 0; i < y.size(); ++i) L += in.dy[i] * y[i];
    return L;
}

std::string grade(LayerNormBackward student, const Inputs& in, bool check_differences) {
    Tensor X = Tensor::from(in.x, {in.rows, in.n}), G = Tensor::from(in.gamma, {in.n}), B = Tensor::from(in.beta, {in.n});
    X.set_requires_grad(true), G.set_requires_grad(true), B.set_requires_grad(true);
    Tensor Y = layer_norm(X, G, B, in.eps);  // (rows, n)
    backward(Y, in.dy);
    const std::size_t N = std::size_t(in.rows * in.n);
    const std::vector<double> dx_ref(X.grad(), X.grad() + N), dgamma_ref(G.grad(), G.grad() + in.n),
        dbeta_ref(B.grad(), B.grad() + in.n);
    std::vector<double> dx = unwritten(N), dgamma = unwritten(std::size_t(in.n)), dbeta = unwritten(std::size_t(in.n));
    student(in.x.data(), in.gamma.data(), in.dy.data(), in.eps, dx.data(), dgamma.data(), dbeta.data(), in.rows, in.n);
    for (std::string wrong : {compare("dbeta", dbeta_ref, dbeta, 1, 1e-9, 1e-12), compare("dgamma", dgamma_ref, dgamma, 1, 1e-9, 1e-12),
                              compare("dx", dx_ref, dx, in.n, 1e-8, 1e-10)})
        if (!wrong.empty()) return wrong;
    if (!check_differences) return "";
    const std::string wrong_x =
        compare("dx", central_differences([&](const std::vector<double>& x) { return loss_at(in, x, in.gamma); }, in.x), dx,
                in.n, 1e-6, 1e-8);
    const std::string wrong_gamma =
        compare("dgamma", central_differences([&](const std::vector<double>& g) { return loss_at(in, in.x, g); }, in.gamma),
                dgamma, 1, 1e-6, 1e-8);
    const std::string wrong = wrong_x.empty() ? wrong_gamma : wrong_x;
    return wrong.empty() ? "" : "against central differences of L = sum(dy * layer_norm(x)):\n" + wrong;
}

Inputs random_inputs(std::uint64_t seed, long rows, long n, double spread = 2, double offset = 0) {
    Rng rng(seed);
    Inputs in{uniform_values(rng, std::size_t(rows * n), offset - spread, offset + spread), uniform_values(rng, std::size_t(n), 0.5, 1.5),
              uniform_values(rng, std::size_t(n), -0.5, 0.5), uniform_values(rng, std::size_t(rows * n), -1, 1), rows, n};
    return in;
}

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<LayerNormBackward>(fn);
    return {
        {"random 4 x 6 rows, against the library and against central differences",
         [=] { return grade(student, random_inputs(1, 4, 6), true); }},
        {"a constant row (variance 0: only eps keeps 1/sqrt(var + eps) finite)",
         [=] {
             Inputs in = random_inputs(2, 2, 5);
             for (long j = 0; j < 5; ++j) in.x[std::size_t(j)] = 0.75;
             return grade(student, in, false);
         }},
        {"some gamma exactly 0: those columns pass no gradient to x, dgamma still has one",
         [=] {
             Inputs in = random_inputs(3, 3, 6);
             in.gamma[1] = in.gamma[4] = 0;
             return grade(student, in, true);
         }},
        {"rows far from 0 (x around 1000): the mean must come out before the variance",
         [=] { return grade(student, random_inputs(4, 3, 8, 1, 1000), false); }},
        {"one value per row (n = 1): x_hat is 0, so dx and dgamma must be 0", [=] { return grade(student, random_inputs(5, 3, 1), false); }},
        {"a large eps (0.5): eps belongs inside the square root", [=] {
             Inputs in = random_inputs(6, 2, 4);
             in.eps = 0.5;
             return grade(student, in, true);
         }},
    };
}

}  // namespace

GradedExercise layer_norm_backward_exercise() {
    return {"layer_norm_backward", "LayerNorm's gradients dx, dgamma and dbeta, from x, gamma and the upstream gradient dy",
            "extern \"C\" void layer_norm_backward(const double* x, const double* gamma, const double* dy, double eps, "
            "double* dx, double* dgamma, double* dbeta, long rows, long n);",
            cases};
}

TF_NAMESPACE_END
