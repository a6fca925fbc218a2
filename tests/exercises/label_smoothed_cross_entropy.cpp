// The reference solution of docs/exercises/label_smoothed_cross_entropy.cpp, which the grader's tests compile
// and check (tests/test_exercises.cpp). With q the smoothed target and p = softmax(logits) per row:
// loss = 1/n' Σ_i Σ_j q_ij (lse_i − logits_ij),  dlogits_ij = (p_ij − q_ij) / n'.
#include <cmath>

extern "C" double label_smoothed_cross_entropy(const double* logits, const int* target, long n, long V, int ignore_index,
                                               double epsilon, double* dlogits) {
    long counted = 0;
    for (long i = 0; i < n; ++i) counted += target[i] != ignore_index;
    double loss = 0;
    for (long i = 0; i < n; ++i) {
        const double* row = logits + i * V;
        double* drow = dlogits + i * V;
        if (target[i] == ignore_index) {
            for (long j = 0; j < V; ++j) drow[j] = 0;
            continue;
        }
        double max = row[0], sum = 0;
        for (long j = 1; j < V; ++j) max = std::fmax(max, row[j]);
        for (long j = 0; j < V; ++j) sum += std::exp(row[j] - max);
        const double lse = max + std::log(sum);
        for (long j = 0; j < V; ++j) {
            const double q = epsilon / double(V) + (j == target[i] ? 1 - epsilon : 0);
            loss += q * (lse - row[j]);
            drow[j] = (std::exp(row[j] - lse) - q) / double(counted);
        }
    }
    return counted ? loss / double(counted) : 0;
}
