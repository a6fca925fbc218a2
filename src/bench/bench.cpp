// `tapeformer bench train`: torch_ref.py's training benchmark, step for step, on tapeformer.
//
// Reading order: torch_ref.py's random batches and model settings; one training step (train_step); then
// the parts of a run, each one function: describe, time_training, time_greedy, profile_steps;
// bench_train calls them in that order.
#include "tapeformer/bench/bench.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/decode.h"
#include "tapeformer/io.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/optim.h"
#include "tapeformer/pool.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/schedule.h"
#include "tapeformer/teach/summary.h"
#include "tapeformer/run/train_step.h"

TF_NAMESPACE_BEGIN

namespace {

constexpr std::int32_t kPad = 0, kBos = 1, kEos = 2, kFirstWord = 4;
constexpr int kBatches = 8;  // cycled, as in torch_ref.py

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double process_cpu_ms() {  // CPU time of all threads: robust where the wall clock is shared with other jobs
    struct timespec ts {};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * double(ts.tv_sec) + 1e-6 * double(ts.tv_nsec);
}

double peak_rss_mb() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::int64_t enc_layers(const BenchTrainOptions& o) { return o.enc_layers >= 0 ? o.enc_layers : o.layers; }
std::int64_t dec_layers(const BenchTrainOptions& o) { return o.dec_layers >= 0 ? o.dec_layers : o.layers; }

// One random batch of torch_ref.py: src (B, S), dec_in (B, T), labels (B, T), row-major.
struct RandomBatch {
    std::vector<std::int32_t> src, dec_in, labels;
    std::int64_t src_nonpad = 0, tgt_nonpad = 0;
};

// torch_ref.py's make_batch. Each row has a length drawn uniformly from [max(1, ceil(frac·L)), L] and
// words uniform in [4, V); positions past the length are padding. The target side is
//   tgt (T + 1) = BOS, w_1 .. w_{len-1}, EOS, PAD ...     (EOS at index len)
//   dec_in = tgt[0 .. T),  labels = tgt[1 .. T].
RandomBatch make_batch(Rng& rng, std::int64_t B, std::int64_t S, std::int64_t T, std::int64_t V, double frac) {
    auto lengths = [&](std::int64_t L) {
        const std::int64_t lo = std::max<std::int64_t>(1, std::int64_t(std::ceil(frac * double(L))));
        std::vector<std::int64_t> len(B);
        for (auto& l : len) l = lo + std::int64_t(rng.below(std::uint64_t(L - lo + 1)));
        return len;
    };
    auto word = [&]() { return std::int32_t(kFirstWord + std::int64_t(rng.below(std::uint64_t(V - kFirstWord)))); };
    RandomBatch b;
    const std::vector<std::int64_t> src_len = lengths(S);
    b.src.assign(B * S, kPad);
    for (std::int64_t i = 0; i < B; ++i)
        for (std::int64_t s = 0; s < src_len[i]; ++s) b.src[i * S + s] = word();
    const std::vector<std::int64_t> tgt_len = lengths(T);
    b.dec_in.assign(B * T, kPad);
    b.labels.assign(B * T, kPad);
    std::vector<std::int32_t> tgt(T + 1);  // one row of tgt
    for (std::int64_t i = 0; i < B; ++i) {
        std::fill(tgt.begin(), tgt.end(), kPad);
        tgt[0] = kBos;
        for (std::int64_t t = 1; t < tgt_len[i]; ++t) tgt[t] = word();
        tgt[tgt_len[i]] = kEos;
        std::copy(tgt.begin(), tgt.end() - 1, b.dec_in.begin() + i * T);
        std::copy(tgt.begin() + 1, tgt.end(), b.labels.begin() + i * T);
    }
    for (std::int32_t id : b.src) b.src_nonpad += id != kPad;
    for (std::int32_t id : b.labels) b.tgt_nonpad += id != kPad;
    return b;
}

ModelConfig model_config(const BenchTrainOptions& o) {
    ModelConfig c;
    c.src_vocab = c.tgt_vocab = o.vocab;
    c.arch = o.decoder_only ? Architecture::DecoderOnly : Architecture::EncoderDecoder;  // decoder-only: src unread
    c.d_model = o.d_model;
    c.heads = o.heads;
    try {
        c.set_head_counts(o.head_counts);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("bench train: --head-counts: ") + e.what());
    }
    c.ffn = o.ffn;
    c.enc_layers = enc_layers(o);
    c.dec_layers = dec_layers(o);
    c.dropout = c.attention_dropout = c.activation_dropout = o.dropout;  // nn.Transformer*Layer: one p
    c.norm = NormPosition::Post;
    c.activation = Activation::ReLU;
    c.tie = o.tie_embeddings ? Tying::All : Tying::None;
    c.positional = PositionalKind::Sinusoidal;
    c.output_bias = true;  // torch_ref.py's output layer is an nn.Linear(d_model, V), bias included
    c.max_len = std::max(o.src_len, o.tgt_len) + 8;
    c.pad_id = kPad;
    c.bos_id = kBos;
    c.eos_id = kEos;
    return c;
}

