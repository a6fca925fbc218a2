// Learning-rate schedules: one small function per kind, each the formula quoted in schedule.h.
#include "tapeformer/schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "tapeformer/error.h"

TF_NAMESPACE_BEGIN

namespace {

constexpr double kPi = 3.14159265358979323846;

struct KindName {
    ScheduleKind kind;
    const char* name;
};
constexpr KindName kKindNames[] = {
    {ScheduleKind::Noam, "noam"},     {ScheduleKind::InverseSqrt, "inverse_sqrt"}, {ScheduleKind::Cosine, "cosine"},
    {ScheduleKind::Linear, "linear"}, {ScheduleKind::Constant, "constant"},
};

// The linear ramp lr·s/w shared by every warmup, for s ≤ w.
double warmup_lr(double lr, double s, double w) { return lr * s / w; }

// lrate = factor · C^-0.5 · min(s^-0.5, s · w^-1.5)
double noam(const Schedule& c, double s) {
    const double w = static_cast<double>(c.warmup);
    const double decay = 1 / std::sqrt(s);
    const double ramp = c.warmup > 0 ? s * std::pow(w, -1.5) : decay;
    return c.lr / std::sqrt(static_cast<double>(c.d_model)) * std::min(decay, ramp);
}

// lr · min(s/w, √(w/s))
double inverse_sqrt(const Schedule& c, double s) {
    const double w = static_cast<double>(std::max<std::int64_t>(c.warmup, 1));
    return c.lr * std::min(s / w, std::sqrt(w / s));
}

// The fraction of the decay phase done at step s > w: (s − w)/(n − w), capped at 1 after n.
double decay_progress(const Schedule& c, double s) {
    const double w = static_cast<double>(c.warmup), n = static_cast<double>(c.total_steps);
    return std::min(1.0, (s - w) / (n - w));
}

// lr_min + (lr − lr_min) · ½(1 + cos(π·progress))
double cosine(const Schedule& c, double s) {
    if (s <= c.warmup) return warmup_lr(c.lr, s, static_cast<double>(c.warmup));
    return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1 + std::cos(kPi * decay_progress(c, s)));
}

// lr − (lr − lr_min) · progress
double linear(const Schedule& c, double s) {
    if (s <= c.warmup) return warmup_lr(c.lr, s, static_cast<double>(c.warmup));
    return c.lr - (c.lr - c.min_lr) * decay_progress(c, s);
}

double constant(const Schedule& c, double s) {
    if (s <= c.warmup) return warmup_lr(c.lr, s, static_cast<double>(c.warmup));
    return c.lr;
}

}  // namespace

const char* schedule_kind_name(ScheduleKind kind) {
    for (const KindName& k : kKindNames)
        if (k.kind == kind) return k.name;
    fail("schedule", "unknown schedule kind " + std::to_string(static_cast<int>(kind)));
}

ScheduleKind parse_schedule_kind(std::string_view name) {
    std::string valid;
    for (const KindName& k : kKindNames) {
        if (name == k.name) return k.kind;
        valid += std::string(valid.empty() ? "" : ", ") + k.name;
    }
    fail("schedule", "unknown learning-rate schedule '" + std::string(name) + "' (expected one of: " + valid + ")");
}

void Schedule::validate() const {
    const std::string kind_name = schedule_kind_name(kind);
    if (!(lr > 0) || !std::isfinite(lr))
        fail("schedule", kind_name + ": lr must be finite and > 0, got " + std::to_string(lr));
    if (warmup < 0) fail("schedule", kind_name + ": warmup must be >= 0, got " + std::to_string(warmup));
    if (kind == ScheduleKind::Noam && d_model <= 0)
        fail("schedule", kind_name + ": d_model must be > 0, got " + std::to_string(d_model));
    if (kind == ScheduleKind::Cosine || kind == ScheduleKind::Linear) {
        if (total_steps <= warmup)
            fail("schedule", kind_name + ": total_steps (" + std::to_string(total_steps) + ") must be greater than warmup (" +
                 std::to_string(warmup) + ")");
        if (!(min_lr >= 0 && min_lr <= lr))
            fail("schedule", kind_name + ": min_lr must be in [0, lr = " + std::to_string(lr) + "], got " + std::to_string(min_lr));
    }
}

double Schedule::lr_at(std::int64_t step) const {
    if (step < 1) fail("schedule", std::string(schedule_kind_name(kind)) + ": steps count from 1, got " + std::to_string(step));
    validate();
    const double s = static_cast<double>(step);
    switch (kind) {
        case ScheduleKind::Noam: return noam(*this, s);
        case ScheduleKind::InverseSqrt: return inverse_sqrt(*this, s);
        case ScheduleKind::Cosine: return cosine(*this, s);
        case ScheduleKind::Linear: return linear(*this, s);
        case ScheduleKind::Constant: return constant(*this, s);
    }
    fail("schedule", "unknown schedule kind " + std::to_string(static_cast<int>(kind)));
}

double cooldown_factor(double progress, double fraction) {
    if (!(fraction >= 0 && fraction < 1)) fail("schedule", "cooldown must be in [0, 1), got " + std::to_string(fraction));
    if (fraction == 0) return 1;
    return std::clamp((1 - progress) / fraction, 0.0, 1.0);
}

std::string Schedule::describe() const {
    std::ostringstream out;
    out << schedule_kind_name(kind) << "(" << (kind == ScheduleKind::Noam ? "factor=" : "lr=") << lr
        << ", warmup=" << warmup;
    if (kind == ScheduleKind::Noam) out << ", d_model=" << d_model;
    if (kind == ScheduleKind::Cosine || kind == ScheduleKind::Linear)
        out << ", total_steps=" << total_steps << ", min_lr=" << min_lr;
    out << ")";
    return out.str();
}

TF_NAMESPACE_END
