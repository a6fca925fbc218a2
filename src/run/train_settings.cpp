// The settings of `tapeformer train`, once, and everything built from the table: merging, config.toml,
// run.json. See train_settings.h.
#include "tapeformer/run/train_settings.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "tapeformer/run/checkpoint.h"
#include "tapeformer/io.h"
#include "run/json_integer.h"

TF_NAMESPACE_BEGIN

namespace fs = std::filesystem;

namespace {

constexpr double kSteps = 1e12;  // bound of step counts: far beyond any run, far below overflow
constexpr double kDefaultAbsoluteLr = 5e-4;  // --lr when --schedule is not noam and --lr is not given

std::vector<Setting<TrainConfig>> build_table() {
    using T = TrainConfig;
    std::vector<Setting<T>> t;
    const std::string data = "Data", model = "Model", opt = "Optimisation", run = "Run";

    t.push_back(text_setting<T>("train-src", "data.train_src", data, "Training source sentences",
                                [](auto& c) -> auto& { return c.data.train_src; }));
    t.push_back(text_setting<T>("train-tgt", "data.train_tgt", data, "Training target sentences, aligned by line",
                                [](auto& c) -> auto& { return c.data.train_tgt; }));
    t.push_back(text_setting<T>("valid-src", "data.valid_src", data,
                                "Validation source sentences (for loss, BLEU and the best model)",
                                [](auto& c) -> auto& { return c.data.valid_src; }));
    t.push_back(text_setting<T>("valid-tgt", "data.valid_tgt", data, "Validation target sentences",
                                [](auto& c) -> auto& { return c.data.valid_tgt; }));
    t.push_back(choice_setting<T>("tokenizer", "data.tokenizer", data, "Tokenizer: word = whitespace-separated words, bpe or unigram = SentencePiece",
                                  {"word", "bpe", "unigram"}, [](auto& c) -> auto& { return c.data.tokenizer; },
                                  parse_tokenizer_kind, [](TokenizerKind k) { return to_string(k); }));
    t.push_back(integer_setting<T>("vocab-size", "data.vocab_size", data,
                                   "Vocabulary entries (SentencePiece: exact; word: at most, 0 = all)", 0,
                                   static_cast<double>(ModelConfig::kMaxVocab), [](auto& c) -> auto& { return c.data.vocab_size; }));
    t.push_back(bool_setting<T>("joint-vocab", "data.joint_vocab", data, "One vocabulary for both languages", "separate-vocab",
                                [](auto& c) -> auto& { return c.data.joint_vocab; }));
    t.push_back(integer_setting<T>("max-len", "data.max_len", data, "Drop training pairs with more tokens than this on either side",
                                   1, 65535, [](auto& c) -> auto& { return c.data.max_len; }));
    t.push_back(integer_setting<T>("batch-tokens", "data.batch_tokens", data, "Padded tokens per batch: sentences x max(S, T)",
                                   1, 1e8, [](auto& c) -> auto& { return c.data.batch_tokens; }));

    // The model's own settings, stored in run.json under "model" as in the weights file's metadata.
    for (const Setting<ModelConfig>& s : model_settings()) {
        Setting<T> lifted = lift_setting<T>(s, [](auto& c) -> auto& { return c.model; });
        lifted.key = "model." + s.key;
        t.push_back(lifted);
        if (s.name == "ffn") {  // the alias, listed beside the two settings it sets
            Setting<T> layers = integer_setting<T>("layers", "", model, "Encoder and decoder layers (sets both)", 1,
                                                   ModelConfig::kMaxLayers,
                                                   [](auto& c) -> auto& { return c.model.enc_layers; });
            layers.set = [check = layers.set](T& c, const std::string& text) {
                check(c, text);
                c.model.dec_layers = c.model.enc_layers;
            };
            t.push_back(layers);
        }
    }

    t.push_back(choice_setting<T>("optimizer", "optim.optimizer", opt, "Optimizer", {"adam", "adamw", "sgd"},
                                  [](auto& c) -> auto& { return c.optim.optimizer; },
                                  [](const std::string& s) { return s; }, [](const std::string& s) { return s; }));
    t.push_back(real_setting<T>("lr", "optim.lr", opt,
                                "Learning rate: for noam the factor in front of d_model^-0.5 (default 1), for the other\n"
                                "schedules the peak rate itself (default 0.0005)",
                                0, 1000, [](auto& c) -> auto& { return c.optim.schedule.lr; }, true));
    t.push_back(choice_setting<T>("schedule", "optim.schedule", opt, "Learning-rate schedule",
                                  {"noam", "inverse_sqrt", "cosine", "linear", "constant"},
                                  [](auto& c) -> auto& { return c.optim.schedule.kind; }, parse_schedule_kind,
                                  [](ScheduleKind k) { return schedule_kind_name(k); }));
    t.push_back(integer_setting<T>("warmup", "optim.warmup", opt, "Warmup steps", 0, 1e9,
                                   [](auto& c) -> auto& { return c.optim.schedule.warmup; }));
    t.push_back(integer_setting<T>("total-steps", "optim.total_steps", opt,
                                   "Steps over which cosine/linear decay (default: --max-steps)", 0, kSteps,
                                   [](auto& c) -> auto& { return c.optim.schedule.total_steps; }));
    t.push_back(real_setting<T>("min-lr", "optim.min_lr", opt, "Floor of cosine/linear decay", 0, 1000,
                                [](auto& c) -> auto& { return c.optim.schedule.min_lr; }));
    t.push_back(added_later(real_setting<T>(
        "cooldown", "optim.cooldown", opt,
        "Over this last fraction of the run, bring the learning rate down linearly to 0 (0 = off): of\n"
        "--max-steps's steps, or of --time-budget's minutes (then by the clock), whichever stop is nearer.\n"
        "For the schedules that never end (noam, inverse_sqrt, constant): a short run ends with a small\n"
        "learning rate, which scores better; cosine and linear decay by themselves",
        0, 1, [](auto& c) -> auto& { return c.optim.cooldown; }, false, true)));
    t.push_back(real_setting<T>("beta1", "optim.beta1", opt, "Adam beta1", 0, 1, [](auto& c) -> auto& { return c.optim.beta1; },
                                false, true));
    t.push_back(real_setting<T>("beta2", "optim.beta2", opt, "Adam beta2", 0, 1, [](auto& c) -> auto& { return c.optim.beta2; },
                                false, true));
    t.push_back(real_setting<T>("adam-eps", "optim.eps", opt, "Adam epsilon", 0, 1, [](auto& c) -> auto& { return c.optim.eps; },
                                true));
    t.push_back(real_setting<T>("weight-decay", "optim.weight_decay", opt, "Weight decay (L2 for adam/sgd, decoupled for adamw)",
                                0, 10, [](auto& c) -> auto& { return c.optim.weight_decay; }));
    t.push_back(real_setting<T>("momentum", "optim.momentum", opt, "SGD momentum", 0, 1,
                                [](auto& c) -> auto& { return c.optim.momentum; }, false, true));
    t.push_back(real_setting<T>("clip", "optim.clip", opt, "Clip the global gradient norm to this (0 = off)", 0, 1e9,
                                [](auto& c) -> auto& { return c.optim.clip; }));
    t.push_back(added_later(integer_setting<T>(
        "accumulate", "optim.accumulate", opt,
        "Sum the gradients of N consecutive batches into each optimizer step (one global batch of N\n"
        "micro-batches, the loss averaged over all their target tokens): steps, schedules, checkpoints and\n"
        "metrics count optimizer steps; an epoch's last global batch holds the batches that are left.\n"
        "Under mpirun -np R (N >= R) the micro-batches are dealt to the ranks: the same weights, bit for bit",
        1, 65536, [](auto& c) -> auto& { return c.optim.accumulate; })));
    t.push_back(real_setting<T>("label-smoothing", "optim.label_smoothing", opt, "Label smoothing epsilon", 0, 1,
                                [](auto& c) -> auto& { return c.optim.label_smoothing; }, false, true));
    t.push_back(real_setting<T>("ema", "optim.ema", opt,
                                "Keep an exponential moving average of the weights with this decay (0 = off): validation\n"
                                "scores it and model.safetensors holds it (it covers about the last 1/(1 - decay) steps,\n"
                                "and at most the last ~1/9 of the run)",
                                0, 1, [](auto& c) -> auto& { return c.optim.ema; }, false, true));

    t.push_back(integer_setting<T>("seed", "seed", run, "Seed for initialisation, dropout, batch order", 0,
                                   static_cast<double>(std::numeric_limits<std::int64_t>::max()),
                                   [](auto& c) -> auto& { return c.seed; }));
    t.push_back(integer_setting<T>("max-steps", "stop.max_steps", run, "Stop after this many updates (0 = no limit)", 0, kSteps,
                                   [](auto& c) -> auto& { return c.max_steps; }));
    t.push_back(integer_setting<T>("epochs", "stop.epochs", run, "Stop after this many passes over the data (0 = no limit)", 0,
                                   1e9, [](auto& c) -> auto& { return c.epochs; }));
    t.push_back(real_setting<T>("time-budget", "stop.time_budget_minutes", run,
                                "Stop after this many minutes of training (validation not counted; 0 = no limit)", 0, 1e7,
                                [](auto& c) -> auto& { return c.time_budget_minutes; }));
    t.push_back(integer_setting<T>("log-every", "every.log", run, "Steps between log lines and metrics.jsonl entries", 1, kSteps,
                                   [](auto& c) -> auto& { return c.log_every; }));
    t.push_back(integer_setting<T>("valid-every", "every.valid", run, "Steps between validations (0 = at the end of each epoch)",
                                   0, kSteps, [](auto& c) -> auto& { return c.valid_every; }));
    t.push_back(integer_setting<T>("checkpoint-every", "every.checkpoint", run, "Steps between checkpoints", 1, kSteps,
                                   [](auto& c) -> auto& { return c.checkpoint_every; }));
    t.push_back(integer_setting<T>("keep", "every.keep", run, "Step checkpoints to keep", 1, 1e6,
                                   [](auto& c) -> auto& { return c.keep; }));
    t.push_back(added_later(integer_setting<T>("keep-every", "every.keep_every", run,
                                   "Also keep every N-th step's checkpoint for good (0 = none), to study the\n"
                                   "model across training (`tapeformer heads` on each)",
                                   0, kSteps, [](auto& c) -> auto& { return c.keep_every; })));
    t.push_back(added_later(integer_setting<T>("log-heads-every", "every.heads", run,
                                   "Every N steps append per-head batch importance, gradient norms and attention entropy of that\n"
                                   "step to DIR/heads.jsonl (measured with dropout and label smoothing on; no extra pass; 0 = off)",
                                   0, kSteps, [](auto& c) -> auto& { return c.log_heads_every; })));
    t.push_back(added_later(choice_setting<T>(
        "precision", "precision", run,
        "Matrix products in fp32, or bf16 with fp32 sums (PyTorch's CPU autocast recipe: weights, Adam, softmax,\n"
        "layer norm and loss stay fp32; on a CPU without bf16 instructions: fp32, with a note), or auto: bf16\n"
        "where the CPU's bf16 products were measured faster (AMX-BF16; AVX512-BF16 on AMD) and d_model >= " +
            std::to_string(kAutoBf16MinWidth) + ",\n"
        "fp32 elsewhere (a run says so in one line where auto chose bf16); run.json records the precision\n"
        "used. (int8 is for decoding only: translate and eval --precision int8)",
        {"auto", "fp32", "bf16"}, [](auto& c) -> auto& { return c.precision; }, parse_precision,
        [](Precision p) { return precision_name(p); }),
        /*absent=*/"fp32"));  // (runs from before auto trained in fp32)
    t.push_back(bool_setting<T>("valid-bleu", "valid_bleu", run,
                                "Decode the validation set (greedy), score BLEU and exact match, and pick the best model by BLEU",
                                "no-valid-bleu", [](auto& c) -> auto& { return c.valid_bleu; }));
    t.push_back(added_later(bool_setting<T>(
        "overfit-batch", "overfit_batch", run,
        "Train every step on one batch, the first pairs of --train-src/--train-tgt that fit --batch-tokens\n"
        "(no shuffling; dropout as configured). The loss must fall to about 0 (with --label-smoothing 0;\n"
        "otherwise the nll does): a debugging habit. Needs --max-steps or --time-budget",
        "", [](auto& c) -> auto& { return c.overfit_batch; })));
    t.push_back(added_later(text_setting<T>(
        "init-from", "init_from", run,
        "Fine-tune: start from this model directory (or checkpoint) — its model settings (but the dropouts),\n"
        "its weights and its tokenizer — instead of a new model; e.g. a pruned model of heads prune --save",
        [](auto& c) -> auto& { return c.init_from; })));
    t.push_back(integer_setting<T>("valid-bleu-sentences", "valid_bleu_sentences", run,
                                   "Decode only the first N validation sentences (0 = all)", 0, 1e9,
                                   [](auto& c) -> auto& { return c.valid_bleu_sentences; }));
    return t;
}

// One value from one place, with where it came from for errors ("--lr", "run.toml:3: lr", "preset toy: lr").
struct SourcedValue {
    std::string name, value, where;
};

// toml++ 3.3 has undefined behaviour (a TOML_UNREACHABLE in is_non_ascii_horizontal_whitespace) when it
// asks whether a non-ASCII character such as U+00A1 is whitespace, which it does after a value, inside a
// key it is reading and after a line-ending backslash of a multi-line string (found by the fuzz target
// `toml` under UBSan). It never asks inside a comment or inside the quotes of a one-line string value, so
// those are the only places a non-ASCII character is accepted here. Elsewhere TOML allows only ASCII
// anyway, except in quoted keys (train's settings have ASCII names) and in multi-line strings, which are
// refused: a setting is one line. So are arrays and inline tables (see below).
void refuse_what_tomlplusplus_misreads(const std::string& text, const std::string& path) {
    enum class In { code, comment, key_string, value_string } in = In::code;
    char quote = 0;             // the quote that ends the string under way
    bool escaped = false;       // the previous character was a backslash inside a "..." string
    bool after_equals = false;  // only blanks since the line's first '=': a string opened now is its value
    bool equals_seen = false;   // the line has had its '=' (toml++ may scan a bad value past a later one)
    std::size_t line = 1, column = 0;
    const auto refuse = [&](const std::string& what) {
        throw std::invalid_argument(path + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + what);
    };
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char ch = text[i];
        ++column;
        if (ch == '\n') {
            ++line;
            column = 0;
            in = In::code;  // a comment or a one-line string ends with its line (toml++ reports the string)
            escaped = after_equals = equals_seen = false;
            continue;
        }
        if (static_cast<unsigned char>(ch) >= 0x80 && in != In::comment && in != In::value_string)
            refuse("a non-ASCII character is allowed only in a comment or inside the quotes of a value, "
                   "such as train-src = \"données/train.de\"");
        switch (in) {
        case In::comment: break;
        case In::key_string:
        case In::value_string:
            if (escaped) escaped = false;
            else if (ch == '\\' && quote == '"') escaped = true;
            else if (ch == quote) in = In::code;
            break;
        case In::code:
            // Arrays and inline tables are no setting's value, and toml++ asserts on some malformed ones
            // ("x = [[}"): refused before it reads them.
            if (ch == '{' || (ch == '[' && equals_seen))
                refuse("a setting's value is one string, number or true/false, not an array or a table");
            if (ch == '#') in = In::comment;
            if (ch == '"' || ch == '\'') {
                if (text.compare(i, 3, std::string(3, ch)) == 0) refuse("multi-line strings are not supported; a setting is one line");
                quote = ch;
                in = after_equals ? In::value_string : In::key_string;
            }
            after_equals = (ch == '=' && !equals_seen) || (after_equals && (ch == ' ' || ch == '\t'));
            equals_seen = equals_seen || ch == '=';
            break;
        }
    }
}

