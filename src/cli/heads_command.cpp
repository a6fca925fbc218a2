// `tapeformer heads`: per-head importance, gradient norms and attention statistics of a model over sentence
// pairs (heads.h), written to OUT/heads.json and OUT/heads.csv and printed as layers × heads tables.
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "tapeformer/checkpoint.h"
#include "tapeformer/cli/commands.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/data/text.h"
#include "tapeformer/decode.h"
#include "tapeformer/heads.h"
#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

namespace {

struct HeadsCommandOptions {
    std::string model_dir, src, tgt, out_dir, mask, granularity = "token", loss = "nll";
    bool raw = false;
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
        "resampling (sacreBLEU's --paired-bs), with the count of significant changes.\n"
        "Example: tapeformer heads ablate --model runs/toy --src data/toy/valid.src --ref data/toy/valid.tgt");
    cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train`")->required();
    cmd->add_option("--src", opt->src, "Source sentences, one per line")->required();
    cmd->add_option("--ref", opt->ref, "Reference translations, aligned by line")->required();
    cmd->add_option("--samples", opt->samples, "Bootstrap resamples")->check(CLI::Range(1, 100000))->capture_default_str();
    cmd->add_option("--alpha", opt->alpha, "Significance level")->check(CLI::Range(1e-6, 0.5))->capture_default_str();
    cmd->add_option("--seed", opt->seed, "Seed of the resampling")->capture_default_str();
    cmd->add_option("--json", opt->json, "Also write the results to this JSON file");
    add_decode_options(*cmd, opt->decode, opt->batch_tokens);
    cmd->callback([opt]() {
        if (!opt->json.empty()) check_output_path(opt->json, "--json");
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

}  // namespace

void add_heads_command(CLI::App& app) {
    auto opt = std::make_shared<HeadsCommandOptions>();
    CLI::App* cmd = app.add_subcommand(
        "heads",
        "Study every attention head on sentence pairs (dropout off, batches in file order): importance as Michel\n"
        "et al. (2019) define it, gradient norms of each head's slices of W_q, W_k, W_v, W_o, and attention\n"
        "statistics (entropy, confidence, share on EOS/BOS, distance, positional offset). Heads are named\n"
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
    cmd->add_option("--mask-heads", opt->mask, "Heads whose gate is 0 during the study, e.g. E:0:1,A:2:3");
    add_ablate_command(cmd);
    cmd->callback([opt, cmd]() {
        if (!cmd->get_subcommands().empty()) return;  // `heads ablate` ran
        for (const auto& [flag, value] : {std::pair{"--model", &opt->model_dir}, {"--src", &opt->src}, {"--tgt", &opt->tgt},
                                          {"--out", &opt->out_dir}})
            if (value->empty()) throw std::runtime_error(std::string("heads: ") + flag + " is required (see tapeformer heads --help)");
        if (std::filesystem::exists(opt->out_dir) && !std::filesystem::is_directory(opt->out_dir))
            throw std::runtime_error("--out '" + opt->out_dir + "' is a file; expected a directory (it is created if missing)");
        ModelBundle bundle = load_model_dir(opt->model_dir);
        Transformer& model = *bundle.model;
        if (!opt->mask.empty()) mask_heads(model, parse_head_list(opt->mask, model.config));
        const ParallelText text = read_parallel(opt->src, opt->tgt);
        const EncodedCorpus corpus = encode_parallel(text, bundle.tokenizers, std::int32_t(model.config.max_len - 1));
        if (corpus.examples.empty())
            throw std::runtime_error("--src '" + opt->src + "' and --tgt '" + opt->tgt + "': no pair to study (" +
                                     corpus.stats.summary() + ")");
        if (corpus.stats.too_long > 0 || corpus.stats.empty_skipped > 0)
            std::cerr << "tapeformer: note: " << corpus.stats.summary() << "; pairs longer than the model's "
                      << model.config.max_len - 1 << " tokens are left out\n";
        opt->study.granularity = parse_granularity(opt->granularity);
        opt->study.smoothed = opt->loss == "smoothed";
        opt->study.normalise = !opt->raw;
        const HeadReport report = study_heads(model, corpus.examples, opt->study);
        std::filesystem::create_directories(opt->out_dir);
        write_file_atomic((std::filesystem::path(opt->out_dir) / "heads.json").string(), heads_json(report));
        write_file_atomic((std::filesystem::path(opt->out_dir) / "heads.csv").string(), heads_csv(report));
        std::cout << report.pairs << " pairs, " << report.src_tokens << " source and " << report.tgt_tokens
                  << " target tokens, " << report.batches << " batches; loss (" << opt->loss << ", summed) "
                  << report.loss << "\n\n"
                  << heads_tables(report) << "wrote " << opt->out_dir << "/heads.json and heads.csv\n";
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
