// matmul and gemm (ops.h, blas.h) against the three-loop reference::gemm: every transpose combination,
// batched and shared operands, odd sizes, and thread counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>

#include "tapeformer/blas.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/ops.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

namespace {

Tensor random(const Shape& shape, std::uint64_t seed) { return tf::random_tensor(shape, seed, -1, 1, false); }

// max |a − b| / max |b|
double relative_error(const std::vector<real>& a, const std::vector<real>& b) {
    REQUIRE(a.size() == b.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::fabs(double(b[i])));
    }
    return diff / std::max(scale, 1e-30);
}

// op(a) @ op(b) one matrix at a time with reference::gemm. a: (..., Ra, Ca), b: (..., Rb, Cb) with the same
// leading axes, or b 2-D and shared by all of a's matrices.
std::vector<real> reference_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
    const std::int64_t Ra = a.size(-2), Ca = a.size(-1), Rb = b.size(-2), Cb = b.size(-1);
    const std::int64_t M = ta ? Ca : Ra, K = ta ? Ra : Ca, N = tb ? Rb : Cb;
    const std::int64_t batch = a.numel() / (Ra * Ca);
    const bool shared = b.rank() == 2 && a.rank() > 2;
    std::vector<real> c(std::size_t(batch * M * N), real(0));
    for (std::int64_t i = 0; i < batch; ++i)
        tf::reference::gemm(ta, tb, M, N, K, 1, a.data() + i * Ra * Ca, Ca, b.data() + (shared ? 0 : i * Rb * Cb), Cb, 0,
                           c.data() + i * M * N, N);
    return c;
}

// The stored shape of an operand that, after the optional transpose, is (..., rows, cols).
Shape stored(Shape s, bool transposed) {
    if (transposed) std::swap(s.dims[s.rank - 1], s.dims[s.rank - 2]);
    return s;
}

void check_matmul(const Shape& a_logical, const Shape& b_logical, bool ta, bool tb, std::uint64_t seed) {
    Tensor a = random(stored(a_logical, ta), seed);
    Tensor b = random(stored(b_logical, tb), seed + 100);
    INFO("a " << a.shape().str() << (ta ? "^T" : "") << " @ b " << b.shape().str() << (tb ? "^T" : ""));
    Tensor c = tf::matmul(a, b, ta, tb);
    Shape expected = a_logical;
    expected[-1] = b_logical[-1];
    CHECK(c.shape() == expected);
    CHECK(relative_error(c.to_vector(), reference_matmul(a, b, ta, tb)) <= 1e-5);
}

}  // namespace

TEST_CASE("reference::gemm computes a 2x2 product by hand", "[matmul]") {
    // [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50]
    const std::vector<real> A = {1, 2, 3, 4}, B = {5, 6, 7, 8};
    std::vector<real> C(4, real(1));
    tf::reference::gemm(false, false, 2, 2, 2, 1, A.data(), 2, B.data(), 2, 0, C.data(), 2);
    CHECK(C == std::vector<real>{19, 22, 43, 50});
    // Aᵀ B = [1 3; 2 4] [5 6; 7 8] = [26 30; 38 44];  with alpha 2 and beta 1 onto C = 1
    std::fill(C.begin(), C.end(), real(1));
    tf::reference::gemm(true, false, 2, 2, 2, 2, A.data(), 2, B.data(), 2, 1, C.data(), 2);
    CHECK(C == std::vector<real>{53, 61, 77, 89});
    // A Bᵀ = [1 2; 3 4] [5 7; 6 8] = [17 23; 39 53]
    tf::reference::gemm(false, true, 2, 2, 2, 1, A.data(), 2, B.data(), 2, 0, C.data(), 2);
    CHECK(C == std::vector<real>{17, 23, 39, 53});
}

