// bench_decode_products: the products of one decoding step, a few rows by a weight matrix, on one thread:
// raw cblas_sgemm, tf::gemm as training runs it, and tf::gemm with the weight held by FrozenMatrices (packed
// once for oneDNN's brgemm kernel, as decoding holds them), in fp32 and, where the CPU has it, bf16.
//
//   bench_decode_products [--reps N]
//
// Shapes: C (M, N) = X (M, K) · Wᵀ with W (N, K) the default model's weights (C 256, FFN 1024, V 8000) and
// M = 1, 32 (decode.cpp's group of rows) and 64 rows. Prints µs per product and GFLOP/s.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tapeformer/blas.h"

static_assert(std::is_same_v<tf::real, float>, "bench_decode_products compares against sgemm: link the float32 core");

namespace {

// Mean µs of f over `reps` runs, after two untimed ones.
double micros(const std::function<void()>& f, int reps) {
    f();
    f();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 200;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: bench_decode_products [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1) {
        std::fprintf(stderr, "bench_decode_products: --reps must be at least 1\n");
        return 2;
    }
    tf::set_threads(1);
    const bool bf16 = tf::cpu_has_bf16();
    std::printf("one thread; OpenBLAS %s; bf16 %s\n", tf::blas_core(), bf16 ? "yes" : "no (this CPU has no bf16 instructions)");
    std::printf("%-22s %20s %20s %20s %20s %20s\n", "M x N x K", "cblas_sgemm", "tf::gemm fp32", "held fp32",
                "tf::gemm bf16", "held bf16");
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1, 1);
    const std::int64_t shapes[][2] = {{256, 256}, {768, 256}, {1024, 256}, {256, 1024}, {8000, 256}};
    for (std::int64_t M : {1, 32, 64}) {
        for (const auto& nk : shapes) {
            const std::int64_t N = nk[0], K = nk[1];
            std::vector<float> X(std::size_t(M * K)), W(std::size_t(N * K)), C(std::size_t(M * N));
            for (float& v : X) v = dist(gen);
            for (float& v : W) v = dist(gen);
            const double flops = 2.0 * double(M) * double(N) * double(K);
            auto tf_gemm = [&] { tf::gemm(false, true, M, N, K, 1, X.data(), K, W.data(), K, 0, C.data(), N); };
            std::string cells;
            auto cell = [&](double us) {
                char buf[64];
                std::snprintf(buf, sizeof buf, " %10.1f (%5.0f GF)", us, flops / us / 1e3);
                cells += buf;
            };
            cell(micros([&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, X.data(), K, W.data(), K, 0,
                                          C.data(), N); }, reps));
            for (tf::Precision p : {tf::Precision::FP32, tf::Precision::BF16}) {
                if (p == tf::Precision::BF16 && !bf16) {
                    cells += "                    -                    -";
                    continue;
                }
                tf::set_precision(p);
                cell(micros(tf_gemm, reps));
                tf::FrozenMatrices frozen;
                frozen.add(W.data(), N, K);
                cell(micros(tf_gemm, reps));
            }
            tf::set_precision(tf::Precision::FP32);
            std::printf("%4lld x %4lld x %4lld     %s\n", (long long)M, (long long)N, (long long)K, cells.c_str());
        }
    }
    return 0;
}
