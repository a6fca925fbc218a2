// The copy and reverse tasks: each pair is a run of uniformly drawn symbols and its copy or reversal.
#include "tapeformer/data/tasks.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "tapeformer/io.h"
#include "tapeformer/random.h"

TF_NAMESPACE_BEGIN

const char* to_string(SequenceTask task) { return task == SequenceTask::copy ? "copy" : "reverse"; }

SequenceTaskOptions SequenceTaskOptions::defaults_for(SequenceTask task) {
    SequenceTaskOptions o;
    o.task = task;
    if (task == SequenceTask::copy) {  // the Annotated Transformer: V = 11 with 0 for padding, length 10
        o.train = 20000;
        o.symbols = 10;
        o.first_symbol = 1;
        o.train_min_len = o.train_max_len = 10;
        o.eval_min_len = o.eval_max_len = 10;
    }
    return o;
}

namespace {

void check_range(const char* name, int value, int lo, int hi) {
    if (value < lo || value > hi)
        throw std::invalid_argument(std::string("sequence task: ") + name + " must be in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "], got " + std::to_string(value));
}

// One pair: the length uniform in [min_len, max_len], then each symbol uniform over the symbols.
SequencePair draw_pair(Rng& rng, const SequenceTaskOptions& opt, int min_len, int max_len) {
    const int len = min_len + int(rng.below(std::uint64_t(max_len - min_len + 1)));
    std::vector<std::string> words(static_cast<std::size_t>(len));
    for (auto& w : words) w = std::to_string(opt.first_symbol + int(rng.below(std::uint64_t(opt.symbols))));
    auto join = [](const std::vector<std::string>& ws) {
        std::string line;
        for (const auto& w : ws) line += (line.empty() ? "" : " ") + w;
        return line;
    };
    SequencePair p;
    p.src = join(words);
    if (opt.task == SequenceTask::reverse) std::reverse(words.begin(), words.end());
    p.tgt = join(words);
    return p;
}

}  // namespace

SequenceTaskData generate_sequence_task(const SequenceTaskOptions& opt) {
    constexpr int kMaxPairs = 10'000'000, kMaxLen = 1000;
    check_range("--train", opt.train, 1, kMaxPairs);
    check_range("--valid", opt.valid, 1, kMaxPairs);
    check_range("--test", opt.test, 1, kMaxPairs);
    check_range("--symbols", opt.symbols, 1, 100000);
    check_range("--first-symbol", opt.first_symbol, 0, 1000000);
    check_range("--train-min-len", opt.train_min_len, 1, kMaxLen);
    check_range("--train-max-len", opt.train_max_len, opt.train_min_len, kMaxLen);
    check_range("--eval-min-len", opt.eval_min_len, 1, kMaxLen);
    check_range("--eval-max-len", opt.eval_max_len, opt.eval_min_len, kMaxLen);
    Rng rng(opt.seed);
    SequenceTaskData data;
    for (int i = 0; i < opt.train; ++i) data.train.push_back(draw_pair(rng, opt, opt.train_min_len, opt.train_max_len));
    for (int i = 0; i < opt.valid; ++i) data.valid.push_back(draw_pair(rng, opt, opt.eval_min_len, opt.eval_max_len));
    for (int i = 0; i < opt.test; ++i) data.test.push_back(draw_pair(rng, opt, opt.eval_min_len, opt.eval_max_len));
    return data;
}

void write_sequence_task(const std::string& out_dir, const SequenceTaskOptions& opt) {
    namespace fs = std::filesystem;
    if (out_dir.empty()) throw std::runtime_error("sequence task: the output directory path is empty");
    const SequenceTaskData data = generate_sequence_task(opt);  // every option checked before the disk is touched
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec || !fs::is_directory(out_dir))
        throw std::runtime_error("cannot create directory " + out_dir + (ec ? ": " + ec.message() : ": not a directory"));
    for (auto [name, pairs] : {std::pair{"train", &data.train}, {"valid", &data.valid}, {"test", &data.test}}) {
        std::string src, tgt;
        for (const SequencePair& p : *pairs) {
            src += p.src + '\n';
            tgt += p.tgt + '\n';
        }
        const std::string base = (fs::path(out_dir) / name).string();
        write_file_atomic(base + ".src", src);
        write_file_atomic(base + ".tgt", tgt);
    }
}

TF_NAMESPACE_END
