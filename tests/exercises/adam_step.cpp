// The reference solution of docs/exercises/adam_step.cpp, which the grader's tests compile and check
// (tests/test_exercises.cpp): torch.optim.Adam's step, ε after the bias correction of √v.
#include <cmath>

extern "C" void adam_step(double* p, const double* g, double* m, double* v, long n, long t, double lr, double beta1,
                          double beta2, double eps) {
    const double correction1 = 1 - std::pow(beta1, double(t)), correction2 = 1 - std::pow(beta2, double(t));
    for (long i = 0; i < n; ++i) {
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        p[i] -= lr / correction1 * m[i] / (std::sqrt(v[i]) / std::sqrt(correction2) + eps);
    }
}
