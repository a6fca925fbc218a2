// `tapeformer data ...`: commands that make datasets. `data toy` writes the toy translation corpus
// (data/README.md describes its grammar); with the default options its files equal data/toy/.
#include <iostream>
#include <stdexcept>

#include "tapeformer/cli/commands.h"
#include "tapeformer/data/toy.h"

TF_NAMESPACE_BEGIN

void add_data_command(CLI::App& app) {
    CLI::App* data = app.add_subcommand("data", "Make datasets (run `tapeformer data toy --help`)");
    // Not require_subcommand(1): CLI11's "A subcommand is required" would not say which command needs one.
    data->callback([data]() {
        if (data->get_subcommands().empty())
            throw std::runtime_error("`tapeformer data` needs a subcommand: toy (see tapeformer data --help)");
    });

    auto opt = std::make_shared<ToyCorpusOptions>();
    auto out_dir = std::make_shared<std::string>();
    CLI::App* toy = data->add_subcommand(
        "toy",
        "Write the toy translation corpus: train, valid and test splits as .src/.tgt files, one sentence per\n"
        "line. The defaults reproduce the committed data/toy/ byte for byte.");
    toy->add_option("--out", *out_dir, "Directory to write the six files into (created if needed)")->required();
    toy->add_option("--seed", opt->seed, "Seed of the generator: same seed, same files on any machine")
        ->capture_default_str();
    toy->add_option("--train", opt->train, "Sentence pairs in train.{src,tgt}")
        ->check(number_above(0, false))
        ->capture_default_str();
    toy->add_option("--valid", opt->valid, "Sentence pairs in valid.{src,tgt}")
        ->check(number_above(0, false))
        ->capture_default_str();
    toy->add_option("--test", opt->test, "Sentence pairs in test.{src,tgt}")
        ->check(number_above(0, false))
        ->capture_default_str();
    toy->callback([opt, out_dir]() {
        write_toy_corpus(*out_dir, *opt);
        std::cout << "wrote " << opt->train << " / " << opt->valid << " / " << opt->test
                  << " train / valid / test pairs (seed " << opt->seed << ") to " << *out_dir << "\n";
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
