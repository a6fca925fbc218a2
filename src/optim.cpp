// Optimizers and gradient checks. Each update is one fused loop over a parameter's values, gradient and
// state (one pass over memory instead of torch's four or five tensor ops); the arithmetic follows torch's
// ops term by term, with the scalar coefficients computed in double and rounded to `real` as torch does.
#include "tapeformer/optim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "tapeformer/error.h"
#include "tapeformer/parallel.h"

TF_NAMESPACE_BEGIN

namespace {

void check_lr(const char* who, double lr) {
    if (!(lr >= 0) || !std::isfinite(lr)) fail(who, "learning rate must be finite and >= 0, got " + std::to_string(lr));
}

void check_option(const char* who, const char* name, double value, double lo, double hi_excl) {
    if (!(value >= lo && value < hi_excl))
        fail(who, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi_excl) + "), got " +
                      std::to_string(value));
}

// The parameters whose gradient buffer exists, each storage once.
std::vector<Tensor> unique_with_grad(const ParamList& params) {
    std::vector<Tensor> out;
    for (const NamedTensor& p : unique_parameters(params))
        if (p.tensor.has_grad()) out.push_back(p.tensor);
    return out;
}

// ---- state entries ---------------------------------------------------------------------------------------
// "<prefix><field>.<parameter name>", e.g. "adam.m.decoder.norm.weight".

// name → index into the optimizer's (deduplicated) parameter list.
std::unordered_map<std::string, std::size_t> index_by_name(const ParamList& params) {
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < params.size(); ++i) index.emplace(params[i].name, i);
    return index;
}

// Splits a state entry's name into its field and its parameter's index; throws when either is unknown.
// Returns false for entries that do not start with prefix (they belong to someone else).
bool parse_entry(const char* who, const std::string& key, const std::string& prefix,
                 const std::vector<std::string>& fields, const std::unordered_map<std::string, std::size_t>& index,
                 std::string& field, std::size_t& param) {
    if (key.compare(0, prefix.size(), prefix) != 0) return false;
    for (const std::string& f : fields) {
        const std::string head = prefix + f + ".";
        if (key.compare(0, head.size(), head) != 0) continue;
        auto it = index.find(key.substr(head.size()));
        if (it == index.end()) fail(who, "state entry '" + key + "' names no parameter of this optimizer");
        field = f;
        param = it->second;
        return true;
    }
    fail(who, "unknown state entry '" + key + "'");
}

Tensor step_tensor(std::int64_t step) { return Tensor::scalar(static_cast<real>(step)); }

std::int64_t read_step(const char* who, const NamedTensor& e) {
    if (e.tensor.numel() != 1) fail(who, "state entry '" + e.name + "' must hold one value, has shape " + e.tensor.shape().str());
    const double v = e.tensor.item();
    if (!(v >= 0) || !std::isfinite(v) || std::floor(v) != v)
        fail(who, "state entry '" + e.name + "' must be a non-negative whole step count, got " + std::to_string(v));
    return static_cast<std::int64_t>(v);
}

Tensor read_buffer(const char* who, const NamedTensor& e, const Tensor& param) {
    if (e.tensor.shape() != param.shape())
        fail(who, "state entry '" + e.name + "' has shape " + e.tensor.shape().str() + ", its parameter " +
                      param.shape().str());
    return e.tensor.clone();
}

// ---- kernels -----------------------------------------------------------------------------------------------

struct AdamCoefficients {
    real beta1, one_minus_beta1;      // m ← β1·m + (1 − β1)·g
    real beta2, one_minus_beta2;      // v ← β2·v + (1 − β2)·g²
    real l2;                          // Adam: g ← g + wd·p (0 for AdamW)
    real decay;                       // AdamW: p ← p·(1 − lr·wd) (1 for Adam)
    real step_size;                   // lr / (1 − β1^t)
    real bias_correction2_sqrt;       // √(1 − β2^t)
    real eps;
};

