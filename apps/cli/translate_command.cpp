// `tapeformer translate`: a trained model over text, one sentence per line in, one translation per line out.
// Also the decoding flags and the progress line that `tapeformer eval` shares (declared in commands.h).
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <streambuf>
#include <stdexcept>

#include "tapeformer/blas.h"
#include "tapeformer/run/checkpoint.h"
#include "cli/commands.h"
#include "tapeformer/data/text.h"
#include "tapeformer/run/evaluate.h"
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
    bool timing = false;  // --timing: the decoding time and speed on stderr at the end
};

// The lines joined with '\n', one after each: the file format read_lines reads back.
std::string join_lines(const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + '\n';
    return text;
}

// Input is read and translated this many lines at a time at most (sorted by length within them for batching),
// each piece's translations written before the next is read: memory does not grow with the input. A piece
// also ends when no further line has arrived yet, so that a client writing one line at a time and waiting
// gets each answer, while a file or a fast pipe still fills whole pieces.
constexpr std::size_t kLinesPerPiece = 2000;

// Lines in a file ('\n'-terminated, plus a last one without it), for the progress bar's total.
std::int64_t count_lines(const std::string& path) {
    std::ifstream in = open_text_file(path);
    std::int64_t lines = 0;
    char last = '\n';
    char buffer[1 << 16];
    while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
        lines += std::count(buffer, buffer + in.gcount(), '\n');
        last = buffer[in.gcount() - 1];
    }
    return lines + (last != '\n');
}

// The first SIGINT or SIGTERM asks the loop to stop (0: none yet): the batch being decoded finishes, what is
// translated is written and the process then ends by that signal. A second one ends it at once. Either way
// the --output temporary file is removed and the previous output left as it was.
volatile std::sig_atomic_t g_stop_signal = 0;
char g_output_temp[4096];
extern "C" void on_stop_signal(int sig) {
    if (g_stop_signal != 0) {
        if (g_output_temp[0] != '\0') ::unlink(g_output_temp);
        std::signal(sig, SIG_DFL);
        std::raise(sig);
        return;
    }
    g_stop_signal = sig;
}

// Installs on_stop_signal for SIGINT and SIGTERM without SA_RESTART, so that a read() waiting for input
// returns (EINTR) and the loop sees the request.
void catch_stop_signals(void (*handler)(int)) {
    struct sigaction action {};
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGTERM, &action, nullptr);
}

// Standard input read straight from its descriptor, so that the loop can ask whether a further whole line
// has already arrived (line_ready) before it would block waiting for one.
class DescriptorInput : public std::streambuf {
public:
    explicit DescriptorInput(int fd) : fd_(fd), buffer_(1 << 16) { setg(buffer_.data(), buffer_.data(), buffer_.data()); }

    // True when the next line can be read without waiting: a '\n' is buffered, the input has ended, or the
    // bytes already waiting in the pipe complete a line.
    bool line_ready() {
        for (;;) {
            if (ended_ || std::memchr(gptr(), '\n', static_cast<std::size_t>(egptr() - gptr())) != nullptr) return true;
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 0) <= 0) return false;
            try {
                if (!fill()) return true;  // the end
            } catch (const std::runtime_error&) {
                return true;  // a read error: the reader's next read meets it again and names it
            }
        }
    }

protected:
    int_type underflow() override {
        if (gptr() == egptr() && !fill()) return traits_type::eof();
        return traits_type::to_int_type(*gptr());
    }

private:
    // Appends what the descriptor has after the unread bytes (waiting for some); false at the end of the input
    // or once a stop signal has come. A read error throws: the stream sets badbit and LineReader names it.
    bool fill() {
        if (ended_) return false;
        const std::size_t unread = static_cast<std::size_t>(egptr() - gptr());
        std::memmove(buffer_.data(), gptr(), unread);
        if (unread == buffer_.size()) buffer_.resize(2 * buffer_.size());  // a line longer than the buffer
        setg(buffer_.data(), buffer_.data(), buffer_.data() + unread);
        ssize_t n = -1;
        while (n < 0) {
            n = ::read(fd_, buffer_.data() + unread, buffer_.size() - unread);
            if (n < 0 && errno != EINTR) throw std::runtime_error(std::strerror(errno));
            if (n < 0 && g_stop_signal != 0) n = 0;
        }
        setg(buffer_.data(), buffer_.data(), buffer_.data() + unread + n);
        ended_ = n == 0;
        return n > 0 || unread > 0;
    }

    int fd_;
    std::vector<char> buffer_;
    bool ended_ = false;
};

// The lines [0, n) of `translated` that are all done: what can be written in input order.
std::size_t translated_prefix(const std::vector<std::optional<std::string>>& translated) {
    std::size_t n = 0;
    while (n < translated.size() && translated[n]) ++n;
    return n;
}

