// FrozenMatrices (blas.h) and decode.h's FrozenWeights: products whose weight is held run as one oneDNN
// matmul over a copy packed once. They must compute the product (against reference::gemm, in fp32 and on the
// bf16-rounded operands in bf16), give the same bits on any thread count and on any thread, leave every
// other product to the usual path, and decode the same translations on 1 and 2 threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/decode.h"
#include "tapeformer/random.h"
#include "helpers.h"

using tf::Precision;
using tf_test::PrecisionScope;
using tf_test::uniform;

namespace {

std::vector<Precision> precisions_here() {
    if (tf::cpu_has_bf16()) return {Precision::FP32, Precision::BF16};
    tf_test::skipped("the bf16 cases: this CPU has no bf16 instructions (AVX512-BF16 or AMX); the fp32 ones ran");
    return {Precision::FP32};
}



// Decoding's weights: a square one, an FFN pair, the output projection, a fused (3C, C) Q, K, V weight.
struct Weights {
    static constexpr std::int64_t C = 256;
    std::vector<float> square = uniform(C * C, 70), ffn_in = uniform(4 * C * C, 71), ffn_out = uniform(4 * C * C, 72);
    std::vector<float> wide = uniform(2000 * C, 73), qkv = uniform(3 * C * C, 74);
    void hold(tf::FrozenMatrices& f) const {
        f.add(square.data(), C, C);
        f.add(ffn_in.data(), 4 * C, C);
        f.add(ffn_out.data(), C, 4 * C);
        f.add(wide.data(), 2000, C);
        f.add(qkv.data(), 3 * C, C);
    }
};

// A product C (M, N) = α·A (M, K)·Bᵀ + β·C with B (N, K) dense, A and C with padded row strides.
struct Use {
    const char* what;
    const float* B;
    std::int64_t M, N, K;
    float alpha, beta;
};

std::vector<Use> uses_of(const Weights& w) {
    const std::int64_t C = Weights::C;
    return {{"square, 64 rows", w.square.data(), 64, C, C, 1, 1},
            {"square, 1 row", w.square.data(), 1, C, C, 1, 0},
            {"ffn in, 32 rows", w.ffn_in.data(), 32, 4 * C, C, 1, 1},
            {"ffn out, 32 rows", w.ffn_out.data(), 32, C, 4 * C, 1, 1},
            {"output projection, 19 rows, alpha 0.5", w.wide.data(), 19, 2000, C, 0.5f, 0},
            {"fused qkv, 640 rows", w.qkv.data(), 640, 3 * C, C, 1, 1},
            {"query rows", w.qkv.data(), 32, C, C, 1, 1},
            {"key and value rows", w.qkv.data() + C * C, 320, 2 * C, C, 1, 0}};
}

struct Operands {
    std::vector<float> A, C0;
    std::int64_t lda, ldc;
};

Operands operands(const Use& u, std::uint64_t seed) {
    Operands o;
    o.lda = u.K + 3;
    o.ldc = u.N + 2;
    o.A = uniform(std::size_t(u.M * o.lda), seed);
    o.C0 = uniform(std::size_t(u.M * o.ldc), seed + 1);
    return o;
}

std::vector<float> run(const Use& u, const Operands& o) {
    std::vector<float> C = o.C0;
    tf::gemm(false, true, u.M, u.N, u.K, u.alpha, o.A.data(), o.lda, u.B, u.K, u.beta, C.data(), o.ldc);
    return C;
}

}  // namespace

TEST_CASE("frozen matrices: a held product computes the product, fp32 and bf16, whole weights and row blocks",
          "[frozen]") {
    const Weights w;
    for (Precision p : precisions_here()) {
        PrecisionScope scope(p);
        tf::FrozenMatrices frozen;
        w.hold(frozen);
        CHECK(frozen.size() == 5);
        std::uint64_t seed = 100;
        for (const Use& u : uses_of(w)) {
            INFO(tf::precision_name(p) << ": " << u.what);
            REQUIRE(frozen.holds(u.B, u.N, u.K, u.K));
            const Operands o = operands(u, seed += 2);
            const std::vector<float> C = run(u, o);
            // The reference on what the product multiplies: the operands themselves, or rounded to bf16 (in
            // bf16 precision, for products of kSmallProduct multiply-adds or more; smaller ones stay fp32).
            std::vector<float> A = o.A, B(u.B, u.B + u.N * u.K), ref = o.C0;
            if (p == Precision::BF16 && u.M * u.N * u.K >= tf::kSmallProduct) {
                std::transform(A.begin(), A.end(), A.begin(), tf_test::round_bf16);
                std::transform(B.begin(), B.end(), B.begin(), tf_test::round_bf16);
            }
            tf::reference::gemm(false, true, u.M, u.N, u.K, u.alpha, A.data(), o.lda, B.data(), u.K, u.beta, ref.data(), o.ldc);
            double worst = 0;
            for (std::int64_t i = 0; i < u.M; ++i)
                for (std::int64_t j = 0; j < u.N; ++j) {
                    const double r = ref[i * o.ldc + j], d = std::fabs(double(C[i * o.ldc + j]) - r);
                    worst = std::max(worst, d / (std::sqrt(double(u.K)) * 1e-6 + 1e-6 * std::fabs(r)));
                }
            CHECK(worst <= 8);  // within a few fp32 roundings of the sum
            for (std::int64_t i = 0; i < u.M; ++i)  // the padding between rows of C is untouched
                for (std::int64_t j = u.N; j < o.ldc; ++j) CHECK(C[i * o.ldc + j] == o.C0[i * o.ldc + j]);
        }
    }
}