// What the benchmark trains: the model, Adam and the Noam schedule of torch_ref.py, its kBatches random
// batches and the dropout stream, with the number of steps taken so far.
struct BenchRun {
    explicit BenchRun(const BenchTrainOptions& o)
        : options(o), model(model_config(o), o.seed), adam(model.parameters(), AdamOptions{0.9, 0.98, 1e-9, 0}),
          dropout_rng(o.seed ^ 0xD50F7ULL) {
        schedule.kind = ScheduleKind::Noam;
        schedule.lr = 1.0;
        schedule.warmup = o.warmup_steps;
        schedule.d_model = o.d_model;
        Rng batch_rng(o.seed ^ 0xBA7C4ULL);
        for (int i = 0; i < kBatches; ++i)
            batches.push_back(make_batch(batch_rng, o.batch, o.src_len, o.tgt_len, o.vocab, o.min_len_frac));
    }

    const BenchTrainOptions& options;
    Transformer model;
    Adam adam;
    Schedule schedule;
    std::vector<RandomBatch> batches;
    Rng dropout_rng;
    std::int64_t steps_taken = 0;
};

// Time by op: backward through backward()'s per-record hook, forward through the tape's push hook. Each
// record is charged the time since the previous one (or since the pass began), which in backward includes
// freeing what the previous record held: the profiled pass frees memory exactly as an unprofiled one does.
// With `products`, the part of each charge spent in products is summed apart, by op.
struct OpTimer {
    std::map<std::string, double> ms_by_op;           // backward, summed over the profiled steps
    std::map<std::string, double> product_ms_by_op;   // of which in products
    std::map<std::string, double> forward_ms_by_op;   // forward, by the record each op appends
    std::map<std::string, double> forward_product_ms_by_op;
    Clock::time_point last;
    const ProductTimer* products = nullptr;
    double last_product_ms = 0;

    void start() {
        last = Clock::now();
        last_product_ms = products ? products->ms : 0;
    }

    // Charges the time since the previous call to `r`'s op in `ms` and `product_ms`.
    void charge(const TapeRecord& r, std::map<std::string, double>& ms, std::map<std::string, double>& product_ms) {
        const Clock::time_point now = Clock::now();
        ms[r.op] += std::chrono::duration<double, std::milli>(now - last).count();
        last = now;
        if (!products) return;
        product_ms[r.op] += products->ms - last_product_ms;
        last_product_ms = products->ms;
    }
    RecordHook hook() {
        return [this](const TapeRecord& r) { charge(r, ms_by_op, product_ms_by_op); };
    }
    std::function<void(const TapeRecord&)> push_hook() {
        return [this](const TapeRecord& r) { charge(r, forward_ms_by_op, forward_product_ms_by_op); };
    }
};

