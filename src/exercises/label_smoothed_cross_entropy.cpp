// Exercise label_smoothed_cross_entropy: the training loss and its gradient with respect to the logits.
//   loss = 1/n Σ_i [(1 − ε) · (−log p_i,t_i) + ε/V · Σ_j (−log p_i,j)],  p_i = softmax(logits_i)
// over the n rows whose target is not ignore_index; ∂loss/∂logits_i,j = (p_i,j − q_i,j) / n with the smoothed
// target q_i = (1 − ε) · onehot(t_i) + ε/V (and 0 for an ignored row). Checked against the library's
// cross_entropy (src/ops.cpp) and central differences of the loss.
#include <limits>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

using CrossEntropy = double (*)(const double* logits, const int* target, long n, long V, int ignore_index, double epsilon,
                                double* dlogits);

struct Inputs {
    std::vector<double> logits;  // (n, V)
    std::vector<int> target;     // n
    long n, V;
    int ignore_index = 0;
    double epsilon = 0.1;
};

double library_loss(const Inputs& in, const std::vector<double>& logits, std::vector<double>* dlogits) {
    Tensor L = Tensor::from(logits, {in.n, in.V});
    L.set_requires_grad(dlogits != nullptr);
    const std::vector<std::int32_t> target(in.target.begin(), in.target.end());
    Tensor loss = cross_entropy(L, target, in.ignore_index, in.epsilon);  // ()
    const double value = loss.item();
    if (dlogits && !loss.requires_grad()) dlogits->assign(std::size_t(in.n * in.V), 0.0);  // no row counts: a constant 0
    else if (dlogits) {
        backward(loss);
        dlogits->assign(L.grad(), L.grad() + in.n * in.V);
    }
    return value;
}

std::string grade(CrossEntropy student, const Inputs& in, bool check_differences) {
    std::vector<double> expected;
    const double loss_ref = library_loss(in, in.logits, &expected);
    std::vector<double> dlogits = unwritten(expected.size());
    const double loss = student(in.logits.data(), in.target.data(), in.n, in.V, in.ignore_index, in.epsilon, dlogits.data());
    std::string wrong = compare("loss", {loss_ref}, {loss}, 1, 1e-9, 1e-12);
    if (wrong.empty()) wrong = compare("dlogits", expected, dlogits, in.V, 1e-9, 1e-12);
    if (!wrong.empty() || !check_differences) return wrong;
    const auto f = [&](const std::vector<double>& at) {
        NoGradGuard no_grad;
        return library_loss(in, at, nullptr);
    };
    wrong = compare("dlogits", central_differences(f, in.logits), dlogits, in.V, 1e-6, 1e-8);
    return wrong.empty() ? "" : "against central differences of the loss:\n" + wrong;
}

Inputs random_inputs(std::uint64_t seed, long n, long V, double spread = 3) {
    Rng rng(seed);
    Inputs in{uniform_values(rng, std::size_t(n * V), -spread, spread), {}, n, V};
    for (long i = 0; i < n; ++i) in.target.push_back(1 + int(rng.below(std::uint64_t(V - 1))));  // 0 is ignore_index
    return in;
}

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<CrossEntropy>(fn);
    return {
        {"random 4 x 7 logits, epsilon 0.1, against the library and central differences",
         [=] { return grade(student, random_inputs(1, 4, 7), true); }},
        {"epsilon 0: plain cross-entropy", [=] {
             Inputs in = random_inputs(2, 3, 5);
             in.epsilon = 0;
             return grade(student, in, true);
         }},
        {"two of five rows are padding (target = ignore_index): the mean is over the other three",
         [=] {
             Inputs in = random_inputs(3, 5, 6);
             in.target[1] = in.target[3] = in.ignore_index;
             return grade(student, in, true);
         }},
        {"every row is padding: the loss and its gradient are 0", [=] {
             Inputs in = random_inputs(4, 2, 4);
             in.target = {0, 0};
             return grade(student, in, false);
         }},
        {"logits around 800: exp overflows unless the row's maximum comes out first",
         [=] {
             Inputs in = random_inputs(5, 3, 6);
             for (double& x : in.logits) x += 800;
             return grade(student, in, false);
         }},
        {"epsilon 1: the target is uniform over the vocabulary", [=] {
             Inputs in = random_inputs(6, 3, 5);
             in.epsilon = 1;
             return grade(student, in, true);
         }},
    };
}

}  // namespace

GradedExercise label_smoothed_cross_entropy_exercise() {
    return {"label_smoothed_cross_entropy",
            "the label-smoothed cross-entropy of logits against target ids (mean over rows not ignored), and dlogits",
            "extern \"C\" double label_smoothed_cross_entropy(const double* logits, const int* target, long n, long V, "
            "int ignore_index, double epsilon, double* dlogits);",
            cases};
}

TF_NAMESPACE_END
