// Learning-rate schedules: the learning rate as a pure function of the (1-based) update step.
//
// The trainer calls lr_at(step) once per optimizer update, step = 1 for the first update, and passes the
// result (times cooldown_factor, below, when the run has a cooldown) to Optimizer::step. Every schedule with
// a warmup rises linearly, lr·s/w, reaching its peak at step w (the same ramp as the paper's, whose peak is
// also at s = w).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// With s the step, w = warmup, n = total_steps, lr the peak and lr_min = min_lr:
enum class ScheduleKind {
    // "Attention Is All You Need" §5.3: lrate = factor · C^-0.5 · min(s^-0.5, s · w^-1.5), factor = lr.
    // Rises linearly to factor·(C·w)^-0.5 at s = w, then decays as 1/√s. w = 0: factor·(C·s)^-0.5.
    Noam,
    // lr · min(s/w, √(w/s)): the same shape as Noam with the peak set directly (fairseq's inverse_sqrt).
    // w = 0 behaves as w = 1: lr/√s.
    InverseSqrt,
    // Warmup, then half a cosine from lr down to lr_min at s = n:
    // lr_min + (lr − lr_min) · ½(1 + cos(π · (s − w)/(n − w))); lr_min after n.
    Cosine,
    // Warmup, then a straight line from lr down to lr_min at s = n: lr − (lr − lr_min)·(s − w)/(n − w);
    // lr_min after n.
    Linear,
    // Warmup (when w > 0), then lr.
    Constant,
};

// "noam", "inverse_sqrt", "cosine", "linear", "constant".
const char* schedule_kind_name(ScheduleKind kind);
// The inverse of schedule_kind_name. Throws std::invalid_argument listing the valid names.
ScheduleKind parse_schedule_kind(std::string_view name);

struct Schedule {
    ScheduleKind kind = ScheduleKind::Noam;  // the paper's schedule
    double lr = 1.0;               // peak learning rate; for Noam, the factor (the paper: 1)
    std::int64_t warmup = 4000;    // w: steps of linear warmup (the paper: 4000)
    std::int64_t total_steps = 0;  // n: where Cosine and Linear reach min_lr (must exceed warmup); else unused
    double min_lr = 0;             // the floor of Cosine and Linear
    std::int64_t d_model = 512;    // C, for Noam only (the paper's base model: 512)

    // The learning rate of update `step` (1-based). Throws std::invalid_argument when step < 1 or the
    // schedule is invalid (see validate).
    double lr_at(std::int64_t step) const;
    // Throws std::invalid_argument naming the field unless: lr > 0 and finite, warmup ≥ 0, d_model > 0
    // (Noam), total_steps > warmup and 0 ≤ min_lr ≤ lr (Cosine, Linear).
    void validate() const;
    // One line for logs: "cosine(lr=0.0005, warmup=1000, total_steps=20000, min_lr=1e-05)".
    std::string describe() const;
};

// A cooldown over the last `fraction` of a run (the "decay" of warmup–stable–decay schedules): the factor,
// min(1, (1 − progress)/fraction), by which the schedule's learning rate is multiplied when `progress` of the
// run (0 to 1, measured before the step) is done; it falls linearly to 0 at the run's end. The trainer
// measures progress by steps or by training time, whichever stop is nearer (--cooldown, train_settings.h).
// fraction 0: no cooldown (1). Throws std::invalid_argument unless 0 ≤ fraction < 1.
double cooldown_factor(double progress, double fraction);

TF_NAMESPACE_END