// p, g, m, v: (n) — one pass over all four, on the calling thread (Adam::step shares the parameters'
// pieces among the threads). GCC vectorises it only under -fno-math-errno: otherwise std::sqrt keeps a
// branch that may set errno.
void adam_update(real* p, const real* g, real* m, real* v, std::int64_t n, const AdamCoefficients& c) {
    const AdamCoefficients k = c;  // locals, so the vectoriser sees loop invariants
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
        const real gi = g[i] + k.l2 * p[i];
        m[i] = k.beta1 * m[i] + k.one_minus_beta1 * gi;
        v[i] = k.beta2 * v[i] + k.one_minus_beta2 * (gi * gi);
        // denom = √v̂ + ε with v̂ = v / (1 − β2^t), taken as torch does: √v / √(1 − β2^t) + ε
        const real denom = std::sqrt(v[i]) / k.bias_correction2_sqrt + k.eps;
        p[i] = p[i] * k.decay - k.step_size * (m[i] / denom);
    }
}

struct SgdCoefficients {
    real lr, weight_decay;            // d = g + wd·p;  p ← p − lr·d
    bool use_momentum;
    real buf_keep, buf_take;          // buf ← keep·buf + take·d: (0, 1) on the first step, else (μ, 1 − dampening)
    real out_d, out_buf;              // d ← out_d·d + out_buf·buf: Nesterov (1, μ), else (0, 1)
};

// p, g, buf: (n); buf (zeroed before the first step) is unused without momentum. The momentum cases are
// written as coefficients, not branches, so the loop vectorises; each product by 0 or 1 is exact.
void sgd_update(real* p, const real* g, real* buf, std::int64_t n, const SgdCoefficients& c) {
    const real lr = c.lr, wd = c.weight_decay;
    if (!c.use_momentum) {
#pragma omp simd
        for (std::int64_t i = 0; i < n; ++i) p[i] = p[i] - lr * (g[i] + wd * p[i]);
        return;
    }
    const real keep = c.buf_keep, take = c.buf_take, out_d = c.out_d, out_buf = c.out_buf;
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
        const real d = g[i] + wd * p[i];
        buf[i] = keep * buf[i] + take * d;
        p[i] = p[i] - lr * (out_d * d + out_buf * buf[i]);
    }
}

