// The reference solution of docs/exercises/softmax_backward.cpp, which the grader's tests compile and
// check (tests/test_exercises.cpp). dx_j = y_j · (dy_j − Σ_k dy_k · y_k), row by row.
extern "C" void softmax_backward(const double* y, const double* dy, double* dx, long rows, long n) {
    for (long r = 0; r < rows; ++r) {
        const double* yr = y + r * n;
        const double* dyr = dy + r * n;
        double dot = 0;  // Σ_k dy_k · y_k
        for (long k = 0; k < n; ++k) dot += dyr[k] * yr[k];
        for (long j = 0; j < n; ++j) dx[r * n + j] = yr[j] * (dyr[j] - dot);
    }
}
