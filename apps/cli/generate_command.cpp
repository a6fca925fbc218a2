// `tapeformer generate`: a decoder-only model continues a prompt (generate.h), greedy or sampled.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "tapeformer/generate.h"
#include "tapeformer/run/checkpoint.h"

TF_NAMESPACE_BEGIN

namespace {
struct GenerateCommandOptions {
    std::string model_dir;
    std::string prompt;
    GenerateOptions generate;
};
}  // namespace

void add_generate_command(CLI::App& app) {
    auto opt = std::make_shared<GenerateCommandOptions>();
    CLI::App* cmd = app.add_subcommand(
        "generate",
        "Continue a prompt with a decoder-only model (train --arch decoder-only): prints the prompt and what the\n"
        "model writes after it, up to EOS or --max-tokens. Greedy with --temperature 0; otherwise sampled, and\n"
        "the same --seed gives the same text.");
    cmd->add_option("--model", opt->model_dir, "Model directory written by `tapeformer train --arch decoder-only`")->required();
    cmd->add_option("--prompt", opt->prompt, "Text the model continues (default: none, a line from scratch)");
    cmd->add_option("--temperature", opt->generate.temperature,
                    "Softmax temperature: 0 = greedy (the most probable token), 1 = the model's distribution (default 1)");
    cmd->add_option("--top-k", opt->generate.top_k, "Sample from the K most probable tokens only (0 = all; default 0)");
    cmd->add_option("--top-p", opt->generate.top_p,
                    "Nucleus sampling: from the most probable tokens whose probabilities sum to P, in (0, 1] (default 1)");
    cmd->add_option("--max-tokens", opt->generate.max_tokens, "Tokens to generate at most (default 100)");
    cmd->add_option("--seed", opt->generate.seed, "Seed of the sampling (default 1)");
    cmd->callback([opt]() {
        opt->generate.validate();  // a bad flag before the model is read
        ModelBundle bundle = load_model_dir(opt->model_dir);
        if (!bundle.model->config.decoder_only())
            throw std::invalid_argument("generate: " + opt->model_dir +
                                        " holds an encoder-decoder (translation) model: use tapeformer translate");
        if (!bundle.note.empty()) std::cerr << "tapeformer: note: " << bundle.note << "\n";
        const Tokenizer& tok = *bundle.tokenizers.target;
        std::vector<std::int32_t> ids = tok.encode(opt->prompt);
        const Generation g = generate(*bundle.model, ids, opt->generate);
        ids.insert(ids.end(), g.tokens.begin(), g.tokens.end());
        std::cout << tok.decode(ids) << "\n";
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