// Σ g² of one block, in double, in 8 fixed lanes (lane l sums the values at l, l + 8, ...) added in a
// fixed order at the end: vectorised, and the same result wherever the block is summed.
double block_sum_of_squares(const real* g, std::int64_t n) {
    constexpr int kLanes = 8;
    double lane[kLanes] = {};
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(g[i + l]) * g[i + l];
    for (; i < n; ++i) lane[i % kLanes] += static_cast<double>(g[i]) * g[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// A piece of one parameter: the unit that the passes over all gradients share among the threads. The
// pieces are cut by size alone, so sums over them do not depend on the number of threads.
struct Piece {
    std::size_t param;
    std::int64_t begin, end;
};
constexpr std::int64_t kPiece = 1 << 13;

std::vector<Piece> pieces_of(const std::vector<Tensor>& tensors) {
    std::vector<Piece> out;
    for (std::size_t t = 0; t < tensors.size(); ++t)
        for (std::int64_t b = 0, n = tensors[t].numel(); b < n; b += kPiece) out.push_back({t, b, std::min(n, b + kPiece)});
    return out;
}

// An optimizer's update over all its parameters in one parallel loop over their pieces: one fork and
// join per step, not one per parameter (the updates are elementwise, so the split changes nothing).
// update(k, begin, g, n) updates values [begin, begin + n) of parameter k from gradient values g, which
// are the gradient times grad_scale: rounded to float in a buffer of the piece's own, exactly as a
// gradient clipped in place would be (and the optimizer's arithmetic stays as written), without a pass
// over all gradients in memory.
template <class Update>
void update_in_pieces(const std::vector<Tensor>& params, const std::vector<const real*>& grads, real grad_scale,
                      Update update) {
    const std::vector<Piece> pieces = pieces_of(params);
    const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (count > 8)
    for (std::int64_t k = 0; k < count; ++k) {
        const Piece& piece = pieces[k];
        const std::int64_t n = piece.end - piece.begin;
        const real* g = grads[piece.param] + piece.begin;
        alignas(64) real scaled[kPiece];
        if (grad_scale != real(1)) {
            for (std::int64_t i = 0; i < n; ++i) scaled[i] = g[i] * grad_scale;
            g = scaled;
        }
        update(piece.param, piece.begin, g, n);
    }
}

}  // namespace

ParamList named_by_index(const std::vector<Tensor>& tensors) {
    ParamList params;
    for (std::size_t i = 0; i < tensors.size(); ++i) params.push_back({std::to_string(i), tensors[i]});
    return params;
}

// ---- Optimizer -----------------------------------------------------------------------------------------------

namespace {

// unique_parameters (module.h: each storage once, under its first name), after refusing an undefined
// tensor and one name given to two different tensors.
ParamList checked_unique_parameters(const ParamList& params, const char* who) {
    for (std::size_t i = 0; i < params.size(); ++i) {
        const NamedTensor& p = params[i];
        if (!p.tensor.defined()) fail(who, "parameter '" + p.name + "' is an undefined tensor");
        for (std::size_t j = 0; j < i; ++j)
            if (params[j].name == p.name && !params[j].tensor.same_storage(p.tensor))
                fail(who, "two different tensors are both named '" + p.name + "'");
    }
    return unique_parameters(params);
}

}  // namespace

Optimizer::Optimizer(const ParamList& params, const char* who) : params_(checked_unique_parameters(params, who)) {}

void Optimizer::zero_grad(bool set_to_none) {
    for (NamedTensor& p : params_) set_to_none ? p.tensor.release_grad() : p.tensor.zero_grad();
}

// ---- Adam / AdamW ----------------------------------------------------------------------------------------------

Adam::Adam(const ParamList& params, AdamOptions options) : Adam(params, options, false, "Adam") {}

AdamW::AdamW(const ParamList& params, AdamOptions options) : Adam(params, options, true, "AdamW") {}

Adam::Adam(const ParamList& params, AdamOptions options, bool decoupled, const char* who)
    : Optimizer(params, who), options_(options), decoupled_(decoupled), moments_(params_.size()) {
    check_option(who, "beta1", options.beta1, 0, 1);
    check_option(who, "beta2", options.beta2, 0, 1);
    check_option(who, "eps", options.eps, 0, INFINITY);
    check_option(who, "weight_decay", options.weight_decay, 0, INFINITY);
}

// The coefficients of every parameter first, then update_in_pieces.
void Adam::step(double lr, double grad_scale) {
    check_lr(decoupled_ ? "AdamW" : "Adam", lr);
    const AdamOptions& o = options_;
    struct Update {
        real *p, *m, *v;
        AdamCoefficients c;
    };
    std::vector<Update> updates;
    std::vector<Tensor> updated;
    std::vector<const real*> grads;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = params_[i].tensor;
        if (!p.requires_grad() || !p.has_grad()) continue;
        Moments& s = moments_[i];
        if (s.step == 0) {
            s.m = Tensor::zeros(p.shape());
            s.v = Tensor::zeros(p.shape());
        }
        s.step += 1;
        const double t = static_cast<double>(s.step);
        AdamCoefficients c;
        c.beta1 = static_cast<real>(o.beta1);
        c.one_minus_beta1 = static_cast<real>(1 - o.beta1);
        c.beta2 = static_cast<real>(o.beta2);
        c.one_minus_beta2 = static_cast<real>(1 - o.beta2);
        c.l2 = decoupled_ ? real(0) : static_cast<real>(o.weight_decay);
        c.decay = decoupled_ ? static_cast<real>(1 - lr * o.weight_decay) : real(1);
        c.step_size = static_cast<real>(lr / (1 - std::pow(o.beta1, t)));
        c.bias_correction2_sqrt = static_cast<real>(std::sqrt(1 - std::pow(o.beta2, t)));
        c.eps = static_cast<real>(o.eps);
        updates.push_back({p.data(), s.m.data(), s.v.data(), c});
        updated.push_back(p);
        grads.push_back(p.grad());
    }
    update_in_pieces(updated, grads, static_cast<real>(grad_scale),
                     [&](std::size_t k, std::int64_t b, const real* g, std::int64_t n) {
                         const Update& u = updates[k];
                         adam_update(u.p + b, g, u.m + b, u.v + b, n, u.c);
                     });
}

std::vector<NamedTensor> Adam::state() const {
    std::vector<NamedTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        const Moments& s = moments_[i];
        if (s.step == 0) continue;
        const std::string& name = params_[i].name;
        out.push_back({"adam.step." + name, step_tensor(s.step)});
        out.push_back({"adam.m." + name, s.m.clone()});
        out.push_back({"adam.v." + name, s.v.clone()});
    }
    return out;
}

