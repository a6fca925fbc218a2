// Exercise softmax_backward: the gradient of a row softmax from its output.
//   y = softmax(x) over each row;  dx_j = y_j · (dy_j − Σ_k dy_k · y_k)
// Checked against the library's softmax backward (src/ops.cpp) and against central differences of
// L(x) = Σ dy ⊙ softmax(x).
#include <limits>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

using SoftmaxBackward = void (*)(const double* y, const double* dy, double* dx, long rows, long n);

// The library's y = softmax(x + mask) and its dx for the upstream gradient dy; x, mask, dy (rows, n).
struct Reference {
    std::vector<double> y, dx;
};
Reference library(const std::vector<double>& x, const std::vector<double>& mask, const std::vector<double>& dy, long rows,
                  long n) {
    Tensor X = Tensor::from(x, {rows, n});
    X.set_requires_grad(true);
    Tensor Y = mask.empty() ? softmax(X) : softmax(X, Tensor::from(mask, {rows, n}));  // (rows, n)
    Reference r{Y.to_vector(), {}};
    backward(Y, dy);
    r.dx.assign(X.grad(), X.grad() + rows * n);
    return r;
}

// The student's dx for the library's y, compared with the library's dx (and, with check_differences, with
// central differences of L(x) = Σ dy ⊙ softmax(x)).
std::string grade(SoftmaxBackward student, const std::vector<double>& x, const std::vector<double>& mask,
                  const std::vector<double>& dy, long rows, long n, bool check_differences) {
    const Reference ref = library(x, mask, dy, rows, n);
    std::vector<double> dx = unwritten(ref.dx.size());
    student(ref.y.data(), dy.data(), dx.data(), rows, n);
    std::string wrong = compare("dx", ref.dx, dx, n, 1e-9, 1e-12);
    if (!wrong.empty() || !check_differences) return wrong;
    const auto loss = [&](const std::vector<double>& at) {
        NoGradGuard no_grad;
        const std::vector<double> y = softmax(Tensor::from(at, {rows, n})).to_vector();
        double L = 0;
        for (std::size_t i = 0; i < y.size(); ++i) L += dy[i] * y[i];
        return L;
    };
    wrong = compare("dx", central_differences(loss, x), dx, n, 1e-6, 1e-8);
    return wrong.empty() ? "" : "against central differences of L = sum(dy * softmax(x)):\n" + wrong;
}

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<SoftmaxBackward>(fn);
    return {
        {"random 3 x 5 rows, against the library and against central differences",
         [=] {
             Rng rng(1);
             return grade(student, uniform_values(rng, 15, -2, 2), {}, uniform_values(rng, 15, -1, 1), 3, 5, true);
         }},
        {"one column (n = 1): y is always 1, so dx must be 0",
         [=] { return grade(student, {0.3, -1.7}, {}, {0.5, -2.0}, 2, 1, false); }},
        {"peaked rows (logits up to 40): y is nearly one-hot",
         [=] {
             Rng rng(2);
             return grade(student, uniform_values(rng, 12, -40, 40), {}, uniform_values(rng, 12, -1, 1), 2, 6, true);
         }},
        {"masked positions (y = 0 there, as after a -inf mask): dx must be 0 there too",
         [=] {
             Rng rng(3);
             const double inf = std::numeric_limits<double>::infinity();
             std::vector<double> mask(12, 0.0);
             mask[2] = mask[3] = mask[7] = -inf;
             return grade(student, uniform_values(rng, 12, -1, 1), mask, uniform_values(rng, 12, -1, 1), 2, 6, false);
         }},
        {"one long row (n = 1000): no fixed-size buffers",
         [=] {
             Rng rng(4);
             return grade(student, uniform_values(rng, 1000, -3, 3), {}, uniform_values(rng, 1000, -1, 1), 1, 1000, false);
         }},
    };
}

}  // namespace

GradedExercise softmax_backward_exercise() {
    return {"softmax_backward", "the gradient of a row softmax, from its output y and the upstream gradient dy",
            "extern \"C\" void softmax_backward(const double* y, const double* dy, double* dx, long rows, long n);", cases};
}

TF_NAMESPACE_END