TEST_CASE("gemm matches reference::gemm with alpha, beta and padded strides", "[matmul]") {
    // Small products (libxsmm's kernels where the CPU has them: α = 1 and β ∈ {0, 1} in the kernel, other α and
    // β applied after, a transposed B copied) and a larger one, tiled; every transpose and (α, β) path.
    struct Size {
        std::int64_t M, N, K;
    };
    const Size sizes[] = {{7, 5, 13}, {20, 64, 20}, {20, 20, 64}, {96, 80, 72}};
    const std::pair<real, real> scales[] = {{1, 0}, {1, 1}, {real(0.5), 0}, {real(0.5), 1}, {real(0.5), real(-2)}, {1, real(0.25)}};
    const std::int64_t pad = 3;
    for (const Size& s : sizes)
        for (const auto& [alpha, beta] : scales)
            for (int ta = 0; ta < 2; ++ta)
                for (int tb = 0; tb < 2; ++tb) {
                    const std::int64_t M = s.M, N = s.N, K = s.K;
                    INFO("M " << M << " N " << N << " K " << K << " alpha " << alpha << " beta " << beta << " trans_a " << ta
                              << " trans_b " << tb);
                    // Stored matrices with `pad` extra columns that must not be read.
                    const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
                    const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
                    Tensor A = random({a_rows, lda}, 11 + ta), B = random({b_rows, ldb}, 21 + tb), C0 = random({M, ldc}, 31);
                    std::vector<real> c = C0.to_vector(), c_ref = C0.to_vector();
                    tf::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, c.data(), ldc);
                    tf::reference::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, c_ref.data(), ldc);
                    CHECK(relative_error(c, c_ref) <= 1e-5);
                    for (std::int64_t i = 0; i < M; ++i)  // the padding columns of C are left alone
                        for (std::int64_t j = N; j < ldc; ++j) CHECK(c[i * ldc + j] == C0.data()[i * ldc + j]);
                }
}

TEST_CASE("gemm with beta 0 ignores C, and K = 0 gives beta C", "[matmul]") {
    const std::vector<real> A = {1, 2, 3, 4}, B = {1, 0, 0, 1};
    const real nan = std::numeric_limits<real>::quiet_NaN();
    std::vector<real> C(4, nan), C_ref(4, nan);
    tf::gemm(false, false, 2, 2, 2, 1, A.data(), 2, B.data(), 2, 0, C.data(), 2);
    tf::reference::gemm(false, false, 2, 2, 2, 1, A.data(), 2, B.data(), 2, 0, C_ref.data(), 2);
    CHECK(C == A);
    CHECK(C_ref == A);
    for (int tb = 0; tb < 2; ++tb) {  // α ≠ 1 is applied after the product: C's NaNs still unread
        std::fill(C.begin(), C.end(), nan);
        tf::gemm(false, tb, 2, 2, 2, 2, A.data(), 2, B.data(), 2, 0, C.data(), 2);
        CHECK(C == std::vector<real>{2, 4, 6, 8});
    }
    std::vector<real> E = {1, 2, 3, 4}, E_ref = E;
    tf::gemm(false, false, 2, 2, 0, 1, A.data(), 1, B.data(), 2, 3, E.data(), 2);
    tf::reference::gemm(false, false, 2, 2, 0, 1, A.data(), 1, B.data(), 2, 3, E_ref.data(), 2);
    CHECK(E == std::vector<real>{3, 6, 9, 12});
    CHECK(E_ref == E);
}

TEST_CASE("matmul 2-D, every transpose combination", "[matmul]") {
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            check_matmul({7, 13}, {13, 5}, ta, tb, 1);
            check_matmul({1, 1}, {1, 1}, ta, tb, 2);
            check_matmul({1, 9}, {9, 1}, ta, tb, 3);   // a dot product
            check_matmul({6, 1}, {1, 4}, ta, tb, 4);   // an outer product
            check_matmul({64, 96}, {96, 33}, ta, tb, 5);
        }
}

TEST_CASE("matmul batched 3-D and 4-D, every transpose combination", "[matmul]") {
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            check_matmul({3, 7, 13}, {3, 13, 5}, ta, tb, 10);
            check_matmul({4, 1, 1}, {4, 1, 1}, ta, tb, 11);
            check_matmul({2, 3, 5, 8}, {2, 3, 8, 6}, ta, tb, 12);  // (B, H, T, D) @ (B, H, D, S)
            check_matmul({1, 2, 1, 3}, {1, 2, 3, 1}, ta, tb, 13);
        }
    // Products large enough that matmul runs them one after another on a threaded BLAS instead of
    // splitting the batch across threads.
    check_matmul({2, 128, 160}, {2, 160, 208}, false, true, 14);
    check_matmul({2, 128, 160}, {2, 160, 208}, true, false, 15);
}