void Adam::load_state(const std::vector<NamedTensor>& state) {
    const char* who = decoupled_ ? "AdamW" : "Adam";
    const auto index = index_by_name(params_);
    std::vector<Moments> loaded(params_.size());
    for (const NamedTensor& e : state) {
        std::string field;
        std::size_t i = 0;
        if (!parse_entry(who, e.name, "adam.", {"step", "m", "v"}, index, field, i)) continue;
        if (field == "step")
            loaded[i].step = read_step(who, e);
        else
            (field == "m" ? loaded[i].m : loaded[i].v) = read_buffer(who, e, params_[i].tensor);
    }
    // Either a parameter has taken steps and has both moments, or it has neither (it starts fresh).
    for (std::size_t i = 0; i < params_.size(); ++i) {
        const Moments& s = loaded[i];
        const bool both = s.m.defined() && s.v.defined(), none = !s.m.defined() && !s.v.defined();
        if (!((s.step > 0 && both) || (s.step == 0 && none)))
            fail(who, "state of parameter '" + params_[i].name + "' is incomplete: needs adam.step (> 0), adam.m and adam.v");
    }
    moments_ = std::move(loaded);
}

// ---- SGD --------------------------------------------------------------------------------------------------------

Sgd::Sgd(const ParamList& params, SgdOptions options)
    : Optimizer(params, "SGD"), options_(options), buffers_(params_.size()) {
    check_option("SGD", "momentum", options.momentum, 0, INFINITY);
    check_option("SGD", "dampening", options.dampening, 0, INFINITY);
    check_option("SGD", "weight_decay", options.weight_decay, 0, INFINITY);
    if (options.nesterov && (options.momentum <= 0 || options.dampening != 0))
        fail("SGD", "Nesterov momentum requires momentum > 0 and dampening = 0");
}

void Sgd::step(double lr, double grad_scale) {
    check_lr("SGD", lr);
    const SgdOptions& o = options_;
    struct Update {
        real *p, *buf;
        SgdCoefficients c;
    };
    std::vector<Update> updates;
    std::vector<Tensor> updated;
    std::vector<const real*> grads;
    for (std::size_t i = 0; i < params_.size(); ++i) {
        Tensor& p = params_[i].tensor;
        if (!p.requires_grad() || !p.has_grad()) continue;
        const bool first_step = o.momentum != 0 && !buffers_[i].defined();
        if (first_step) buffers_[i] = Tensor::zeros(p.shape());
        SgdCoefficients c;
        c.lr = static_cast<real>(lr);
        c.weight_decay = static_cast<real>(o.weight_decay);
        c.use_momentum = o.momentum != 0;
        c.buf_keep = first_step ? real(0) : static_cast<real>(o.momentum);
        c.buf_take = first_step ? real(1) : static_cast<real>(1 - o.dampening);
        c.out_d = o.nesterov ? real(1) : real(0);
        c.out_buf = o.nesterov ? static_cast<real>(o.momentum) : real(1);
        updates.push_back({p.data(), c.use_momentum ? buffers_[i].data() : nullptr, c});
        updated.push_back(p);
        grads.push_back(p.grad());
    }
    update_in_pieces(updated, grads, static_cast<real>(grad_scale),
                     [&](std::size_t k, std::int64_t b, const real* g, std::int64_t n) {
                         const Update& u = updates[k];
                         sgd_update(u.p + b, g, u.buf ? u.buf + b : nullptr, n, u.c);
                     });
}

std::vector<NamedTensor> Sgd::state() const {
    std::vector<NamedTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i)
        if (buffers_[i].defined()) out.push_back({"sgd.momentum_buffer." + params_[i].name, buffers_[i].clone()});
    return out;
}

void Sgd::load_state(const std::vector<NamedTensor>& state) {
    const auto index = index_by_name(params_);
    std::vector<Tensor> loaded(params_.size());
    for (const NamedTensor& e : state) {
        std::string field;
        std::size_t i = 0;
        if (!parse_entry("SGD", e.name, "sgd.", {"momentum_buffer"}, index, field, i)) continue;
        loaded[i] = read_buffer("SGD", e, params_[i].tensor);
    }
    buffers_ = std::move(loaded);
}

// ---- WeightAverage ----------------------------------------------------------------------------------------------

WeightAverage::WeightAverage(const ParamList& params, double decay)
    : params_(checked_unique_parameters(params, "WeightAverage")), decay_(decay) {
    if (!(decay > 0 && decay < 1)) fail("WeightAverage", "decay must be in (0, 1), got " + std::to_string(decay));
    for (const NamedTensor& p : params_) average_.push_back(p.tensor.clone());
}