// The values a config file gives: top-level keys, or keys of a [train] table (TOML, read by toml++).
std::vector<SourcedValue> read_config_file(const std::string& path) {
    // TOML allows no control character but tab, CR and LF anywhere; refusing them here also keeps such
    // bytes away from toml++ 3.3's parser, which asserts on some of them in table headers (found by the
    // fuzz target `toml`; tests/fuzz/regressions/toml/).
    std::string text = read_file(path);
    // A UTF-8 byte order mark is dropped here, so that the checks below see the first line as toml++ does.
    if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
    std::size_t line = 1;
    for (unsigned char ch : text) {
        if (ch == '\n') ++line;
        if ((ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7f)
            throw std::invalid_argument(path + ":" + std::to_string(line) + ": control character " + std::to_string(int(ch)) +
                                        " is not allowed in TOML");
    }
    // The same parser also asserts when a table header does not start with a key ("[\n", "[=]"): a header
    // must be [name] or [[name]] with the name's first character a key character or a quote.
    line = 0;
    for (std::size_t at = 0; at <= text.size();) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        ++line;
        std::size_t i = text.find_first_not_of(" \t", at);
        if (i < end && text[i] == '[') {
            i = text.find_first_not_of(" \t", i + 1);
            if (i < end && text[i] == '[') i = text.find_first_not_of(" \t", i + 1);
            const char c = i < end ? text[i] : '\n';
            if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '"' || c == '\''))
                throw std::invalid_argument(path + ":" + std::to_string(line) + ": a table header must name a table, such as [train]");
        }
        at = end + 1;
    }
    refuse_what_tomlplusplus_misreads(text, path);
    toml::table file;
    try {
        file = toml::parse(text, path);
    } catch (const toml::parse_error& e) {
        throw std::invalid_argument(path + ":" + std::to_string(e.source().begin.line) + ": not valid TOML: " +
                                    std::string(e.description()));
    }
    std::vector<SourcedValue> out;
    // A key given both at top level and under [train] would leave the file's meaning to a rule of reading
    // order: refused, naming both lines.
    std::map<std::string, std::string> seen;  // name -> where
    auto read_value = [&](const toml::key& key, const toml::node& node) {
        const std::string name(key.str());
        const std::string where = path + ":" + std::to_string(node.source().begin.line) + ": " + name;
        const auto [earlier, first] = seen.emplace(name, where);
        if (!first)
            throw std::invalid_argument(where + ": set again; " + earlier->second +
                                        " already sets it (top level and [train] are one set of settings)");
        // "\u0000" is valid TOML, but a path stops at its first NUL: the file would name another path.
        if (auto s = node.value_exact<std::string>(); s && s->find('\0') != std::string::npos)
            throw std::invalid_argument(where + ": a NUL character (\\u0000) is not allowed in a setting");
        if (auto s = node.value_exact<std::string>()) out.push_back({name, *s, where});
        else if (auto i = node.value_exact<std::int64_t>()) out.push_back({name, std::to_string(*i), where});
        else if (auto d = node.value_exact<double>()) out.push_back({name, setting_detail::format_real(*d), where});
        else if (auto b = node.value_exact<bool>()) out.push_back({name, *b ? "true" : "false", where});
        else throw std::invalid_argument(where + ": must be a string, a number or true/false");
    };
    for (auto&& [key, node] : file) {
        if (const toml::table* section = node.as_table()) {
            if (key.str() != "train") throw std::invalid_argument(path + ": section [" + std::string(key.str()) + "] is not [train]");
            for (auto&& [k, n] : *section) read_value(k, n);
        } else {
            read_value(key, node);
        }
    }
    return out;
}

}  // namespace

