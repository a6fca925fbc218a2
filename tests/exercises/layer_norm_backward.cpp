// The reference solution of docs/exercises/layer_norm_backward.cpp, which the grader's tests compile and
// check (tests/test_exercises.cpp). With g = dy · gamma and r = 1 / sqrt(var + eps):
//   dx = r · (g − mean(g) − x_hat · mean(g · x_hat)),  dgamma = Σ_rows dy · x_hat,  dbeta = Σ_rows dy.
#include <cmath>
#include <vector>

extern "C" void layer_norm_backward(const double* x, const double* gamma, const double* dy, double eps, double* dx,
                                    double* dgamma, double* dbeta, long rows, long n) {
    for (long j = 0; j < n; ++j) dgamma[j] = dbeta[j] = 0;
    std::vector<double> x_hat(static_cast<std::size_t>(n));
    for (long r = 0; r < rows; ++r) {
        const double* xr = x + r * n;
        const double* dyr = dy + r * n;
        double mu = 0, var = 0;
        for (long j = 0; j < n; ++j) mu += xr[j];
        mu /= double(n);
        for (long j = 0; j < n; ++j) var += (xr[j] - mu) * (xr[j] - mu);
        var /= double(n);
        const double rstd = 1 / std::sqrt(var + eps);
        double mean_g = 0, mean_g_xhat = 0;
        for (long j = 0; j < n; ++j) {
            x_hat[j] = (xr[j] - mu) * rstd;
            const double g = dyr[j] * gamma[j];
            mean_g += g / double(n);
            mean_g_xhat += g * x_hat[j] / double(n);
            dgamma[j] += dyr[j] * x_hat[j];
            dbeta[j] += dyr[j];
        }
        for (long j = 0; j < n; ++j) dx[r * n + j] = rstd * (dyr[j] * gamma[j] - mean_g - x_hat[j] * mean_g_xhat);
    }
}
