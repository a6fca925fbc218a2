// What every module shares: the module walk, by which each module names its parameters and its parts once
// (PyTorch's named_parameters() / named_modules(), under the names users see in checkpoints); the pass,
// which switches between training and evaluation behaviour (dropout) and may carry an observer of the
// forward's intermediates (PyTorch's forward hooks).
#pragma once
#include <string>
#include <vector>

#include "tapeformer/random.h"
#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

struct NamedTensor {
    std::string name;   // "encoder.layers.0.self_attn.in_proj_weight"
    Tensor tensor;
};
using ParamList = std::vector<NamedTensor>;

// `params` with every storage once: a tied parameter, listed under several names, keeps its first name
// (what the optimizer updates, what gradient clipping and parameter counts see). Undefined tensors are
// left out.
ParamList unique_parameters(const ParamList& params);

// ---- probes: what a forward pass shows to whoever listens ------------------------------------------------

// Which of the model's two inputs a section of the forward runs over: the source sentence (S positions) or
// the target (T positions: the decoder's input, then the logits over it).
enum class Input { Source, Target };

// A listener to one forward pass. Modules report named intermediates at the points the lessons name —
// "qkv", "q", "k", "v", "scores", "mask", "weights", "context", "merge", "out_proj", "ffn_hidden", "add_norm",
// ... — together with the module that computed them (named by the module walk below). The tensors are the
// forward's own (on the tape when it records); the modules keep nothing of a pass once it returns.
class ForwardObserver {
public:
    virtual ~ForwardObserver() = default;
    // `module` of type `type` (its kType; a module and its first member share an address) reports `value`.
    virtual void probe(const void* module, const char* type, const char* name, const Tensor& value) = 0;
    // The model enters one of its sections ("encoder", "decoder", "output"), running over `input`'s positions:
    // what follows until the next section belongs to it. Listeners that do not care leave it.
    virtual void section(const char* name, Input input) {
        (void)name, (void)input;
    }
};

// How one forward pass runs. Passed down through every module's forward().
struct Pass {
    Rng* dropout_rng = nullptr;   // training: dropout masks come from here; nullptr: evaluation, no dropout
    // Whoever listens to this pass's probes; nullptr (the default): nobody, so nothing is reported and
    // nothing computed for it.
    ForwardObserver* observer = nullptr;
    // Attention as one op over heads read in place (ops.h attention_heads: the same numbers, faster) instead
    // of the composed ops a reader of the tape sees; where it applies (dot-product scores, no cache, no
    // observer, every head's gate 1 and not trained). Training and bench train turn it on.
    bool fuse_attention = false;
    // Values go back to the pool (Tensor::drop_values) once nothing in the forward reads them again and backward
    // either does not read them or computes them again. Sublayers, post-norm: the sublayer's output (the Add &
    // Norm's record keeps the sum instead) and the layer's input when it is an earlier norm's output (computed
    // again from that norm's sum). Pre-norm: the norm's output (computed again from its input), the sublayer's
    // output once dropout has copied it, and that copy once the residual add has read it (add's backward reads
    // no values). The embeddings: the looked-up rows, their scaled copy and their sum with the positions, once
    // the next step has read each (scale, add and dropout backward read none). One (B, T, C) tensor less per
    // post-norm layer norm from the forward to the backward, three per pre-norm sublayer, three per embedding,
    // for one more pass over each recomputed one. Training and bench train turn it on; it acts only where no
    // observer listens (one may hold those tensors): may_drop_values().
    bool let_values_go = false;
    bool training() const { return dropout_rng != nullptr; }
    bool may_drop_values() const { return let_values_go && !observer; }
    // A module reports `value` under `name`: to the observer if there is one.
    template <class M>
    void probe(const M* module, const char* name, const Tensor& value) const {
        if (observer) observer->probe(module, M::kType, name, value);
    }
    // The model enters a section (ForwardObserver::section).
    void section(const char* name, Input input) const {
        if (observer) observer->section(name, input);
    }
};

// ---- the module walk: each module names its parameters and parts once ----------------------------------