const std::vector<Setting<TrainConfig>>& train_settings() {
    static const std::vector<Setting<TrainConfig>> table = build_table();
    return table;
}

std::vector<Preset> train_presets() {
    const char* env = std::getenv("TAPEFORMER_MULTI30K");
    const std::string m = env ? env : "../shared/data/multi30k";
    return {
        {"toy",
         "the toy corpus in data/toy: word vocabulary, small model, 800 steps (at most 4.5 minutes of training)",
         {{"train-src", "data/toy/train.src"}, {"train-tgt", "data/toy/train.tgt"}, {"valid-src", "data/toy/valid.src"},
          {"valid-tgt", "data/toy/valid.tgt"}, {"tokenizer", "word"}, {"vocab-size", "0"}, {"tie", "all"},
          {"d-model", "128"}, {"heads", "4"}, {"ffn", "256"}, {"layers", "2"}, {"dropout", "0.1"},
          {"batch-tokens", "3000"}, {"max-len", "40"}, {"lr", "1.0"}, {"warmup", "400"}, {"max-steps", "800"},
          {"time-budget", "4.5"}, {"valid-every", "500"}, {"checkpoint-every", "500"}, {"log-every", "100"},
          {"valid-bleu-sentences", "300"}},
         ""},
        // A decoder-only language model of the toy corpus's English-like side: one sentence per example
        // (BOS + words -> words + EOS). docs/lesson-decoder-only.md shows what `generate` writes after it.
        {"toy-lm",
         "a decoder-only language model (GPT) of the English-like side of data/toy (train.src): word vocabulary,\n"
         "    2 layers, C 64, 600 steps (under a minute on 2 cores); then try tapeformer generate --model DIR",
         {{"train-src", "data/toy/train.src"}, {"valid-src", "data/toy/valid.src"}, {"arch", "decoder-only"},
          {"tokenizer", "word"}, {"vocab-size", "0"}, {"tie", "decoder"}, {"d-model", "64"}, {"heads", "4"},
          {"ffn", "256"}, {"layers", "2"}, {"norm", "pre"}, {"dropout", "0"}, {"batch-tokens", "2000"}, {"max-len", "40"},
          {"schedule", "cosine"}, {"lr", "0.003"}, {"warmup", "50"}, {"min-lr", "0.0001"}, {"max-steps", "600"},
          {"valid-every", "300"}, {"checkpoint-every", "600"}, {"log-every", "100"}},
         ""},
        // The sequence tasks of `tapeformer data copy|reverse` (data/tasks.h), trained to exact match: the lesson
        // that attention routes by position. Measured figures in README.md.
        {"copy",
         "the copy task in data/copy (write it first: tapeformer data copy --out data/copy): 1+1 layers, C 32,\n"
         "    600 steps, validated once at the end, so the model kept is the last (an earlier one that already\n"
         "    scores BLEU 100 on validation may still miss a test sequence where sums round differently)",
         {{"train-src", "data/copy/train.src"}, {"train-tgt", "data/copy/train.tgt"}, {"valid-src", "data/copy/valid.src"},
          {"valid-tgt", "data/copy/valid.tgt"}, {"tokenizer", "word"}, {"vocab-size", "0"}, {"tie", "all"},
          {"d-model", "32"}, {"heads", "2"}, {"ffn", "64"}, {"layers", "1"}, {"dropout", "0"}, {"batch-tokens", "1100"},
          {"max-len", "12"}, {"lr", "1.0"}, {"warmup", "200"}, {"max-steps", "600"}, {"valid-every", "600"},
          {"checkpoint-every", "600"}, {"log-every", "50"}},
         "tapeformer data copy --out data/copy"},
        {"reverse",
         "the reverse task in data/reverse (write it first: tapeformer data reverse --out data/reverse): 1+1 layers,\n"
         "    C 64, cosine decay from lr 0.01 over 1500 steps; 813-818 of the 818 test sequences of a trained length\n"
         "    (1-25) reversed exactly, by CPU (README); sequences of 26-30, longer than any trained on, measure length\n"
         "    generalisation: most fail",
         {{"train-src", "data/reverse/train.src"}, {"train-tgt", "data/reverse/train.tgt"},
          {"valid-src", "data/reverse/valid.src"}, {"valid-tgt", "data/reverse/valid.tgt"}, {"tokenizer", "word"},
          {"vocab-size", "0"}, {"tie", "all"}, {"d-model", "64"}, {"heads", "4"}, {"ffn", "256"}, {"layers", "1"},
          {"dropout", "0"}, {"batch-tokens", "2600"}, {"max-len", "30"}, {"schedule", "cosine"}, {"lr", "0.01"},
          {"warmup", "200"}, {"min-lr", "0.0001"}, {"max-steps", "1500"}, {"valid-every", "250"},
          {"valid-bleu-sentences", "300"}, {"checkpoint-every", "1500"}, {"log-every", "100"}},
         "tapeformer data reverse --out data/reverse"},
        {"multi30k",
         "Multi30k German->English from $TAPEFORMER_MULTI30K (default ../shared/data/multi30k), the reference setup of "
         "../shared/bench/README.md, with a weight average and a cooldown over the run's last 40%",
         {{"train-src", m + "/train.de"}, {"train-tgt", m + "/train.en"}, {"valid-src", m + "/val.de"},
          {"valid-tgt", m + "/val.en"}, {"tokenizer", "unigram"}, {"vocab-size", "8000"}, {"tie", "all"},
          {"d-model", "256"}, {"heads", "4"}, {"ffn", "512"}, {"layers", "3"}, {"dropout", "0.1"},
          {"batch-tokens", "2600"}, {"max-len", "100"}, {"lr", "1.0"}, {"warmup", "800"}, {"cooldown", "0.4"}, {"ema", "0.999"},
          {"epochs", "100"},
          {"valid-every", "1000"}, {"checkpoint-every", "1000"}, {"log-every", "100"}},
         "get Multi30k (see README.md) and set $TAPEFORMER_MULTI30K to its directory"},
    };
}

