// Exercise attention: scaled dot-product attention with a mask, for N independent heads.
//   scores = Q Kᵀ / √D + mask,   weights = softmax(scores) over the keys,   out = weights V
// Checked against the library's composition of the same ops (matmul, softmax: src/ops.cpp), the one every
// attention module of the model runs.
#include <cmath>
#include <limits>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

using Attention = void (*)(const double* q, const double* k, const double* v, const double* mask, double* out, long N,
                           long Tq, long Tk, long D);

struct Inputs {
    std::vector<double> q, k, v, mask;  // (N, Tq, D), (N, Tk, D), (N, Tk, D), (Tq, Tk) or empty: no mask
    long N, Tq, Tk, D;
};

std::vector<double> library(const Inputs& in) {
    NoGradGuard no_grad;
    const Tensor Q = Tensor::from(in.q, {in.N, in.Tq, in.D}), K = Tensor::from(in.k, {in.N, in.Tk, in.D}),
                 V = Tensor::from(in.v, {in.N, in.Tk, in.D});
    const Tensor scores = matmul(Q, K, false, true, real(1 / std::sqrt(double(in.D))));  // (N, Tq, Tk)
    const Tensor weights = in.mask.empty() ? softmax(scores) : softmax(scores, Tensor::from(in.mask, {1, in.Tq, in.Tk}));
    return matmul(weights, V).to_vector();  // (N, Tq, D)
}

std::string grade(Attention student, const Inputs& in) {
    const std::vector<double> expected = library(in);
    std::vector<double> out = unwritten(expected.size());
    student(in.q.data(), in.k.data(), in.v.data(), in.mask.empty() ? nullptr : in.mask.data(), out.data(), in.N, in.Tq, in.Tk,
            in.D);
    return compare("out", expected, out, in.D, 1e-9, 1e-12);
}

Inputs random_inputs(std::uint64_t seed, long N, long Tq, long Tk, long D, double spread = 1) {
    Rng rng(seed);
    return {uniform_values(rng, std::size_t(N * Tq * D), -spread, spread), uniform_values(rng, std::size_t(N * Tk * D), -spread, spread),
            uniform_values(rng, std::size_t(N * Tk * D), -1, 1), {}, N, Tq, Tk, D};
}

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<Attention>(fn);
    return {
        {"2 heads, 3 queries over 4 keys, D = 5, no mask (mask = nullptr)", [=] { return grade(student, random_inputs(1, 2, 3, 4, 5)); }},
        {"a causal mask (-inf above the diagonal): query i sees keys 0..i", [=] {
             Inputs in = random_inputs(2, 2, 4, 4, 3);
             in.mask.assign(16, 0.0);
             for (long i = 0; i < 4; ++i)
                 for (long j = i + 1; j < 4; ++j) in.mask[std::size_t(i * 4 + j)] = kMinusInf;
             return grade(student, in);
         }},
        {"a padding mask (the last two keys -inf for every query)", [=] {
             Inputs in = random_inputs(3, 3, 2, 5, 4);
             in.mask.assign(10, 0.0);
             for (long i = 0; i < 2; ++i) in.mask[std::size_t(i * 5 + 3)] = in.mask[std::size_t(i * 5 + 4)] = kMinusInf;
             return grade(student, in);
         }},
        {"one key (Tk = 1): every query's output is that key's value", [=] { return grade(student, random_inputs(4, 2, 3, 1, 4)); }},
        {"large scores (q, k up to 60): softmax must take the row's maximum out", [=] {
             return grade(student, random_inputs(5, 1, 3, 6, 4, 60));
         }},
        {"the 1/sqrt(D) scale: D = 64", [=] { return grade(student, random_inputs(6, 1, 2, 3, 64)); }},
    };
}

}  // namespace

GradedExercise attention_exercise() {
    return {"attention", "scaled dot-product attention softmax(Q K^T / sqrt(D) + mask) V for N heads",
            "extern \"C\" void attention(const double* q, const double* k, const double* v, const double* mask, double* out, "
            "long N, long Tq, long Tk, long D);",
            cases};
}

TF_NAMESPACE_END
