// `tapeformer train`: a flag for every setting of the table in train_settings.h, --config, --preset.
// The callback collects what was given, resolve_train_config merges it, tf::train runs it with the head-log
// watcher (study/head_log.h).
#include <unistd.h>

#include <iostream>
#include <map>
#include <memory>

#include "tapeformer/blas.h"
#include "cli/commands.h"
#include "tapeformer/run/distributed.h"
#include "tapeformer/run/train.h"
#include "tapeformer/run/train_settings.h"
#include "tapeformer/study/head_log.h"

TF_NAMESPACE_BEGIN

void add_train_command(CLI::App& app) {
    // What the user typed, by setting name; merged with --config and --preset by resolve_train_config.
    auto given = std::make_shared<std::map<std::string, std::string>>();
    auto args = std::make_shared<TrainArguments>();

    std::string preset_help = "Fill in unset settings from a preset:";
    for (const Preset& p : train_presets()) preset_help += "\n  " + p.name + ": " + p.description;

    CLI::App* cmd = app.add_subcommand("train", "Train a translation model on two aligned text files (one sentence per line), or with\n"
                                                "--arch decoder-only a language model on one text file (--train-src only).\n"
                                                "Examples: tapeformer train --preset toy --out runs/toy\n"
                                                "          tapeformer train --preset toy-lm --out runs/toy-lm\n"
                                                "Settings come from the flags, then --config, then --preset, then the defaults.");
    cmd->add_option("--config", args->config_file,
                    "Read settings from a TOML file of name = value lines (top level or under [train]), such as\n"
                    "the DIR/config.toml a run writes; flags win over the file, the file over --preset")
        ->check(CLI::ExistingFile);
    cmd->add_option("--preset", args->preset, preset_help);

    // One flag per setting of the table (train_settings.h), with its bounds and default in the help.
    const TrainConfig defaults;
    for (const Setting<TrainConfig>& s : train_settings()) {
        if (s.name.empty()) continue;  // stored values such as the vocabulary size, filled in by training
        std::string help = s.help;
        if (s.type == SettingType::Integer || s.type == SettingType::Real) help += "; " + s.expected();
        if (s.type == SettingType::Choice) help += "; " + s.expected();
        if (s.type == SettingType::Bool) {
            const std::string off = s.negation.empty() ? "no-" + s.name : s.negation;
            help += " (default: " + std::string(s.get(defaults) == "true" ? "on" : "off") + "; --" + off + " turns it off)";
            cmd->add_flag_function("--" + s.name + ",!--" + off,
                                   [given, name = s.name](std::int64_t n) { (*given)[name] = n > 0 ? "true" : "false"; }, help)
                ->group(s.group);
            continue;
        }
        if (!s.key.empty() && s.help.find("default") == std::string::npos && !s.get(defaults).empty())
            help += " (default: " + s.get(defaults) + ")";
        cmd->add_option_function<std::string>("--" + s.name, [given, name = s.name](const std::string& v) { (*given)[name] = v; },
                                              help)
            ->type_name(s.type == SettingType::Integer ? "INT" : s.type == SettingType::Real ? "NUMBER" : "TEXT")
            ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)  // the last of a repeated flag wins
            ->group(s.group);
    }

    const std::string run = "Run";
    cmd->add_option("--out", args->out_dir, "Model directory to write (checkpoints, logs, the model)")->group(run);
    cmd->add_flag("--resume", args->resume, "Continue the run in --out from its last checkpoint, with its own settings; this call may\n"
                                              "change only --max-steps, --epochs, --time-budget, --log-every, --valid-every,\n"
                                              "--checkpoint-every and --keep (these four are kept in run.json for later resumes)")->group(run);
    cmd->add_flag("--force", args->force, "Start over in an --out that holds another run: once this run's inputs are read, deletes\n"
                                            "the files training wrote there (model, checkpoints, metrics, ...), not the user's own")->group(run);
    cmd->add_flag("--check-nan", args->check_nan, "On a non-finite loss or gradient, name the first op that produced it")->group(run);

    cmd->callback([cmd, given, args]() {
        args->flags.clear();
        for (const Setting<TrainConfig>& s : train_settings())  // in the table's order
            if (auto it = given->find(s.name); it != given->end()) args->flags.emplace_back(s.name, it->second);
        args->threads = num_threads();  // as set by the global --threads (default: all cores)
        const ResolvedTrainConfig resolved = resolve_train_config(*args);
        // Under mpirun every rank resolves the same settings: rank 0 says what they note, once for the job.
        // (world() also sets an MPI job's output up before the first line: distributed.cpp)
        if (world().rank() == 0)
            for (const std::string& note : resolved.notes) std::cerr << "tapeformer: note: " << note << "\n";
        // The studies that watch training from above: the head log writes heads.jsonl when the run's
        // --log-heads-every says so (its own on --resume, which the flags here do not carry).
        HeadLogWatcher head_log;
        const TrainResult r = train(resolved.config, std::cerr, isatty(STDERR_FILENO) != 0, {&head_log});
        command_exit_code() = r.interrupted() ? 130 : 0;
    });
}

TF_NAMESPACE_END