ResolvedTrainConfig resolve_train_config(const TrainArguments& args) {
    ResolvedTrainConfig r;
    TrainConfig& c = r.config;
    c.out_dir = args.out_dir;
    c.resume = args.resume;
    c.force = args.force;
    c.check_nan = args.check_nan;
    c.threads = args.threads;
    const auto& table = train_settings();

    std::vector<SourcedValue> flags;
    for (const auto& [name, value] : args.flags) flags.push_back({name, value, "--" + name});

    const std::vector<Preset> presets = train_presets();
    const Preset* preset = nullptr;
    if (!args.preset.empty()) {
        std::string names;
        for (const Preset& p : presets) {
            if (p.name == args.preset) preset = &p;
            names += (names.empty() ? "" : ", ") + p.name;
        }
        if (!preset) throw std::invalid_argument("--preset '" + args.preset + "' is not one of: " + names);
    }

    // The sources, from the lowest precedence to the highest; each overrides what came before.
    std::vector<std::vector<SourcedValue>> sources;
    if (args.resume) {
        // The run's own settings (run.json) apply; this call may change only where the run stops and
        // what it logs, validates and keeps, none of which changes a number the training computes.
        const std::set<std::string> stopping = {"max-steps", "epochs", "time-budget"};
        const std::set<std::string> changes = {"log-every", "valid-every", "checkpoint-every", "keep"};
        std::string ignored;
        if (!args.config_file.empty()) ignored += " --config";
        if (!args.preset.empty()) ignored += " --preset";
        std::vector<SourcedValue> applied;
        for (const SourcedValue& v : flags) {
            if (stopping.count(v.name) || changes.count(v.name)) applied.push_back(v);
            else ignored += " " + v.where;
        }
        sources.push_back(applied);
        if (!ignored.empty())
            r.notes.push_back("--resume keeps the run's own settings (the seed, the model, the data and how the best model "
                              "is chosen cannot change mid-run); ignored:" + ignored);
    } else {
        if (preset) {
            std::vector<SourcedValue> values;
            for (const auto& [name, value] : preset->values) values.push_back({name, value, "preset " + preset->name + ": " + name});
            sources.push_back(values);
        }
        if (!args.config_file.empty()) sources.push_back(read_config_file(args.config_file));
        sources.push_back(flags);
    }
    std::set<std::string> given;  // settings some source set
    for (const std::vector<SourcedValue>& source : sources) {
        std::set<std::string> here;
        for (const SourcedValue& v : source) here.insert(v.name);
        if (here.count("layers") && (here.count("enc-layers") || here.count("dec-layers")))
            throw std::invalid_argument(source.front().where + ": --layers sets both --enc-layers and --dec-layers; "
                                        "give either --layers or those two, not both");
        for (const SourcedValue& v : source) {
            const Setting<TrainConfig>* s = find_setting(table, v.name);
            if (!s) throw std::invalid_argument(v.where + ": not a setting of tapeformer train (see tapeformer train --help)");
            apply_setting(*s, c, v.value, v.where);
            given.insert(v.name);
            if (v.name == "layers") given.insert({"enc-layers", "dec-layers"});
        }
    }
    if (args.resume) {
        const auto value = [&](const char* name) { return std::stoll(find_setting(table, name)->get(c)); };
        if (given.count("log-every")) c.resume_changes.log_every = value("log-every");
        if (given.count("valid-every")) c.resume_changes.valid_every = value("valid-every");
        if (given.count("checkpoint-every")) c.resume_changes.checkpoint_every = value("checkpoint-every");
        if (given.count("keep")) c.resume_changes.keep = static_cast<int>(value("keep"));
        if (given.count("max-steps")) c.resume_changes.max_steps = c.max_steps;
        if (given.count("epochs")) c.resume_changes.epochs = c.epochs;
        if (given.count("time-budget")) c.resume_changes.time_budget_minutes = c.time_budget_minutes;
        return r;
    }

    // --init-from DIR trains DIR's model with its settings and tokenizer (Trainer::read_init_model): what the
    // command line and --config said of those is named, as --resume names what it ignores. (A preset's
    // values go unsaid: a preset names a whole recipe, of which --init-from keeps the rest.)
    if (!c.init_from.empty()) {
        std::set<std::string> from_model = {"layers", "tokenizer", "vocab-size", "joint-vocab"};
        for (const Setting<ModelConfig>& s : model_settings()) from_model.insert(s.name);
        for (const char* own : {"dropout", "attention-dropout", "activation-dropout"}) from_model.erase(own);
        std::string ignored;
        for (std::size_t i = preset ? 1 : 0; i < sources.size(); ++i)
            for (const SourcedValue& v : sources[i])
                if (from_model.count(v.name)) ignored += " " + v.where;
        if (!ignored.empty())
            r.notes.push_back("--init-from trains " + c.init_from + "'s model with its own settings and tokenizer (of "
                              "those, only the dropouts may change); ignored:" + ignored);
    }

    // A preset's data that is not there yet: say how to make it rather than "cannot open".
    if (preset && !preset->make_data.empty() && c.data.train_src == preset->values.front().second &&
        !std::ifstream(c.data.train_src))
        throw std::invalid_argument("preset " + preset->name + " reads " + c.data.train_src + ", which does not exist: " +
                                    preset->make_data);

    // Defaults that follow from other settings.
    if (!given.count("attention-dropout")) c.model.attention_dropout = c.model.dropout;
    if (!given.count("activation-dropout")) c.model.activation_dropout = c.model.dropout;
    if (c.model.decoder_only() && !given.count("valid-bleu")) c.valid_bleu = false;  // a language model: validated by its loss
    Schedule& schedule = c.optim.schedule;
    if (schedule.kind != ScheduleKind::Noam) {
        if (!given.count("lr")) {
            schedule.lr = kDefaultAbsoluteLr;
        } else if (schedule.lr > 0.01) {
            r.notes.push_back("--lr " + setting_detail::format_real(schedule.lr) + " is the peak learning rate itself with --schedule " +
                              schedule_kind_name(schedule.kind) + " (only noam's --lr is a factor); Transformers usually "
                              "train with 1e-4 to 1e-3");
        }
    }
    const bool decays = schedule.kind == ScheduleKind::Cosine || schedule.kind == ScheduleKind::Linear;
    if (decays && schedule.total_steps == 0 && c.max_steps == 0)
        throw std::invalid_argument(std::string("--schedule ") + schedule_kind_name(schedule.kind) +
                                    " decays over --total-steps, which defaults to --max-steps; with only --time-budget "
                                    "or --epochs the number of steps is not known: give --max-steps or --total-steps");
    if (decays && c.optim.cooldown > 0)
        throw std::invalid_argument(std::string("--cooldown with --schedule ") + schedule_kind_name(schedule.kind) +
                                    ": that schedule decays to --min-lr at --total-steps by itself; the cooldown is for "
                                    "noam, inverse_sqrt and constant");
    if (schedule.total_steps == 0) schedule.total_steps = c.max_steps;
    schedule.d_model = c.model.d_model;
    check_schedule_covers_run(c, false);
    return r;
}