// One training step, as torch_ref.py's train_step: the library's (train_step.h), which train runs, with
// lr from the schedule. Adds the phase times ("fwd": forward and loss, "bwd", "clip", "optim": the Adam
// step and zero_grad) to `phase_ms` and the time by op to `ops` when they are given. Returns the loss.
double train_step(BenchRun& run, const RandomBatch& b, std::map<std::string, double>* phase_ms, OpTimer* ops) {
    const BenchTrainOptions& o = run.options;
    StepSettings settings;
    settings.step = ++run.steps_taken;
    settings.lr = run.schedule.lr_at(settings.step);
    settings.label_smoothing = o.label_smoothing;
    settings.clip = o.clip;  // torch_ref.py's clip_grad_norm_, as the factor in Adam's pass: the same update
    settings.fuse_attention = !o.composed_attention;  // as train does, unless asked
    settings.let_values_go = !o.keep_values;
    StepHooks hooks;
    Clock::time_point t0;
    if (phase_ms || ops)
        hooks.phase_begins = [&](StepPhase p) {
            t0 = Clock::now();
            if (ops && (p == StepPhase::forward || p == StepPhase::backward)) ops->start();
        };
    if (phase_ms) hooks.phase_ends = [&](StepPhase p) { (*phase_ms)[to_string(p)] += ms_since(t0); };
    if (ops) hooks.backward_record = ops->hook();
    const StepResult r = tf::train_step(StepParts{run.model, run.adam, nullptr, &run.dropout_rng},
                                        StepBatch{b.src, b.dec_in, b.labels, o.batch, o.src_len, o.tgt_len}, settings, hooks);
    return r.loss.loss;
}

// The model's size and the work of one step, as torch_ref.py computes them.
void describe(BenchRun& run, BenchTrainResult& res, std::ostream* log) {
    const BenchTrainOptions& o = run.options;
    res.rss_after_model_mb = peak_rss_mb();  // before the counting pass below
    const ForwardFlops fl = forward_flops(run.model, o.batch, o.src_len, o.tgt_len);
    res.options = o;
    res.threads = num_threads();
    res.precision = precision();  // what runs: fp32 where bf16 was asked for on a CPU without it
    res.reference = reference_mode();
    res.params = run.model.parameter_count();
    res.fwd_gflop_per_step = fl.total / 1e9;
    res.train_gflop_per_step = 3 * fl.total / 1e9;
    if (!log) return;
    std::string parts;  // "encoder 0.011, decoder 0.016, generator 0.004"
    for (const auto& [stack, flops] : fl.by_stack) parts += (parts.empty() ? "" : ", ") + stack + " " + fmt("%.3f", flops / 1e9);
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "tapeformer, threads %d; precision %s; BLAS %s; small products %s%s\nmodel: d=%lld h=%lld%s ffn=%lld layers=%s V=%lld params=%lld; "
                  "batch %lldx(src %lld, tgt %lld); fwd GFLOP/step %.3f (%s); train ~3x = %.3f\n",
                  res.threads, precision_name(precision()), blas_info(), small_products_info().c_str(),
                  res.reference ? "; reference ops (three-loop products, no fused kernels)" : "", (long long)o.d_model,
                  (long long)o.heads, o.head_counts.empty() ? "" : (" (per layer " + o.head_counts + ")").c_str(), (long long)o.ffn,
                  (o.decoder_only ? "decoder-only " + std::to_string(dec_layers(o))
                                  : std::to_string(enc_layers(o)) + "+" + std::to_string(dec_layers(o))).c_str(),
                  (long long)o.vocab, (long long)res.params,
                  (long long)o.batch, (long long)o.src_len, (long long)o.tgt_len, fl.total / 1e9, parts.c_str(), 3 * fl.total / 1e9);
    *log << buf << std::flush;
}