void WeightAverage::update(std::int64_t t) {
    if (t < 1) fail("WeightAverage", "update number must be >= 1, got " + std::to_string(t));
    const double d = std::min(decay_, (1.0 + double(t)) / (10.0 + double(t)));
    const real take = static_cast<real>(1 - d);
    std::vector<Tensor> params;
    for (const NamedTensor& p : params_) params.push_back(p.tensor);
    const std::vector<Piece> pieces = pieces_of(params);
    const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (count > 8)
    for (std::int64_t k = 0; k < count; ++k) {
        const Piece& piece = pieces[k];
        const real* p = params[piece.param].data() + piece.begin;
        real* a = average_[piece.param].data() + piece.begin;
        const std::int64_t n = piece.end - piece.begin;
#pragma omp simd
        for (std::int64_t i = 0; i < n; ++i) a[i] += take * (p[i] - a[i]);
    }
}

void WeightAverage::swap_into_parameters() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
        real* p = params_[i].tensor.data();
        std::swap_ranges(p, p + params_[i].tensor.numel(), average_[i].data());
    }
}

std::vector<NamedTensor> WeightAverage::state() const {
    std::vector<NamedTensor> out;
    for (std::size_t i = 0; i < params_.size(); ++i) out.push_back({"ema." + params_[i].name, average_[i].clone()});
    return out;
}

void WeightAverage::load_state(const std::vector<NamedTensor>& state) {
    const auto index = index_by_name(params_);
    std::vector<Tensor> loaded(params_.size());
    for (const NamedTensor& e : state) {
        if (e.name.compare(0, 4, "ema.") != 0) continue;
        auto it = index.find(e.name.substr(4));
        if (it == index.end()) fail("WeightAverage", "state entry '" + e.name + "' names no parameter");
        if (loaded[it->second].defined()) fail("WeightAverage", "state entry '" + e.name + "' is given twice");
        loaded[it->second] = read_buffer("WeightAverage", e, params_[it->second].tensor);
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
        if (!loaded[i].defined()) fail("WeightAverage", "no state entry 'ema." + params_[i].name + "'");
    average_ = std::move(loaded);
}

// ---- gradient checks ----------------------------------------------------------------------------------------

// One parallel loop over the pieces of all gradients; each parameter's pieces are added in order, then
// the parameters in order.
double grad_norm(const ParamList& params) {
    const std::vector<Tensor> tensors = unique_with_grad(params);
    std::vector<const real*> grads;
    for (const Tensor& t : tensors) grads.push_back(t.grad());
    const std::vector<Piece> pieces = pieces_of(tensors);
    std::vector<double> partial(pieces.size());
    const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (count > 8)
    for (std::int64_t k = 0; k < count; ++k) {
        const Piece& piece = pieces[k];
        partial[k] = block_sum_of_squares(grads[piece.param] + piece.begin, piece.end - piece.begin);
    }
    double total = 0, param_total = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
        param_total += partial[k];
        if (k + 1 == pieces.size() || pieces[k + 1].param != pieces[k].param) {
            total += param_total;
            param_total = 0;
        }
    }
    return std::sqrt(total);
}

real clip_coefficient(double total, double max_norm) {
    if (!(max_norm > 0)) fail("clip_grad_norm", "max_norm must be > 0, got " + std::to_string(max_norm));
    return static_cast<real>(std::min(max_norm / (total + 1e-6), 1.0));
}

double clip_grad_norm(const ParamList& params, double max_norm) {
    if (!(max_norm > 0)) fail("clip_grad_norm", "max_norm must be > 0, got " + std::to_string(max_norm));
    const double total = grad_norm(params);
    // torch.nn.utils.clip_grad_norm_: every gradient × min(max_norm / (total + 1e-6), 1). A non-finite
    // norm leaves the gradients as they are, for --check-nan to name the op.
    if (!std::isfinite(total)) return total;
    const real k = clip_coefficient(total, max_norm);
    for (Tensor t : unique_with_grad(params)) {
        real* g = t.grad();
        const std::int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) g[i] *= k;
    }
    return total;
}

std::optional<std::string> first_nonfinite_grad(const ParamList& params) {
    for (const NamedTensor& p : unique_parameters(params)) {
        if (!p.tensor.has_grad()) continue;
        const real* g = p.tensor.grad();
        const std::int64_t n = p.tensor.numel();
        bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) bad = bad || !std::isfinite(g[i]);
        if (bad) return p.name;
    }
    return std::nullopt;
}

TF_NAMESPACE_END
