// `tapeformer data ...`: commands that make datasets. `data toy` writes the toy translation corpus
// (data/README.md describes its grammar); with the default options its files equal data/toy/. `data copy`
// and `data reverse` write the synthetic sequence tasks of data/tasks.h.
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "cli/commands.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/data/toy.h"

TF_NAMESPACE_BEGIN

namespace {

// A dataset already in `dir` is replaced only with --force (as `train` treats a run): refuses, naming the
// first of the six files that are there. Also refuses any of them that is a directory or cannot be written.
void check_dataset_dir(const std::string& dir, bool force) {
    for (const char* name : {"train.src", "train.tgt", "valid.src", "valid.tgt", "test.src", "test.tgt"}) {
        const std::string path = (std::filesystem::path(dir) / name).string();
        std::error_code ec;
        if (!force && std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
            throw std::runtime_error("--out '" + dir + "' already holds " + name + " (a dataset): choose another --out, "
                                     "or give --force to replace it");
        if (std::filesystem::is_directory(dir, ec)) check_output_path(path, "--out");
    }
}

void add_sequence_task_command(CLI::App* data, SequenceTask task, const std::string& description) {
    auto opt = std::make_shared<SequenceTaskOptions>(SequenceTaskOptions::defaults_for(task));
    auto out_dir = std::make_shared<std::string>();
    CLI::App* cmd = data->add_subcommand(to_string(task), description);
    cmd->add_option("--out", *out_dir, "Directory to write the six files into (created if needed)")->required();
    auto force = std::make_shared<bool>(false);
    cmd->add_flag("--force", *force, "Replace a dataset already in --out (its six files)");
    cmd->add_option("--seed", opt->seed, "Seed of the generator: same seed, same files on any machine")->capture_default_str();
    cmd->add_option("--train", opt->train, "Pairs in train.{src,tgt}")->capture_default_str();
    cmd->add_option("--valid", opt->valid, "Pairs in valid.{src,tgt}")->capture_default_str();
    cmd->add_option("--test", opt->test, "Pairs in test.{src,tgt}")->capture_default_str();
    cmd->add_option("--symbols", opt->symbols, "How many different symbols")->capture_default_str();
    cmd->add_option("--first-symbol", opt->first_symbol, "The smallest symbol (symbols are integers)")->capture_default_str();
    cmd->add_option("--train-min-len", opt->train_min_len, "Shortest training sequence")->capture_default_str();
    cmd->add_option("--train-max-len", opt->train_max_len, "Longest training sequence")->capture_default_str();
    cmd->add_option("--eval-min-len", opt->eval_min_len, "Shortest valid/test sequence")->capture_default_str();
    cmd->add_option("--eval-max-len", opt->eval_max_len, "Longest valid/test sequence")->capture_default_str();
    cmd->callback([opt, out_dir, force]() {
        check_dataset_dir(*out_dir, *force);
        write_sequence_task(*out_dir, *opt);
        std::cout << "wrote " << opt->train << " / " << opt->valid << " / " << opt->test << " train / valid / test "
                  << to_string(opt->task) << " pairs (seed " << opt->seed << ") to " << *out_dir << "\n";
        command_exit_code() = 0;
    });
}

}  // namespace

void add_data_command(CLI::App& app) {
    CLI::App* data = app.add_subcommand("data", "Make datasets: the toy translation corpus, the copy and reverse tasks (see `tapeformer data toy --help`)");
    // Not require_subcommand(1): CLI11's "A subcommand is required" would not say which command needs one.
    data->callback([data]() {
        if (data->get_subcommands().empty())
            throw std::runtime_error(
                "`tapeformer data` needs a subcommand: toy, copy or reverse (see tapeformer data --help)");
    });

    add_sequence_task_command(data, SequenceTask::copy,
                              "Write the copy task (the Annotated Transformer's): 10 symbols from 1..10 per line,\n"
                              "the target equal to the source; 20000 / 1000 / 1000 pairs.");
    add_sequence_task_command(data, SequenceTask::reverse,
                              "Write the reverse task (JoeyNMT's): integers 0..49, the target reversed; training\n"
                              "lengths 1..25, valid/test up to 30 (length generalisation); 50000 / 1000 / 1000 pairs.");

    auto opt = std::make_shared<ToyCorpusOptions>();
    auto out_dir = std::make_shared<std::string>();
    CLI::App* toy = data->add_subcommand(
        "toy",
        "Write the toy translation corpus: train, valid and test splits as .src/.tgt files, one sentence per\n"
        "line. The defaults reproduce the committed data/toy/ byte for byte.");
    toy->add_option("--out", *out_dir, "Directory to write the six files into (created if needed)")->required();
    auto force = std::make_shared<bool>(false);
    toy->add_flag("--force", *force, "Replace a dataset already in --out (its six files)");
    toy->add_option("--seed", opt->seed, "Seed of the generator: same seed, same files on any machine")
        ->capture_default_str();
    toy->add_option("--train", opt->train, "Sentence pairs in train.{src,tgt}")
        ->check(number_above(0, false) & CLI::Range(std::int64_t(0), kMaxToyPairs))
        ->capture_default_str();
    toy->add_option("--valid", opt->valid, "Sentence pairs in valid.{src,tgt}")
        ->check(number_above(0, false) & CLI::Range(std::int64_t(0), kMaxToyPairs))
        ->capture_default_str();
    toy->add_option("--test", opt->test, "Sentence pairs in test.{src,tgt}")
        ->check(number_above(0, false) & CLI::Range(std::int64_t(0), kMaxToyPairs))
        ->capture_default_str();
    toy->callback([opt, out_dir, force]() {
        check_dataset_dir(*out_dir, *force);
        write_toy_corpus(*out_dir, *opt);
        std::cout << "wrote " << opt->train << " / " << opt->valid << " / " << opt->test
                  << " train / valid / test pairs (seed " << opt->seed << ") to " << *out_dir << "\n";
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