// bench_warmup untimed steps, then `steps` timed ones (cycling the batches from the first): time per step,
// tokens per second, phases, CPU time, first and last loss.
void time_training(BenchRun& run, BenchTrainResult& res, std::ostream* log) {
    const BenchTrainOptions& o = run.options;
    const std::int64_t B = o.batch, S = o.src_len, T = o.tgt_len;
    for (std::int64_t i = 0; i < o.bench_warmup; ++i) train_step(run, run.batches[i % kBatches], nullptr, nullptr);
    std::vector<double> seconds;
    std::map<std::string, double> phase{{"fwd", 0}, {"bwd", 0}, {"clip", 0}, {"optim", 0}};
    std::int64_t nonpad_src = 0, nonpad_tgt = 0;
    const double cpu0 = process_cpu_ms();
    for (std::int64_t i = 0; i < o.steps; ++i) {
        const RandomBatch& b = run.batches[i % kBatches];
        const auto t0 = Clock::now();
        const double loss = train_step(run, b, &phase, nullptr);
        seconds.push_back(ms_since(t0) / 1000.0);
        if (i == 0) res.loss_first = loss;
        res.loss_last = loss;
        nonpad_tgt += b.tgt_nonpad;
        nonpad_src += b.src_nonpad;
    }
    res.cpu_ms_per_step = (process_cpu_ms() - cpu0) / double(o.steps);
    double total = 0;
    for (double t : seconds) total += t;
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double steps = double(o.steps);
    res.steps = o.steps;
    res.ms_per_step = 1000 * total / steps;
    res.ms_per_step_median = 1000 * sorted[sorted.size() / 2];
    res.ms_per_step_min = 1000 * sorted.front();
    res.tgt_tokens_per_s = double(B * T) * steps / total;
    res.src_tgt_tokens_per_s = double(B * (S + T)) * steps / total;
    res.tgt_nonpad_tokens_per_s = double(nonpad_tgt) / total;
    res.src_tgt_nonpad_tokens_per_s = double(nonpad_src + nonpad_tgt) / total;
    res.achieved_gflop_s = res.train_gflop_per_step / (total / steps);
    for (auto& [k, v] : phase) res.phase_ms[k] = v / steps;
    if (!log) return;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "train: %.1f ms/step (median %.1f, min %.1f); %.0f tgt tok/s, %.0f src+tgt tok/s; %.1f GFLOP/s; "
                  "phases ms: fwd %.1f, bwd %.1f, clip %.1f, optim %.1f; loss %.3f -> %.3f; CPU %.1f ms/step\n",
                  res.ms_per_step, res.ms_per_step_median, res.ms_per_step_min, res.tgt_tokens_per_s,
                  res.src_tgt_tokens_per_s, res.achieved_gflop_s, res.phase_ms["fwd"], res.phase_ms["bwd"],
                  res.phase_ms["clip"], res.phase_ms["optim"], res.loss_first, res.loss_last, res.cpu_ms_per_step);
    *log << buf << std::flush;
}

// torch_ref.py's greedy timing: the first batch's sources decoded for exactly T steps, no early stop;
// one untimed run, then eval_reps timed ones.
void time_greedy(BenchRun& run, BenchTrainResult& res, std::ostream* log) {
    const BenchTrainOptions& o = run.options;
    const std::int64_t B = o.batch, S = o.src_len, T = o.tgt_len;
    DecodeOptions dopt;
    dopt.beam = 1;
    dopt.force_steps = int(T);
    const RandomBatch& b = run.batches[0];
    const FrozenWeights frozen(run.model);          // the weights packed once, as translate does
    translate_batch(run.model, b.src, B, S, dopt);  // untimed
    std::vector<double> seconds;
    for (std::int64_t r = 0; r < o.eval_reps; ++r) {
        const auto t0 = Clock::now();
        translate_batch(run.model, b.src, B, S, dopt);
        seconds.push_back(ms_since(t0) / 1000.0);
    }
    double total = 0;
    for (double t : seconds) total += t;
    const double mean = total / double(seconds.size()), best = *std::min_element(seconds.begin(), seconds.end());
    res.has_greedy = true;
    res.greedy_ms_per_batch = 1000 * mean;
    res.greedy_ms_per_batch_best = 1000 * best;
    res.greedy_tokens_per_s = double(B * T) / mean;
    res.greedy_tokens_per_s_best = double(B * T) / best;
    if (!log) return;
    char buf[256];
    std::snprintf(buf, sizeof buf, "greedy: batch %lld, %lld steps: %.1f ms/batch (best %.1f); %.0f tok/s\n",
                  (long long)B, (long long)T, res.greedy_ms_per_batch, res.greedy_ms_per_batch_best,
                  res.greedy_tokens_per_s);
    *log << buf << std::flush;
}