TEST_CASE("matmul with a shared 2-D second operand", "[matmul]") {
    for (int tb = 0; tb < 2; ++tb) {
        check_matmul({2, 5, 7}, {7, 3}, false, tb, 20);     // (B, T, C) @ W: a linear layer
        check_matmul({2, 3, 5, 7}, {7, 3}, false, tb, 21);  // 4-D rows
        check_matmul({1, 1, 1}, {1, 1}, false, tb, 22);
        check_matmul({3, 37, 64}, {64, 96}, false, tb, 23);
    }
}

TEST_CASE("matmul rejects mismatched shapes, naming the op and the shapes", "[matmul]") {
    auto message = [](const Tensor& a, const Tensor& b, bool ta = false, bool tb = false) -> std::string {
        try {
            tf::matmul(a, b, ta, tb);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "";
    };
    const std::string inner = message(Tensor::zeros({3, 4}), Tensor::zeros({5, 6}));
    CHECK_THAT(inner, Catch::StartsWith("matmul") && Catch::Contains("(3, 4)") && Catch::Contains("(5, 6)"));
    CHECK_THAT(message(Tensor::zeros({3, 4}), Tensor::zeros({3, 4}), false, false), Catch::Contains("matmul"));
    CHECK(message(Tensor::zeros({3, 4}), Tensor::zeros({3, 4}), true, false).empty());  // Aᵀ B is fine
    CHECK(message(Tensor::zeros({3, 4}), Tensor::zeros({3, 4}), false, true).empty());  // A Bᵀ is fine
    CHECK_THAT(message(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})),
               Catch::Contains("matmul") && Catch::Contains("(2, 3, 4)") && Catch::Contains("(3, 4, 5)"));
    CHECK_THAT(message(Tensor::zeros({2, 2, 3, 4}), Tensor::zeros({2, 4, 5})),
               Catch::Contains("matmul") && Catch::Contains("(2, 2, 3, 4)") && Catch::Contains("(2, 4, 5)"));
    CHECK_THAT(message(Tensor::zeros({4}), Tensor::zeros({4, 2})), Catch::Contains("matmul") && Catch::Contains("(4)"));
    CHECK_THAT(message(Tensor::zeros({2, 4, 3}), Tensor::zeros({4, 5}), true, false), Catch::Contains("matmul"));
    CHECK_THAT(message(Tensor::zeros({2, 3, 4}), Tensor::zeros({5, 6})),
               Catch::Contains("matmul") && Catch::Contains("(2, 3, 4)") && Catch::Contains("(5, 6)"));
    CHECK_THAT(message(Tensor(), Tensor::zeros({5, 6})), Catch::Contains("matmul"));
}

TEST_CASE("gemm splits a large product into tiles that give the reference result, for every transpose",
          "[matmul]") {
    // (M, N, K): many row tiles; row and column tiles (only row tiles where oneDNN runs fp32 tiles: tiling's
    // rows_first); a thin C with a long inner dimension (one tile, run in a parallel region); a wide C (column
    // tiles); each with padded strides and beta = 1 onto existing values.
    const std::int64_t shapes[][3] = {{1000, 64, 96}, {600, 700, 40}, {17, 40, 5000}, {40, 3000, 64}};
    const std::int64_t pad = 5;
    for (const auto& s : shapes)
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) {
                const std::int64_t M = s[0], N = s[1], K = s[2];
                INFO("M " << M << " N " << N << " K " << K << " trans_a " << ta << " trans_b " << tb);
                const std::int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
                const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
                Tensor A = random({a_rows, lda}, 51 + ta), B = random({b_rows, ldb}, 61 + tb), C0 = random({M, ldc}, 71);
                std::vector<real> c = C0.to_vector(), c_ref = C0.to_vector();
                tf::gemm(ta, tb, M, N, K, 1, A.data(), lda, B.data(), ldb, 1, c.data(), ldc);
                tf::reference::gemm(ta, tb, M, N, K, 1, A.data(), lda, B.data(), ldb, 1, c_ref.data(), ldc);
                CHECK(relative_error(c, c_ref) <= 1e-5);
                bool padding_kept = true;
                for (std::int64_t i = 0; i < M; ++i)
                    for (std::int64_t j = N; j < ldc; ++j) padding_kept = padding_kept && c[i * ldc + j] == C0.data()[i * ldc + j];
                CHECK(padding_kept);
            }
}

