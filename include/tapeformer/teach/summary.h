// A torchinfo-style summary of a model: one row per module (its parts and their parts, from the module walk)
// in the order data flows through it, with the module's output shape for a batch of B sentences of S source
// and T target tokens, its parameters and the multiply-adds of its matrix products. Teachers use it to show
// where a Transformer's weights and its work are; the numbers come from the model's own walk and from one
// forward pass over such a batch, whose probes give the shapes and whose tape gives the products.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

struct SummaryRow {
    int depth = 0;            // 0: the model; 1: a stack's part (embedding, layer); 2: a layer's part
    std::string name;         // the parameter prefix users see in checkpoints ("encoder.layers.0.self_attn")
    std::string kind;         // the module's type: "MultiHeadAttention", "FeedForward", ...
    std::string stack;        // the model's part it lies in, as the module walk names it: "encoder", "generator"
    Shape output;             // for the batch asked for
    std::int64_t params = 0;  // values of this module's own parameters (with its children's)
    bool shared = false;      // its parameters are another module's (tied embeddings): not counted again
    std::int64_t mult_adds = 0;  // of its matrix products for the batch (with its children's)
};

struct ModelSummary {
    std::vector<SummaryRow> rows;       // rows[0] is the whole model
    std::int64_t total_params = 0;      // distinct parameter values (shared tables once)
    std::int64_t trainable_bytes = 0;   // total_params · sizeof(float)
    std::int64_t B = 0, S = 0, T = 0;
};

// B sentences of S source and T target tokens (T decoder positions), run through the model once (evaluation
// mode; the tape is cleared afterwards). Throws std::invalid_argument for sizes < 1 or longer than the
// model's positional table.
ModelSummary summarize(Transformer& model, std::int64_t B, std::int64_t S, std::int64_t T);

// The table, as torchinfo prints it: an indented tree, then the totals.
std::string format_summary(const ModelSummary& summary);

TF_NAMESPACE_END
