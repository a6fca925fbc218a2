// `tapeformer average`: the mean of a run's last checkpoints written as a model directory that translate,
// eval and the head commands read like any other.
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "tapeformer/run/average.h"
#include "cli/commands.h"

TF_NAMESPACE_BEGIN

namespace {

struct AverageOptions {
    std::string model_dir;
    int last = 5;
    std::vector<std::string> checkpoints;
    std::string out_dir;
    bool force = false;
    bool mix_runs = false;
};

// --out must be new or empty; with --force it may hold an earlier average (never a training run's directory,
// whose model.safetensors is the run's best model).
void check_out_dir(const AverageOptions& opt) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(opt.out_dir, ec)) return;
    if (!fs::is_directory(opt.out_dir, ec)) throw std::runtime_error("--out '" + opt.out_dir + "' is a file, not a directory");
    if (fs::is_empty(opt.out_dir, ec)) return;
    if (fs::exists(fs::path(opt.out_dir) / "run.json", ec))
        throw std::runtime_error("--out '" + opt.out_dir + "' holds a training run; write the average to a directory of its own");
    if (!opt.force)
        throw std::runtime_error("--out '" + opt.out_dir + "' is not empty; give --force to replace the model and tokenizer " +
                                 "files an earlier average wrote there");
    if (!fs::exists(fs::path(opt.out_dir) / "model.safetensors", ec))
        throw std::runtime_error("--out '" + opt.out_dir + "' holds files but no model.safetensors: not an earlier average, left alone");
}

// The files the average writes into --out (model.safetensors; the tokenizer's, of either layout, which
// TokenizerPair::save replaces) may not be inputs nor files of an averaged model's or run's directory:
// --force replaces an earlier average, never a model it reads (a model directory among --checkpoints).
void check_out_files(const AverageOptions& opt) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(opt.out_dir, ec)) return;  // created new: it holds nothing yet
    std::vector<std::string> inputs = opt.checkpoints;
    if (!opt.model_dir.empty()) inputs.push_back(opt.model_dir);
    for (const std::string& path : opt.checkpoints)  // DIR/checkpoints/step-N.safetensors: DIR too
        if (fs::path(path).parent_path().filename() == "checkpoints") {
            const fs::path run = fs::path(path).parent_path().parent_path();
            inputs.push_back(run.empty() ? "." : run.string());
        }
    for (const char* name : {"model.safetensors", "vocab.txt", "spm.model", "src.vocab.txt", "src.spm.model",
                             "tgt.vocab.txt", "tgt.spm.model"})
        check_output_path((fs::path(opt.out_dir) / name).string(), "--out", inputs);
}

}  // namespace

void add_average_command(CLI::App& app) {
    auto opt = std::make_shared<AverageOptions>();
    CLI::App* cmd = app.add_subcommand(
        "average",
        "Average the weights of a run's last checkpoints (fairseq's and Marian's checkpoint averaging) into a new\n"
        "model directory: late in training the mean of the last few checkpoints often translates better than\n"
        "any one of them. Keep enough checkpoints while training (--keep N, --keep-every N).\n"
        "Example: tapeformer average --model runs/m30k --last 5 --out runs/m30k-avg5\n"
        "         tapeformer eval --model runs/m30k-avg5 --src test.de --ref test.en");
    cmd->add_option("--model", opt->model_dir, "The run directory whose newest checkpoints are averaged");
    cmd->add_option("--last", opt->last, "How many of the newest checkpoints (kept ones included)")
        ->check(number_above(1, false))
        ->capture_default_str();
    auto* list = cmd->add_option("--checkpoints", opt->checkpoints,
                                 "Instead of --model/--last: these checkpoints (DIR/checkpoints/step-N.safetensors) of one run");
    cmd->add_option("--out", opt->out_dir, "New model directory: model.safetensors and the run's tokenizer files")->required();
    cmd->add_flag("--force", opt->force, "Replace an earlier average in --out");
    cmd->add_flag("--mix-runs", opt->mix_runs,
                  "Average checkpoints of different runs (refused without it: each run has its own id, see run.json)");
    list->excludes(cmd->get_option("--model"));
    cmd->callback([opt, cmd]() {
        if (opt->checkpoints.empty() && cmd->count("--model") == 0)
            throw std::runtime_error("average: give --model DIR (with --last N) or --checkpoints FILE... (see tapeformer average --help)");
        check_out_dir(*opt);
        check_out_files(*opt);
        const std::vector<std::string> paths =
            opt->checkpoints.empty() ? newest_checkpoints(opt->model_dir, opt->last) : opt->checkpoints;
        const ModelBundle mean = average_models(paths, opt->mix_runs);
        std::filesystem::create_directories(opt->out_dir);
        mean.tokenizers.save(opt->out_dir);
        save_model_weights((std::filesystem::path(opt->out_dir) / "model.safetensors").string(), *mean.model,
                           tokenizer_hash(mean.tokenizers), mean.stamp);
        std::cout << "averaged " << paths.size() << " checkpoints:";
        for (const std::string& p : paths) std::cout << " " << p;
        std::cout << "\nwrote " << opt->out_dir << "/model.safetensors and the tokenizer\n";
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
