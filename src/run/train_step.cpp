// One training step (train_step.h): forward → loss → backward → clip → optimizer → zero_grad, with the
// checks that keep a non-finite value out of the weights. Reading order: the --check-nan diagnostics, the
// micro-batches' gradients and their fixed-order sum (one process, or the ranks of an MPI job), then the step.
#include "tapeformer/run/train_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/nn/module.h"
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

// ---- the micro-batches' gradients, and their sum -----------------------------------------------------------

// At most this many values go to the ranks in one call (16 MiB of float32): the fused buffers are sent in a
// few large buckets rather than one message per parameter.
constexpr std::int64_t kBucketValues = std::int64_t(1) << 22;

void add_into(real* sum, const real* g, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) sum[i] += g[i];
}

// The gradients of a global batch's micro-batches, fused: every parameter's gradient at its offset in one
// flat buffer of P values (unique_parameters' order), and a flag per parameter (a backward reached it).
// One process adds each micro-batch's gradient into the sum as it comes (add): g = ((g_0 + g_1) + g_2) + ...
// A rank of a job keeps its own in slots (keep), and the ranks make the same sum together (exchange), a
// reduce-scatter whose order is fixed: rank q receives part q (P / R values) of every micro-batch's
// gradient, adds them in micro-batch order as one process would, and the summed parts are all-gathered.
// The same additions in the same order, the same bits; each rank sends and receives about (A + 1) / A of a
// gradient buffer per micro-batch it computes (A of them), near a ring allreduce's 2.
class MicroBatchGradients {
public:
    // slots: the micro-batches this rank keeps (0 in one process).
    MicroBatchGradients(const ParamList& params, std::int64_t slots) : params_(unique_parameters(params)), slots_(slots) {
        for (const NamedTensor& p : params_) {
            offset_.push_back(values_);
            values_ += p.tensor.numel();
        }
        sum_.assign(std::size_t(values_), real(0));
        reached_.assign(params_.size(), 0);
        mine_.assign(std::size_t(slots_ * values_), real(0));
        flags_.assign(std::size_t(slots_) * params_.size(), real(0));
    }

    // The parameters' gradients now (one micro-batch's): added into the sum.
    void add() {
        for (std::size_t p = 0; p < params_.size(); ++p) {
            const Tensor& t = params_[p].tensor;
            if (!t.has_grad()) continue;
            add_into(sum_.data() + offset_[p], t.grad(), t.numel());
            reached_[p] = 1;
        }
    }

    // The parameters' gradients now: kept in this rank's slot `slot` (no backward reached: zeros, flag 0).
    void keep(std::int64_t slot) {
        for (std::size_t p = 0; p < params_.size(); ++p) {
            const Tensor& t = params_[p].tensor;
            if (const real* g = t.grad()) {
                std::memcpy(&mine_[std::size_t(slot * values_ + offset_[p])], g, std::size_t(t.numel()) * sizeof(real));
                flags_[std::size_t(slot) * params_.size() + p] = real(1);
            }
        }
    }

