// The reference solution of docs/exercises/attention.cpp, which the grader's tests compile and check
// (tests/test_exercises.cpp): one head at a time, one query row at a time.
#include <cmath>
#include <vector>

extern "C" void attention(const double* q, const double* k, const double* v, const double* mask, double* out, long N,
                          long Tq, long Tk, long D) {
    std::vector<double> w(static_cast<std::size_t>(Tk));
    const double scale = 1 / std::sqrt(double(D));
    for (long n = 0; n < N; ++n)
        for (long i = 0; i < Tq; ++i) {
            const double* qi = q + (n * Tq + i) * D;
            double max = -INFINITY;
            for (long j = 0; j < Tk; ++j) {
                double s = 0;
                for (long d = 0; d < D; ++d) s += qi[d] * k[(n * Tk + j) * D + d];
                w[j] = s * scale + (mask ? mask[i * Tk + j] : 0);
                max = std::fmax(max, w[j]);
            }
            double sum = 0;
            for (long j = 0; j < Tk; ++j) sum += (w[j] = std::exp(w[j] - max));
            for (long d = 0; d < D; ++d) {
                double o = 0;
                for (long j = 0; j < Tk; ++j) o += w[j] / sum * v[(n * Tk + j) * D + d];
                out[(n * Tq + i) * D + d] = o;
            }
        }
}