// Beam search over the same batch, each sentence up to T tokens (no forced steps: beam stops where its
// rule says); one untimed run, then eval_reps timed ones. Tokens/s counts the tokens generated, EOS included.
void time_beam(BenchRun& run, BenchTrainResult& res, std::ostream* log) {
    const BenchTrainOptions& o = run.options;
    const std::int64_t B = o.batch, S = o.src_len, T = o.tgt_len;
    DecodeOptions dopt;
    dopt.beam = o.eval_beam;
    dopt.max_len_ratio = 0;
    dopt.max_len_offset = int(T);  // L(n) = T for every sentence
    const RandomBatch& b = run.batches[0];
    const FrozenWeights frozen(run.model);
    std::int64_t tokens = 0;
    for (const Translation& t : translate_batch_scored(run.model, b.src, B, S, dopt))  // untimed
        tokens += std::int64_t(t.tokens.size()) + (t.ended ? 1 : 0);
    const auto t0 = Clock::now();
    for (std::int64_t r = 0; r < o.eval_reps; ++r) translate_batch_scored(run.model, b.src, B, S, dopt);
    const double mean = ms_since(t0) / 1000.0 / double(o.eval_reps);
    res.has_beam = true;
    res.beam_ms_per_batch = 1000 * mean;
    res.beam_tokens_per_s = double(tokens) / mean;
    if (!log) return;
    char buf[256];
    std::snprintf(buf, sizeof buf, "beam %d: batch %lld, %lld tokens: %.1f ms/batch; %.0f tok/s\n", o.eval_beam,
                  (long long)B, (long long)tokens, res.beam_ms_per_batch, res.beam_tokens_per_s);
    *log << buf << std::flush;
}

// Prints one pass's ops, slowest first: ms per step, share of the pass, and the part in products.
void print_ops(std::ostream& log, const char* pass, const std::map<std::string, double>& ms_by_op,
               const std::map<std::string, double>& product_ms_by_op, std::int64_t steps) {
    double sum = 0;
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [op, ms] : ms_by_op) {
        rows.push_back({ms / double(steps), op});
        sum += ms / double(steps);
    }
    std::sort(rows.rbegin(), rows.rend());
    char buf[256];
    for (auto& [ms, op] : rows) {
        auto p = product_ms_by_op.find(op);
        const double product_ms = p == product_ms_by_op.end() ? 0 : p->second / double(steps);
        std::snprintf(buf, sizeof buf, "  %s %-24s %8.2f ms %5.1f%%   products %6.2f, the rest %6.2f\n", pass,
                      op.c_str(), ms, 100 * ms / std::max(sum, 1e-12), product_ms, ms - product_ms);
        log << buf;
    }
}

// `profile` more training steps with both passes timed op by op (each op charged the time since the
// previous op's record, forward or backward) and the products' wall time summed apart (ProductTimer); the
// log gets the tables, slowest first.
void profile_steps(BenchRun& run, BenchTrainResult& res, std::ostream* log) {
    const std::int64_t n = run.options.profile;
    std::map<std::string, double> phase;
    ProductTimer products;
    OpTimer ops;
    ops.products = &products;
    struct PushHook {  // on for the profiled steps only, whatever they throw
        explicit PushHook(OpTimer& ops) { tape().set_push_hook(ops.push_hook()); }
        ~PushHook() { tape().set_push_hook({}); }
    } push_hook(ops);
    for (std::int64_t i = 0; i < n; ++i) train_step(run, run.batches[i % kBatches], &phase, &ops);
    res.profile_step_ms = (phase["fwd"] + phase["bwd"] + phase["clip"] + phase["optim"]) / double(n);
    res.profile_products_ms = products.ms / double(n);
    res.profile_rounding_ms = products.rounding_ms / double(n);
    for (auto& [op, ms] : ops.ms_by_op) res.backward_ms_by_op[op] = ms / double(n);
    for (auto& [op, ms] : ops.forward_ms_by_op) res.forward_ms_by_op[op] = ms / double(n);
    if (!log) return;
    char buf[256];
    std::snprintf(buf, sizeof buf, "profile over %lld steps (ms/step): fwd %.1f, bwd %.1f (per op below), clip %.1f, optim %.1f\n",
                  (long long)n, phase["fwd"] / double(n), phase["bwd"] / double(n), phase["clip"] / double(n),
                  phase["optim"] / double(n));
    *log << buf;
    std::snprintf(buf, sizeof buf, "  products (%lld a step) %.1f ms of the step's %.1f (%.1f%%); the rest %.1f ms\n",
                  (long long)(products.calls / n), res.profile_products_ms, res.profile_step_ms,
                  100 * res.profile_products_ms / std::max(res.profile_step_ms, 1e-12),
                  res.profile_step_ms - res.profile_products_ms);
    *log << buf;
    if (products.rounding_ms > 0) {  // bf16: what converting the operands costs the products
        std::snprintf(buf, sizeof buf, "  of the products' time, %.1f ms rounding their operands to bf16 (before the tiles that read them)\n",
                      res.profile_rounding_ms);
        *log << buf;
    }
    print_ops(*log, "forward ", ops.forward_ms_by_op, ops.forward_product_ms_by_op, n);
    print_ops(*log, "backward", ops.ms_by_op, ops.product_ms_by_op, n);
    *log << std::flush;
}

}  // namespace

