// One training step (train_step.h): forward → loss → backward → clip → optimizer → zero_grad, with the
// checks that keep a non-finite value out of the weights. Reading order: the --check-nan diagnostics,
// then the step.
#include "tapeformer/run/train_step.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {

bool all_finite(const real* p, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return false;
    return true;
}

// With check_nan: the first op on the tape whose output is not finite.
std::string first_nonfinite_op() {
    const auto& records = tape().records();
    for (std::size_t i = 0; i < records.size(); ++i) {
        const TapeRecord& r = records[i];
        if (all_finite(r.out.data(), r.out.numel())) continue;
        std::string inputs;
        for (const Tensor& t : r.in) inputs += (inputs.empty() ? "" : ", ") + t.shape().str();
        return std::string("first non-finite value produced by op #") + std::to_string(i + 1) + " '" + r.op + "' (inputs " +
               inputs + ", output " + r.out.shape().str() + ")";
    }
    return "no op produced a non-finite value; the inputs or parameters already held one";
}

// With check_nan after backward: the first backward (in reverse order) that wrote a non-finite gradient.
std::string first_nonfinite_backward() {
    const auto& records = tape().records();
    for (auto it = records.rbegin(); it != records.rend(); ++it)
        for (const Tensor& t : it->in)
            if (t.has_grad() && !all_finite(t.grad(), t.numel()))
                return std::string("first non-finite gradient written by the backward of op '") + it->op + "' (output " +
                       it->out.shape().str() + ")";
    return "no backward wrote a non-finite gradient";
}

}  // namespace

const char* to_string(StepPhase phase) {
    switch (phase) {
        case StepPhase::forward: return "fwd";
        case StepPhase::backward: return "bwd";
        case StepPhase::clip: return "clip";
        case StepPhase::optimizer: return "optim";
    }
    return "?";
}

NonFiniteStep::NonFiniteStep(bool of_loss_, std::string value_, std::int64_t step_, std::string where_)
    : std::runtime_error("non-finite " + value_ + " at step " + std::to_string(step_) + (where_.empty() ? "" : "; " + where_)),
      of_loss(of_loss_), value(std::move(value_)), step(step_), where(std::move(where_)) {}

StepResult train_step(const StepParts& parts, const StepBatch& b, const StepSettings& s, const StepHooks& hooks) {
    auto begin = [&](StepPhase p) {
        if (hooks.phase_begins) hooks.phase_begins(p);
    };
    auto end = [&](StepPhase p) {
        if (hooks.phase_ends) hooks.phase_ends(p);
    };
    // A deliberately wrong backward (ops.h BrokenGradientScope) is for gradcheck and explain, never an update.
    if (broken_gradient() != BrokenGradient::None)
        throw std::logic_error(std::string("train step: refusing to train with the deliberately wrong backward ") +
                               to_string(broken_gradient()));
    StepResult result;
    Optimizer& optimizer = parts.optimizer;

    begin(StepPhase::forward);
    Pass pass{parts.dropout};
    pass.fuse_attention = s.fuse_attention;
    pass.observer = s.observer;
    Tensor logits = parts.model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);  // (B, T, V)
    // Nothing reads the logits after the loss's backward, so its gradient may take their memory; not with
    // check_nan, which keeps the tape to look at every value.
    Tensor loss = sequence_loss(logits, b.target, parts.model.config.pad_id, real(s.label_smoothing), &result.loss,
                                /*consume_logits=*/!s.check_nan);
    logits = Tensor();
    if (!std::isfinite(result.loss.loss)) {
        const std::string where = s.check_nan ? first_nonfinite_op() : "";
        tape().clear();
        throw NonFiniteStep(true, "loss", s.step, where);
    }
    end(StepPhase::forward);

    begin(StepPhase::backward);
    optimizer.zero_grad();
    backward(loss, /*keep_tape=*/s.check_nan, hooks.backward_record);
    end(StepPhase::backward);

    begin(StepPhase::clip);
    // The norm is finite exactly when every gradient is: the pass that clipping needs is the check.
    result.grad_norm = grad_norm(optimizer.params());
    if (!std::isfinite(result.grad_norm)) {
        const std::string bad = first_nonfinite_grad(optimizer.params()).value_or("a parameter");
        const std::string where = s.check_nan ? first_nonfinite_backward() : "";
        tape().clear();
        throw NonFiniteStep(false, "gradient of " + bad, s.step, where);
    }
    tape().clear();
    // Clipping (torch's clip_grad_norm_) as the optimizer's factor on the gradients: the same update.
    const real clip = s.clip > 0 ? clip_coefficient(result.grad_norm, s.clip) : real(1);
    end(StepPhase::clip);

    if (hooks.before_update) hooks.before_update(result);

    begin(StepPhase::optimizer);
    optimizer.step(s.lr, clip);
    if (parts.average) parts.average->update(s.step);
    optimizer.zero_grad(/*set_to_none=*/true);  // until the next backward, the gradients' memory serves activations
    end(StepPhase::optimizer);
    return result;
}

TF_NAMESPACE_END
