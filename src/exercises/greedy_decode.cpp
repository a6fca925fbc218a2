// Exercise greedy_decode: greedy decoding over a key/value cache, on a one-layer, one-head model the grader
// makes up (random tables, sinusoidal positions). The student's tokens must be those of decoding without a
// cache — every prefix recomputed with the library's causal attention (matmul and softmax, src/ops.cpp) —
// and each position must be projected exactly once.
#include <cmath>
#include <limits>

#include "tapeformer/autograd.h"
#include "tapeformer/nn/embedding.h"
#include "tapeformer/ops.h"
#include "grader.h"

TF_NAMESPACE_BEGIN

namespace {

// The model as the student's code sees it (docs/exercises/greedy_decode.cpp declares the same struct).
struct DecoderModel {
    void* self;
    long D, V;
    void (*project)(void* self, int token, long position, double* q, double* k, double* v);
    void (*logits)(void* self, const double* context, double* logits);
};

using GreedyDecode = long (*)(const DecoderModel* model, int bos, int eos, long max_len, double* k_cache, double* v_cache,
                              int* out_tokens);

// x = E[token] + PE[position];  q, k, v = Wq x, Wk x, Wv x;  logits = W_out context + b.
struct ToyDecoder {
    long D = 8, V = 12, max_positions = 64;
    std::vector<double> E, Wq, Wk, Wv, W_out, b, pe;  // (V, D), (D, D) x 3, (V, D), (V), (max_positions, D)
    std::vector<std::pair<int, long>> calls;          // (token, position) of every project() call