void BenchTrainOptions::validate() const {
    auto positive = [](const char* flag, std::int64_t v) {
        if (v <= 0) throw std::invalid_argument(std::string("bench train: ") + flag + " must be positive, got " + std::to_string(v));
    };
    positive("--d-model", d_model);
    positive("--heads", heads);
    positive("--ffn", ffn);
    positive("--batch", batch);
    positive("--src-len", src_len);
    positive("--tgt-len", tgt_len);
    positive("--eval-reps", eval_reps);
    // Bounded as train's --batch-tokens is: a typo of a few digits must not ask for terabytes.
    constexpr std::int64_t kMaxBatchTokens = 100000000;
    if (batch > kMaxBatchTokens / std::max(src_len, tgt_len))
        throw std::invalid_argument("bench train: --batch " + std::to_string(batch) + " of " + std::to_string(std::max(src_len, tgt_len)) +
                                    " tokens (--src-len / --tgt-len) exceeds " + std::to_string(kMaxBatchTokens) + " tokens per batch");
    if (vocab <= kFirstWord)
        throw std::invalid_argument("bench train: --vocab must exceed " + std::to_string(kFirstWord) +
                                    " (ids below it are special), got " + std::to_string(vocab));
    if (!(min_len_frac >= 0 && min_len_frac <= 1))
        throw std::invalid_argument("bench train: --min-len-frac must be in [0, 1], got " + std::to_string(min_len_frac));
    if (steps < 0 || bench_warmup < 0 || profile < 0 || warmup_steps < 0)
        throw std::invalid_argument("bench train: --steps, --bench-warmup, --warmup-steps and --profile must not be negative");
    if (!(label_smoothing >= 0 && label_smoothing <= 1))
        throw std::invalid_argument("bench train: --label-smoothing must be in [0, 1], got " + std::to_string(label_smoothing));
    if (precision == Precision::INT8 && !eval_greedy)
        throw std::invalid_argument("bench train --precision int8: int8 is for decoding, which --eval-greedy times "
                                    "(training's products stay fp32); add --eval-greedy");
    if (eval_beam < 0 || (eval_beam > 0 && !eval_greedy))
        throw std::invalid_argument("bench train: --eval-beam K (K >= 1) times beam search beside --eval-greedy; add --eval-greedy");
    if (decoder_only && eval_greedy)
        throw std::invalid_argument("bench train: --eval-greedy times translation, which a decoder-only model does not do");
    model_config(*this).validate();  // layers, heads dividing d_model, dropout range
}

double ForwardFlops::of(const std::string& stack) const {
    for (const auto& [name, flops] : by_stack)
        if (name == stack) return flops;
    return 0;
}

ForwardFlops forward_flops(Transformer& model, std::int64_t B, std::int64_t S, std::int64_t T) {
    ForwardFlops fl;
    for (const SummaryRow& r : summarize(model, B, S, T).rows) {
        if (r.depth != 1 || r.mult_adds == 0) continue;
        if (fl.by_stack.empty() || fl.by_stack.back().first != r.stack) fl.by_stack.push_back({r.stack, 0});
        fl.by_stack.back().second += 2.0 * double(r.mult_adds);
        fl.total += 2.0 * double(r.mult_adds);
    }
    return fl;
}

