// State and checks shared by the CLI's subcommands.
#include "cli/commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "tapeformer/blas.h"
#include "tapeformer/data/text.h"
#include "tapeformer/decode.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/io.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/number_text.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/run/train.h"

TF_NAMESPACE_BEGIN

CLI::Option* add_precision_option(CLI::App& cmd, std::string& precision) {
    return cmd
        .add_option("--precision", precision,
                    "Matrix products in fp32, or bf16 with fp32 sums (weights, softmax, layer norm, loss stay fp32;\n"
                    "without bf16 instructions in the CPU: fp32, with a note), or int8 (decoding only: the linear\n"
                    "layers' and the output projection's products with int8 weights, one scale per output row, and\n"
                    "int8 activations, one scale per token, summed in int32 and rescaled in fp32; attention's\n"
                    "products, softmax, layer norm and log-softmax stay fp32; needs AVX512-VNNI or AMX, else fp32\n"
                    "with a note)")
        ->check(CLI::IsMember({"fp32", "bf16", "int8"}))
        ->capture_default_str();
}

void apply_threads(int n, const std::string& flag) {
    set_threads(n);
    if (n > num_threads() && !reference_mode())  // (reference mode runs on one thread whatever n)
        throw std::invalid_argument(flag + " " + std::to_string(n) + ": this build's OpenBLAS runs at most " +
                                    std::to_string(num_threads()) + " threads; give " + flag + " " +
                                    std::to_string(num_threads()) + " or fewer");
}

void apply_precision(const std::string& precision) {
    if (reference_mode() && parse_precision(precision) == Precision::BF16)
        throw std::invalid_argument("--precision bf16: reference mode (--reference) multiplies in fp32 with three loops; "
                                    "give one of the two");
    const std::string note = set_precision(parse_precision(precision));
    if (!note.empty()) std::cerr << "tapeformer: note: " << note << "\n";
}

CLI::Option* add_mask_heads_option(CLI::App& cmd, std::string& heads) {
    return cmd.add_option("--mask-heads", heads,
                          "Attention heads to switch off (gate 0), as KIND:layer:head, 0-based, comma-separated; KIND is E\n"
                          "(encoder self-attention), D (decoder self-attention) or A (cross-attention), e.g. E:0:1,A:2:3");
}

void apply_mask_heads(Transformer& model, const std::string& heads) {
    if (!heads.empty()) mask_heads(model, parse_head_list(heads, model.config));
}

std::vector<std::string> add_model_switch_flags(CLI::App& cmd, ModelConfig& config, const std::string& help_suffix) {
    const ModelConfig paper;
    std::vector<std::string> flags;
    for (const Setting<ModelConfig>& s : model_settings()) {
        if (s.type == SettingType::Bool && s.get(paper) == "true") {
            const std::string flag = "--" + (s.negation.empty() ? "no-" + s.name : s.negation);
            std::string help = s.help;
            help[0] = char(std::tolower(static_cast<unsigned char>(help[0])));
            cmd.add_flag_callback(flag, [&config, &s, flag] { apply_setting(s, config, "false", flag); },
                                  "Leave out " + help + help_suffix);
            flags.push_back(flag);
        }
        if (s.key == "positional") {
            cmd.add_option_function<std::string>("--positional", [&config, &s](const std::string& v) {
                   apply_setting(s, config, v, "--positional");
               }, s.help + "; " + s.expected() + help_suffix);
            flags.push_back("--positional");
        }
    }
    return flags;
}

TokenizerPair sentence_vocabulary(const std::string& sentence, const std::string& tgt) {
    std::vector<std::string_view> lines{trim(sentence)};
    if (!tgt.empty()) lines.push_back(trim(tgt));
    TokenizerOptions o;
    o.kind = TokenizerKind::word;
    o.vocab_size = 0;
    auto t = WordTokenizer::train(lines, o);
    return TokenizerPair{t, t};
}

int& command_exit_code() {
    static int code = 0;
    return code;
}

namespace {

// std::cout's own buffer (libstdc++'s, writing through stdio), wrapped so that the reason of the first failed
// write is kept: a failure mid-output leaves std::cout bad, and by the time the command ends errno says
// nothing about it any more.
class ReasonKeepingBuf : public std::streambuf {
public:
    explicit ReasonKeepingBuf(std::streambuf* inner) : inner_(inner) {}
    int first_error() const { return error_; }

protected:
    int_type overflow(int_type c) override {
        if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
        errno = 0;
        const int_type r = inner_->sputc(traits_type::to_char_type(c));
        if (traits_type::eq_int_type(r, traits_type::eof())) keep(errno);
        return r;
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        errno = 0;
        const std::streamsize r = inner_->sputn(s, n);
        if (r < n) keep(errno);
        return r;
    }
    int sync() override {
        errno = 0;
        const int r = inner_->pubsync();
        if (r != 0) keep(errno);
        return r;
    }

private:
    void keep(int err) {
        if (error_ == 0) error_ = err != 0 ? err : EIO;
    }
    std::streambuf* inner_;
    int error_ = 0;
};

ReasonKeepingBuf* g_stdout_buf = nullptr;

}  // namespace