    ToyDecoder(std::uint64_t seed, double eos_bias, int eos) {
        Rng rng(seed);
        E = uniform_values(rng, std::size_t(V * D), -1, 1);
        Wq = uniform_values(rng, std::size_t(D * D), -1, 1);
        Wk = uniform_values(rng, std::size_t(D * D), -1, 1);
        Wv = uniform_values(rng, std::size_t(D * D), -1, 1);
        W_out = uniform_values(rng, std::size_t(V * D), -1, 1);
        b.assign(std::size_t(V), 0.0);
        b[std::size_t(eos)] = eos_bias;
        pe = PositionalEncoding(PositionalKind::Sinusoidal, max_positions, D).table.to_vector();
    }
    void project(int token, long position, double* q, double* k, double* v) const {
        for (long i = 0; i < D; ++i) {
            q[i] = k[i] = v[i] = 0;
            for (long j = 0; j < D; ++j) {
                const double x = E[std::size_t(token * D + j)] + pe[std::size_t(position * D + j)];
                q[i] += Wq[std::size_t(i * D + j)] * x, k[i] += Wk[std::size_t(i * D + j)] * x, v[i] += Wv[std::size_t(i * D + j)] * x;
            }
        }
    }
    void logits(const double* context, double* out) const {
        for (long r = 0; r < V; ++r) {
            out[r] = b[std::size_t(r)];
            for (long j = 0; j < D; ++j) out[r] += W_out[std::size_t(r * D + j)] * context[j];
        }
    }
    DecoderModel as_c() {
        return {this, D, V,
                [](void* self, int token, long position, double* q, double* k, double* v) {
                    auto* m = static_cast<ToyDecoder*>(self);
                    m->calls.push_back({token, position});
                    m->project(token, position, q, k, v);
                },
                [](void* self, const double* context, double* out) { static_cast<const ToyDecoder*>(self)->logits(context, out); }};
    }
};

// Decoding without a cache: at every step the whole prefix is projected again and attended with a causal
// mask by the library's ops; the last position's context gives the next token.
std::vector<int> reference_tokens(const ToyDecoder& m, int bos, int eos, long max_len) {
    NoGradGuard no_grad;
    std::vector<int> prefix = {bos}, out;
    const double minus_inf = -std::numeric_limits<double>::infinity();
    while (long(out.size()) < max_len) {
        const long T = long(prefix.size()), D = m.D;
        std::vector<double> q(std::size_t(T * D)), k(q.size()), v(q.size()), mask(std::size_t(T * T), 0.0);
        for (long t = 0; t < T; ++t) m.project(prefix[std::size_t(t)], t, &q[std::size_t(t * D)], &k[std::size_t(t * D)], &v[std::size_t(t * D)]);
        for (long i = 0; i < T; ++i)
            for (long j = i + 1; j < T; ++j) mask[std::size_t(i * T + j)] = minus_inf;
        const Tensor scores = matmul(Tensor::from(q, {T, D}), Tensor::from(k, {T, D}), false, true, real(1 / std::sqrt(double(D))));
        const std::vector<double> context = matmul(softmax(scores, Tensor::from(mask, {T, T})), Tensor::from(v, {T, D})).to_vector();
        std::vector<double> logits(std::size_t(m.V));
        m.logits(&context[std::size_t((T - 1) * D)], logits.data());
        int best = 0;
        for (int j = 1; j < m.V; ++j)
            if (logits[std::size_t(j)] > logits[std::size_t(best)]) best = j;
        out.push_back(best);
        prefix.push_back(best);
        if (best == eos) break;
    }
    return out;
}

std::string tokens_str(const std::vector<int>& tokens) {
    std::string s;
    for (int t : tokens) s += (s.empty() ? "" : " ") + std::to_string(t);
    return "[" + s + "]";
}

std::string grade(GreedyDecode student, std::uint64_t seed, double eos_bias, long max_len) {
    const int bos = 1, eos = 2;
    ToyDecoder m(seed, eos_bias, eos);
    const std::vector<int> expected = reference_tokens(m, bos, eos, max_len);
    const DecoderModel model = m.as_c();
    std::vector<double> k_cache(std::size_t(max_len * m.D), std::nan("")), v_cache(k_cache);
    std::vector<int> out(std::size_t(max_len), -1);
    const long n = student(&model, bos, eos, max_len, k_cache.data(), v_cache.data(), out.data());
    if (n < 0 || n > max_len) return "returned " + std::to_string(n) + " tokens; expected " + std::to_string(expected.size());
    const std::vector<int> got(out.begin(), out.begin() + n);
    if (got != expected) return "tokens: expected " + tokens_str(expected) + ", got " + tokens_str(got);
    for (std::size_t i = 0; i < m.calls.size(); ++i)
        if (m.calls[i].second != long(i))
            return "project() call " + std::to_string(i + 1) + " was for position " + std::to_string(m.calls[i].second) +
                   "; with a cache, position i is projected once, in order (" + std::to_string(m.calls.size()) + " calls for " +
                   std::to_string(n) + " tokens)";
    if (m.calls.size() != std::size_t(n))
        return std::to_string(m.calls.size()) + " calls of project() for " + std::to_string(n) + " tokens: each position once";
    return "";
}

std::vector<GradedCase> cases(void* fn) {
    const auto student = reinterpret_cast<GreedyDecode>(fn);
    return {
        {"eos never wins: stops after max_len = 10 tokens", [=] { return grade(student, 1, -100, 10); }},
        {"another model, max_len = 30: long enough for the cache to matter", [=] { return grade(student, 2, -100, 30); }},
        {"eos always wins: one token, eos", [=] { return grade(student, 3, 100, 10); }},
        {"eos as likely as the rest: whatever comes first, eos or max_len", [=] { return grade(student, 4, 0, 40); }},
        {"max_len = 1", [=] { return grade(student, 5, -100, 1); }},
    };
}

}  // namespace

GradedExercise greedy_decode_exercise() {
    return {"greedy_decode", "greedy decoding over a key/value cache, each position projected once",
            "extern \"C\" long greedy_decode(const DecoderModel* model, int bos, int eos, long max_len, double* k_cache, "
            "double* v_cache, int* out_tokens);",
            cases};
}

TF_NAMESPACE_END
