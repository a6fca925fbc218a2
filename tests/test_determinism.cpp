// Results that do not depend on the thread count: gemm's tiles, attention's batched products, layer norm's
// row sums and a whole model's forward and backward give the same bits on 1, 2, 3 and 4 threads. CTest runs
// the cases tagged [determinism] once per OpenBLAS kernel set these machines may use (Haswell, SkylakeX,
// Zen and OpenBLAS's own choice; tests/CMakeLists.txt), so that a result which depends on a kernel's
// blocking fails on any machine, not only on the CPU that picks that kernel.
#include <catch2/catch.hpp>

#include <cctype>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/ops.h"
#include "tapeformer/pool.h"
#include "tapeformer/random.h"

#include "helpers.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

namespace {

const int kThreadCounts[] = {1, 2, 3, 4};

// Runs f() under each thread count and checks that every run returns the same values as the first.
template <class F>
void check_same_on_every_thread_count(F f) {
    const int before = tf::num_threads();
    tf::set_threads(1);
    const std::vector<std::vector<real>> one = f();
    for (int threads : kThreadCounts) {
        tf::set_threads(threads);
        REQUIRE(tf::num_threads() == threads);
        const std::vector<std::vector<real>> other = f();
        REQUIRE(other.size() == one.size());
        for (std::size_t i = 0; i < one.size(); ++i) {
            INFO(threads << " threads, result " << i << " (" << one[i].size() << " values)");
            CHECK(other[i] == one[i]);
        }
    }
    tf::set_threads(before);
}

Tensor random(const Shape& shape, std::uint64_t seed, bool grad = false) {
    return tf::random_tensor(shape, seed, -1, 1, grad);
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

TEST_CASE("determinism: OpenBLAS runs the kernel set that OPENBLAS_CORETYPE asks for", "[determinism]") {
    const char* asked = std::getenv("OPENBLAS_CORETYPE");
    INFO("OPENBLAS_CORETYPE " << (asked ? asked : "(unset)") << ", OpenBLAS core " << tf::blas_core());
    if (asked) CHECK(lower(tf::blas_core()) == lower(asked));
    else CHECK(std::string(tf::blas_core()).size() > 0);
}

TEST_CASE("determinism: gemm gives the same bits on any thread count, for every transpose", "[determinism]") {
    // (M, N, K): row tiles (dense bands: oneDNN's brgemm where it runs fp32 tiles); row and column tiles (row
    // tiles only there); one tile with a long inner dimension; a wide C (column tiles).
    const std::int64_t shapes[][3] = {{1280, 256, 256}, {600, 700, 40}, {17, 40, 5000}, {64, 8000, 256}, {256, 256, 1280}};
    check_same_on_every_thread_count([&] {
        std::vector<std::vector<real>> out;
        std::uint64_t seed = 1;
        for (const auto& s : shapes)
            for (int ta = 0; ta < 2; ++ta)
                for (int tb = 0; tb < 2; ++tb) {
                    const std::int64_t M = s[0], N = s[1], K = s[2];
                    Tensor A = random({M * K}, seed++), B = random({K * N}, seed++);
                    std::vector<real> c = random({M * N}, seed++).to_vector();
                    tf::gemm(ta, tb, M, N, K, real(0.5), A.data(), ta ? M : K, B.data(), tb ? K : N, 1, c.data(), N);
                    out.push_back(std::move(c));
                }
        return out;
    });
}

TEST_CASE("determinism: matmul forward and backward give the same bits on any thread count", "[determinism]") {
    check_same_on_every_thread_count([] {
        std::vector<std::vector<real>> out;
        // Attention's many small products (B, H, T, D) @ (B, H, S, D)ᵀ, large batched ones, and a linear
        // layer's (B, T, C) @ (C_out, C)ᵀ with a shared second operand.
        const struct { Shape a, b; bool ta, tb; } cases[] = {
            {{8, 4, 24, 16}, {8, 4, 24, 16}, false, true},
            {{2, 160, 128}, {2, 160, 208}, true, false},
            {{16, 80, 256}, {1024, 256}, false, true},
        };
        std::uint64_t seed = 100;
        for (const auto& c : cases) {
            Tensor a = random(c.a, seed++, true), b = random(c.b, seed++, true);
            Tensor y = tf::matmul(a, b, c.ta, c.tb);
            const std::vector<real> upstream = random(y.shape(), seed++).to_vector();
            tf::backward(y, upstream);
            out.push_back(y.to_vector());
            out.emplace_back(a.grad(), a.grad() + a.numel());
            out.emplace_back(b.grad(), b.grad() + b.numel());
        }
        return out;
    });
}

TEST_CASE("determinism: layer norm's row sums (dγ, dβ) give the same bits on any thread count", "[determinism]") {
    check_same_on_every_thread_count([] {
        Tensor x = random({1000, 256}, 7, true), r = random({1000, 256}, 8, true);
        Tensor gamma = random({256}, 9, true), beta = random({256}, 10, true);
        Tensor y = tf::add_layer_norm(x, r, gamma, beta, real(1e-5));
        tf::backward(y, random(y.shape(), 11).to_vector());
        std::vector<std::vector<real>> out{y.to_vector()};
        for (const Tensor* t : {&x, &r, &gamma, &beta}) out.emplace_back(t->grad(), t->grad() + t->numel());
        return out;
    });
}

TEST_CASE("determinism: a model's loss and every gradient give the same bits on any thread count", "[determinism]") {
    tf::ModelConfig config;
    config.src_vocab = config.tgt_vocab = 500;
    config.d_model = 64;
    config.heads = 4;
    config.ffn = 128;
    config.enc_layers = config.dec_layers = 2;
    config.max_len = 64;
    const std::int64_t B = 24, S = 30, T = 28;
    tf::Rng data(3);
    std::vector<std::int32_t> src(B * S), dec_in(B * T), target(B * T);
    for (std::int64_t b = 0; b < B; ++b) {  // rows of different lengths, right-padded
        const std::int64_t s_len = S - b % 7, t_len = T - b % 5;
        for (std::int64_t i = 0; i < S; ++i) src[b * S + i] = i < s_len ? 4 + std::int32_t(data.below(496)) : 0;
        for (std::int64_t i = 0; i < T; ++i) {
            dec_in[b * T + i] = i < t_len ? 4 + std::int32_t(data.below(496)) : 0;
            target[b * T + i] = i < t_len ? 4 + std::int32_t(data.below(496)) : 0;
        }
    }
    // `peak`: the most the tensors asked for, beyond what the model held, from the forward to the backward's end
    auto step = [&](bool fuse_attention, bool let_values_go = false, std::size_t* peak = nullptr) {
        tf::Transformer model(config, 11);
        tf::Rng dropout(5);
        tf::Pass pass;
        pass.dropout_rng = &dropout;
        pass.fuse_attention = fuse_attention;
        pass.let_values_go = let_values_go;
        tf::pool_reset_peak();
        const std::size_t held = tf::pool_stats().bytes_asked;
        Tensor logits = model.forward(src, B, S, dec_in, T, pass);
        Tensor loss = tf::sequence_loss(logits, target, 0, real(0.1));
        tf::backward(loss);
        if (peak) *peak = tf::pool_stats().peak_bytes_asked - held;
        std::vector<std::vector<real>> out{loss.to_vector()};
        for (const auto& p : model.parameters()) out.emplace_back(p.tensor.grad(), p.tensor.grad() + p.tensor.numel());
        return out;
    };
    check_same_on_every_thread_count([&] { return step(false); });
    SECTION("and attention as one op (ops.h attention_heads) gives the composed ops' bits") {
        const std::vector<std::vector<real>> composed = step(false);
        check_same_on_every_thread_count([&] {
            const std::vector<std::vector<real>> fused = step(true);
            REQUIRE(fused.size() == composed.size());
            for (std::size_t i = 0; i < fused.size(); ++i) {
                INFO("result " << i << " (0: the loss, then the parameters' gradients)");
                CHECK(fused[i] == composed[i]);
            }
            return fused;
        });
    }
    SECTION("and passes that let values go (Pass::let_values_go) give the same bits, with two (B, L, C) tensors "
            "less a sublayer at the peak but at the stacks' ends (post-norm, three pre-norm) and three an embedding") {
        for (const tf::NormPosition norm : {tf::NormPosition::Post, tf::NormPosition::Pre}) {
            config.norm = norm;
            const bool post = norm == tf::NormPosition::Post;
            INFO((post ? "post-norm" : "pre-norm"));
            std::size_t kept_peak = 0, recomputing_peak = 0;
            const std::vector<std::vector<real>> kept = step(true, false, &kept_peak);
            check_same_on_every_thread_count([&] {
                const std::vector<std::vector<real>> recomputing = step(true, true, &recomputing_peak);
                REQUIRE(recomputing.size() == kept.size());
                for (std::size_t i = 0; i < kept.size(); ++i) {
                    INFO("result " << i << " (0: the loss, then the parameters' gradients)");
                    CHECK(recomputing[i] == kept[i]);
                }
                return recomputing;
            });
            // The peak comes near the start of backward, while the forward's activations are all there. Each
            // embedding lets three values go: the looked-up rows, their scaled copy and their sum with the
            // positions. Post-norm: each sublayer lets two go, the sublayer's output and the Add & Norm's input
            // (its record keeps the sum either way), but for the input of each stack's first layer (the
            // embeddings: no norm's output) and the output of its last (the encoder's, which every cross-attention
            // reads; the decoder's, which the output layer reads at the peak). Pre-norm: three, the norm's output
            // (computed again from its input), the sublayer's output, of which dropout made a copy, and that copy,
            // which only the residual add reads; its peak (measured: three decoder tensors short of all) is held
            // to six short.
            const std::int64_t L = config.enc_layers, C = config.d_model;
            const std::int64_t embeddings = 3 * B * S + 3 * B * T;
            const std::int64_t sublayers = post ? (2 * 2 * L - 2) * B * S + (2 * 3 * L - 2) * B * T
                                                : 3 * 2 * L * B * S + (3 * 3 * L - 6) * B * T;
            const std::size_t at_least = sizeof(real) * C * std::size_t(embeddings + sublayers);
            INFO("peak asked " << kept_peak << " bytes keeping every value, " << recomputing_peak << " recomputing");
            CHECK(kept_peak >= recomputing_peak + at_least);
        }
        config.norm = tf::NormPosition::Post;
    }
}

TEST_CASE("determinism: a model's gradients do not depend on what the buffers held before (ops that overwrite a "
          "gradient write all of it)",
          "[determinism][autograd]") {
    // Each configuration exercises other ops' backward: tied tables (a gradient written by the output
    // projection, then added to by the embedding), an output bias, pre-norm, GELU, padded rows that the
    // loss ignores, dropout. Two steps with zero_grad between them: the second one overwrites stale buffers.
    // Variant 2 runs as training does: attention as the fused op (which writes the gradients of the
    // projections its heads cover whole) and the loss's gradient computed in its forward over the logits.
    // Variants 1 and 2 let values go after the forward (Pass::let_values_go: the layer norms' outputs, written
    // again in backward, and the values no backward reads).
    for (const int variant : {0, 1, 2}) {
        tf::ModelConfig config;
        config.src_vocab = config.tgt_vocab = 300;
        config.d_model = 32;
        config.heads = 4;
        config.ffn = 64;
        config.enc_layers = config.dec_layers = 2;
        config.max_len = 32;
        if (variant == 1) {
            config.tie = tf::Tying::All;
            config.output_bias = true;
            config.norm = tf::NormPosition::Pre;
            config.activation = tf::Activation::GELU;
            config.attention = tf::AttentionScore::Additive;
        }
        const std::int64_t B = 6, S = 9, T = 7;
        auto run = [&](bool poison) {
            tf::pool_release_cached();
            tf::pool_poison(poison);
            tf::Transformer model(config, 11);
            tf::Rng data(3), dropout(5);
            tf::Pass pass;
            pass.dropout_rng = &dropout;
            pass.fuse_attention = variant == 2;
            pass.let_values_go = variant != 0;
            std::vector<std::vector<real>> out;
            for (int step = 0; step < 2; ++step) {
                std::vector<std::int32_t> src(B * S), dec_in(B * T), target(B * T);
                for (std::int64_t b = 0; b < B; ++b)
                    for (std::int64_t i = 0; i < std::max(S, T); ++i) {
                        const bool real_token = i < S - b % 3;  // right-padded rows
                        if (i < S) src[b * S + i] = real_token ? 4 + std::int32_t(data.below(296)) : 0;
                        if (i < T) dec_in[b * T + i] = i < T - b % 4 ? 4 + std::int32_t(data.below(296)) : 0;
                        if (i < T) target[b * T + i] = i < T - b % 4 ? 4 + std::int32_t(data.below(296)) : 0;
                    }
                for (auto& p : model.parameters()) p.tensor.zero_grad();
                Tensor logits = model.forward(src, B, S, dec_in, T, pass);
                Tensor loss = tf::sequence_loss(logits, target, 0, real(0.1), nullptr, /*consume_logits=*/variant == 2);
                logits = Tensor();
                tf::backward(loss);
                out.push_back(loss.to_vector());
                for (const auto& p : model.parameters()) out.push_back(p.tensor.grad_vector());
            }
            tf::pool_poison(false);
            return out;
        };
        INFO("variant " << variant);
        const auto clean = run(false), poisoned = run(true);
        REQUIRE(clean.size() == poisoned.size());
        for (std::size_t i = 0; i < clean.size(); ++i) {
            INFO("entry " << i);
            for (real v : poisoned[i]) REQUIRE(std::isfinite(v));
            CHECK(clean[i] == poisoned[i]);
        }
    }
}

TEST_CASE("determinism: gemm_group gives the bits of its products run in turn, on any thread count", "[determinism]") {
    // A linear layer's backward (dx and dW, large, tiled, reading the same dy), a large product onto a bias
    // (α = 1: oneDNN adds it in its kernel), attention's small batched products and a large batched one, in
    // one group with jobs; against each product alone. In fp32, and in bf16 where the CPU has it (where the
    // group rounds the shared dy once).
    struct Case {
        bool ta, tb;
        std::int64_t batch, M, N, K;
        bool bias;
    };
    const Case cases[] = {{false, false, 1, 1280, 256, 768, false}, {true, false, 1, 768, 256, 1280, false},
                          {false, true, 1, 1280, 1024, 256, true},  {false, true, 256, 20, 20, 64, false},
                          {true, false, 3, 300, 200, 128, false}};
    auto run = [&](bool grouped) {
        std::vector<std::vector<real>> out;
        std::vector<Tensor> keep;  // the operands, alive until the group has run
        std::vector<tf::GemmCall> calls;
        std::uint64_t seed = 11;
        for (const Case& c : cases) {
            Tensor A = random({c.batch * c.M * c.K}, seed++), B = random({c.batch * c.K * c.N}, seed++);
            Tensor bias = random({c.N}, seed++);
            out.push_back(random({c.batch * c.M * c.N}, seed++).to_vector());
            tf::GemmCall g{c.ta, c.tb, c.M, c.N, c.K, c.bias ? real(1) : real(0.5), A.data(), c.ta ? c.M : c.K, B.data(),
                           c.tb ? c.K : c.N, real(1), out.back().data(), c.N, c.batch, c.M * c.K, c.K * c.N, c.M * c.N,
                           c.bias ? bias.data() : nullptr};
            calls.push_back(g);
            keep.insert(keep.end(), {A, B, bias});
        }
        calls[1].A = calls[0].A;  // dW = dyᵀ x reads the dy of dx = dy W: (1280, 768) as stored in both
        // Jobs: each writes its own value once.
        std::vector<real> job_out(37, real(-1));
        auto job = [&](std::int64_t i) { job_out[std::size_t(i)] = real(i) * real(0.25); };
        if (grouped) {
            tf::gemm_group({calls[0], calls[1], calls[2], calls[3], calls[4]}, std::int64_t(job_out.size()), job);
        } else {
            for (const tf::GemmCall& g : calls) {
                if (g.bias) {  // a group of one (oneDNN adds a bias in its kernel, which gemm_batched cannot ask for)
                    tf::gemm_group({g});
                    continue;
                }
                tf::gemm_batched(g.trans_a, g.trans_b, g.batch, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.a_step, g.B, g.ldb,
                                 g.b_step, g.beta, g.C, g.ldc, g.c_step);
            }
            for (std::int64_t i = 0; i < std::int64_t(job_out.size()); ++i) job(i);
        }
        out.push_back(job_out);
        return out;
    };
    auto check = [&] {
        const std::vector<std::vector<real>> in_turn = run(false);
        check_same_on_every_thread_count([&] {
            const std::vector<std::vector<real>> grouped = run(true);
            REQUIRE(grouped.size() == in_turn.size());
            for (std::size_t i = 0; i < grouped.size(); ++i) {
                INFO("result " << i);
                CHECK(grouped[i] == in_turn[i]);
            }
            return grouped;
        });
    };
    SECTION("fp32") { check(); }
    SECTION("bf16") {
        if (!tf::cpu_has_bf16()) return;  // fp32 only: the section above
        tf_test::PrecisionScope bf16(tf::Precision::BF16);
        check();
    }
}