void check_schedule_covers_run(const TrainConfig& c, bool resumed) {
    const Schedule& s = c.optim.schedule;
    if (s.kind != ScheduleKind::Cosine && s.kind != ScheduleKind::Linear) return;
    if (s.min_lr > 0 || c.max_steps <= s.total_steps) return;
    const std::string steps = std::to_string(s.total_steps + 1) + " to " + std::to_string(c.max_steps);
    const std::string ends = std::string("--schedule ") + schedule_kind_name(s.kind) + " reaches --min-lr 0 at --total-steps " +
                             std::to_string(s.total_steps);
    if (resumed)
        throw std::invalid_argument("--resume --max-steps " + std::to_string(c.max_steps) + ": the run's " + ends +
                                    ", so steps " + steps + " would train at learning rate 0; a resumed run keeps its "
                                    "schedule: stop at " + std::to_string(s.total_steps) +
                                    " or train a new run with a larger --total-steps");
    throw std::invalid_argument("--max-steps " + std::to_string(c.max_steps) + " runs past the end of the schedule: " + ends +
                                ", so steps " + steps + " would train at learning rate 0; give --total-steps " +
                                std::to_string(c.max_steps) + " (or a --min-lr above 0)");
}

namespace {

// `text` as a one-line TOML basic string: quotes, backslashes and control characters escaped ("\n", "\t",
// "\u001B"), the rest (UTF-8 included) as it is, so that --config reads every written value back. toml++
// writes a value with a newline as a multi-line string, which read_config_file refuses.
std::string toml_basic_string(const std::string& text) {
    std::string out = "\"";
    for (const char ch : text) {
        const unsigned char u = static_cast<unsigned char>(ch);
        switch (ch) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\t': out += "\\t"; break;
        case '\n': out += "\\n"; break;
        case '\f': out += "\\f"; break;
        case '\r': out += "\\r"; break;
        default:
            if (u < 0x20 || u == 0x7f) {
                char escape[8];
                std::snprintf(escape, sizeof escape, "\\u%04X", u);
                out += escape;
            } else {
                out += ch;
            }
        }
    }
    return out + "\"";
}

}  // namespace

