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

Rng micro_batch_dropout(const Rng& run_stream, std::int64_t step, std::int64_t k) {
    return Rng(hash64(hash64(run_stream.seed, static_cast<std::uint64_t>(step)), static_cast<std::uint64_t>(k)));
}

StepResult train_step(const StepParts& parts, const StepBatch& b, const StepSettings& s, const StepHooks& hooks) {
    return train_step(parts, std::vector<StepBatch>{b}, s, hooks);
}

StepResult train_step(const StepParts& parts, const std::vector<StepBatch>& micro, const StepSettings& s,
                      const StepHooks& hooks) {
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
    if (micro.empty()) throw std::invalid_argument("train step: a global batch of no micro-batches");
    StepResult result;
    Optimizer& optimizer = parts.optimizer;
    const bool accumulating = micro.size() > 1;
    // tokens: the global batch's non-pad targets, the loss's denominator (a row always ends with EOS).
    std::int64_t tokens = 0;
    for (const StepBatch& b : micro)
        for (std::int32_t id : b.target) tokens += id != parts.model.config.pad_id;
    double loss_sum = 0, nll_sum = 0;  // Σ_k L_k · tokens_k, for the report

    for (std::size_t k = 0; k < micro.size(); ++k) {
        const StepBatch& b = micro[k];
        begin(StepPhase::forward);
        Rng own_dropout;
        if (accumulating && parts.dropout) own_dropout = micro_batch_dropout(*parts.dropout, s.step, std::int64_t(k));
        Pass pass{accumulating && parts.dropout ? &own_dropout : parts.dropout};
        pass.fuse_attention = s.fuse_attention;
        pass.observer = k == 0 ? s.observer : nullptr;
        Tensor logits = parts.model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);  // (B, T, V)
        // Nothing reads the logits after the loss's backward, so its gradient may take their memory; not with
        // check_nan, which keeps the tape to look at every value.
        LossReport report;
        Tensor loss = sequence_loss(logits, b.target, parts.model.config.pad_id, real(s.label_smoothing), &report,
                                    /*consume_logits=*/!s.check_nan);  // () mean over this micro-batch's tokens
        logits = Tensor();
        if (!std::isfinite(report.loss)) {
            const std::string where = s.check_nan ? first_nonfinite_op() : "";
            tape().clear();
            optimizer.zero_grad(/*set_to_none=*/true);
            throw NonFiniteStep(true, "loss", s.step, where);
        }
        if (!accumulating) result.loss = report;  // one batch: its loss as the loss op computed it
        loss_sum += report.loss * double(report.tokens);
        nll_sum += report.nll * double(report.tokens);
        end(StepPhase::forward);

        begin(StepPhase::backward);
        if (k == 0) optimizer.zero_grad();
        // ∂L/∂L_k = tokens_k / tokens: the backward seeded with it adds this micro-batch's share of the
        // global batch's gradient to what the earlier ones left (backward accumulates with +=). One batch:
        // seed 1, exactly as a step always was.
        if (!accumulating) {
            backward(loss, /*keep_tape=*/s.check_nan, hooks.backward_record);
        } else {
            // check_nan keeps the last micro-batch's tape only (an earlier one's backward clears its own).
            backward(loss, {real(double(report.tokens) / double(tokens))},
                     /*keep_tape=*/s.check_nan && k + 1 == micro.size(), hooks.backward_record);
        }
        end(StepPhase::backward);
    }
    if (accumulating) {
        result.loss.tokens = tokens;
        result.loss.loss = loss_sum / double(tokens);
        result.loss.nll = nll_sum / double(tokens);
        result.loss.ppl = std::exp(result.loss.nll);
    }

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
