// `tapeformer heads`: per-head importance, gradient norms and attention statistics of a model over sentence
// pairs (heads.h), written to OUT/heads.json and OUT/heads.csv and printed as layers × heads tables.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "cli/commands.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/data/text.h"
#include "tapeformer/decode.h"
#include "tapeformer/study/ablation.h"
#include "tapeformer/study/head_formats.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/study/prune.h"
#include "tapeformer/study/heads_l0.h"
#include "tapeformer/study/heads_similarity.h"
#include "tapeformer/io.h"
#include "tapeformer/number_text.h"

TF_NAMESPACE_BEGIN

namespace {

struct HeadsCommandOptions {
    std::string model_dir, src, tgt, out_dir, mask, granularity = "token", loss = "nll";
    bool raw = false, per_sentence = false;
    HeadStudyOptions study;
};

struct AblateOptions {
    std::string model_dir, src, ref, mask, json;
    DecodeOptions decode;
    std::int64_t batch_tokens = 4096;
    int samples = 1000;
    double alpha = 0.05;
    std::uint64_t seed = 12345;
};

void add_ablate_command(CLI::App* heads) {
    auto opt = std::make_shared<AblateOptions>();
    CLI::App* cmd = heads->add_subcommand(
        "ablate",
        "Translation quality with heads masked (Michel et al. 2019): BLEU with each single head masked, and with\n"
        "all heads of a layer but one masked, each tested against the unmasked model by paired bootstrap\n"
        "resampling (sacreBLEU's --paired-bs), with the count of significant changes uncorrected and after the\n"
        "Holm and Benjamini-Hochberg corrections over all the tests made; each ΔBLEU and ΔNLL (the references'\n"
        "teacher-forced NLL per token) with its percentile bootstrap interval at 1 − alpha.\n"
        "Example: tapeformer heads ablate --model runs/toy --src data/toy/valid.src --ref data/toy/valid.tgt");
    cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train`")->required();
    cmd->add_option("--src", opt->src, "Source sentences, one per line")->required();
    cmd->add_option("--ref", opt->ref, "Reference translations, aligned by line")->required();
    cmd->add_option("--samples", opt->samples, "Bootstrap resamples")->check(CLI::Range(1, 100000))->capture_default_str();
    cmd->add_option("--alpha", opt->alpha, "Significance level (the intervals are at confidence 1 − alpha)")->check(CLI::Range(1e-6, 0.5))->capture_default_str();
    cmd->add_option("--seed", opt->seed, "Seed of the resampling")->capture_default_str();
    cmd->add_option("--json", opt->json, "Also write the results to this JSON file");
    add_decode_options(*cmd, opt->decode, opt->batch_tokens);
    cmd->callback([opt]() {
        if (!opt->json.empty()) check_output_path(opt->json, "--json", {opt->src, opt->ref, opt->model_dir});
        const std::vector<std::string> src = read_lines(opt->src), ref = read_lines(opt->ref);
        ModelBundle bundle = load_model_dir(opt->model_dir);
        const auto bar = terminal_progress("ablations");
        const AblationReport report =
            ablate_heads(*bundle.model, bundle.tokenizers, src, ref, opt->decode, opt->batch_tokens, opt->samples,
                         opt->alpha, opt->seed, [&](int done, int total) { if (bar) bar(done, total); });
        std::cout << ablation_table(report);
        if (!opt->json.empty()) write_file_atomic(opt->json, ablation_json(report));
        command_exit_code() = 0;
    });
}

struct PruneCommandOptions {
    std::vector<std::string> models;
    std::string method = "mask", src, ref, imp_src, imp_tgt, order = "importance", step = "10%", kinds, granularity = "token", json;
    std::string save_dir, save_at;  // --save DIR (--save-at FRACTION: "" = the curve's last point)
    bool force = false;
    PruneOptions prune;
    L0Options l0;
};

// --save: checked before any work (one model, an output directory that replaces nothing of the user's).
void check_save(const PruneCommandOptions& opt) {
    if (opt.save_dir.empty()) {
        if (!opt.save_at.empty()) throw std::runtime_error("heads prune: --save-at picks the point --save writes; give --save DIR");
        return;
    }
    if (opt.models.size() != 1)
        throw std::runtime_error("heads prune: --save writes one pruned model; give one --model (got " + std::to_string(opt.models.size()) + ")");
    check_model_out_dir(opt.save_dir, "--save", "pruned model", opt.force,
                        {opt.models[0], opt.src, opt.ref, opt.imp_src, opt.imp_tgt, opt.json});
}

// --save: the model with the heads masked now (gate 0) removed and the other gates folded into W_o
// (prune.h remove_heads), written with the tokenizer and DIR/pruning.json; then its NLL on the evaluation
// pairs beside the masked model's, which it must equal to rounding.
void save_pruned(ModelBundle& bundle, const PruneCommandOptions& opt, PruneRecord record, const std::vector<std::string>& src,
                 const std::vector<std::string>& ref) {
    namespace fs = std::filesystem;
    Transformer& model = *bundle.model;
    record.removed = masked_heads(model);
    const HeadRemoval removal = remove_heads(model, record.removed);
    ParallelText pairs;
    std::tie(pairs.source, pairs.target) = scorable_pairs(src, ref, "heads prune --save");
    const EncodedCorpus encoded = encode_parallel(pairs, bundle.tokenizers, std::int32_t(model.config.max_len - 1));
    record.nll_masked = teacher_forced_loss(model, encoded.examples, opt.prune.batch_tokens, 0.0).nll;
    record.nll_removed = teacher_forced_loss(*removal.model, encoded.examples, opt.prune.batch_tokens, 0.0).nll;
    record.parameters_before = model.parameter_count();
    record.parameters_after = removal.model->parameter_count();
    StudyProvenance made_from = study_provenance(bundle, opt.models[0]);
    made_from.data = {opt.src, opt.ref};
    made_from.pairs_read = std::int64_t(src.size());
    made_from.pairs_used = std::int64_t(encoded.examples.size());
    fs::create_directories(opt.save_dir);
    bundle.tokenizers.save(opt.save_dir);
    save_model_weights((fs::path(opt.save_dir) / "model.safetensors").string(), *removal.model, tokenizer_hash(bundle.tokenizers));
    write_file_atomic((fs::path(opt.save_dir) / "pruning.json").string(), pruning_json(made_from, record, removal));
    std::printf("saved %s: %zu heads removed (%s), parameters %lld -> %lld; NLL on the evaluation pairs %.6f, masked %.6f\n",
                opt.save_dir.c_str(), record.removed.size(),
                removal.model->config.heads_removed() ? removal.model->config.head_counts_text().c_str() : "none",
                (long long)record.parameters_before, (long long)record.parameters_after, record.nll_removed, record.nll_masked);
    for (const HeadId& h : removal.zeroed)
        std::printf("  %s: every head of its attention was masked; it keeps head 0 with W_o's columns zero (output = W_o's bias)\n",
                    h.str().c_str());
}

// heads prune --method l0: one fine-tuning run per model, its gates as tables, and the JSON of all runs.
void run_l0(const PruneCommandOptions& opt) {
    L0Options o = opt.l0;
    o.decode = opt.prune.decode;
    o.batch_tokens = opt.prune.batch_tokens;
    o.seed = opt.prune.seed;
    if (!opt.kinds.empty()) o.kinds = parse_head_kinds(opt.kinds);
    if (!opt.json.empty()) {
        std::vector<std::string> inputs = opt.models;
        inputs.insert(inputs.end(), {opt.src, opt.ref, opt.imp_src, opt.imp_tgt});
        check_output_path(opt.json, "--json", inputs);
    }
    check_save(opt);
    if (opt.imp_src.empty() || opt.imp_tgt.empty())
        throw std::runtime_error("heads prune: --method l0 needs --imp-src and --imp-tgt (the pairs the gates are fine-tuned on)");
    const std::vector<std::string> src = read_lines(opt.src), ref = read_lines(opt.ref);
    const std::vector<std::string> train_src = read_lines(opt.imp_src), train_tgt = read_lines(opt.imp_tgt);
    nlohmann::json runs = nlohmann::json::array();
    for (const std::string& dir : opt.models) {
        ModelBundle bundle = load_model_dir(dir);
        std::cout << "model " << dir << ": L0 gates (Hard-Concrete, temperature " << o.temperature << "), lambda " << o.lambda
                  << ", " << o.steps << " steps\n";
        std::printf("  %6s %9s %14s %7s\n", "step", "NLL", "E[open heads]", "closed");
        const L0Report report = l0_prune_heads(*bundle.model, bundle.tokenizers, train_src, train_tgt, src, ref, o,
                                               [](const L0Progress& p) {
                                                   std::printf("  %6d %9.4f %14.2f %7d\n", p.step, p.nll, p.expected_open, p.closed);
                                                   std::fflush(stdout);
                                               });
        std::cout << "\n" << l0_table(report) << "\n";
        if (!opt.save_dir.empty()) {
            PruneRecord record;
            record.method = "l0";
            record.fraction = report.heads.empty() ? 0 : double(report.closed) / double(report.heads.size());
            record.bleu = report.bleu_after;
            save_pruned(bundle, opt, record, src, ref);
        }
        nlohmann::json j = nlohmann::json::parse(l0_json(report));
        j["model"] = dir;
        runs.push_back(j);
    }
    if (!opt.json.empty()) write_file_atomic(opt.json, nlohmann::json({{"method", "l0"}, {"models", runs}}).dump(1) + "\n");
}

// "10%" or "0.1" -> 0.1
double parse_fraction(const std::string& text, const char* flag) {
    const bool percent = !text.empty() && text.back() == '%';
    double v = -1;
    if (read_real(percent ? text.substr(0, text.size() - 1) : text, v) != NumberRead::ok)
        throw std::runtime_error(std::string(flag) + ": expected a fraction such as 0.1 or 10%, got '" + text + "'");
    return percent ? v / 100 : v;
}

void add_prune_command(CLI::App* heads) {
    auto opt = std::make_shared<PruneCommandOptions>();
    CLI::App* cmd = heads->add_subcommand(
        "prune",
        "Mask heads in steps from the least to the most important and score BLEU and NLL on the evaluation pairs\n"
        "after each step (a pruning curve, as Michel et al. 2019). Importance is measured on --imp-src/--imp-tgt,\n"
        "pairs separate from the evaluation ones. Several --model give one curve each.\n"
        "With --method l0 (Voita et al. 2019) the heads are not ranked: each gets a Hard-Concrete gate (temperature\n"
        "0.33, stretch (-0.1, 1.1)) and the model is fine-tuned on --imp-src/--imp-tgt with the loss\n"
        "NLL + lambda * sum_h P(gate h open); the heads whose gate ends at 0 are closed.\n"
        "Example: tapeformer heads prune --model runs/toy --src data/toy/test.src --ref data/toy/test.tgt\n"
        "         --imp-src data/toy/valid.src --imp-tgt data/toy/valid.tgt --step 10%\n"
        "         tapeformer heads prune --method l0 --lambda 0.05 --model runs/toy --src data/toy/test.src\n"
        "         --ref data/toy/test.tgt --imp-src data/toy/valid.src --imp-tgt data/toy/valid.tgt");
    cmd->add_option("--model", opt->models, "Model directories (one curve each)")->required();
    cmd->add_option("--src", opt->src, "Evaluation source sentences")->required();
    cmd->add_option("--ref", opt->ref, "Evaluation references, aligned by line")->required();
    cmd->add_option("--imp-src", opt->imp_src, "Source sentences the heads are ranked on (not needed with --order random);\nwith --method l0, the pairs the gates are fine-tuned on");
    cmd->add_option("--imp-tgt", opt->imp_tgt, "Their references, aligned by line");
    cmd->add_option("--order", opt->order, "importance (Michel et al.), ablation (BLEU lost masking the head alone),\n"
                                           "entropy (most diffuse first) or random")
        ->check(CLI::IsMember({"importance", "ablation", "entropy", "random"}))
        ->capture_default_str();
    cmd->add_option("--step", opt->step, "Fraction of the heads masked per step (0.1 or 10%)")->capture_default_str();
    cmd->add_option("--kinds", opt->kinds, "Prune (l0: gate) only these kinds, e.g. E,A (default: E, D and A ranked jointly)");
    cmd->add_flag("--recompute", opt->prune.recompute, "Rank again after every step, with the masked heads masked");
    cmd->add_flag("--keep-one-per-layer", opt->prune.keep_one_per_layer, "Never mask the last head of an attention");
    cmd->add_option("--stop-below", opt->prune.stop_below, "Stop once BLEU falls below this fraction of the unpruned BLEU")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--seed", opt->prune.seed, "Seed of --order random (l0: of the batch order, dropout and the gates' noise)")->capture_default_str();
    cmd->add_option("--granularity", opt->granularity, "Importance granularity: token, sentence or batch")
        ->check(CLI::IsMember({"token", "sentence", "batch"}))
        ->capture_default_str();
    cmd->add_option("--json", opt->json, "Also write the curves (or, with --method l0, the gates) to this JSON file");
    cmd->add_option("--save", opt->save_dir,
                    "Write the pruned model to this directory with the pruned heads removed (smaller and faster; every\n"
                    "command loads it, `train --init-from` fine-tunes it): the heads masked at --save-at, or with\n"
                    "--method l0 those its gates closed; with the tokenizer and pruning.json (what it was made from)");
    cmd->add_option("--save-at", opt->save_at, "The curve's point --save writes: the last at or below this fraction pruned (default: the last)");
    cmd->add_flag("--force", opt->force, "Let --save replace a model an earlier heads prune --save wrote there");
    cmd->add_option("--method", opt->method,
                    "mask: mask heads in --order, step by step (a pruning curve); l0: fine-tune on --imp-src/--imp-tgt\n"
                    "with a Hard-Concrete gate per head and an L0 penalty (Voita et al. 2019), then report which\n"
                    "heads closed and the BLEU/NLL of the pruned model")
        ->check(CLI::IsMember({"mask", "l0"}))
        ->capture_default_str();
    std::vector<CLI::Option*> l0_flags = {
        cmd->add_option("--lambda", opt->l0.lambda, "l0: weight of the expected number of open heads in the loss")
            ->check(CLI::Range(0.0, 1e6))
            ->capture_default_str(),
        cmd->add_option("--l0-steps", opt->l0.steps, "l0: fine-tuning updates")->check(CLI::Range(1, 100000000))->capture_default_str(),
        cmd->add_option("--lr", opt->l0.lr, "l0: Adam learning rate of the model's weights (0: only the gates learn)")
            ->check(CLI::Range(0.0, 1.0))
            ->capture_default_str(),
        cmd->add_option("--gate-lr", opt->l0.gate_lr, "l0: Adam learning rate of the gates' log alpha")
            ->check(number_above(0, true))
            ->capture_default_str(),
        cmd->add_option("--temperature", opt->l0.temperature, "l0: temperature beta of the Hard-Concrete gates")
            ->check(number_above(0, true))
            ->capture_default_str(),
        cmd->add_option("--init-log-alpha", opt->l0.init_log_alpha, "l0: every gate's log alpha at the start (3: open)")
            ->capture_default_str(),
        cmd->add_option("--log-every", opt->l0.log_every, "l0: print progress every N steps")
            ->check(CLI::Range(1, 100000000))
            ->capture_default_str()};
    std::vector<CLI::Option*> mask_flags = {cmd->get_option("--order"), cmd->get_option("--step"), cmd->get_option("--recompute"),
                                            cmd->get_option("--keep-one-per-layer"), cmd->get_option("--stop-below"),
                                            cmd->get_option("--granularity"), cmd->get_option("--save-at")};
    add_decode_options(*cmd, opt->prune.decode, opt->prune.batch_tokens);
    cmd->callback([opt, l0_flags, mask_flags]() {
        for (CLI::Option* flag : opt->method == "l0" ? mask_flags : l0_flags)
            if (flag->count() > 0)
                throw std::runtime_error("heads prune: " + flag->get_name() + " does not apply to --method " + opt->method);
        if (opt->method == "l0") {
            run_l0(*opt);
            command_exit_code() = 0;
            return;
        }
        PruneOptions p = opt->prune;
        p.order = parse_prune_order(opt->order);
        p.step = parse_fraction(opt->step, "--step");
        if (!(p.step > 0 && p.step <= 1)) throw std::runtime_error("--step: must be in (0, 100%], got '" + opt->step + "'");
        p.study.granularity = parse_granularity(opt->granularity);
        if (!opt->kinds.empty()) p.kinds = parse_head_kinds(opt->kinds);
        p.study.batch_tokens = p.batch_tokens;
        if (!opt->json.empty()) {
            std::vector<std::string> inputs = opt->models;
            inputs.insert(inputs.end(), {opt->src, opt->ref, opt->imp_src, opt->imp_tgt});
            check_output_path(opt->json, "--json", inputs);
        }
        check_save(*opt);
        double save_at = 1;
        if (!opt->save_at.empty()) {
            save_at = parse_fraction(opt->save_at, "--save-at");
            if (!(save_at >= 0 && save_at <= 1)) throw std::runtime_error("--save-at: must be in [0, 100%], got '" + opt->save_at + "'");
        }
        if (p.order != PruneOrder::random && (opt->imp_src.empty() || opt->imp_tgt.empty()))
            throw std::runtime_error("heads prune: --order " + opt->order + " needs --imp-src and --imp-tgt (pairs to rank the heads on)");
        const std::vector<std::string> src = read_lines(opt->src), ref = read_lines(opt->ref);
        std::vector<std::string> imp_src, imp_tgt;
        if (!opt->imp_src.empty()) imp_src = read_lines(opt->imp_src);
        if (!opt->imp_tgt.empty()) imp_tgt = read_lines(opt->imp_tgt);
        nlohmann::json curves = nlohmann::json::array();
        for (const std::string& dir : opt->models) {
            ModelBundle bundle = load_model_dir(dir);
            Transformer& model = *bundle.model;
            std::cout << "model " << dir << ": order " << to_string(p.order) << ", step " << p.step * 100 << "%"
                      << (p.recompute ? ", recomputed after each step" : "") << "\n";
            std::printf("  %8s %7s %8s %8s   %s\n", "pruned", "heads", "BLEU", "NLL", "masked in this step");
            std::size_t shown = 0;
            const auto curve = prune_heads(model, bundle.tokenizers, src, ref, imp_src, imp_tgt, p,
                                           [&](const PrunePoint& point) {
                                               std::string added;
                                               for (std::size_t i = shown; i < point.masked.size(); ++i)
                                                   added += (added.empty() ? "" : ",") + point.masked[i].str();
                                               shown = point.masked.size();
                                               std::printf("  %7.1f%% %7zu %8.2f %8.4f   %s\n", 100 * point.fraction,
                                                           point.masked.size(), point.bleu, point.nll, added.c_str());
                                               std::fflush(stdout);
                                           });
            nlohmann::json points = nlohmann::json::array();
            for (const PrunePoint& point : curve) {
                nlohmann::json masked = nlohmann::json::array();
                for (const HeadId& h : point.masked) masked.push_back(h.str());
                points.push_back({{"fraction", point.fraction}, {"bleu", point.bleu}, {"nll", point.nll}, {"masked", masked}});
            }
            curves.push_back({{"model", dir}, {"curve", points}});
            if (!opt->save_dir.empty()) {  // the last point at or below --save-at (default: the curve's last)
                const PrunePoint* chosen = &curve.front();
                for (const PrunePoint& point : curve)
                    if (point.fraction <= save_at + 1e-9) chosen = &point;
                mask_heads(model, chosen->masked);
                PruneRecord record;
                record.method = "mask (order " + opt->order + ")";
                record.fraction = chosen->fraction;
                record.bleu = chosen->bleu;
                save_pruned(bundle, *opt, record, src, ref);
            }
        }
        if (!opt->json.empty()) {
            const nlohmann::json j = {{"order", opt->order}, {"step", p.step}, {"recompute", p.recompute},
                                      {"keep_one_per_layer", p.keep_one_per_layer}, {"stop_below", p.stop_below},
                                      {"granularity", opt->granularity}, {"models", curves}};
            write_file_atomic(opt->json, j.dump(1) + "\n");
        }
        command_exit_code() = 0;
    });
}

struct SimilarityCommandOptions {
    std::vector<std::string> models;
    std::string src, tgt, json;
    std::int64_t max_pairs = 500;
    SimilarityOptions similarity;
};

void add_similarity_command(CLI::App* heads) {
    auto opt = std::make_shared<SimilarityCommandOptions>();
    CLI::App* cmd = heads->add_subcommand(
        "similarity",
        "Do heads specialise? Per attention (kind and layer) and per model: how alike its heads are in their\n"
        "attention maps (Jensen-Shannon divergence over a sample of pairs), in the gradients that reach them\n"
        "(correlation of the per-token gate gradients), in their query/key/value/output subspaces (overlap\n"
        "||U_i^T U_j||_F^2 / D, chance level D/C), and in W_QK = W_q^T W_k and W_OV = W_o W_v (Frobenius cosine).\n"
        "With several --model (same shape, e.g. checkpoints kept by --keep-every), also each model against the first.\n"
        "Example: tapeformer heads similarity --model runs/toy --src data/toy/valid.src --tgt data/toy/valid.tgt");
    cmd->add_option("--model", opt->models, "Model directories (or kept checkpoints, DIR/checkpoints/step-N.safetensors); from the\nsecond on, each is also compared with the first")
        ->required();
    cmd->add_option("--src", opt->src, "Source sentences of the sample, one per line")->required();
    cmd->add_option("--tgt", opt->tgt, "Their target sentences (references), aligned by line")->required();
    cmd->add_option("--max-pairs", opt->max_pairs, "Measure on the first N pairs of the files (0: all)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--batch-tokens", opt->similarity.batch_tokens, "Padded tokens per batch: sentences x max(S, T)")
        ->check(number_above(1, false))
        ->capture_default_str();
    cmd->add_option("--json", opt->json, "Also write every head-by-head matrix to this JSON file");
    cmd->callback([opt]() {
        if (!opt->json.empty()) {
            std::vector<std::string> inputs = opt->models;
            inputs.insert(inputs.end(), {opt->src, opt->tgt});
            check_output_path(opt->json, "--json", inputs);
        }
        ParallelText text = read_parallel(opt->src, opt->tgt);
        if (opt->max_pairs > 0 && std::int64_t(text.source.size()) > opt->max_pairs) {
            text.source.resize(std::size_t(opt->max_pairs));
            text.target.resize(std::size_t(opt->max_pairs));
        }
        std::vector<ModelBundle> bundles;
        std::vector<Transformer*> models;
        std::vector<std::vector<Example>> examples;
        for (const std::string& dir : opt->models) {
            bundles.push_back(load_model_dir(dir));
            Transformer& model = *bundles.back().model;
            const EncodedCorpus corpus = encode_parallel(text, bundles.back().tokenizers, std::int32_t(model.config.max_len - 1));
            if (corpus.examples.empty())
                throw std::runtime_error("--src '" + opt->src + "' and --tgt '" + opt->tgt + "': no pair to measure " + dir +
                                         " on (" + corpus.stats.summary() + ")");
            models.push_back(&model);
            examples.push_back(corpus.examples);
        }
        const SimilarityReport report = head_similarity(models, opt->models, examples, opt->similarity);
        std::cout << similarity_tables(report);
        if (!opt->json.empty()) write_file_atomic(opt->json, similarity_json(report));
        command_exit_code() = 0;
    });
}

}  // namespace

void add_heads_command(CLI::App& app) {
    auto opt = std::make_shared<HeadsCommandOptions>();
    CLI::App* cmd = app.add_subcommand(
        "heads",
        "Study every attention head on sentence pairs (dropout off, batches in file order): importance as Michel\n"
        "et al. (2019) define it, gradient norms of each head's slices of W_q, W_k, W_v, W_o, and attention\n"
        "statistics (entropy, confidence, share on EOS/BOS, on punctuation and on each sentence's rarest tokens,\n"
        "attention by relative offset, distance, positional offset). Heads are named\n"
        "KIND:layer:head, 0-based: E encoder self-attention, D decoder self-attention, A cross-attention.\n"
        "Writes OUT/heads.json and OUT/heads.csv and prints a layers x heads table per kind.\n"
        "Example: tapeformer heads --model runs/toy --src data/toy/valid.src --tgt data/toy/valid.tgt --out runs/toy/heads");
    // Not ->required(): `heads ablate` has flags of its own; the callback checks these when they are needed.
    cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train` (required)");
    cmd->add_option("--src", opt->src, "Source sentences, one per line (required)");
    cmd->add_option("--tgt", opt->tgt, "Target sentences (references), aligned by line (required)");
    cmd->add_option("--out", opt->out_dir, "Directory for heads.json and heads.csv, created if needed (required)");
    cmd->add_option("--batch-tokens", opt->study.batch_tokens, "Padded tokens per batch: sentences x max(S, T)")
        ->check(number_above(1, false))
        ->capture_default_str();
    cmd->add_option("--granularity", opt->granularity,
                    "Where the absolute value is taken: token (Michel et al.: per query position), sentence (one\n"
                    "gate per sentence, Hugging Face's head_mask) or batch (one gate per batch)")
        ->check(CLI::IsMember({"token", "sentence", "batch"}))
        ->capture_default_str();
    cmd->add_option("--loss", opt->loss, "nll (token-summed, no smoothing) or smoothed (label-smoothed, --label-smoothing)")
        ->check(CLI::IsMember({"nll", "smoothed"}))
        ->capture_default_str();
    cmd->add_option("--label-smoothing", opt->study.label_smoothing, "Epsilon of --loss smoothed")
        ->check(CLI::Range(0.0, 0.99))
        ->capture_default_str();
    cmd->add_flag("--raw", opt->raw, "Raw importances (default: divided by their L2 norm over each layer's heads)");
    cmd->add_flag("--per-sentence", opt->per_sentence,
                  "Also write OUT/heads_per_sentence.jsonl: a line per pair, in file order (with its line number and\n"
                  "tokens), with each head's gate gradient at every query token and its token, sentence and signed\n"
                  "importance for that pair alone (raw, whatever --granularity and --raw say)");
    cmd->add_option("--rare-outside-top", opt->study.rare_outside_top,
                    "Rare-token statistics only over sentences whose rarest token is not among this many most\n"
                    "frequent token types of the studied file (Voita et al. 2019 used 500 of a 60k-type corpus); 0: all")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    add_mask_heads_option(*cmd, opt->mask);
    add_ablate_command(cmd);
    add_prune_command(cmd);
    add_similarity_command(cmd);
    cmd->callback([opt, cmd]() {
        if (!cmd->get_subcommands().empty()) return;  // `heads ablate`, `prune` or `similarity` ran
        for (const auto& [flag, value] : {std::pair{"--model", &opt->model_dir}, {"--src", &opt->src}, {"--out", &opt->out_dir}})
            if (value->empty()) throw std::runtime_error(std::string("heads: ") + flag + " is required (see tapeformer heads --help)");
        if (std::filesystem::exists(opt->out_dir) && !std::filesystem::is_directory(opt->out_dir))
            throw std::runtime_error("--out '" + opt->out_dir + "' is a file; expected a directory (it is created if missing)");
        if (std::filesystem::is_directory(opt->out_dir))
            for (const char* name : {"heads.json", "heads.csv", "heads_per_sentence.jsonl"})
                check_output_path((std::filesystem::path(opt->out_dir) / name).string(), "--out", {opt->model_dir, opt->src, opt->tgt});
        ModelBundle bundle = load_model_dir(opt->model_dir);
        Transformer& model = *bundle.model;
        // A decoder-only model reads one text (--src), BOS + tokens, as in training: its heads are D heads only.
        const bool lm = model.config.decoder_only();
        if (opt->tgt.empty() && !lm) throw std::runtime_error("heads: --tgt is required (see tapeformer heads --help)");
        if (!opt->tgt.empty() && lm)
            throw std::runtime_error("heads: " + opt->model_dir + " is a decoder-only model, which reads one text: give it as --src, "
                                     "without --tgt");
        apply_mask_heads(model, opt->mask);
        const ParallelText text = read_parallel(opt->src, lm ? opt->src : opt->tgt);
        EncodedCorpus corpus;
        try {
            corpus = study_pairs(model, bundle.tokenizers, text);
        } catch (const std::invalid_argument& e) {
            throw std::runtime_error("--src '" + opt->src + "' and --tgt '" + opt->tgt + "': " + e.what());
        }
        if (corpus.stats.too_long > 0 || corpus.stats.empty_skipped > 0)
            std::cerr << "tapeformer: note: " << corpus.stats.summary() << "; pairs longer than the model's "
                      << model.config.max_len - 1 << " tokens are left out\n";
        opt->study.granularity = parse_granularity(opt->granularity);
        opt->study.smoothed = opt->loss == "smoothed";
        opt->study.normalise = !opt->raw;
        opt->study.punctuation = punctuation_ids(bundle.tokenizers);
        // heads_per_sentence.jsonl is written as the batches are done (it can be large), committed at the end.
        const std::string per_sentence_path = (std::filesystem::path(opt->out_dir) / "heads_per_sentence.jsonl").string();
        std::unique_ptr<AtomicFile> per_sentence;
        if (opt->per_sentence)
            opt->study.per_sentence = [&](const SentenceHeads& s) {
                if (!per_sentence) {
                    std::filesystem::create_directories(opt->out_dir);
                    per_sentence = std::make_unique<AtomicFile>(per_sentence_path);
                }
                per_sentence->write(sentence_heads_json_line(s, bundle.tokenizers, model.config));
            };
        const HeadReport report = study_heads(model, corpus.examples, opt->study);
        StudyProvenance made_from = study_provenance(bundle, opt->model_dir);
        made_from.data = {opt->src, opt->tgt};
        made_from.pairs_read = corpus.stats.pairs_read;
        made_from.pairs_used = std::int64_t(corpus.examples.size());
        std::filesystem::create_directories(opt->out_dir);
        write_file_atomic((std::filesystem::path(opt->out_dir) / "heads.json").string(), heads_json(report, made_from));
        write_file_atomic((std::filesystem::path(opt->out_dir) / "heads.csv").string(), heads_csv(report));
        if (per_sentence) per_sentence->commit();
        std::cout << report.pairs << " pairs, " << report.src_tokens << " source and " << report.tgt_tokens
                  << " target tokens, " << report.batches << " batches; loss (" << opt->loss << ", summed) "
                  << report.loss << "\n\n"
                  << heads_tables(report) << "wrote " << opt->out_dir << "/heads.json"
                  << (per_sentence ? ", heads.csv and heads_per_sentence.jsonl\n" : " and heads.csv\n");
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
