// Token embeddings and positional encodings: the input of each stack is
//   x = dropout(E[ids] · √C + PE[0..T))          ("Attention Is All You Need", section 3.4 and 3.5)
#pragma once
#include <string>
#include <vector>

#include "tapeformer/nn/module.h"

TF_NAMESPACE_BEGIN

struct Embedding {
    static constexpr const char* kType = "Embedding";
    Tensor weight;            // (V, C); the padding row starts at zero and never gets a gradient
    std::int32_t padding_idx = 0;
    real scale = 1;           // √C in the model: keeps embeddings on the scale of the positional signal

    Embedding() = default;
    Embedding(std::int64_t V, std::int64_t C, std::int32_t padding_idx);
    // ids (B, T) -> (B, T, C); probes "embed" (the table's rows) and, when scaled, "scale".
    Tensor forward(const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T, const Pass& pass = {}) const;
    void visit(ModuleWalk& walk) const;  // weight
    // N(0, C^-0.5) as in the reference benchmark, padding row zeroed.
    void init(Rng& rng);
};

// None: no positional signal at all: the model sees its input as a bag of tokens (attention is
// permutation-equivariant), which the model leaves out of its walk and its forward.
enum class PositionalKind { Sinusoidal, Learned, None };

struct PositionalEncoding {
    static constexpr const char* kType = "PositionalEncoding";
    PositionalKind kind = PositionalKind::Sinusoidal;
    // Sinusoidal: a constant table, computed once:
    //   PE[pos, 2i] = sin(pos / 10000^(2i/C)),   PE[pos, 2i+1] = cos(pos / 10000^(2i/C))
    // Learned: a parameter of the same shape (max_len, C). None: undefined.
    Tensor table;

    PositionalEncoding() = default;
    PositionalEncoding(PositionalKind kind, std::int64_t max_len, std::int64_t C);
    // x (B, T, C) -> x + PE[0..T)   (or the positions [start, start + T) during incremental decoding);
    // probes "positional".
    Tensor forward(const Tensor& x, std::int64_t start = 0, const Pass& pass = {}) const;
    void visit(ModuleWalk& walk) const;  // weight, only when learned
};

TF_NAMESPACE_END
