// The fuzz targets of targets.h. Each feeds the bytes to the loader exactly as tapeformer's commands do,
// then uses what came back the way they would, so that a value that parses but breaks a later step is
// found too.
#include "targets.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "tapeformer/model_settings.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/data/text.h"
#include "tapeformer/error.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/data/vocab.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/safetensors.h"
#include "tapeformer/run/train.h"
#include "tapeformer/run/train_settings.h"

namespace tf_fuzz {

namespace {

std::string_view bytes_of(const std::uint8_t* data, std::size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

// Loaders that only take a path read the bytes from an anonymous in-memory file (no disk, no cleanup).
class MemoryFile {
public:
    explicit MemoryFile(std::string_view bytes) {
        fd_ = memfd_create("tapeformer-fuzz", 0);
        if (fd_ < 0) throw std::logic_error("memfd_create failed");
        for (std::size_t done = 0; done < bytes.size();) {
            const ssize_t n = write(fd_, bytes.data() + done, bytes.size() - done);
            if (n <= 0) throw std::logic_error("write to memfd failed");
            done += static_cast<std::size_t>(n);
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    ~MemoryFile() { close(fd_); }
    MemoryFile(const MemoryFile&) = delete;
    MemoryFile& operator=(const MemoryFile&) = delete;
    const std::string& path() const { return path_; }

private:
    int fd_ = -1;
    std::string path_;
};

// Lines of the input (split at '\n'), for the targets that take several strings.
std::vector<std::string> split_lines(std::string_view s) {
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start <= s.size()) {
        const std::size_t end = s.find('\n', start);
        if (end == std::string_view::npos) {
            lines.emplace_back(s.substr(start));
            break;
        }
        lines.emplace_back(s.substr(start, end - start));
        start = end + 1;
    }
    return lines;
}

// Models this small are built and loaded; the fuzzer must not spend its time allocating big ones (the
// limits a real load applies to sizes are ModelConfig::validate's).
bool small_enough_to_build(const tf::ModelConfig& c) {
    return c.d_model <= 64 && c.ffn <= 128 && c.enc_layers <= 2 && c.dec_layers <= 2 && c.src_vocab <= 512 &&
           c.tgt_vocab <= 512 && c.max_len <= 512;
}

}  // namespace

void fuzz_safetensors(const std::uint8_t* data, std::size_t size) {
    const tf::SafetensorsFile file = tf::parse_safetensors(bytes_of(data, size), "fuzz.safetensors");
    for (const auto& [name, entry] : file.tensors)
        if (entry.shape.size() <= 4) (void)file.tensor(name);
    // What load_model_dir and load_training_checkpoint do with the metadata.
    tf::ModelConfig config;
    try {
        config = tf::model_config_from_metadata(file.metadata);
        config.validate();
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string("fuzz.safetensors: ") + e.what());
    }
    auto state = file.metadata.find("tapeformer.train_state");
    if (state != file.metadata.end()) (void)tf::train_state_from_json(state->second);
    if (small_enough_to_build(config)) {
        tf::Transformer model(config);
        tf::load_into(model.parameters(), file, /*strict=*/false);
    }
}

void fuzz_run_state(const std::uint8_t* data, std::size_t size) {
    const std::string text(bytes_of(data, size));
    // The three readers share the input: whichever parses it gets to check it.
    for (const std::string& line : split_lines(text)) (void)tf::checkpoint_step(line);
    try {
        (void)tf::train_state_from_json(text);
    } catch (const std::runtime_error&) {
    }
    tf::TrainConfig c = tf::train_config_from_json(text);
    c.out_dir = "fuzz-run";
    c.validate();
}

void fuzz_text(const std::uint8_t* data, std::size_t size) {
    std::istringstream in{std::string(bytes_of(data, size))};
    const std::vector<std::string> lines = tf::read_lines(in, "fuzz.txt");
    std::vector<std::string_view> views(lines.begin(), lines.end());
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    options.vocab_size = 64;
    const auto tokenizer = tf::WordTokenizer::train(views, options);
    for (const std::string& line : lines) (void)tokenizer->decode(tokenizer->encode(line));
}

void fuzz_vocab(const std::uint8_t* data, std::size_t size) {
    MemoryFile file(bytes_of(data, size));
    const tf::WordTokenizer tokenizer(tf::Vocab::load(file.path()));
    for (std::int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
        const std::string piece = tokenizer.id_to_piece(id);
        if (id >= tf::kFirstRealId && tokenizer.piece_to_id(piece) != id)
            throw std::logic_error("vocab entry " + std::to_string(id) + " does not map back to its id");
    }
}

void fuzz_sentencepiece(const std::uint8_t* data, std::size_t size) {
    const tf::SentencePieceTokenizer tokenizer(std::string(bytes_of(data, size)), "fuzz.spm.model");
    const std::vector<std::int32_t> ids = tokenizer.encode("Ein Hund läuft über die Wiese. 123 <unk>");
    (void)tokenizer.decode(ids);
    (void)tokenizer.pieces("a b");
    for (std::int32_t id = 0; id < std::min<std::int32_t>(tokenizer.vocab_size(), 64); ++id)
        (void)tokenizer.id_to_piece(id);
}

void fuzz_toml(const std::uint8_t* data, std::size_t size) {
    // `train --config FILE` as the command reads it (toml++), merged into a TrainConfig and checked.
    MemoryFile file(bytes_of(data, size));
    tf::TrainArguments args;
    args.config_file = file.path();
    args.out_dir = "fuzz-run";
    const tf::TrainConfig c = tf::resolve_train_config(args).config;
    (void)tf::to_toml(c);
    (void)tf::to_json(c);
}

void fuzz_bleu(const std::uint8_t* data, std::size_t size) {
    const std::vector<std::string> lines = split_lines(bytes_of(data, size));
    const std::size_t half = lines.size() / 2;
    const std::vector<std::string> hyps(lines.begin(), lines.begin() + half),
        refs(lines.begin() + half, lines.begin() + 2 * half);
    for (const std::string& line : lines) (void)tf::tokenize_13a(line);
    (void)tf::corpus_chrf(hyps, refs);
    (void)tf::corpus_bleu(hyps, refs);
}

const std::vector<NamedTarget>& all_targets() {
    static const std::vector<NamedTarget> targets = {
        {"safetensors", fuzz_safetensors}, {"run_state", fuzz_run_state},         {"text", fuzz_text},
        {"vocab", fuzz_vocab},             {"sentencepiece", fuzz_sentencepiece}, {"toml", fuzz_toml},
        {"bleu", fuzz_bleu}};
    return targets;
}

std::string run_checked(Target target, const std::uint8_t* data, std::size_t size) {
    // Messages quote what the input holds, line breaks included; the CLI prints them through tf::one_line.
    // What must hold is that the printed line is one line and still says something.
    auto one_line = [](const char* what) -> std::string {
        const std::string printed = tf::one_line(what);
        if (printed.find('\n') != std::string::npos || printed.size() < 10)
            return std::string("error message is not one readable line: ") + printed;
        return "";
    };
    try {
        target(data, size);
        return "";
    } catch (const std::bad_alloc&) {
        return "std::bad_alloc: a size from the input was allocated before it was checked";
    } catch (const std::runtime_error& e) {  // a file that cannot be read as expected
        return one_line(e.what());
    } catch (const std::invalid_argument& e) {  // a setting that is not allowed
        return one_line(e.what());
    } catch (const std::exception& e) {  // std::out_of_range, std::logic_error, a JSON exception leaking out
        return std::string("unexpected exception: ") + e.what();
    }
}

}  // namespace tf_fuzz
