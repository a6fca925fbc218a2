// Reference mode: the textbook form of every op that training and decoding run, to read line by line and
// to test the fast ops against. While it is on, the ops of ops.h send their work here (src/reference_ops.cpp,
// one file): matrix products as three nested loops (no BLAS), softmax with std::exp and its max-subtraction
// written out (no fast exp), LayerNorm and its backward term by term, the fused kernels as the compositions
// they equal, and one thread. The elementwise, shape and embedding ops of ops.cpp are plain loops already;
// reference mode runs them on that one thread.
#pragma once
#include <cstdint>
#include <vector>

#include "tapeformer/ops.h"
#include "tapeformer/random.h"
#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

// ---- the switch --------------------------------------------------------------------------------------------
// On: every later op takes its reference form, and the thread count is 1 (set_threads asks for more in vain
// while it is on). Off: the fast ops again, on the thread count from before it was switched on. Process-wide,
// like set_precision; switch it between steps, not while a tape records (a backward runs the form its
// forward recorded). `tapeformer --reference` switches it on for the whole command.
void set_reference_mode(bool on);
bool reference_mode();

// Reference mode for one scope (a test case, one training run); the mode from before at its end.
class ReferenceModeScope {
public:
    explicit ReferenceModeScope(bool on = true);
    ~ReferenceModeScope();
    ReferenceModeScope(const ReferenceModeScope&) = delete;
    ReferenceModeScope& operator=(const ReferenceModeScope&) = delete;

private:
    bool previous_;
};

// ---- the reference ops -------------------------------------------------------------------------------------
// The same contracts as their namesakes in ops.h and blas.h, which check the arguments and then, in reference
// mode, call these: called directly, they trust their arguments to be what those accept.
namespace reference {

// C (M, N) = α·op(A) (M, K)·op(B) (K, N) + β·C, row-major, lda/ldb/ldc the row strides: three nested loops,
// the sum over k in double. The product every fast gemm is tested against (tests/test_matmul.cpp).
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
          std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc);

// The int8 product of --precision int8 (blas.h's INT8), C (M, N) = α·A (M, K)·Bᵀ + β·C with B (N, K): B's
// rows and A's rows quantised to int8 with one scale each, the dot products summed in int32, rescaled in
// fp32 — each step a plain loop. What a product over a held matrix computes in int8 precision (tests/
// test_int8.cpp compares the two), and, in reference mode, what it runs.
void gemm_int8(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, std::int64_t lda,
               const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false, real alpha = 1);
Tensor softmax(const Tensor& a, const Tensor& mask = Tensor());
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, real eps = real(1e-5));
Tensor cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t ignore_index,
                     real label_smoothing, CrossEntropyStats* stats = nullptr);

// The fused kernels of fused_ops.cpp, each written as the composition it equals.
Tensor affine(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor slice_heads(const Tensor& x, std::int64_t begin, std::int64_t end, std::int64_t H);
Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                      real eps = real(1e-5));
Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, Rng& rng, const Tensor& gamma,
                              const Tensor& beta, real eps = real(1e-5), bool training = true);
Tensor relu_dropout(const Tensor& a, real p, Rng& rng, bool training = true);
Tensor affine_relu_dropout(const Tensor& x, const Tensor& weight, const Tensor& bias, real p, Rng& rng,
                           bool training = true);
Tensor attention_heads(const Tensor& xq, std::int64_t q_at, const Tensor& xkv, std::int64_t k_at, std::int64_t v_at,
                       std::int64_t H, std::int64_t D, const Tensor& mask, real p, Rng& rng, bool training = true);

// Local attention as the composition it equals: Q Kᵀ·scale over the full (T, T), the band and key masks
// added inside softmax, dropout drawn per band slot (band_attention's draws) as a constant multiplier, @ V.
Tensor band_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask, std::int64_t W,
                      bool causal, real scale, real p, Rng& rng, bool training = true);
}  // namespace reference

TF_NAMESPACE_END