void watch_standard_output() {
    if (g_stdout_buf) return;
    g_stdout_buf = new ReasonKeepingBuf(std::cout.rdbuf());  // lives as long as std::cout
    std::cout.rdbuf(g_stdout_buf);
}

void finish_standard_output() {
    errno = 0;
    std::cout.flush();
    int err = g_stdout_buf ? g_stdout_buf->first_error() : 0;
    if (std::fflush(stdout) != 0 && err == 0) err = errno;
    if (!std::cout || std::ferror(stdout))
        throw std::runtime_error(std::string("cannot write to standard output: ") + std::strerror(err != 0 ? err : EIO));
}

namespace {

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

}  // namespace

void check_model_out_dir(const std::string& dir, const std::string& flag, const std::string& made_by, bool force,
                         std::vector<std::string> inputs) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(dir, ec)) {
        const std::string named = flag + " '" + dir + "'";
        if (!fs::is_directory(dir, ec)) throw std::runtime_error(named + " is a file, not a directory");
        if (!fs::is_empty(dir, ec)) {
            if (fs::exists(fs::path(dir) / "run.json", ec))
                throw std::runtime_error(named + " holds a training run; write the " + made_by + " to a directory of its own");
            if (!force)
                throw std::runtime_error(named + " is not empty; give --force to replace the model and tokenizer files of an earlier " +
                                         made_by + " there");
            if (!fs::exists(fs::path(dir) / "model.safetensors", ec))
                throw std::runtime_error(named + " holds files but no model.safetensors: not an earlier " + made_by + ", left alone");
        }
    }
    if (!fs::is_directory(dir, ec)) return;  // created new: it holds nothing yet
    for (std::size_t i = 0, n = inputs.size(); i < n; ++i)  // DIR/checkpoints/step-N.safetensors: DIR too
        if (fs::path(inputs[i]).parent_path().filename() == "checkpoints") {
            const fs::path run = fs::path(inputs[i]).parent_path().parent_path();
            inputs.push_back(run.empty() ? "." : run.string());
        }
    for (const char* name : {"model.safetensors", "vocab.txt", "spm.model", "src.vocab.txt", "src.spm.model", "tgt.vocab.txt",
                             "tgt.spm.model"})
        check_output_path((fs::path(dir) / name).string(), flag, inputs);
}

void check_output_path(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs) {
    namespace fs = std::filesystem;
    const OutputPlan plan = plan_output(path);  // io.h: the rule every output obeys
    if (plan.kind == OutputPlan::standard_output || plan.kind == OutputPlan::write_through) return;
    if (plan.kind == OutputPlan::refused) {
        if (std::string(plan.refused_as) == "directory")
            throw std::runtime_error(flag + " '" + path + "' is a directory, not a file");
        throw std::runtime_error(flag + " '" + path + "' is a " + plan.refused_as +
                                 "; an output is a file, a character device, a FIFO or - (standard output)");
    }
    const std::string& target = plan.target;
    const fs::path parent = fs::path(target).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::is_directory(parent, ec))
        throw std::runtime_error(flag + " '" + path + "': directory '" + parent.string() + "' does not exist");

    // Inputs compared by device and inode: another spelling, a link or a hard link of an input is that input.
    const std::string dir = parent.empty() ? "." : parent.string(), name = fs::path(target).filename().string();
    struct stat in {}, where {}, above {};
    const bool where_known = ::stat(dir.c_str(), &where) == 0;
    const bool above_known = ::stat((dir + "/..").c_str(), &above) == 0;
    for (const std::string& input : inputs) {
        if (input.empty() || ::stat(input.c_str(), &in) != 0) continue;
        if (S_ISDIR(in.st_mode)) {  // a model or run directory: the files training wrote there are its inputs
            const bool in_dir = where_known && same_file(where, in) && is_run_file(name);
            const bool in_checkpoints = above_known && same_file(above, in) &&
                                        fs::path(dir).filename() == "checkpoints" && is_run_file("checkpoints/" + name);
            if (in_dir || in_checkpoints)
                throw std::runtime_error(flag + " '" + path + "' is " + (in_dir ? name : "checkpoints/" + name) +
                                         " of the model directory '" + input + "'; an output may not replace it");
        } else if (plan.exists && plan.device == std::uint64_t(in.st_dev) && plan.inode == std::uint64_t(in.st_ino)) {
            throw std::runtime_error(flag + " '" + path + "' is the input '" + input + "'; an output may not replace an input");
        }
    }
}