BenchTrainResult bench_train(const BenchTrainOptions& o, std::ostream* log) {
    o.validate();
    if (reference_mode() && o.precision == Precision::BF16)
        throw std::invalid_argument("bench train --precision bf16: reference mode multiplies in fp32 with three loops; "
                                    "give one of the two");
    const std::string note = set_precision(o.precision);  // for the whole benchmark; fp32 again at the end
    struct RestoreFp32 {
        ~RestoreFp32() { set_precision(Precision::FP32); }
    } restore;
    if (log && !note.empty()) *log << note << "\n";
    BenchRun run(o);
    BenchTrainResult res;
    describe(run, res, log);
    if (o.steps > 0) time_training(run, res, log);
    if (o.eval_greedy) time_greedy(run, res, log);
    if (o.eval_greedy && o.eval_beam > 0) time_beam(run, res, log);
    if (o.profile > 0) profile_steps(run, res, log);
    res.peak_rss_mb = peak_rss_mb();
    res.pool_peak_mb = double(pool_stats().peak_bytes_in_use) / (1024.0 * 1024.0);
    return res;
}

std::string BenchTrainResult::to_json() const {
    const BenchTrainOptions& o = options;
    const nlohmann::json config = {
        {"d_model", o.d_model},           {"heads", o.heads},     {"head_counts", o.head_counts}, {"ffn", o.ffn},
        {"enc_layers", enc_layers(o)},    {"dec_layers", dec_layers(o)}, {"vocab", o.vocab},
        {"batch", o.batch},               {"src_len", o.src_len}, {"tgt_len", o.tgt_len},
        {"min_len_frac", o.min_len_frac}, {"dropout", o.dropout}, {"tie_embeddings", o.tie_embeddings},
        {"composed_attention", o.composed_attention}, {"keep_values", o.keep_values},
        {"arch", o.decoder_only ? "decoder-only" : "encoder-decoder"}};
    nlohmann::json j = {{"name", o.name},
                        {"impl", "tapeformer"},
                        {"threads", threads},
                        {"precision", precision_name(precision)},
                        {"reference", reference},
                        {"blas", blas_info()},
                        {"small_products", small_products_info()},
                        {"config", config},
                        {"params", params},
                        {"fwd_gflop_per_step", fwd_gflop_per_step},
                        {"train_gflop_per_step", train_gflop_per_step}};
    if (steps > 0) {
        j["steps"] = steps;
        j["ms_per_step"] = ms_per_step;
        j["ms_per_step_median"] = ms_per_step_median;
        j["ms_per_step_min"] = ms_per_step_min;
        j["tgt_tokens_per_s"] = tgt_tokens_per_s;
        j["src_tgt_tokens_per_s"] = src_tgt_tokens_per_s;
        j["tgt_nonpad_tokens_per_s"] = tgt_nonpad_tokens_per_s;
        j["src_tgt_nonpad_tokens_per_s"] = src_tgt_nonpad_tokens_per_s;
        j["achieved_gflop_s"] = achieved_gflop_s;
        j["phase_ms"] = phase_ms;
        j["cpu_ms_per_step"] = cpu_ms_per_step;
        j["loss_first"] = loss_first;
        j["loss_last"] = loss_last;
    }
    if (has_beam) {
        j["beam"] = options.eval_beam;
        j["beam_ms_per_batch"] = beam_ms_per_batch;
        j["beam_tokens_per_s"] = beam_tokens_per_s;
    }
    if (has_greedy) {
        j["greedy_ms_per_batch"] = greedy_ms_per_batch;
        j["greedy_ms_per_batch_best"] = greedy_ms_per_batch_best;
        j["greedy_tokens_per_s"] = greedy_tokens_per_s;
        j["greedy_tokens_per_s_best"] = greedy_tokens_per_s_best;
        j["greedy_note"] = "key/value cache: one new position per step; fixed T steps, no early stop";
    }
    if (!backward_ms_by_op.empty()) {
        j["profile_backward_ms_by_op"] = backward_ms_by_op;
        j["profile_forward_ms_by_op"] = forward_ms_by_op;
        j["profile_step_ms"] = profile_step_ms;
        j["profile_products_ms"] = profile_products_ms;
        j["profile_rounding_ms"] = profile_rounding_ms;
    }
    j["peak_rss_mb"] = peak_rss_mb;
    j["pool_peak_mb"] = pool_peak_mb;
    j["rss_after_model_mb"] = rss_after_model_mb;
    return j.dump();
}

TF_NAMESPACE_END
