// `tapeformer summary`: the torchinfo-style table of a trained model (--model DIR) or of a freshly
// initialised one (--init with the model flags), for a batch of the size asked for.
#include <iostream>
#include <memory>
#include <stdexcept>

#include "tapeformer/run/checkpoint.h"
#include "cli/commands.h"
#include "tapeformer/teach/summary.h"

TF_NAMESPACE_BEGIN

namespace {

struct SummaryOptions {
    std::string model_dir;
    bool init = false;
    ModelConfig config;  // with --init
    std::string norm = "post", tie = "none";
    std::int64_t layers = 0;
    std::int64_t vocab = 8000;
    std::int64_t batch = 1, src_len = 20, tgt_len = 20;
};

}  // namespace

void add_summary_command(CLI::App& app) {
    auto opt = std::make_shared<SummaryOptions>();
    CLI::App* cmd = app.add_subcommand(
        "summary",
        "A table of the model's modules in the order data flows: output shape, parameters and the multiply-adds\n"
        "of the matrix products for one batch (torchinfo's columns).\n"
        "Examples: tapeformer summary --model runs/toy\n"
        "          tapeformer summary --init --d-model 8 --heads 2 --ffn 16 --layers 1 --vocab 20");
    auto* model = cmd->add_option("--model", opt->model_dir, "A model directory written by `tapeformer train`");
    auto* init = cmd->add_flag("--init", opt->init, "An untrained model with the flags below instead of --model");
    model->excludes(init);
    cmd->add_option("--batch", opt->batch, "Sentences in the batch (B)")->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--src-len", opt->src_len, "Source tokens per sentence (S)")->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--tgt-len", opt->tgt_len, "Target positions per sentence (T)")->check(number_above(1, false))->capture_default_str();
    const std::string with_init = " (with --init)";
    cmd->add_option("--d-model", opt->config.d_model, "Model width C" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--heads", opt->config.heads, "Attention heads H" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--ffn", opt->config.ffn, "FFN inner width F" + with_init)->check(number_above(1, false))->capture_default_str();
    cmd->add_option("--layers", opt->layers, "Encoder and decoder layers" + with_init)->check(number_above(1, false));
    cmd->add_option("--vocab", opt->vocab, "Vocabulary size V, both sides" + with_init)->check(number_above(5, false))->capture_default_str();
    cmd->add_option("--norm", opt->norm, "post or pre" + with_init)->check(CLI::IsMember({"post", "pre"}))->capture_default_str();
    cmd->add_option("--tie", opt->tie, "none, decoder or all" + with_init)->check(CLI::IsMember({"none", "decoder", "all"}))->capture_default_str();
    const std::vector<std::string> switches = add_model_switch_flags(*cmd, opt->config, with_init);
    cmd->callback([opt, cmd, switches]() {
        const bool model_given = cmd->count("--model") > 0;
        if (!model_given && !opt->init) throw std::runtime_error("summary: give --model DIR or --init (see tapeformer summary --help)");
        for (const std::string& flag : switches)
            if (model_given && cmd->count(flag))
                throw std::runtime_error(flag + ": only with --init; --model DIR brings its own model");
        std::unique_ptr<Transformer> built;
        ModelBundle bundle;
        Transformer* m = nullptr;
        if (model_given) {
            bundle = load_model_dir(opt->model_dir);
            m = bundle.model.get();
        } else {
            ModelConfig c = opt->config;
            if (opt->layers) c.enc_layers = c.dec_layers = opt->layers;
            c.src_vocab = c.tgt_vocab = opt->vocab;
            c.norm = parse_norm_position(opt->norm);
            c.tie = parse_tying(opt->tie);
            c.validate();
            built = std::make_unique<Transformer>(c);
            m = built.get();
        }
        std::cout << format_summary(summarize(*m, opt->batch, opt->src_len, opt->tgt_len));
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
