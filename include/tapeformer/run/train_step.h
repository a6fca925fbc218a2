// One training step, the only one: `train` (train.h) and `bench train` (bench.h) both call it.
//
//   logits = model(src, dec_in)              forward, recorded on the tape          phase "fwd"
//   loss   = CE_ε(logits, target)            label-smoothed, pad ignored            (also "fwd")
//   zero_grad; backward(loss)                the tape in reverse                    phase "bwd"
//   ‖g‖ of all gradients                     the clipping norm and the finite check phase "clip"
//   optimizer.step(lr, clip factor)          clipping as the optimizer's factor     phase "optim"
//   average.update; zero_grad (set to none)  --ema; gradient memory back to the pool (also "optim")
//
// With gradient accumulation (--accumulate N) one step is a global batch of N micro-batches: forward, loss
// and backward run per micro-batch, each backward seeded with tokens_k / tokens (its share of the global
// batch's target tokens), so the summed gradients are those of the global batch's mean loss
//   L = Σ_k Σ_{t ∈ k} ℓ_t / Σ_k tokens_k = Σ_k (tokens_k / tokens) · L_k;
// clipping and the optimizer then run once. Micro-batch k of step s draws its dropout from its own stream,
// seeded by (the run's dropout seed, s, k), so that which process computes it changes nothing; one batch
// (N = 1) draws from the run's stream, as it always has.
//
// Each micro-batch's gradient g_k is computed from zero, and the step's gradient is their sum in a fixed
// order, g = ((g_0 + g_1) + g_2) + ...: so that the R ranks of an MPI job (distributed.h) give the same
// bits as one process. Rank r computes the micro-batches k ≡ r (mod R); each g_k is fused into one flat
// buffer, and the ranks sum them with a reduce-scatter whose order is fixed (rank q adds part q of every
// g_k in the order above; the summed parts are then all-gathered; a few large buckets per call); every
// rank then clips and updates as one process does: the weights stay identical on every rank.
//
// Whoever times the step, or reads its gradients, does it through StepHooks: the step itself neither
// times nor logs, so the benchmark measures the step that training runs.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/optim.h"
#include "tapeformer/random.h"
#include "tapeformer/run/distributed.h"

TF_NAMESPACE_BEGIN

// A batch as the step reads it: token ids, row-major, padding = the model's pad_id.
struct StepBatch {
    const std::vector<std::int32_t>& src;     // (B, S)
    const std::vector<std::int32_t>& dec_in;  // (B, T) BOS + tokens
    const std::vector<std::int32_t>& target;  // (B, T) tokens + EOS: dec_in shifted by one
    std::int64_t B, S, T;
};

// What the step trains: the model, its optimizer (over the model's parameters), the weight average
// (--ema, nullptr: none) and the dropout stream the forward pass draws from.
struct StepParts {
    Transformer& model;
    Optimizer& optimizer;
    WeightAverage* average = nullptr;
    Rng* dropout = nullptr;
    Communicator* ranks = nullptr;  // the ranks that share the global batch's micro-batches; nullptr: this process alone
};

struct StepSettings {
    double lr = 0;                  // of this step (Schedule::lr_at(step))
    std::int64_t step = 0;          // the step this is, from 1: the weight average's and the errors' count
    double label_smoothing = 0.1;
    double clip = 1.0;              // global gradient-norm clipping (<= 0: off)
    bool fuse_attention = true;     // ops.h attention_heads: the composed ops' numbers, faster
    bool let_values_go = true;      // Pass::let_values_go: less memory, the same numbers (not with check_nan)
    ForwardObserver* observer = nullptr;  // listens to the forward's probes (module.h); nullptr: nobody
    bool check_nan = false;         // keep the tape, to name the first op that made a non-finite value
};

enum class StepPhase { forward, backward, clip, optimizer };
const char* to_string(StepPhase phase);  // "fwd", "bwd", "clip", "optim": bench's phase_ms keys

struct StepResult {
    LossReport loss;         // of this (global) batch, before the update: means over all its target tokens
    double grad_norm = 0;    // ‖g‖₂ of all gradients, before clipping
    double reduce_seconds = 0;  // in the ranks' exchange of gradients (0 in one process)
};

// Optional callbacks, each empty unless set: nothing in the step waits for them or depends on them.
struct StepHooks {
    std::function<void(StepPhase)> phase_begins, phase_ends;  // around each phase (the comment above)
    RecordHook backward_record;                                // after each tape record's backward
    // After backward, before clipping: the gradients as the loss gave them (the tape already cleared).
    std::function<void(const StepResult&)> before_update;
};

// A non-finite loss or gradient. The step stops before the optimizer touches a weight, with the tape
// cleared; what() says which value, at which step, and (check_nan) where it came from.
struct NonFiniteStep : std::runtime_error {
    NonFiniteStep(bool of_loss, std::string value, std::int64_t step, std::string where);
    bool of_loss;       // the loss (else a gradient)
    std::string value;  // "loss", or "gradient of <parameter>"
    std::int64_t step;
    std::string where;  // with check_nan: the first op that produced it; "" otherwise
};

// One step on `batch`: forward, loss, backward, clip, optimizer step, zero_grad. Throws NonFiniteStep.
StepResult train_step(const StepParts& parts, const StepBatch& batch, const StepSettings& settings,
                      const StepHooks& hooks = {});
// One step on the global batch of `micro` (at least one micro-batch), as above. The observer watches the
// first micro-batch's forward only. With parts.ranks, every rank passes the whole global batch (its target
// tokens are the loss's denominator) and computes its own share of it.
StepResult train_step(const StepParts& parts, const std::vector<StepBatch>& micro, const StepSettings& settings,
                      const StepHooks& hooks = {});

// Micro-batch k's dropout stream in step `step` of an accumulating run (N > 1): a pure function of the run's
// dropout seed, the step and k.
Rng micro_batch_dropout(const Rng& run_stream, std::int64_t step, std::int64_t k);

TF_NAMESPACE_END
