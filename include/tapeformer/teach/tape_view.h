// `tapeformer tape`: the tape of one training step made visible. A tiny model (or a trained one) runs one
// forward pass on one sentence pair with the tape recording; the view lists each record (op, inputs, output)
// in the order recorded, then the order backward visits them and, step by step, which gradients each
// record's backward filled. It also writes the graph as Graphviz DOT, micrograd-style: a node per tensor
// (name, shape, value norm and first values, gradient or "grad: not computed") and per op, coloured as
// torchviz colours them, top to bottom; or collapsed, one node per layer or module listing what it holds.
// A graph whose every tensor is one number (a first graph, expression.h's tanh(a*b + c)) is shown as
// micrograd shows one: each value and gradient written out, the DOT top to bottom.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

// A tensor of the graph: a parameter, a constant or input (mask, positional table), or a record's output.
struct TapeTensor {
    enum class Kind { Parameter, Constant, Activation, Loss };
    Kind kind = Kind::Activation;
    std::string name;           // parameter name ("encoder.layers.0.norm1.weight"), "#12" for a record's output
    Shape shape;
    int record = -1;            // the record that produced it (activations and the loss)
    std::string module;         // the module the walk lists it under ("encoder.layers.0.self_attn"), "" when none
    std::string layer;          // the layer that module lies in ("encoder.layers.0"), "" outside the layers
    double value_norm = 0;
    std::vector<double> first_values;  // up to 4
    bool has_grad = false;             // after backward
    double grad_norm = 0;
    std::vector<double> first_grads;   // up to 4
};

struct TapeOp {
    std::string op;                // "matmul", "affine", ...
    std::vector<int> inputs;       // indices into TapeGraph::tensors
    std::vector<Shape> input_shapes;  // as the op saw them (a view may have another shape than its tensor)
    int output = -1;
    std::string module, layer;     // of its parameters, or else of its latest input
    bool has_backward = true;
};

struct TapeGraph {
    std::vector<TapeTensor> tensors;
    std::vector<TapeOp> ops;                // in recorded order
    std::vector<int> backward_order;        // op indices in the order backward visited them (empty before backward)
    std::vector<std::vector<int>> filled;   // for each visited op (same order): tensors whose gradient it added to
    std::vector<std::vector<double>> filled_norms;  // their gradient norms right after that op's backward
    std::vector<std::vector<double>> filled_first;  // and their first gradient values
    bool backward_done = false;
    double loss = 0;                        // the output's value (the last record's: a training step's loss)
    std::string output_label = "loss";      // how the listing's last line names it: "loss = 2.302585 (...)"
    std::string output_note = "(label-smoothed cross-entropy, ε = 0.1)";
    std::string title = "one training step";  // the DOT's caption
};

// The graph of what the tape holds now, ending at `output` (the last record's output, one value): tensors in
// `named` (parameters, variables) keep their names, as do those in `constants`; others are named "#r" after the
// record that made them, or "constant". With run_backward, backward from `output` (seed 1), noting what each
// record's backward filled. Clears the tape. The gradients of `named` are left holding this backward's. With
// a module walk, each parameter and each op belongs to the module (and layer) the walk lists it under.
TapeGraph graph_of_tape(Tensor& output, const ParamList& named, const ParamList& constants, bool run_backward,
                        const ModuleWalk* walk = nullptr);

// True when every tensor of the graph is a single number: then the listing and the DOT show each value and
// gradient itself rather than a shape, a norm and first values.
bool every_tensor_one_number(const TapeGraph& graph);

struct TapeStepOptions {
    std::string src = "a b c", tgt = "c b a";  // the sentence pair of the step (word ids of the model's vocabulary)
    bool backward = true;                        // run backward (false: the graph as recorded, "grad: not computed")
    std::uint64_t seed = 1;                      // dropout masks of the step
};

// One training step's forward (with dropout, as training runs it) and label-smoothed loss, recorded on the tape,
// then (options.backward) backward. src_ids/tgt_ids are the pair's token ids without EOS/BOS. The model's
// parameter gradients are set to zero first and left holding this step's gradients.
TapeGraph record_training_step(Transformer& model, const std::vector<std::int32_t>& src_ids,
                               const std::vector<std::int32_t>& tgt_ids, const TapeStepOptions& options);

// The listing: records in order with input and output shapes, then the backward order; with step_backward, what
// each backward record filled.
std::string format_tape(const TapeGraph& graph, bool step_backward);

// Graphviz DOT, top to bottom, scaled to fit A3 portrait. collapse: "" (every tensor and op a node), "layer"
// (each encoder/decoder layer one node: its ops by kind, its parameters, how many activations it saved) or
// "module" (the same per module); constants and what lies outside every layer or module keep their nodes.
// Throws std::invalid_argument for another collapse value.
std::string tape_dot(const TapeGraph& graph, const std::string& collapse);

// Two forward + backward passes without zero_grad in between: each parameter's gradient norm after the first and
// after the second (twice the first: backward adds, +=). One line per parameter and a verdict.
std::string backward_twice_report(Transformer& model, const std::vector<std::int32_t>& src_ids,
                                  const std::vector<std::int32_t>& tgt_ids, const TapeStepOptions& options);

// The default model of `tapeformer tape`: 1+1 layers, C 8, 2 heads, F 16, the given vocabulary size.
ModelConfig tiny_tape_config(std::int64_t vocab);

TF_NAMESPACE_END
