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
        std::vector<std::string> inputs = opt->checkpoints;
        if (!opt->model_dir.empty()) inputs.push_back(opt->model_dir);
        check_model_out_dir(opt->out_dir, "--out", "average", opt->force, inputs);
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
