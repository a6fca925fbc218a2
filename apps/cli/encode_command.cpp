// `tapeformer encode`: what the model reads. Each input line comes out as the tokens its tokenizer makes
// of it (pieces, or ids with --ids), space-separated, without BOS and EOS.
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "cli/commands.h"
#include "tapeformer/data/text.h"
#include "tapeformer/data/tokenizer.h"

TF_NAMESPACE_BEGIN

namespace {

struct EncodeOptions {
    std::string model_dir;
    std::string input;         // empty: standard input
    std::string side = "src";  // which tokenizer: the source's or the target's
    bool ids = false;
};

}  // namespace

void add_encode_command(CLI::App& app) {
    auto opt = std::make_shared<EncodeOptions>();
    CLI::App* cmd = app.add_subcommand(
        "encode",
        "Show how a model's tokenizer splits text: for each input line, its tokens space-separated, without\n"
        "BOS/EOS. Tokens are shown as the model sees them: a word or piece outside the vocabulary is <unk>.");
    cmd->add_option("--model", opt->model_dir, "Model directory (only its tokenizer files are read)")->required();
    cmd->add_option("--input", opt->input, "File to encode (default: standard input)")->check(CLI::ExistingFile);
    cmd->add_flag("--ids", opt->ids, "Print token ids instead of pieces");
    cmd->add_option("--side", opt->side, "Which tokenizer: src (source language) or tgt (target language)")
        ->check(CLI::IsMember({"src", "tgt"}))
        ->capture_default_str();
    cmd->callback([opt]() {
        std::error_code ec;
        if (std::filesystem::exists(opt->model_dir, ec) && !std::filesystem::is_directory(opt->model_dir, ec))
            throw std::runtime_error("--model '" + opt->model_dir + "' is a file; expected a model directory");
        if (!std::filesystem::is_directory(opt->model_dir, ec))
            throw std::runtime_error("model directory '" + opt->model_dir + "' does not exist");
        const TokenizerPair tokenizers = TokenizerPair::load(opt->model_dir);
        const Tokenizer& tokenizer = opt->side == "src" ? *tokenizers.source : *tokenizers.target;
        const std::vector<std::string> lines =
            opt->input.empty() ? read_lines(std::cin, "standard input") : read_lines(opt->input);
        std::string out;
        for (const std::string& line : lines) {
            const std::vector<std::int32_t> ids = tokenizer.encode(line);
            for (std::size_t i = 0; i < ids.size(); ++i) {
                if (i > 0) out += ' ';
                out += opt->ids ? std::to_string(ids[i]) : tokenizer.id_to_piece(ids[i]);
            }
            out += '\n';
        }
        std::cout << out;
        finish_standard_output();  // "cannot write to standard output: <the system's reason>"
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
