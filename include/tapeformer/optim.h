// Optimizers, and the gradient checks a training step runs before it updates: the global norm, clipping
// and the search for a non-finite gradient.
//
// Each optimizer updates named parameters in place from their .grad buffers with the exact update rule of
// torch.optim 1.13 (single-tensor path), one fused loop per parameter. Parameters that share storage
// (tied embeddings listed under two names) are kept once, under the first name, so they step once.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tapeformer/nn/module.h"
#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

// Names plain tensors by their position ("0", "1", ...), as torch.optim keys its state, so a bare
// std::vector<Tensor> can be handed to an optimizer or to the gradient helpers below.
ParamList named_by_index(const std::vector<Tensor>& tensors);

// ---- optimizers ------------------------------------------------------------------------------------------
// The common interface a training loop needs: update, clear gradients, save and restore state.
// Parameters that do not require grad, or have no gradient buffer yet, are skipped by step() and keep no
// state, as torch.optim skips parameters whose .grad is None.
class Optimizer {
public:
    virtual ~Optimizer() = default;

    // One update with learning rate lr (≥ 0, finite) from the current gradients, each multiplied by
    // grad_scale on the way in (clipping's coefficient, see clip_coefficient: the same numbers as scaling
    // the gradients first, without a pass of its own). The gradient buffers are left as they are.
    virtual void step(double lr, double grad_scale) = 0;
    void step(double lr) { step(lr, 1.0); }
    // Every gradient reads as zero again (keeps the buffers, as torch's zero_grad(set_to_none=False);
    // the first op to write one overwrites it: Tensor::grad_target). With set_to_none, as torch's
    // zero_grad(set_to_none=True), the buffers go back to the pool instead, so that the next forward's
    // activations can use that memory; step() then skips a parameter that no backward reached.
    void zero_grad(bool set_to_none = false);

    // A snapshot (deep copies) of everything step() depends on besides lr and the parameters, named
    // "<prefix>.<what>.<parameter name>", e.g. "adam.m.encoder.layers.0.linear1.weight". Step counts are
    // one-element tensors of shape () holding an integer (exact in float32 up to 2^24 steps).
    virtual std::vector<NamedTensor> state() const = 0;
    // Restores a snapshot from state(). Entries that do not start with this optimizer's prefix are
    // ignored, so a whole checkpoint (model + optimizer) can be passed. Parameters absent from the
    // snapshot start fresh. Throws std::invalid_argument on an entry naming no parameter, a wrong shape
    // or an invalid step count.
    virtual void load_state(const std::vector<NamedTensor>& state) = 0;

    // The parameters actually updated: deduplicated by storage, in first-seen order.
    const ParamList& params() const { return params_; }

protected:
    // who: the optimizer's name for error messages. Throws on undefined tensors, or on one name given to
    // two different tensors.
    Optimizer(const ParamList& params, const char* who);
    ParamList params_;
};

// Adam (Kingma & Ba 2015), torch.optim.Adam / AdamW 1.13 semantics. With g the gradient at step t:
//   Adam:   g ← g + wd·p                        (L2 penalty folded into the gradient)
//   AdamW:  p ← p·(1 − lr·wd)                   (decoupled decay, Loshchilov & Hutter 2019)
//   m ← β1·m + (1 − β1)·g        v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// Note that ε is added after the bias correction of √v, as PyTorch does (not ε̂ of the paper's
// "efficient version"). t counts the steps of each parameter separately, as in torch.
struct AdamOptions {
    double beta1 = 0.9;         // "Attention Is All You Need" §5.3; PyTorch's default is also 0.9
    double beta2 = 0.98;        // the paper; PyTorch's default is 0.999
    double eps = 1e-9;          // the paper; PyTorch's default is 1e-8
    double weight_decay = 0;    // Adam: L2 on the gradient; AdamW: decoupled. torch's AdamW defaults to 1e-2
};

class Adam : public Optimizer {
public:
    // Throws std::invalid_argument unless 0 ≤ β1, β2 < 1, ε ≥ 0 and weight_decay ≥ 0.
    explicit Adam(const ParamList& params, AdamOptions options = {});
    using Optimizer::step;
    void step(double lr, double grad_scale) override;
    std::vector<NamedTensor> state() const override;  // "adam.step.<p>", "adam.m.<p>", "adam.v.<p>"
    void load_state(const std::vector<NamedTensor>& state) override;

    const AdamOptions& options() const { return options_; }
    std::int64_t step_count(std::size_t i) const { return moments_[i].step; }  // t of params()[i]

protected:
    Adam(const ParamList& params, AdamOptions options, bool decoupled, const char* who);

private:
    struct Moments {
        Tensor m, v;            // same shape as the parameter; undefined until its first step
        std::int64_t step = 0;
    };
    AdamOptions options_;
    bool decoupled_;            // AdamW
    std::vector<Moments> moments_;  // moments_[i] belongs to params_[i]
};