std::string to_toml(const TrainConfig& c) {
    std::ostringstream out;
    out << "# tapeformer train: the resolved settings of this run.\n"
           "# Repeat it with: tapeformer train --config config.toml --out NEWDIR\n";
    std::string group;
    for (const Setting<TrainConfig>& s : train_settings()) {
        if (s.name.empty() || s.key.empty()) continue;  // stored-only values and aliases
        if (s.group != group) out << "\n# " << (group = s.group) << "\n";
        out << s.name << " = ";
        if (s.type == SettingType::Text || s.type == SettingType::Choice)
            out << toml_basic_string(s.get(c));
        else
            out << s.get(c);
        out << "\n";
    }
    return out.str();
}

namespace {

nlohmann::json::json_pointer json_path(const std::string& key) {  // "optim.lr" -> /optim/lr
    std::string path = "/" + key;
    for (char& ch : path)
        if (ch == '.') ch = '/';
    return nlohmann::json::json_pointer(path);
}

}  // namespace

std::string to_json(const TrainConfig& c) {
    nlohmann::json j;
    for (const Setting<TrainConfig>& s : train_settings()) {
        if (s.key.empty()) continue;
        nlohmann::json& slot = j[json_path(s.key)];
        const std::string value = s.get(c);
        switch (s.type) {
            case SettingType::Integer: slot = std::stoll(value); break;
            case SettingType::Real: slot = std::stod(value); break;
            case SettingType::Bool: slot = value == "true"; break;
            case SettingType::Text:
            case SettingType::Choice: slot = value; break;
        }
    }
    j["format"] = kCheckpointFormat;
    return j.dump(2) + "\n";
}

