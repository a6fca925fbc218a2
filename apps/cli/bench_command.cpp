// `tapeformer bench train`: the flags of ../shared/bench/torch_ref.py, filled into BenchTrainOptions; the
// library runs the benchmark (src/bench/bench.cpp). Prints human-readable lines, then one JSON line.
#include <iostream>
#include <memory>

#include "tapeformer/bench/attention_bench.h"
#include "tapeformer/bench/bench.h"
#include "tapeformer/blas.h"
#include "cli/commands.h"

TF_NAMESPACE_BEGIN

void add_bench_command(CLI::App& app) {
    CLI::App* bench = app.add_subcommand("bench", "Benchmarks (compare with ../shared/bench/torch_ref.py)");
    bench->require_subcommand(1);

    auto o = std::make_shared<BenchTrainOptions>();
    auto threads = std::make_shared<int>(0);
    auto precision = std::make_shared<std::string>("fp32");
    auto bf16 = std::make_shared<bool>(false);
    CLI::App* train = bench->add_subcommand(
        "train",
        "Time training steps of torch_ref.py's model on random batches; the last line of output is JSON with\n"
        "torch_ref.py's keys (tgt_tokens_per_s, ms_per_step, peak_rss_mb, ...).");
    train->add_option("--d-model", o->d_model, "Model width C")->capture_default_str();
    train->add_option("--heads", o->heads, "Attention heads H")->capture_default_str();
    train->add_option("--head-counts", o->head_counts,
                      "Heads per layer of a model with heads removed, as heads prune --save stores them, e.g.\n"
                      "'E:2,2,2;D:4,4,4;A:1,2,2' (head width stays d-model / heads): the speed of a pruned model");
    train->add_option("--ffn", o->ffn, "FFN inner width F")->capture_default_str();
    train->add_option("--layers", o->layers, "Encoder layers = decoder layers (unless overridden)")->capture_default_str();
    train->add_option("--enc-layers", o->enc_layers, "Encoder layers (default: --layers)");
    train->add_option("--dec-layers", o->dec_layers, "Decoder layers (default: --layers)");
    train->add_option("--vocab", o->vocab, "Shared vocabulary size V")->capture_default_str();
    train->add_option("--batch", o->batch, "Sentences per batch")->capture_default_str();
    train->add_option("--src-len", o->src_len, "Padded source length S")->capture_default_str();
    train->add_option("--tgt-len", o->tgt_len, "Decoder positions T (input BOS + words, labels shifted)")->capture_default_str();
    train->add_option("--min-len-frac", o->min_len_frac, "Lengths uniform in [ceil(frac*len), len]; 1.0 = no padding")
        ->capture_default_str();
    train->add_option("--dropout", o->dropout, "Dropout probability everywhere")->capture_default_str();
    train->add_option("--label-smoothing", o->label_smoothing, "Label smoothing of the loss")->capture_default_str();
    train->add_option("--warmup-steps", o->warmup_steps, "Noam schedule warmup (not benchmark warm-up)")->capture_default_str();
    train->add_option("--steps", o->steps, "Timed training steps (0 = skip training)")->capture_default_str();
    train->add_option("--bench-warmup", o->bench_warmup, "Untimed steps before timing")->capture_default_str();
    train->add_option("--threads", *threads, "Threads for OpenMP and OpenBLAS (same as the global --threads; 0: keep it)");
    train->add_option("--clip", o->clip, "Gradient-norm clipping (<= 0: none)")->capture_default_str();
    auto arch = std::make_shared<std::string>("encoder-decoder");
    train->add_option("--arch", *arch,
                      "encoder-decoder (torch_ref.py) or decoder-only (bench/torch_decoder_only.py: the decoder alone, "
                      "no cross-attention, on the tgt-len side; --src-len and --enc-layers unused)")
        ->check(CLI::IsMember({"encoder-decoder", "decoder-only"}))
        ->capture_default_str();
    train->add_flag("--tie-embeddings", o->tie_embeddings, "Share source, target embeddings and output projection");
    train->add_option("--seed", o->seed, "Seed of the model and the batches")->capture_default_str();
    train->add_flag("--composed-attention", o->composed_attention,
                    "Run attention as the composed ops a tape shows (slice_heads, matmul, softmax, dropout, permute) "
                    "instead of the fused attention_heads that train uses: the same numbers, to compare the speed");
    train->add_flag("--keep-values", o->keep_values,
                    "Keep every value backward reads from the forward to the backward, where train lets the layer "
                    "norms' inputs and outputs go and computes them again in backward: the same numbers, to compare "
                    "the memory and the speed");
    train->add_flag("--eval-greedy", o->eval_greedy, "Also time greedy decoding of one batch for exactly tgt-len steps");
    train->add_option("--eval-reps", o->eval_reps, "Timed greedy repetitions")->capture_default_str();
    train->add_option("--eval-beam", o->eval_beam,
                      "With --eval-greedy: also time beam search with K beams on the same batch, each sentence up to\n"
                      "tgt-len tokens (stopping where beam's rule says; tokens/s counts those generated)")
        ->capture_default_str();
    train->add_option("--name", o->name, "Label copied into the JSON line");
    train->add_option("--profile", o->profile, "After timing, N steps with per-op timers for both passes and the time in matrix products, and in bf16 the part of it spent rounding their operands (printed)")
        ->capture_default_str();
    add_precision_option(*train, *precision);
    train->add_flag("--bf16", *bf16, "Same as --precision bf16 (torch_ref.py's flag, so that compare.sh can pass it to both)");
    train->callback([o, threads, precision, bf16, arch]() {
        o->decoder_only = *arch == "decoder-only";
        if (*threads > 0) apply_threads(*threads, "--threads");  // after the global --threads (parse_complete_callback)
        o->precision = *bf16 ? Precision::BF16 : parse_precision(*precision);
        const BenchTrainResult result = bench_train(*o, &std::cout);
        std::cout << result.to_json() << std::endl;
    });

    auto a = std::make_shared<BenchAttentionOptions>();
    auto kind = std::make_shared<std::string>("dot");
    auto encoder = std::make_shared<bool>(false);
    CLI::App* attention = bench->add_subcommand(
        "attention",
        "Time one self-attention's forward + backward on random input and count the tensor memory it needs,\n"
        "against sequence length (docs/lesson-efficient-attention.md).");
    attention->add_option("--kind", *kind, "dot, linear or local (additive works too)")
        ->check(CLI::IsMember({"dot", "additive", "linear", "local"}))
        ->capture_default_str();
    attention->add_option("--length", a->length, "Sequence length T")->capture_default_str();
    attention->add_option("--batch", a->batch, "Sequences B")->capture_default_str();
    attention->add_option("--d-model", a->d_model, "Model width C")->capture_default_str();
    attention->add_option("--heads", a->heads, "Heads H")->capture_default_str();
    attention->add_option("--window", a->window, "Local attention's window W")->capture_default_str();
    attention->add_flag("--encoder", *encoder, "Encoder self-attention (no mask) instead of the decoder's causal one");
    attention->add_option("--reps", a->reps, "Timed passes (after one untimed); the median is printed")->capture_default_str();
    attention->add_option("--seed", a->seed, "Seed of the weights and the input")->capture_default_str();
    attention->callback([a, kind, encoder]() {
        a->kind = parse_attention_score(*kind);
        a->causal = !*encoder;
        std::cout << bench_attention(*a).to_text() << std::endl;
    });
}

TF_NAMESPACE_END