// Every module has `static constexpr const char* kType` (its type's name) and `void visit(ModuleWalk&) const`,
// which lists its own parameters and its child modules in order, each under the name users see. Nothing
// else describes the structure: parameter lists, counts and shapes, the attention modules, the summary's
// rows and the module names on the tape all come from this walk.
struct ModuleEntry {
    std::string name;     // "encoder.layers.0.self_attn"; "" for the root
    std::string type;     // "MultiHeadAttention"
    std::string role;     // what its parent uses it for ("causal self-attention"); "" when the type says it
    int depth = 0;        // 0: the root
    std::string stack;    // the root's part it lies in, its name's first word: "encoder" for the above; "" for the root
    int layer = -1;       // the index of the layer it is or lies in (ModuleWalk::layers); −1 outside the layers
    std::string layer_name;  // that layer's name: "encoder.layers.0"; "" outside the layers
    const void* module = nullptr;
    std::vector<std::size_t> parameters;  // indices into the walk's parameter list: its own and its parts'
};

class ModuleWalk {
public:
    std::vector<ModuleEntry> modules;  // in the order visit() lists them, parents before their parts
    ParamList parameters;              // in the order visit() lists them

    // Starts at a root module.
    template <class M>
    explicit ModuleWalk(const M& root) {
        enter("", M::kType, "", &root, false);
        root.visit(*this);
        leave();
    }

    // A part of the module being visited, named `name` under it. `flat`: its parameters are named as if they
    // were the parent's own (PyTorch puts a feed-forward network's linear1, linear2 straight under the layer).
    template <class M>
    void child(const std::string& name, const M& m, const char* role = "", bool flat = false) {
        enter(name, M::kType, role, &m, flat);
        m.visit(*this);
        leave();
    }
    // The layers of a stack, a list of parts named "<stack>.layers.<i>" (PyTorch's ModuleList): every module
    // in layer i, the layer included, knows its index and the layer's name (ModuleEntry::layer, layer_name).
    template <class M>
    void layers(const std::string& stack, const std::vector<M>& list) {
        for (std::size_t i = 0; i < list.size(); ++i) {
            enter(stack + ".layers." + std::to_string(i), M::kType, "", &list[i], false, int(i));
            list[i].visit(*this);
            leave();
        }
    }
    // A parameter of the module being visited (an undefined tensor is left out).
    void parameter(const std::string& name, const Tensor& t);

    // The entry of `module` of type `type`, nullptr when the walk did not meet it.
    const ModuleEntry* find(const void* module, const char* type) const;

private:
    struct Open {
        std::size_t entry;
        std::string param_prefix;  // what the module's parameter names start with
    };
    std::vector<Open> open_;
    void enter(const std::string& name, const char* type, const char* role, const void* module, bool flat, int layer = -1);
    void leave();
};

// PyTorch's named_parameters() and named_modules() of any module.
template <class M>
ParamList named_parameters(const M& root) {
    return ModuleWalk(root).parameters;
}
template <class M>
std::vector<ModuleEntry> named_modules(const M& root) {
    return ModuleWalk(root).modules;
}

// Dropout with probability p when the pass is training, the identity otherwise; and the fused forms
// (ops.h) of dropout(relu(x Wᵀ + b)) and layer_norm(x + dropout(residual)), which fall back to relu(affine)
// and add_layer_norm the same way.
Tensor dropout(const Tensor& x, real p, const Pass& pass);
Tensor affine_relu_dropout(const Tensor& x, const Tensor& weight, const Tensor& bias, real p, const Pass& pass);
Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, const Pass& pass, const Tensor& gamma,
                              const Tensor& beta, real eps);

// Once `next` is made from `value` by an op whose backward reads none of value's values (add, scale, dropout),
// and nothing else in the forward reads them: value's values go back to the pool (Tensor::drop_values) when
// the pass lets values go (Pass::may_drop_values), value is an op's output (a leaf may be the caller's) and next
// is not value itself (an op that passed its input through, as dropout does outside training).
void let_go_of(const Pass& pass, Tensor value, const Tensor& next);

// A fresh parameter: zero-filled leaf tensor that requires grad. Modules initialise it afterwards.
Tensor make_param(const Shape& shape);

TF_NAMESPACE_END