// AdamW: Adam with decoupled weight decay. Same state names ("adam.*"): the state of one loads into the
// other.
class AdamW : public Adam {
public:
    explicit AdamW(const ParamList& params, AdamOptions options = {});
};

// SGD, torch.optim.SGD 1.13 semantics:
//   d ← g + wd·p
//   with momentum μ: buf ← d on the first step, else buf ← μ·buf + (1 − dampening)·d;
//                    d ← d + μ·buf (Nesterov) or d ← buf
//   p ← p − lr·d
struct SgdOptions {
    double momentum = 0;        // μ; 0 = plain SGD (no buffer kept)
    double dampening = 0;
    bool nesterov = false;      // needs momentum > 0 and dampening = 0
    double weight_decay = 0;    // L2 on the gradient
};

class Sgd : public Optimizer {
public:
    // Throws std::invalid_argument on negative values or an invalid Nesterov setting.
    explicit Sgd(const ParamList& params, SgdOptions options = {});
    using Optimizer::step;
    void step(double lr, double grad_scale) override;
    std::vector<NamedTensor> state() const override;  // "sgd.momentum_buffer.<p>"
    void load_state(const std::vector<NamedTensor>& state) override;

    const SgdOptions& options() const { return options_; }

private:
    SgdOptions options_;
    std::vector<Tensor> buffers_;  // buffers_[i] belongs to params_[i]; undefined until its first step
};

// ---- an average of the weights ----------------------------------------------------------------------
// An exponential moving average of the parameters, kept beside them (Polyak averaging; Marian's
// --exponential-smoothing; the warm-up of d_t is TensorFlow's ExponentialMovingAverage with num_updates).
// After update t (t = 1, 2, ...), for every value:
//   a ← a + (1 − d_t)·(p − a),   d_t = min(decay, (1 + t) / (10 + t))
// Early on d_t is small, so the average follows the weights while they change fast; later it forgets
// at most 1 − decay of itself per step, so it covers about the last 1 / (1 − decay) updates, and at most
// the last ~t / 9 of them: late in training the weights wander around a minimum, and their average sits
// closer to it than any one step. Each value is updated on its own, so the result does not depend on
// the number of threads. Parameters that share storage are kept once, as the optimizers keep them.
class WeightAverage {
public:
    // Starts as a copy of the parameters. Throws std::invalid_argument unless 0 < decay < 1.
    WeightAverage(const ParamList& params, double decay);

    void update(std::int64_t t);  // after the optimizer's update number t (≥ 1)
    // Exchanges the averaged values and the parameters' own, in place: call again to swap back.
    void swap_into_parameters();

    // The averages, named "ema.<parameter name>".
    std::vector<NamedTensor> state() const;
    // Restores a snapshot from state(); entries without the "ema." prefix are ignored. Throws
    // std::invalid_argument unless every parameter has exactly one entry of its shape.
    void load_state(const std::vector<NamedTensor>& state);

    double decay() const { return decay_; }

private:
    ParamList params_;
    std::vector<Tensor> average_;  // average_[i] belongs to params_[i]
    double decay_;
};

// The averaged weights in the parameters for as long as it lives (nothing when `average` is null).
class AveragedWeightsScope {
public:
    explicit AveragedWeightsScope(WeightAverage* average) : average_(average) {
        if (average_) average_->swap_into_parameters();
    }
    ~AveragedWeightsScope() {
        if (average_) average_->swap_into_parameters();
    }
    AveragedWeightsScope(const AveragedWeightsScope&) = delete;
    AveragedWeightsScope& operator=(const AveragedWeightsScope&) = delete;

private:
    WeightAverage* average_;
};

// ---- gradient checks -----------------------------------------------------------------------------------
// All of these read the gradient buffers of the parameters that have one, each shared storage once.

// The global L2 norm sqrt(Σ g²) over all gradients, accumulated in double. The sum is taken in fixed
// blocks, so the result does not depend on the number of threads.
double grad_norm(const ParamList& params);

// torch.nn.utils.clip_grad_norm_ (1.13): total = grad_norm(params); coef = max_norm / (total + 1e-6);
// every gradient is multiplied by min(coef, 1), as PyTorch does. Returns total, the norm before clipping.
// A non-finite total leaves the gradients untouched (torch would spread the NaN into them); check with
// first_nonfinite_grad. Throws std::invalid_argument unless max_norm > 0 (+infinity: never clip).
// A training loop passes clip_coefficient to Optimizer::step instead: the same update, one pass fewer.
double clip_grad_norm(const ParamList& params, double max_norm);
// min(max_norm / (total + 1e-6), 1) as float32, clip_grad_norm's factor for a finite total norm. Throws
// as clip_grad_norm does.
real clip_coefficient(double total, double max_norm);

// The name of the first parameter (in list order) whose gradient holds a NaN or an infinity, or nullopt
// when every gradient is finite.
std::optional<std::string> first_nonfinite_grad(const ParamList& params);

TF_NAMESPACE_END