namespace {

// Levenshtein distance, for "did you mean": a typed subcommand name against the real ones.
std::size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t substitution = diagonal + (a[i - 1] != b[j - 1]);
            diagonal = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
        }
    }
    return row[b.size()];
}

// CLI11 converts integer flags with strtoll/strtoull without looking at errno: a value past the type's
// range saturates (--batch-tokens 99999999999999999999 became 9223372036854775807) and "-1" for an
// unsigned flag wraps to 18446744073709551615. This check sees the text first and refuses both, quoting
// the value as typed. (An `int` flag's narrower range CLI11 refuses itself: "Could not convert".)
CLI::Validator integer_fits(bool is_unsigned) {
    return CLI::Validator(
        [is_unsigned](std::string& text) -> std::string {
            const std::size_t digits_from = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
            if (text.size() == digits_from || text.find_first_not_of("0123456789", digits_from) != std::string::npos)
                return {};  // not a plain integer: CLI11's conversion reports it
            if (is_unsigned && text[0] == '-') return "must be a non-negative integer, got " + text;
            long long as_signed = 0;
            unsigned long long as_unsigned = 0;
            const NumberRead read = is_unsigned ? read_unsigned(text, as_unsigned) : read_integer(text, as_signed);
            if (read == NumberRead::out_of_range)
                return "must be an integer in [" +
                       (is_unsigned ? std::string("0, 18446744073709551615") : std::string("-9223372036854775808, 9223372036854775807")) +
                       "], got " + text;
            return {};
        },
        "");
}

}  // namespace

void check_integer_flags(CLI::App& app) {
    for (CLI::Option* option : app.get_options()) {
        const std::string type = option->get_type_name();
        if (type.rfind("INT", 0) == 0) option->check(integer_fits(false));
        else if (type.rfind("UINT", 0) == 0) option->check(integer_fits(true));
    }
    for (CLI::App* sub : app.get_subcommands({})) {
        // `tapeformer train` reads its flags as text through the settings table, which checks each against
        // the setting's own bounds, overflow included ("--max-steps: must be an integer in [0, 1e+12]").
        if (sub->get_name() == "train" && !app.get_parent()) continue;
        check_integer_flags(*sub);
    }
}

void check_subcommand_name(const CLI::App& app, int argc, const char* const* argv) {
    const CLI::App* level = &app;
    const auto where_is = [](const CLI::App* at) {
        std::string where = "tapeformer";
        for (const CLI::App* p = at; p->get_parent(); p = p->get_parent()) where = "tapeformer " + p->get_name();
        return where;
    };
    std::string unknown_flag;  // the last word was a flag no level up to here has: its value follows
    for (int i = 1; i < argc; ++i) {
        const std::string word = argv[i];
        if (word == "--") return;
        if (word.empty() || word[0] == '-') {
            // A flag of this level or one above it (CLI11 falls through to the parents) that takes a value
            // (--threads 2) consumes the next word.
            const std::string name = word.substr(0, word.find('='));
            const CLI::Option* option = nullptr;
            for (const CLI::App* at = level; at && !option; at = at->get_parent()) option = at->get_option_no_throw(name);
            unknown_flag = option || word == "-" ? "" : name;
            if (option && option->get_expected_min() > 0 && word.find('=') == std::string::npos) ++i;  // a flag (--raw) expects none
            continue;
        }
        const auto subcommands = level->get_subcommands([](const CLI::App*) { return true; });
        if (subcommands.empty()) return;  // a leaf: the rest are its flags' values and positionals
        const CLI::App* found = nullptr;
        std::string closest;
        std::size_t best = std::string::npos;
        for (const CLI::App* sub : subcommands) {
            if (sub->get_name() == word) found = sub;
            const std::size_t d = edit_distance(word, sub->get_name());
            if (d < best) best = d, closest = sub->get_name();
        }
        if (!found && !unknown_flag.empty())  // `heads --precision bf16`: the flag is what is wrong, not "bf16"
            throw std::invalid_argument("unknown option '" + unknown_flag + "' of `" + where_is(level) + "`; see " +
                                        where_is(level) + " --help");
        if (!found) {
            const std::string where = where_is(level);
            throw std::invalid_argument("unknown subcommand '" + word + "' of `" + where + "`" +
                                        (best <= 2 ? " (did you mean '" + closest + "'?)" : std::string()) +
                                        "; see " + where + " --help");
        }
        level = found;
    }
}

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

TF_NAMESPACE_END
