// The checks behind `tapeformer gradcheck`: every primitive op and every model block against central
// finite differences (gradcheck.h), and the table that reports them. Built against the float64 core
// (target tapeformer_gradcheck_suite); it sits above nn, since the block checks build model layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/gradcheck.h"

TF_NAMESPACE_BEGIN

// Every primitive op of ops.h on small random inputs (src/gradcheck_suite/primitive_ops.cpp).
std::vector<GradcheckResult> check_primitive_ops(std::uint64_t seed);
// The ops check_primitive_ops covers ("add", "matmul", "softmax", ...): the first word of each check's name.
std::vector<std::string> primitive_op_names();
// The first (simplest) check of one op, with every element's analytic and numeric gradient kept. Throws
// std::invalid_argument listing the valid names for an unknown op.
GradcheckResult check_one_op(const std::string& op, std::uint64_t seed);
// That check element by element: input, position, analytic, numeric, |difference|, relative error; a verdict.
std::string format_gradcheck_elements(const GradcheckResult& result);
// The model's blocks: attention with each mask, head gates, encoder and decoder layers in both norm
// positions, the label-smoothed loss, a whole tiny model; then the parts that can be switched off
// (unscaled scores, no residual, no LayerNorm; no causal mask and no positions in a whole model)
// (src/gradcheck_suite/model_blocks.cpp).
std::vector<GradcheckResult> check_model_blocks(std::uint64_t seed);
// The primitive ops, then the blocks.
std::vector<GradcheckResult> check_everything(std::uint64_t seed);

// A table for people: op, shapes, max abs error, max rel error, PASS/FAIL; then a summary line.
std::string format_gradcheck_table(const std::vector<GradcheckResult>& results, bool color);

TF_NAMESPACE_END