    // The sum over every rank's slots (rank s's slot j is micro-batch k = j · R + s) in the order k = 0, 1, ...
    void exchange(Communicator& ranks) {
        const std::int64_t R = ranks.size(), me = ranks.rank(), block = R * slots_, np = std::int64_t(params_.size());
        // Which micro-batches reached which parameters, on every rank: (block, np), rank s's slot j at row s · slots + j.
        std::vector<real> flags(std::size_t(block * np));
        ranks.all_gather(flags_.data(), slots_ * np, flags.data());
        for (std::int64_t k = 0; k < block; ++k)
            for (std::int64_t p = 0; p < np; ++p) reached_[std::size_t(p)] |= flags[std::size_t(k * np + p)] != 0;
        // Rank q sums values [q · part, (q + 1) · part) of the flat buffer, bucket by bucket.
        const std::int64_t part = (values_ + R - 1) / R, lo = std::min(values_, me * part), hi = std::min(values_, lo + part);
        std::vector<real> mine_summed(std::size_t(part), real(0));
        const std::int64_t bucket = std::max<std::int64_t>(1, kBucketValues / std::max<std::int64_t>(1, slots_));
        std::vector<real> send, got;
        for (std::int64_t c0 = 0; c0 < part; c0 += bucket) {
            const std::int64_t len = std::min(bucket, part - c0);
            // To rank q: values [q · part + c0, + len) of each of this rank's slots, zeros past the end. (R, slots, len)
            send.assign(std::size_t(R * slots_ * len), real(0));
            for (std::int64_t q = 0; q < R; ++q)
                for (std::int64_t j = 0; j < slots_; ++j) {
                    const std::int64_t from = q * part + c0, n = std::max<std::int64_t>(0, std::min(len, values_ - from));
                    if (n > 0)
                        std::memcpy(&send[std::size_t((q * slots_ + j) * len)], &mine_[std::size_t(j * values_ + from)],
                                    std::size_t(n) * sizeof(real));
                }
            got.resize(send.size());
            ranks.all_to_all(send.data(), slots_ * len, got.data());  // from rank s: (slots, len) at s · slots · len
            // Values [lo + c0, lo + c0 + len) of micro-batch k = j · R + s, added in the order of k.
            for (std::int64_t k = 0; k < block; ++k) {
                const std::int64_t row = (k % R) * slots_ + k / R;
                for (std::int64_t p = 0; p < np; ++p) {
                    if (flags[std::size_t(row * np + p)] == 0) continue;
                    const std::int64_t a = std::max(offset_[p], lo + c0);
                    const std::int64_t b = std::min({offset_[p] + params_[p].tensor.numel(), lo + c0 + len, hi});
                    if (a < b)
                        add_into(&mine_summed[std::size_t(a - lo)], &got[std::size_t(row * len + (a - lo - c0))], b - a);
                }
            }
        }
        // Every rank's summed part, to every rank: the sum.
        std::vector<real> all;
        for (std::int64_t c0 = 0; c0 < part; c0 += kBucketValues) {
            const std::int64_t len = std::min(kBucketValues, part - c0);
            all.resize(std::size_t(R * len));
            ranks.all_gather(&mine_summed[std::size_t(c0)], len, all.data());
            for (std::int64_t q = 0; q < R; ++q) {
                const std::int64_t from = q * part + c0, n = std::max<std::int64_t>(0, std::min(len, values_ - from));
                if (n > 0) std::memcpy(&sum_[std::size_t(from)], &all[std::size_t(q * len)], std::size_t(n) * sizeof(real));
            }
        }
    }

