// Two identities about attention heads that hold exactly, checked in float64 on a whole model:
//   1. the gradient of a head's gate (one gate for the whole batch) is the Frobenius product of the head's
//      columns of the out-projection with their gradient: ∂L/∂ξ_h = ⟨W_o^h, ∂L/∂W_o^h⟩_F (at ξ = 1; the
//      out-projection's bias is not part of any head). So the batch importance of Michel et al. comes for
//      free from the weight gradient that training computes anyway.
//   2. the key bias gets no gradient, ∂L/∂b_k^h = 0: adding a constant vector to every key adds the same
//      q·b_k to every score of a query, and softmax ignores a shift per row.
#include <catch2/catch.hpp>

#include <cmath>

#include "tapeformer/autograd.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/ops.h"

using namespace tf;

TEST_CASE("heads: the batch gate gradient equals <W_o^h, dL/dW_o^h>, and the key bias gets no gradient",
          "[heads][identities]") {
    ModelConfig c;
    c.src_vocab = c.tgt_vocab = 17;
    c.d_model = 12;
    c.heads = 3;
    c.ffn = 16;
    c.enc_layers = c.dec_layers = 2;
    c.max_len = 16;
    c.tie = Tying::None;
    Transformer model(c, 9);
    for (auto& [name, m] : model.attentions()) {  // non-zero biases, so that b_k's zero gradient is a finding
        Rng rng(std::hash<std::string>{}(name));
        for (std::int64_t i = 0; i < m->in_proj_bias.numel(); ++i) m->in_proj_bias.data()[i] = real(rng.uniform() - 0.5);
        m->gate.set_requires_grad(true);
    }
    const std::int64_t B = 3, S = 6, T = 5;
    const std::vector<std::int32_t> src = {5, 6, 7, 8, 9, 2, 4, 5, 6, 2, 0, 0, 11, 12, 13, 14, 2, 0};
    const std::vector<std::int32_t> dec_in = {1, 5, 6, 7, 8, 1, 9, 10, 0, 0, 1, 4, 4, 4, 0};
    const std::vector<std::int32_t> target = {5, 6, 7, 8, 2, 9, 10, 2, 0, 0, 4, 4, 4, 2, 0};
    Tensor loss = sequence_loss(model.forward(src, B, S, dec_in, T, Pass{}), target, 0, real(0.1));
    backward(loss);

    const std::int64_t C = c.d_model, D = c.d_model / c.heads;
    for (auto& [name, m] : model.attentions()) {
        double bq = 0, bk = 0;
        for (std::int64_t i = 0; i < C; ++i) {
            bq = std::max(bq, std::fabs(double(m->in_proj_bias.grad()[i])));
            bk = std::max(bk, std::fabs(double(m->in_proj_bias.grad()[C + i])));
        }
        INFO(name);
        CHECK(bq > 1e-6);   // the query bias does get a gradient ...
        CHECK(bk < 1e-15);  // ... the key bias none
        for (std::int64_t h = 0; h < c.heads; ++h) {
            double frobenius = 0;  // ⟨W_o^h, ∂L/∂W_o^h⟩ over the head's D columns of W_o (C, C)
            for (std::int64_t r = 0; r < C; ++r)
                for (std::int64_t k = h * D; k < (h + 1) * D; ++k)
                    frobenius += double(m->out_proj.weight.data()[r * C + k]) * m->out_proj.weight.grad()[r * C + k];
            const double gate = m->gate.grad()[h];
            INFO("head " << h << ": gate gradient " << gate << ", Frobenius product " << frobenius);
            CHECK(std::fabs(gate) > 1e-8);
            CHECK(std::fabs(gate - frobenius) <= 1e-12 * std::max(1.0, std::fabs(gate)));
        }
    }
}
