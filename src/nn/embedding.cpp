// Token embeddings and positional encodings.
#include "tapeformer/nn/embedding.h"

#include <cmath>
#include <stdexcept>

#include "tapeformer/nn/linear.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

Embedding::Embedding(std::int64_t V, std::int64_t C, std::int32_t pad)
    : weight(make_param({V, C})), padding_idx(pad), scale(real(std::sqrt(double(C)))) {}

Tensor Embedding::forward(const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T, const Pass& pass) const {
    const Tensor rows = embedding(weight, ids, {B, T}, padding_idx);  // (B, T, C)
    pass.probe(this, "embed", rows);
    if (scale == real(1)) return rows;
    Tensor x = tf::scale(rows, scale);  // (B, T, C)
    pass.probe(this, "scale", x);
    let_go_of(pass, rows, x);  // scale's backward reads no values, the embedding's only the ids
    return x;
}

void Embedding::visit(ModuleWalk& walk) const { walk.parameter("weight", weight); }

void Embedding::init(Rng& rng) {
    init_normal(weight, rng, 1.0 / std::sqrt(double(weight.size(1))));
    if (!weight.shape_only() && padding_idx >= 0 && padding_idx < weight.size(0)) {
        real* row = weight.data() + std::int64_t(padding_idx) * weight.size(1);
        for (std::int64_t c = 0; c < weight.size(1); ++c) row[c] = 0;
    }
}

PositionalEncoding::PositionalEncoding(PositionalKind k, std::int64_t max_len, std::int64_t C) : kind(k) {
    if (kind == PositionalKind::None) return;
    if (kind == PositionalKind::Learned) {
        table = make_param({max_len, C});
        return;
    }
    table = Tensor::empty({max_len, C});  // a constant: no gradient
    if (table.shape_only()) return;
    real* pe = table.data();
    for (std::int64_t pos = 0; pos < max_len; ++pos)
        for (std::int64_t i = 0; i < C; i += 2) {
            // 1 / 10000^(i/C) computed as exp(−i · ln(10000) / C), as PyTorch's tutorials do
            const double angle = double(pos) * std::exp(-double(i) * std::log(10000.0) / double(C));
            pe[pos * C + i] = real(std::sin(angle));
            if (i + 1 < C) pe[pos * C + i + 1] = real(std::cos(angle));
        }
}

Tensor PositionalEncoding::forward(const Tensor& x, std::int64_t start, const Pass& pass) const {
    if (kind == PositionalKind::None) throw std::logic_error("positional encoding: the model has none (positional none)");
    const std::int64_t T = x.size(1);
    if (start + T > table.size(0))
        throw std::invalid_argument("positional encoding: position " + std::to_string(start + T - 1) +
                                    " is beyond max_len " + std::to_string(table.size(0)) +
                                    " (raise the model's max_len or shorten the input)");
    Tensor out = add(x, table.rows(start, start + T));  // (B, T, C) + (T, C)
    pass.probe(this, "positional", out);
    return out;
}

void PositionalEncoding::visit(ModuleWalk& walk) const {
    if (kind == PositionalKind::Learned) walk.parameter("weight", table);
}

TF_NAMESPACE_END
