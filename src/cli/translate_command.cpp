// `tapeformer translate`: a trained model over text, one sentence per line in, one translation per line out.
// Also the decoding flags and the progress line that `tapeformer eval` shares (declared in commands.h).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "tapeformer/checkpoint.h"
#include "tapeformer/cli/commands.h"
#include "tapeformer/heads.h"
#include "tapeformer/data/text.h"
#include "tapeformer/evaluate.h"
#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

namespace {

struct TranslateOptions {
    std::string model_dir;
    std::string mask_heads;  // "E:0:1,A:2:3": these heads' gates set to 0
    std::string input;   // empty: standard input
    std::string output;  // empty: standard output
    DecodeOptions decode;
    std::int64_t batch_tokens = 4096;
    std::string precision = "fp32";
};

// The lines joined with '\n', one after each: the file format read_lines reads back.
std::string join_lines(const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + '\n';
    return text;
}

}  // namespace

CLI::Validator number_above(double lo, bool strict) {
    const std::string bound = (strict ? "> " : ">= ") + CLI::detail::to_string(lo);
    return CLI::Validator(
        [lo, strict, bound](std::string& text) -> std::string {
            double x = 0;
            if (!CLI::detail::lexical_cast(text, x)) return "'" + text + "' is not a number";
            // inf would be accepted by the bound but cannot be stored in run.json (JSON has no infinity).
            if (!std::isfinite(x)) return "must be a finite number, got " + text;
            if (strict ? x > lo : x >= lo) return {};
            return "must be " + bound + ", got " + text;
        },
        lo == 0 ? (strict ? "POSITIVE" : "NONNEGATIVE") : bound);
}

void check_output_path(const std::string& path, const std::string& flag) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw std::runtime_error(flag + " '" + path + "' is a directory, not a file");
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
        throw std::runtime_error(flag + " '" + path + "': directory '" + parent.string() + "' does not exist");
}

void add_decode_options(CLI::App& cmd, DecodeOptions& options, std::int64_t& batch_tokens) {
    cmd.add_option("--beam", options.beam, "Beam size K: hypotheses kept per sentence (1 = greedy)")
        ->check(number_above(0, true))
        ->capture_default_str();
    cmd.add_option("--length-penalty", options.length_penalty,
                   "GNMT length penalty alpha: a finished hypothesis ranks by log p / ((5 + len) / 6)^alpha "
                   "(0 = none; only matters with --beam > 1)")
        ->check(number_above(0, false))
        ->capture_default_str();
    cmd.add_option("--max-len", options.max_len_abs,
                   "Longest output in tokens, whatever the source length (the model's max_len caps it too)")
        ->check(number_above(0, true))
        ->capture_default_str();
    cmd.add_option("--max-len-ratio", options.max_len_ratio,
                   "Output cap relative to the source: at most ratio * source tokens + --max-len-offset")
        ->check(number_above(0, true))
        ->capture_default_str();
    cmd.add_option("--max-len-offset", options.max_len_offset, "Tokens added to the relative output cap")
        ->check(number_above(0, false))
        ->capture_default_str();
    cmd.add_option("--batch-tokens", batch_tokens,
                   "Source tokens per batch (sentences are sorted by length and packed up to this budget)")
        ->check(number_above(0, true))
        ->capture_default_str();
}

std::function<void(std::int64_t, std::int64_t)> terminal_progress(const std::string& what) {
    if (!isatty(STDERR_FILENO)) return nullptr;
    const auto start = std::chrono::steady_clock::now();
    return [what, start](std::int64_t done, std::int64_t total) {
        constexpr int kWidth = 30;
        const double fraction = total > 0 ? double(done) / double(total) : 1.0;
        const int filled = static_cast<int>(fraction * kWidth);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "\r%s [%s%s] %lld/%lld sentences, %.1f s", what.c_str(), std::string(filled, '#').c_str(),
                     std::string(kWidth - filled, '.').c_str(), static_cast<long long>(done),
                     static_cast<long long>(total), seconds);
        if (done >= total) std::fputc('\n', stderr);
        std::fflush(stderr);
    };
}

void add_translate_command(CLI::App& app) {
    auto opt = std::make_shared<TranslateOptions>();
    CLI::App* cmd = app.add_subcommand(
        "translate",
        "Translate text with a trained model: one sentence per input line, one translation per output line\n"
        "(same count and order; an empty line gives an empty line).");
    cmd->add_option("--model", opt->model_dir, "Model directory written by `tapeformer train`")->required();
    cmd->add_option("--mask-heads", opt->mask_heads,
                    "Attention heads to switch off (gate 0), as KIND:layer:head, 0-based, comma-separated; KIND is E\n"
                    "(encoder self-attention), D (decoder self-attention) or A (cross-attention), e.g. E:0:1,A:2:3");
    cmd->add_option("--input", opt->input, "File to translate (default: standard input)")->check(CLI::ExistingFile);
    cmd->add_option("--output", opt->output,
                    "File to write the translations to, replaced only once all are done "
                    "(default: standard output)");
    add_decode_options(*cmd, opt->decode, opt->batch_tokens);
    add_precision_option(*cmd, opt->precision);
    cmd->callback([opt]() {
        if (!opt->output.empty()) check_output_path(opt->output, "--output");
        apply_precision(opt->precision);
        // The model first: a wrong --model should fail at once, not after the user has typed the input.
        ModelBundle bundle = load_model_dir(opt->model_dir);
        if (!opt->mask_heads.empty()) mask_heads(*bundle.model, parse_head_list(opt->mask_heads, bundle.model->config));
        if (!bundle.note.empty()) std::cerr << "tapeformer: note: " << bundle.note << "\n";
        const std::vector<std::string> lines =
            opt->input.empty() ? read_lines(std::cin, "standard input") : read_lines(opt->input);
        std::int64_t truncated = 0;
        const std::vector<std::string> translations =
            translate_lines(*bundle.model, bundle.tokenizers, lines, opt->decode, opt->batch_tokens,
                            terminal_progress("translating"), &truncated);
        if (truncated > 0)
            std::cerr << "tapeformer: note: " << truncated << " of " << lines.size()
                      << " input sentences were longer than the model's " << bundle.model->config.max_len - 1
                      << " source tokens; only their beginning was translated\n";
        const std::string text = join_lines(translations);
        if (opt->output.empty()) {
            std::cout << text << std::flush;
            if (!std::cout) throw std::runtime_error("cannot write the translations to standard output");
        } else {
            write_file_atomic(opt->output, text);
        }
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