TrainConfig train_config_from_json(const std::string& text) {
    TrainConfig c;
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        const int format = json_integer<int>(j.at("format"), "format");
        if (format != kCheckpointFormat)
            throw std::runtime_error("format " + std::to_string(format) + ", this build reads " +
                                     std::to_string(kCheckpointFormat) + " (written by another version of tapeformer)");
        for (const Setting<TrainConfig>& s : train_settings()) {
            if (s.key.empty()) continue;
            const auto path = json_path(s.key);
            if (!j.contains(path)) {
                if (s.required) throw std::runtime_error("\"" + s.key + "\" is missing");
                // written by an older version: what it ran with
                if (!s.absent.empty()) apply_setting(s, c, s.absent, "\"" + s.key + "\" (absent)");
                continue;
            }
            const nlohmann::json& v = j.at(path);  // older versions wrote the model's values as strings
            apply_setting(s, c, v.is_string() ? v.get<std::string>() : v.dump(),
                          "\"" + s.key + "\"" + (s.name.empty() ? "" : " (--" + s.name + ")"));
        }
        c.optim.schedule.d_model = c.model.d_model;
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string("run.json cannot be used: ") + e.what());
    }
    return c;
}

// ---- checks and run.json ----------------------------------------------------------------------------------------

void TrainConfig::validate() const {
    auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
    if (out_dir.empty()) fail("train: --out DIR is required");
    if (resume && force)
        fail("train: --resume continues the run in '" + out_dir + "' and --force starts it over: give one of them");
    // Every number within the bounds of its setting (train_settings.h): finite, since run.json must hold
    // it and JSON has no infinity or NaN, and small enough not to overflow.
    for (const Setting<TrainConfig>& s : train_settings())
        if (const std::string problem = setting_problem(s, *this); !problem.empty())
            fail("train: " + (s.name.empty() ? s.key : "--" + s.name) + " " + problem);
    if (model.decoder_only()) {
        // A language model of one text: no target side (see docs/lesson-decoder-only.md).
        if (!resume && data.train_src.empty()) fail("train: --arch decoder-only needs --train-src FILE, the text to model");
        if (!data.train_tgt.empty() || !data.valid_tgt.empty())
            fail("train: --arch decoder-only learns one text from --train-src (and --valid-src); --train-tgt and --valid-tgt "
                 "are for --arch encoder-decoder");
        if (valid_bleu) fail("train: --valid-bleu scores translations; a decoder-only model is validated by its loss");
    } else {
        if (!resume && (data.train_src.empty() || data.train_tgt.empty()))
            fail("train: --train-src and --train-tgt are required (or --preset toy / multi30k)");
        if (data.valid_src.empty() != data.valid_tgt.empty())
            fail("train: give both --valid-src and --valid-tgt, or neither");
    }
    // A resumed run keeps the stopping rules in its run.json unless this call gives new ones.
    if (!resume && max_steps <= 0 && epochs <= 0 && time_budget_minutes <= 0)
        fail("train: say when to stop: --max-steps, --epochs or --time-budget");
    if (data.batch_tokens < data.max_len + 1)
        fail("train: --batch-tokens " + std::to_string(data.batch_tokens) + " cannot hold one sentence of --max-len " +
             std::to_string(data.max_len) + " (+1 for BOS/EOS)");
    if (data.tokenizer != TokenizerKind::word && data.vocab_size < 8)
        fail("train: --vocab-size must be at least 8 for SentencePiece, got " + std::to_string(data.vocab_size));
    if (model.tie == Tying::All && !data.joint_vocab && !model.decoder_only())
        fail("train: --tie all shares one embedding table between the languages, which needs --joint-vocab");
    if (resume_changes.log_every.value_or(1) < 1 || resume_changes.checkpoint_every.value_or(1) < 1 ||
        resume_changes.valid_every.value_or(0) < 0 || resume_changes.keep.value_or(1) < 1)
        fail("train: --log-every, --checkpoint-every and --keep must be at least 1 (--valid-every at least 0)");
    if (overfit_batch && optim.accumulate > 1)
        fail("train: --overfit-batch trains on one batch, so there is nothing to accumulate: give --accumulate 1");
    if (overfit_batch && (epochs > 0 || (max_steps <= 0 && time_budget_minutes <= 0)))
        fail("train: --overfit-batch repeats one batch, so epochs do not end: stop it with --max-steps or --time-budget");
    optim.schedule.validate();
    ModelConfig m = model;
    m.src_vocab = m.tgt_vocab = std::max<std::int64_t>(m.src_vocab, 8);  // the real sizes come from the tokenizer
    m.validate();
}