// Reads the input a piece at a time and writes each piece's translations (standard output, flushed per
// piece, or the --output file, renamed into place once all are done).
void translate_stream(const TranslateOptions& opt, ModelBundle& bundle) {
    std::ifstream file;
    DescriptorInput standard_input(STDIN_FILENO);
    std::istream piped(&standard_input);
    if (!opt.input.empty()) file = open_text_file(opt.input);
    LineReader reader(opt.input.empty() ? piped : file, opt.input.empty() ? "standard input" : opt.input);
    // A file never pauses; standard input (a pipe, a terminal) may.
    const auto line_ready = [&] { return !opt.input.empty() || standard_input.line_ready(); };
    // The bar needs the file's line count: read the file an extra time only when a bar is drawn.
    auto bar = opt.input.empty() ? nullptr : terminal_progress("translating");
    const std::int64_t total = bar ? count_lines(opt.input) : 0;
    if (total == 0) bar = nullptr;

    std::optional<AtomicFile> output;
    catch_stop_signals(on_stop_signal);
    if (!opt.output.empty()) {
        output.emplace(opt.output);
        std::snprintf(g_output_temp, sizeof g_output_temp, "%s", output->temp_path().c_str());
    }
    std::vector<std::string> lines;
    std::string line;
    std::int64_t done = 0, read = 0, truncated = 0;
    double decoding_seconds = 0;        // --timing: inside translate_lines_until only (no reading, writing)
    std::int64_t output_tokens = 0;     // --timing: the translations' target tokens, EOS not counted
    for (bool more = true; more && g_stop_signal == 0;) {
        lines.clear();
        while (lines.size() < kLinesPerPiece && (lines.empty() || line_ready()) && (more = reader.next(line)))
            lines.push_back(line);
        if (g_stop_signal != 0 || lines.empty()) break;
        read += static_cast<std::int64_t>(lines.size());
        std::int64_t cut = 0;
        ProgressFn progress;
        if (bar) progress = [&](std::int64_t d, std::int64_t) { bar(done + d, total); };
        const auto started = std::chrono::steady_clock::now();
        auto translated = translate_lines_until(*bundle.model, bundle.tokenizers, lines, opt.decode, opt.batch_tokens,
                                                progress, [] { return g_stop_signal != 0; }, &cut);
        decoding_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        truncated += cut;
        // Interrupted: the lines translated from the piece's start are still written.
        lines.resize(translated_prefix(translated));
        for (std::size_t i = 0; i < lines.size(); ++i) lines[i] = std::move(*translated[i]);
        if (opt.timing)
            for (const std::string& out : lines) output_tokens += std::int64_t(bundle.tokenizers.target->encode(out).size());
        const std::string text = join_lines(lines);
        done += static_cast<std::int64_t>(lines.size());
        if (output) {
            output->write(text);
        } else {
            std::cout << text;
            finish_standard_output();  // each piece reaches a line-at-a-time client now; a lost one names why
        }
    }
    if (g_stop_signal != 0) {
        const int sig = g_stop_signal;
        const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
        if (output) {
            output.reset();  // removes the temporary file
            std::cerr << "tapeformer: interrupted by " << name << " after translating " << done << " of the " << read
                      << " input lines read; --output '" << opt.output << "' left as it was\n";
        } else {
            std::cerr << "tapeformer: interrupted by " << name << ": wrote the translations of the first " << done
                      << " input lines; the rest were not translated\n";
        }
        std::signal(sig, SIG_DFL);
        std::raise(sig);
    }
    if (output) output->commit();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    if (opt.timing)
        std::fprintf(stderr, "decoded %lld sentences, %lld target tokens in %.3f s: %.1f tokens/s, %.1f sentences/s (%d thread%s)\n",
                     (long long)done, (long long)output_tokens, decoding_seconds,
                     decoding_seconds > 0 ? double(output_tokens) / decoding_seconds : 0.0,
                     decoding_seconds > 0 ? double(done) / decoding_seconds : 0.0, num_threads(), num_threads() == 1 ? "" : "s");
    if (truncated > 0)
        std::cerr << "tapeformer: note: " << truncated << " of " << done << " input sentences were longer than the model's "
                  << bundle.model->config.max_len - 1 << " source tokens; only their beginning was translated\n";
}

}  // namespace


void add_translate_command(CLI::App& app) {
    auto opt = std::make_shared<TranslateOptions>();
    CLI::App* cmd = app.add_subcommand(
        "translate",
        "Translate text with a trained model: one sentence per input line, one translation per output line\n"
        "(same count and order; an empty line gives an empty line).");
    cmd->add_option("--model", opt->model_dir, "Model directory written by `tapeformer train`")->required();
    add_mask_heads_option(*cmd, opt->mask_heads);
    cmd->add_option("--input", opt->input, "File to translate (default: standard input)")->check(CLI::ExistingFile);
    cmd->add_option("--output", opt->output,
                    "File to write the translations to, replaced only once all are done; Ctrl-C leaves it as it was\n"
                    "(default: standard output, written as each piece of input is translated: at most 2000 lines,\n"
                    "fewer when the input pauses, so a client writing one line at a time gets each answer; Ctrl-C\n"
                    "writes what is translated, says so and stops)");
    add_decode_options(*cmd, opt->decode, opt->batch_tokens);
    add_precision_option(*cmd, opt->precision);
    cmd->add_flag("--timing", opt->timing,
                  "At the end, print to stderr the time spent decoding (reading and writing not counted), the target\n"
                  "tokens of the translations and tokens/s: to compare models (a pruned one: docs/heads.md) or settings");
    cmd->callback([opt]() {
        if (!opt->output.empty()) check_output_path(opt->output, "--output", {opt->input, opt->model_dir});
        apply_precision(opt->precision);
        // The model first: a wrong --model should fail at once, not after the user has typed the input.
        ModelBundle bundle = load_model_dir(opt->model_dir);
        if (bundle.model->config.decoder_only())
            throw std::invalid_argument("translate: " + opt->model_dir + " holds a decoder-only model (a language model, no source "
                                        "side): use tapeformer generate");
        apply_mask_heads(*bundle.model, opt->mask_heads);
        if (!bundle.note.empty()) std::cerr << "tapeformer: note: " << bundle.note << "\n";
        translate_stream(*opt, bundle);
        command_exit_code() = 0;
    });
}

TF_NAMESPACE_END
