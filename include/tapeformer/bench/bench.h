// Training-throughput benchmark: the library side of `tapeformer bench train`.
//
// It trains the model of ../shared/bench/torch_ref.py (post-norm encoder–decoder, ReLU FFN, dropout,
// sinusoidal positions, label-smoothed loss, Adam (0.9, 0.98, 1e-9), Noam schedule, gradient clipping)
// on random batches built the same way, times a number of steps, and reports the figures that
// torch_ref.py reports, under the same JSON keys, so that compare.sh can put the two side by side.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// The flags of torch_ref.py, with its defaults. The thread count is not among them: bench_train uses the
// current setting (set_threads), which the CLI defaults to every core where torch_ref.py defaults to 1,
// so pass the same --threads to both when comparing.
struct BenchTrainOptions {
    std::int64_t d_model = 256;      // C
    std::int64_t heads = 4;          // H
    std::string head_counts;         // heads per layer, as a pruned model stores them ("E:2,2,2;D:4,4,4;A:1,2,2"),
                                     // "" = H in every attention: the speed of a model with heads removed
    std::int64_t ffn = 1024;         // F
    std::int64_t layers = 3;         // encoder layers = decoder layers, unless set below
    std::int64_t enc_layers = -1;    // -1: = layers
    std::int64_t dec_layers = -1;    // -1: = layers
    std::int64_t vocab = 8000;       // V, shared by source and target
    std::int64_t batch = 64;         // B sentences per batch
    std::int64_t src_len = 20;       // S, padded source length
    std::int64_t tgt_len = 20;       // T, decoder positions (BOS + words, labels shifted by one)
    double min_len_frac = 0.75;      // lengths uniform in [ceil(frac·L), L]; 1 = no padding
    double dropout = 0.1;            // embeddings, sublayer outputs, attention weights, FFN inside
    double label_smoothing = 0.1;
    std::int64_t warmup_steps = 4000;  // Noam schedule warmup (not the benchmark's untimed steps)
    std::int64_t steps = 20;         // timed training steps (0: skip training)
    std::int64_t bench_warmup = 3;   // untimed steps before timing
    double clip = 1.0;               // gradient-norm clipping; <= 0: none
    bool tie_embeddings = false;     // one table for source, target and output projection
    bool decoder_only = false;       // --arch decoder-only: the decoder alone on the target side (bench/torch_decoder_only.py)
    std::uint64_t seed = 0;          // model initialisation and batches
    bool composed_attention = false; // attention as the composed ops instead of ops.h's attention_heads (to compare)
    bool keep_values = false;        // keep the values train lets go until backward (StepSettings::let_values_go off, to compare)
    bool eval_greedy = false;        // also time greedy decoding of the first batch for exactly T steps
    std::int64_t eval_reps = 3;      // timed greedy repetitions (after one untimed)
    int eval_beam = 0;               // with eval_greedy: also time beam search with this many beams, up to T tokens (0: no)
    std::string name;                // copied into the result
    std::int64_t profile = 0;        // > 0: after timing, N more steps with per-op timers (both passes)
    Precision precision = Precision::FP32;  // of the products (blas.h); bf16 falls back to fp32 without bf16 instructions

    // Throws std::invalid_argument naming the flag when a value is out of range.
    void validate() const;
};

class Transformer;

// Matmul FLOPs (2·MAC) of one forward pass of `model` on a full padded batch of B sentences of S source and
// T target positions: twice the multiply-adds that summarize() (summary.h) counts on the model's own
// forward, in total and by the model's parts as its module walk names them ("encoder", "decoder", and
// "generator", the output projection: torch_ref.py's flops_forward calls it "out_proj").
struct ForwardFlops {
    double total = 0;
    std::vector<std::pair<std::string, double>> by_stack;  // the parts that compute, in the order data reaches them
    double of(const std::string& stack) const;              // 0 for a part that computes nothing
};
ForwardFlops forward_flops(Transformer& model, std::int64_t B, std::int64_t S, std::int64_t T);

struct BenchTrainResult {
    BenchTrainOptions options;       // what was run (options.name is copied into the JSON line)
    int threads = 0;
    Precision precision = Precision::FP32;  // of the products, as run
    bool reference = false;          // reference mode (reference_ops.h) was on
    std::int64_t params = 0;         // distinct parameter values
    double fwd_gflop_per_step = 0, train_gflop_per_step = 0;
    // Training (when steps > 0).
    std::int64_t steps = 0;
    double ms_per_step = 0, ms_per_step_median = 0, ms_per_step_min = 0;
    double tgt_tokens_per_s = 0;          // B·T per second, padding included
    double src_tgt_tokens_per_s = 0;      // B·(S + T) per second
    double tgt_nonpad_tokens_per_s = 0;   // non-pad labels per second
    double src_tgt_nonpad_tokens_per_s = 0;
    double achieved_gflop_s = 0;          // train_gflop_per_step / seconds per step
    std::map<std::string, double> phase_ms;  // fwd (forward + loss), bwd, clip, optim: ms per step
    double cpu_ms_per_step = 0;           // process CPU time (all threads) per timed step: steadier on a busy machine
    double loss_first = 0, loss_last = 0;
    // Greedy decoding (when eval_greedy).
    bool has_greedy = false;
    double greedy_ms_per_batch = 0, greedy_ms_per_batch_best = 0;
    double greedy_tokens_per_s = 0, greedy_tokens_per_s_best = 0;
    // Beam search (when eval_beam > 0): the same batch, up to T tokens a sentence, eval_reps timed runs;
    // tokens are those generated (EOS included), which depend on where the beams stop.
    bool has_beam = false;
    double beam_ms_per_batch = 0, beam_tokens_per_s = 0;
    // Per-op backward time (when profile > 0): op name -> ms per step.
    std::map<std::string, double> backward_ms_by_op;
    std::map<std::string, double> forward_ms_by_op;  // the same for the forward pass (each op charged at its record)
    double profile_step_ms = 0;      // a profiled step: its four phases
    double profile_products_ms = 0;  // of which in products (blas.h's ProductTimer), wall time
    double profile_rounding_ms = 0;  // of that, rounding the products' operands to bf16 (0 in fp32)
    double peak_rss_mb = 0;          // getrusage's ru_maxrss at the end
    double pool_peak_mb = 0;         // most tensor memory in use at once (pool.h), parameters included
    double rss_after_model_mb = 0;   // ru_maxrss once the model, optimizer and batches exist

    // One line of JSON with torch_ref.py's keys where they are meaningful; the model and batch settings
    // under "config", as torch_ref.py names them.
    std::string to_json() const;
};

// Builds the model and 8 random batches, runs bench_warmup + steps training steps (cycling the batches),
// then the greedy timing and the profile if asked. Human-readable progress goes to `log` (nullable).
// Uses the current thread setting (see set_threads).
BenchTrainResult bench_train(const BenchTrainOptions& options, std::ostream* log = nullptr);

TF_NAMESPACE_END