// The settings (by run.json key) that a run may change mid-run: where it stops and what it logs, validates
// and keeps (TrainConfig::ResumeChanges), none of which changes a number the training computes; and the
// data files' paths, whose contents are compared instead (a file moved and named anew in run.json is the
// same data). Every other setting decides the run and must stay what its checkpoints were trained with.
bool may_change_mid_run(const std::string& key) {
    static const std::set<std::string> keys = {
        "stop.max_steps", "stop.epochs",    "stop.time_budget_minutes", "every.log",      "every.valid",
        "every.checkpoint", "every.keep",   "every.keep_every",         "every.heads",    "data.train_src",
        "data.train_tgt", "data.valid_src", "data.valid_tgt"};
    return keys.count(key) > 0;
}

// DIR/run.json: the settings (train_settings.h to_json) and the run's identity.
std::string run_json(const TrainConfig& c, const RunIdentity& identity) {
    nlohmann::json j = nlohmann::json::parse(to_json(c));
    if (!identity.run_id.empty()) j["run_id"] = identity.run_id;
    for (const auto& [key, file] : identity.data)
        j["data_files"][key] = {{"path", file.path}, {"bytes", file.bytes}, {"crc32c", file.crc32c}};
    return j.dump(2) + "\n";
}

RunIdentity run_identity_from_json(const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text);
    RunIdentity identity;
    if (j.contains("run_id")) {
        identity.run_id = j.at("run_id").get<std::string>();
        if (identity.run_id.empty()) throw std::runtime_error("\"run_id\" is empty");
    }
    if (j.contains("data_files")) {
        for (const auto& [name, f] : j.at("data_files").items()) {
            const std::string key = name;  // a copy: C++17 lambdas cannot capture a structured binding (clang)
            if (std::none_of(std::begin(kDataSlots), std::end(kDataSlots), [&](const DataSlot& d) { return key == d.key; }))
                throw std::runtime_error("\"data_files\" has an entry '" + key + "', which is no data file of a run");
            identity.data[key] = DataFile{f.at("path").get<std::string>(),
                                          json_integer<std::int64_t>(f.at("bytes"), "data_files." + key + ".bytes"),
                                          f.at("crc32c").get<std::string>()};
        }
    }
    return identity;
}

TrainConfig load_run_config(const std::string& dir, RunIdentity* identity) {
    const std::string path = (fs::path(dir) / "run.json").string();
    if (!fs::exists(path))
        throw std::runtime_error("cannot resume: '" + dir + "' holds no run.json (is it a tapeformer training directory?)");
    try {
        const std::string text = read_file(path);
        TrainConfig c = train_config_from_json(text);
        c.out_dir = dir;
        c.validate();  // an edited run.json (--checkpoint-every 0 would divide by zero) is refused here
        if (identity) {
            try {
                *identity = run_identity_from_json(text);
            } catch (const std::exception& e) {
                throw std::runtime_error(std::string("run.json cannot be used: ") + e.what());
            }
        }
        return c;
    } catch (const std::exception& e) {
        throw std::runtime_error(path + ": " + e.what());
    }
}

TF_NAMESPACE_END
