// `tapeformer report`: the training report of a model directory as one self-contained HTML file.
// The callback only fills ReportOptions and calls tf::training_report_html (src/teach/report.cpp).
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "tapeformer/io.h"
#include "tapeformer/teach/report.h"

TF_NAMESPACE_BEGIN

void add_report_command(CLI::App& app) {
    auto opt = std::make_shared<ReportOptions>();
    auto dir = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "report",
        "Write one self-contained HTML page about a training run (inline SVG and CSS; it loads nothing, so it\n"
        "opens offline): loss, perplexity and learning rate against step, validation BLEU, the learning-rate\n"
        "schedule, per-layer gradient norms, head importance and attention entropy over training (with\n"
        "--log-heads-every), the pruning curve (from `heads prune --json`), attention maps of a few validation\n"
        "sentences, the positional encoding, the padding and causal masks and the label-smoothed target.\n"
        "Sections without data say what is missing.\n"
        "Example: tapeformer report --model runs/toy --out runs/toy/report.html");
    cmd->add_option("--model", *dir, "A model directory written by `tapeformer train`")->required();
    cmd->add_option("--out", *out, "The HTML file to write (default: DIR/report.html)");
    cmd->add_option("--prune", opt->prune_json, "The pruning curve: a `heads prune --json` file (default: DIR/prune.json when present)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--src", opt->src, "Source sentences for the attention maps and the mask pictures, one per line\n"
                                       "(default: the run's --valid-src, when that path can be read from here)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--tgt", opt->tgt, "Their references, aligned by line: maps are teacher-forced with them (default: the run's\n"
                                       "--valid-tgt with its --valid-src; without any, the target is decoded greedily)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--sentences", opt->sentences, "How many sentences get attention maps")
        ->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--head-snapshots", opt->head_snapshots, "How many logged steps of heads.jsonl are drawn (evenly spaced)")
        ->check(number_above(1, false))->capture_default_str();
    cmd->callback([opt, dir, out, cmd]() {
        if (!opt->tgt.empty() && opt->src.empty()) throw std::runtime_error("report: --tgt needs --src (the sentences it belongs to)");
        if (!std::filesystem::is_directory(*dir)) throw std::runtime_error("report: --model '" + *dir + "' is not a directory");
        const std::string path = out->empty() ? (std::filesystem::path(*dir) / "report.html").string() : *out;
        const std::string prune = opt->prune_json.empty() ? (std::filesystem::path(*dir) / "prune.json").string() : opt->prune_json;
        check_output_path(path, "--out", {*dir, prune, opt->src, opt->tgt});
        std::vector<std::string> problems;
        const std::string html = training_report_html(*dir, *opt, &problems);
        constexpr std::size_t kShown = 5;  // the rest are in the page
        for (std::size_t i = 0; i < problems.size() && i < kShown; ++i) std::cerr << "tapeformer: note: " << problems[i] << "\n";
        if (problems.size() > kShown)
            std::cerr << "tapeformer: note: and " << problems.size() - kShown << " more lines left out (listed in the page)\n";
        write_file_atomic(path, html);
        std::cerr << "wrote " << path << " (" << html.size() / 1024 << " KiB)\n";
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