TEST_CASE("frozen matrices: a held product gives the same bits on 1 and 2 threads and on another thread",
          "[frozen][determinism]") {
    const Weights w;
    tf_test::ThreadsGuard threads;
    for (Precision p : precisions_here()) {
        PrecisionScope scope(p);
        tf::FrozenMatrices frozen;
        w.hold(frozen);
        std::uint64_t seed = 200;
        for (const Use& u : uses_of(w)) {
            INFO(tf::precision_name(p) << ": " << u.what);
            const Operands o = operands(u, seed += 2);
            tf::set_threads(1);
            const std::vector<float> one = run(u, o);
            tf::set_threads(2);
            const std::vector<float> two = run(u, o);
            std::vector<float> elsewhere;
            std::thread([&] { elsewhere = run(u, o); }).join();  // its own primitives and stream
            CHECK(one == two);
            CHECK(elsewhere == two);
        }
    }
}

TEST_CASE("frozen matrices: every other product takes the usual path, bit for bit", "[frozen]") {
    const Weights w;
    const std::int64_t C = Weights::C;
    const std::vector<float> other = uniform(std::size_t(C * C), 90);
    for (Precision p : precisions_here()) {
        PrecisionScope scope(p);
        // B not held; B held but read untransposed, or with another row stride; A transposed.
        struct Case {
            const char* what;
            bool ta, tb;
            const float* B;
            std::int64_t ldb;
        };
        const std::vector<Case> cases = {{"a matrix not held", false, true, other.data(), C},
                                         {"B untransposed", false, false, w.square.data(), C},
                                         {"A transposed", true, true, w.square.data(), C},
                                         {"another row stride", false, true, w.qkv.data(), 2 * C}};
        const std::vector<float> A = uniform(std::size_t(C * C), 91), C0 = uniform(std::size_t(C * C), 92);
        for (const Case& c : cases) {
            INFO(tf::precision_name(p) << ": " << c.what);
            auto product = [&] {
                std::vector<float> out = C0;
                tf::gemm(c.ta, c.tb, C, C, C, 1, A.data(), C, c.B, c.ldb, 1, out.data(), C);
                return out;
            };
            const std::vector<float> usual = product();
            tf::FrozenMatrices frozen;
            w.hold(frozen);
            CHECK(product() == usual);
        }
    }
}

TEST_CASE("frozen matrices: holds() takes whole rows of a held matrix only, and one lives at a time", "[frozen]") {
    const Weights w;
    const std::int64_t C = Weights::C;
    tf::FrozenMatrices frozen;
    w.hold(frozen);
    CHECK(frozen.holds(w.qkv.data() + 2 * C * C, C, C, C));       // the value rows
    CHECK_FALSE(frozen.holds(w.qkv.data(), C, C, C + 1));         // another row stride
    CHECK_FALSE(frozen.holds(w.qkv.data() + C * C, 3 * C, C, C));  // rows past the end
    CHECK_FALSE(frozen.holds(w.qkv.data() + 5, C, C, C));          // a start inside a row
    CHECK_FALSE(frozen.holds(w.ffn_in.data(), C, 4 * C, 4 * C));   // the same floats read as another shape
    const std::vector<float> other = uniform(std::size_t(C * C), 93);
    CHECK_FALSE(frozen.holds(other.data(), C, C, C));              // not held
    CHECK_THROWS_AS(tf::FrozenMatrices(), std::logic_error);
}

TEST_CASE("FrozenWeights: greedy and beam translations, held weights, the same on 1 and 2 threads",
          "[frozen][decode][determinism]") {
    tf_test::DecodingCase d = tf_test::sharpened_decoding_case();  // several groups of rows, products of every kind
    tf::Transformer& model = *d.model;
    const std::vector<std::int32_t>& src = d.src;
    const std::int64_t B = d.B, S = d.S;
    std::size_t matrices = 0;
    for (const tf::NamedTensor& p : model.parameters()) matrices += p.tensor.rank() == 2;
    tf_test::ThreadsGuard threads;
    for (Precision p : precisions_here()) {
        PrecisionScope scope(p);
        for (int beam : {1, 3}) {
            INFO(tf::precision_name(p) << ", beam " << beam);
            tf::DecodeOptions o;
            o.beam = beam;
            tf::set_threads(2);
            const auto usual = tf::translate_batch_scored(model, src, B, S, o);
            const tf::FrozenWeights frozen(model);
            CHECK(frozen.size() == matrices);
            tf::set_threads(1);
            const auto one = tf::translate_batch_scored(model, src, B, S, o);
            tf::set_threads(2);
            const auto two = tf::translate_batch_scored(model, src, B, S, o);
            REQUIRE(one.size() == std::size_t(B));
            REQUIRE(two.size() == std::size_t(B));
            for (std::int64_t b = 0; b < B; ++b) {
                INFO("sentence " << b);
                CHECK(one[b].tokens == two[b].tokens);
                CHECK(one[b].log_prob == two[b].log_prob);
                // Against the products without held weights: the same words, scores equal up to the
                // order of the sums — in bf16 up to bf16's precision (2^-8), since an activation that
                // differs in its last fp32 bit can round to the neighbouring bf16 value in the next product.
                CHECK(one[b].tokens == usual[b].tokens);
                CHECK(one[b].log_prob == Approx(usual[b].log_prob).epsilon(p == Precision::BF16 ? 2e-3 : 1e-4));
            }
        }
    }
}