TEST_CASE("gemm_group: a bias starts every row, beta is not used, products of M = 0 are skipped", "[matmul]") {
    for (const std::int64_t M : {std::int64_t(3), std::int64_t(700)}) {  // a small product, a large (tiled) one
        const std::int64_t N = 300, K = 130;
        INFO("M " << M);
        Tensor A = random({M, K}, 5), W = random({N, K}, 6), bias = random({N}, 7);
        std::vector<real> c(std::size_t(M * N), std::numeric_limits<real>::quiet_NaN()), ref(std::size_t(M * N));
        for (std::int64_t i = 0; i < M; ++i) std::copy(bias.data(), bias.data() + N, ref.begin() + i * N);
        tf::reference::gemm(false, true, M, N, K, 2, A.data(), K, W.data(), K, 1, ref.data(), N);
        // β = 7 would read C's NaNs: with a bias it is not used.
        tf::gemm_group({tf::GemmCall{false, true, M, N, K, 2, A.data(), K, W.data(), K, 7, c.data(), N, 1, 0, 0, 0, bias.data()},
                        tf::GemmCall{}});
        CHECK(relative_error(c, ref) <= 1e-5);
    }
}

TEST_CASE("gemm_group: runs every job once, with or without products", "[matmul]") {
    for (const std::int64_t M : {std::int64_t(0), std::int64_t(2), std::int64_t(600)}) {
        INFO("M " << M);
        Tensor A = random({std::max<std::int64_t>(M, 1), 500}, 1), B = random({500, 400}, 2);
        std::vector<real> c(std::size_t(std::max<std::int64_t>(M, 1) * 400));
        std::vector<std::atomic<int>> runs(100);
        tf::gemm_group({tf::GemmCall{false, false, M, 400, 500, 1, A.data(), 500, B.data(), 400, 0, c.data(), 400}}, 100,
                       [&](std::int64_t i) { ++runs[std::size_t(i)]; });
        CHECK(std::all_of(runs.begin(), runs.end(), [](const std::atomic<int>& r) { return r == 1; }));
    }
}

TEST_CASE("ProductTimer: sums the products' wall time, a batch once, one timer at a time", "[matmul]") {
    Tensor A = random({64, 20, 20}, 1), B = random({64, 20, 20}, 2);
    {
        tf::ProductTimer timer;
        CHECK_THROWS_AS(tf::ProductTimer(), std::logic_error);
        Tensor c = tf::matmul(A, B);                    // 64 products in one gemm_batched: one call
        tf::gemm(false, false, 20, 20, 20, 1, A.data(), 20, B.data(), 20, 0, c.data(), 20);
        CHECK(timer.calls == 2);
        CHECK(timer.ms > 0);
    }
    tf::ProductTimer again;  // the first one is gone
    CHECK(again.calls == 0);
}

TEST_CASE("ProductTimer: products inside a parallel region count, each its time over the team's size", "[matmul]") {
    // attention_heads' per-head products run inside its parallel region over heads; at 2 threads and more, a
    // step's profile left them out of the products before.
    Tensor A = random({20, 20}, 1), B = random({20, 20}, 2);
    tf::ProductTimer timer;
    int team = 0;
#pragma omp parallel num_threads(2)
    {
        std::vector<real> c(400);
        tf::gemm(false, false, 20, 20, 20, 1, A.data(), 20, B.data(), 20, 0, c.data(), 20);
#pragma omp single
        team = omp_get_num_threads();
    }
    CHECK(timer.calls == team);
    CHECK(timer.ms > 0);
}