    // The sum as the parameters' gradients (a parameter no backward reached keeps none).
    void into_parameters() {
        for (std::size_t p = 0; p < params_.size(); ++p) {
            if (!reached_[p]) continue;
            Tensor& t = params_[p].tensor;
            std::memcpy(t.grad(), sum_.data() + offset_[p], std::size_t(t.numel()) * sizeof(real));
        }
    }

private:
    ParamList params_;
    std::int64_t slots_;
    std::vector<std::int64_t> offset_;  // of each parameter's gradient in the flat buffer
    std::int64_t values_ = 0;           // P
    std::vector<real> sum_;             // (P) the global batch's gradient
    std::vector<char> reached_;         // of each parameter: some micro-batch's backward reached it
    std::vector<real> mine_;            // (slots, P) this rank's micro-batches' gradients
    std::vector<real> flags_;           // (slots, parameters) 1 where this rank's micro-batch reached the parameter
};

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
    const std::int64_t n = std::int64_t(micro.size());
    const bool accumulating = n > 1;
    // tokens: the global batch's non-pad targets, the loss's denominator (a row always ends with EOS).
    std::int64_t tokens = 0;
    for (const StepBatch& b : micro)
        for (std::int32_t id : b.target) tokens += id != parts.model.config.pad_id;

    // Forward, loss and backward of micro-batch k, its backward seeded with `seed` (∂L/∂L_k).
    auto forward_backward = [&](std::int64_t k, real seed, bool keep_tape) {
        const StepBatch& b = micro[std::size_t(k)];
        begin(StepPhase::forward);
        Rng own_dropout;
        if (accumulating && parts.dropout) own_dropout = micro_batch_dropout(*parts.dropout, s.step, k);
        Pass pass{accumulating && parts.dropout ? &own_dropout : parts.dropout};
        pass.fuse_attention = s.fuse_attention;
        pass.let_values_go = s.let_values_go && !s.check_nan;  // check_nan reads every value the tape holds
        pass.observer = k == 0 ? s.observer : nullptr;
        Tensor logits = parts.model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);  // (B, T, V)
        // Nothing reads the logits after the loss, so its gradient, computed with the loss, may take their memory;
        // not with check_nan, which keeps the tape to look at every value.
        LossReport report;
        Tensor loss = sequence_loss(logits, b.target, parts.model.config.pad_id, real(s.label_smoothing), &report,
                                    /*consume_logits=*/!s.check_nan, seed);  // () mean over this micro-batch's tokens
        logits = Tensor();
        if (!std::isfinite(report.loss)) {
            const std::string where = s.check_nan ? first_nonfinite_op() : "";
            tape().clear();
            optimizer.zero_grad(/*set_to_none=*/true);
            throw NonFiniteStep(true, "loss", s.step, where);
        }
        end(StepPhase::forward);
        begin(StepPhase::backward);
        if (accumulating) backward(loss, {seed}, keep_tape, hooks.backward_record);
        else backward(loss, keep_tape, hooks.backward_record);  // seed 1, exactly as a step always was
        end(StepPhase::backward);
        return report;
    };

    if (!accumulating) {
        optimizer.zero_grad();
        result.loss = forward_backward(0, 1, /*keep_tape=*/s.check_nan);  // its loss as the loss op computed it
    } else {
        Communicator* ranks = parts.ranks && parts.ranks->size() > 1 ? parts.ranks : nullptr;
        const std::int64_t R = ranks ? ranks->size() : 1, me = ranks ? ranks->rank() : 0;
        const std::int64_t slots = (n + R - 1) / R;  // micro-batches per rank; a short global batch leaves some empty
        MicroBatchGradients grads(optimizer.params(), ranks ? slots : 0);
        std::vector<double> reports(std::size_t(3 * slots), 0.0);  // per slot: loss, nll, tokens
        for (std::int64_t k = me; k < n; k += R) {
            // ∂L/∂L_k = tokens_k / tokens: this micro-batch's share of the global batch's gradient, from zero.
            // check_nan keeps the last micro-batch's tape only (an earlier one's backward clears its own).
            optimizer.zero_grad(/*set_to_none=*/true);
            std::int64_t tokens_k = 0;
            for (std::int32_t id : micro[std::size_t(k)].target) tokens_k += id != parts.model.config.pad_id;
            const LossReport report =
                forward_backward(k, real(double(tokens_k) / double(tokens)), s.check_nan && k + R >= n);
            if (ranks) grads.keep(k / R);
            else grads.add();  // one process: straight into the sum, in the order k = 0, 1, ...
            double* r = &reports[std::size_t(3 * (k / R))];
            r[0] = report.loss, r[1] = report.nll, r[2] = double(report.tokens);
        }
        std::vector<double> all_reports = reports;
        if (ranks) {
            const auto t0 = std::chrono::steady_clock::now();
            grads.exchange(*ranks);
            all_reports.resize(std::size_t(R) * reports.size());
            ranks->all_gather(reports.data(), std::int64_t(reports.size()), all_reports.data());
            result.reduce_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        grads.into_parameters();
        // The global batch's loss: Σ_k L_k · tokens_k / tokens, summed in the order k = 0, 1, ... on every rank.
        double loss_sum = 0, nll_sum = 0;
        for (std::int64_t k = 0; k < n; ++k) {
            const double* r = &all_reports[std::size_t(3 * ((k % R) * slots + k / R))];
            loss_sum += r[0] * r[2];
            nll_sum += r[1] * r[2];
        }
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
