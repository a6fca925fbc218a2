// `tapeformer train`: every model and optimisation setting as a flag, TOML config files, presets.
// The callback only fills a TrainConfig and calls tf::train (src/train/train.cpp).
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "tapeformer/blas.h"
#include "tapeformer/cli/commands.h"
#include "tapeformer/train.h"

TF_NAMESPACE_BEGIN

namespace {

// A preset fills in settings the user did not give (on the command line or in --config).
struct Preset {
    std::string description;
    std::map<std::string, std::string> values;  // option name (without --) -> value
};

std::string multi30k_dir() {
    const char* env = std::getenv("TAPEFORMER_MULTI30K");
    return env ? env : "../shared/data/multi30k";
}

std::map<std::string, Preset> presets() {
    const std::string m = multi30k_dir();
    return {
        {"toy",
         {"the toy corpus in data/toy: word vocabulary, small model, 800 steps (at most 4.5 minutes of training)",
          {{"train-src", "data/toy/train.src"}, {"train-tgt", "data/toy/train.tgt"}, {"valid-src", "data/toy/valid.src"},
           {"valid-tgt", "data/toy/valid.tgt"}, {"tokenizer", "word"}, {"vocab-size", "0"}, {"tie", "all"},
           {"d-model", "128"}, {"heads", "4"}, {"ffn", "256"}, {"layers", "2"}, {"dropout", "0.1"},
           {"batch-tokens", "3000"}, {"max-len", "40"}, {"lr", "1.0"}, {"warmup", "400"}, {"max-steps", "800"}, {"time-budget", "4.5"},
           {"valid-every", "500"}, {"checkpoint-every", "500"}, {"log-every", "100"}, {"valid-bleu-sentences", "300"}}}},
        // The sequence tasks of `tapeformer data copy|reverse` (data/tasks.h), trained to exact match: the lesson
        // that attention routes by position. Measured figures in README.md ("Toy tasks").
        {"copy",
         {"the copy task in data/copy (write it first: tapeformer data copy --out data/copy): 1+1 layers, C 32,\n"
          "    400 steps; greedy BLEU 100 and every test sequence copied exactly from step 300",
          {{"train-src", "data/copy/train.src"}, {"train-tgt", "data/copy/train.tgt"}, {"valid-src", "data/copy/valid.src"},
           {"valid-tgt", "data/copy/valid.tgt"}, {"tokenizer", "word"}, {"vocab-size", "0"}, {"tie", "all"},
           {"d-model", "32"}, {"heads", "2"}, {"ffn", "64"}, {"layers", "1"}, {"dropout", "0"}, {"batch-tokens", "1100"},
           {"max-len", "12"}, {"lr", "1.0"}, {"warmup", "200"}, {"max-steps", "400"}, {"valid-every", "100"},
           {"checkpoint-every", "400"}, {"log-every", "50"}}}},
        {"reverse",
         {"the reverse task in data/reverse (write it first: tapeformer data reverse --out data/reverse): 1+1 layers,\n"
          "    C 64, cosine decay from lr 0.01 over 1500 steps; every test sequence of a trained length (1-25) reversed\n"
          "    exactly (test sequences of 26-30, longer than any trained on, measure length generalisation: most fail)",
          {{"train-src", "data/reverse/train.src"}, {"train-tgt", "data/reverse/train.tgt"},
           {"valid-src", "data/reverse/valid.src"}, {"valid-tgt", "data/reverse/valid.tgt"}, {"tokenizer", "word"},
           {"vocab-size", "0"}, {"tie", "all"}, {"d-model", "64"}, {"heads", "4"}, {"ffn", "256"}, {"layers", "1"},
           {"dropout", "0"}, {"batch-tokens", "2600"}, {"max-len", "30"}, {"schedule", "cosine"}, {"lr", "0.01"},
           {"warmup", "200"}, {"min-lr", "0.0001"}, {"max-steps", "1500"}, {"valid-every", "250"},
           {"valid-bleu-sentences", "300"}, {"checkpoint-every", "1500"}, {"log-every", "100"}}}},
        {"multi30k",
         {"Multi30k German->English from $TAPEFORMER_MULTI30K (default ../shared/data/multi30k), the reference setup of "
          "../shared/bench/README.md",
          {{"train-src", m + "/train.de"}, {"train-tgt", m + "/train.en"}, {"valid-src", m + "/val.de"},
           {"valid-tgt", m + "/val.en"}, {"tokenizer", "unigram"}, {"vocab-size", "8000"}, {"tie", "all"},
           {"d-model", "256"}, {"heads", "4"}, {"ffn", "512"}, {"layers", "3"}, {"dropout", "0.1"},
           {"batch-tokens", "2600"}, {"max-len", "100"}, {"lr", "1.0"}, {"warmup", "800"}, {"epochs", "100"},
           {"valid-every", "1000"}, {"checkpoint-every", "1000"}, {"log-every", "100"}}}},
    };
}

// The resolved settings as a CLI11 config file: every option of `train` with its final value, so
// `tapeformer train --config DIR/config.toml --out NEW` repeats the run.
std::string to_toml(const TrainConfig& c) {
    auto q = [](const std::string& v) { return "\"" + v + "\""; };
    auto num = [](double v) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        return std::string(buf);
    };
    const Schedule& s = c.optim.schedule;
    std::vector<std::pair<std::string, std::string>> kv = {
        {"train-src", q(c.data.train_src)}, {"train-tgt", q(c.data.train_tgt)},
        {"valid-src", q(c.data.valid_src)}, {"valid-tgt", q(c.data.valid_tgt)},
        {"tokenizer", q(to_string(c.data.tokenizer))}, {"vocab-size", std::to_string(c.data.vocab_size)},
        {"joint-vocab", c.data.joint_vocab ? "true" : "false"},
        {"max-len", std::to_string(c.data.max_len)}, {"batch-tokens", std::to_string(c.data.batch_tokens)},
        {"d-model", std::to_string(c.model.d_model)}, {"heads", std::to_string(c.model.heads)},
        {"ffn", std::to_string(c.model.ffn)}, {"enc-layers", std::to_string(c.model.enc_layers)},
        {"dec-layers", std::to_string(c.model.dec_layers)}, {"dropout", num(c.model.dropout)},
        {"attention-dropout", num(c.model.attention_dropout)}, {"activation-dropout", num(c.model.activation_dropout)},
        {"norm", q(to_string(c.model.norm))}, {"activation", q(to_string(c.model.activation))},
        {"tie", q(to_string(c.model.tie))}, {"positional", q(to_string(c.model.positional))},
        {"max-positions", std::to_string(c.model.max_len)},
        {"optimizer", q(c.optim.optimizer)}, {"lr", num(s.lr)}, {"schedule", q(schedule_kind_name(s.kind))},
        {"warmup", std::to_string(s.warmup)}, {"total-steps", std::to_string(s.total_steps)}, {"min-lr", num(s.min_lr)},
        {"beta1", num(c.optim.beta1)}, {"beta2", num(c.optim.beta2)}, {"adam-eps", num(c.optim.eps)},
        {"weight-decay", num(c.optim.weight_decay)}, {"momentum", num(c.optim.momentum)}, {"clip", num(c.optim.clip)},
        {"label-smoothing", num(c.optim.label_smoothing)}, {"seed", std::to_string(c.seed)},
        {"max-steps", std::to_string(c.max_steps)}, {"epochs", std::to_string(c.epochs)},
        {"time-budget", num(c.time_budget_minutes)}, {"log-every", std::to_string(c.log_every)},
        {"valid-every", std::to_string(c.valid_every)}, {"checkpoint-every", std::to_string(c.checkpoint_every)},
        {"keep", std::to_string(c.keep)}, {"keep-every", std::to_string(c.keep_every)},
        {"log-heads-every", std::to_string(c.log_heads_every)}, {"valid-bleu", c.valid_bleu ? "true" : "false"},
        {"valid-bleu-sentences", std::to_string(c.valid_bleu_sentences)},
        {"overfit-batch", c.overfit_batch ? "true" : "false"}};
    std::string out = "# tapeformer train: the resolved settings of this run.\n"
                      "# Repeat it with: tapeformer train --config config.toml --out NEWDIR\n";
    for (const auto& [k, v] : kv) out += k + "=" + v + "\n";
    return out;
}

}  // namespace

void add_train_command(CLI::App& app) {
    auto c = std::make_shared<TrainConfig>();
    auto preset = std::make_shared<std::string>();
    auto layers = std::make_shared<std::int64_t>(0);
    auto strings = std::make_shared<std::map<std::string, std::string>>();  // enum-valued options as text
    (*strings)["tokenizer"] = "bpe";
    (*strings)["norm"] = "post";
    (*strings)["activation"] = "relu";
    (*strings)["tie"] = "none";
    (*strings)["positional"] = "sinusoidal";
    (*strings)["schedule"] = "noam";
    c->optim.schedule.lr = 1.0;
    c->optim.schedule.warmup = 4000;

    std::string preset_help = "Fill in unset options from a preset:";
    for (const auto& [name, p] : presets()) preset_help += "\n  " + name + ": " + p.description;

    CLI::App* cmd = app.add_subcommand("train", "Train a translation model on two aligned text files (one sentence per line).\n"
                                                "Example: tapeformer train --preset toy --out runs/toy");
    auto config_file = std::make_shared<std::string>();
    cmd->add_option("--config", *config_file,
                    "Read settings from a TOML file of option=value lines, such as the DIR/config.toml a run writes;\n"
                    "options on the command line win over the file, the file over --preset")
        ->check(CLI::ExistingFile);
    cmd->add_option("--preset", *preset, preset_help)->check(CLI::IsMember({"toy", "multi30k", "copy", "reverse"}));

    auto data = "Data";
    cmd->add_option("--train-src", c->data.train_src, "Training source sentences")->group(data);
    cmd->add_option("--train-tgt", c->data.train_tgt, "Training target sentences, aligned by line")->group(data);
    cmd->add_option("--valid-src", c->data.valid_src, "Validation source sentences (for loss, BLEU and the best model)")->group(data);
    cmd->add_option("--valid-tgt", c->data.valid_tgt, "Validation target sentences")->group(data);
    cmd->add_option("--tokenizer", (*strings)["tokenizer"], "word (whitespace), bpe or unigram (SentencePiece)")
        ->check(CLI::IsMember({"word", "bpe", "unigram"}))->capture_default_str()->group(data);
    cmd->add_option("--vocab-size", c->data.vocab_size, "Vocabulary entries (SentencePiece: exact; word: at most, 0 = all)")
        ->check(number_above(0, false))->capture_default_str()->group(data);
    cmd->add_flag("--joint-vocab,!--separate-vocab", c->data.joint_vocab, "One vocabulary for both languages (default)")->group(data);
    cmd->add_option("--max-len", c->data.max_len, "Drop training pairs with more tokens than this on either side")
        ->check(number_above(0, true))->capture_default_str()->group(data);
    cmd->add_option("--batch-tokens", c->data.batch_tokens, "Padded tokens per batch: sentences x max(S, T)")
        ->check(number_above(0, true))->capture_default_str()->group(data);

    auto model = "Model";
    cmd->add_option("--d-model", c->model.d_model, "Model width C")->check(number_above(0, true))->capture_default_str()->group(model);
    cmd->add_option("--heads", c->model.heads, "Attention heads H (d-model must be divisible by it)")
        ->check(number_above(0, true))->capture_default_str()->group(model);
    cmd->add_option("--ffn", c->model.ffn, "Feed-forward inner width F")->check(number_above(0, true))->capture_default_str()->group(model);
    cmd->add_option("--layers", *layers, "Encoder and decoder layers (sets both)")->check(number_above(0, true))->group(model);
    cmd->add_option("--enc-layers", c->model.enc_layers, "Encoder layers")->check(number_above(0, true))->capture_default_str()->group(model);
    cmd->add_option("--dec-layers", c->model.dec_layers, "Decoder layers")->check(number_above(0, true))->capture_default_str()->group(model);
    cmd->add_option("--dropout", c->model.dropout, "Dropout on embeddings and sublayer outputs")
        ->check(CLI::Range(0.0, 0.99))->capture_default_str()->group(model);
    cmd->add_option("--attention-dropout", c->model.attention_dropout, "Dropout on attention weights (default: --dropout)")
        ->check(CLI::Range(0.0, 0.99))->group(model);
    cmd->add_option("--activation-dropout", c->model.activation_dropout, "Dropout inside the FFN (default: --dropout)")
        ->check(CLI::Range(0.0, 0.99))->group(model);
    cmd->add_option("--norm", (*strings)["norm"], "LayerNorm position: post (the paper) or pre")
        ->check(CLI::IsMember({"post", "pre"}))->capture_default_str()->group(model);
    cmd->add_option("--activation", (*strings)["activation"], "FFN activation: relu or gelu")
        ->check(CLI::IsMember({"relu", "gelu"}))->capture_default_str()->group(model);
    cmd->add_option("--tie", (*strings)["tie"], "Embedding tying: none, decoder (target embedding = output layer), all")
        ->check(CLI::IsMember({"none", "decoder", "all"}))->capture_default_str()->group(model);
    cmd->add_option("--positional", (*strings)["positional"], "Positional encoding: sinusoidal or learned")
        ->check(CLI::IsMember({"sinusoidal", "learned"}))->capture_default_str()->group(model);
    cmd->add_option("--max-positions", c->model.max_len, "Longest sequence the positional table covers")
        ->check(number_above(0, true))->capture_default_str()->group(model);

    auto opt = "Optimisation";
    cmd->add_option("--optimizer", c->optim.optimizer, "adam, adamw or sgd")
        ->check(CLI::IsMember({"adam", "adamw", "sgd"}))->capture_default_str()->group(opt);
    cmd->add_option("--lr", c->optim.schedule.lr, "Learning rate (for noam: the factor in front of d_model^-0.5)")
        ->check(number_above(0, true))->capture_default_str()->group(opt);
    cmd->add_option("--schedule", (*strings)["schedule"], "noam, inverse_sqrt, cosine, linear or constant")
        ->check(CLI::IsMember({"noam", "inverse_sqrt", "cosine", "linear", "constant"}))->capture_default_str()->group(opt);
    cmd->add_option("--warmup", c->optim.schedule.warmup, "Warmup steps")->check(number_above(0, false))->capture_default_str()->group(opt);
    cmd->add_option("--total-steps", c->optim.schedule.total_steps, "Steps over which cosine/linear decay (default: --max-steps)")
        ->check(number_above(0, false))->group(opt);
    cmd->add_option("--min-lr", c->optim.schedule.min_lr, "Floor of cosine/linear decay")->check(number_above(0, false))->group(opt);
    cmd->add_option("--beta1", c->optim.beta1, "Adam beta1")->check(CLI::Range(0.0, 0.999999))->capture_default_str()->group(opt);
    cmd->add_option("--beta2", c->optim.beta2, "Adam beta2")->check(CLI::Range(0.0, 0.999999))->capture_default_str()->group(opt);
    cmd->add_option("--adam-eps", c->optim.eps, "Adam epsilon")->check(number_above(0, true))->capture_default_str()->group(opt);
    cmd->add_option("--weight-decay", c->optim.weight_decay, "Weight decay (L2 for adam/sgd, decoupled for adamw)")
        ->check(number_above(0, false))->capture_default_str()->group(opt);
    cmd->add_option("--momentum", c->optim.momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999999))->group(opt);
    cmd->add_option("--clip", c->optim.clip, "Clip the global gradient norm to this (0 = off)")
        ->check(number_above(0, false))->capture_default_str()->group(opt);
    cmd->add_option("--label-smoothing", c->optim.label_smoothing, "Label smoothing epsilon")
        ->check(CLI::Range(0.0, 0.99))->capture_default_str()->group(opt);

    auto run = "Run";
    cmd->add_option("--out", c->out_dir, "Model directory to write (checkpoints, logs, the model)")->group(run);
    cmd->add_option("--seed", c->seed, "Seed for initialisation, dropout, batch order")->capture_default_str()->group(run);
    cmd->add_option("--max-steps", c->max_steps, "Stop after this many updates")->check(number_above(0, false))->group(run);
    cmd->add_option("--epochs", c->epochs, "Stop after this many passes over the data")->check(number_above(0, false))->group(run);
    cmd->add_option("--time-budget", c->time_budget_minutes, "Stop after this many minutes of training (validation not counted)")
        ->check(number_above(0, false))->group(run);
    cmd->add_option("--log-every", c->log_every, "Steps between log lines and metrics.jsonl entries")
        ->check(number_above(0, true))->capture_default_str()->group(run);
    cmd->add_option("--valid-every", c->valid_every, "Steps between validations (0 = at the end of each epoch)")
        ->check(number_above(0, false))->capture_default_str()->group(run);
    cmd->add_option("--checkpoint-every", c->checkpoint_every, "Steps between checkpoints")
        ->check(number_above(0, true))->capture_default_str()->group(run);
    cmd->add_option("--keep", c->keep, "Step checkpoints to keep")->check(number_above(0, true))->capture_default_str()->group(run);
    cmd->add_option("--keep-every", c->keep_every, "Also keep every N-th step's checkpoint for good (0 = none), to study the\n"
                                                   "model across training (`tapeformer heads` on each)")
        ->check(number_above(0, false))->capture_default_str()->group(run);
    cmd->add_option("--log-heads-every", c->log_heads_every,
                    "Every N steps append per-head batch importance, gradient norms and attention entropy of that\n"
                    "step to DIR/heads.jsonl (measured with dropout and label smoothing on; no extra pass; 0 = off)")
        ->check(number_above(0, false))->capture_default_str()->group(run);
    cmd->add_flag("--valid-bleu,!--no-valid-bleu", c->valid_bleu, "Decode the validation set (greedy) and pick the best model by BLEU")
        ->group(run);
    cmd->add_option("--valid-bleu-sentences", c->valid_bleu_sentences, "Decode only the first N validation sentences (0 = all)")
        ->check(number_above(0, false))->group(run);
    cmd->add_flag("--resume", c->resume, "Continue the run in --out from its last checkpoint, with its own settings; this call may\n"
                                           "change only --max-steps, --epochs, --time-budget, --log-every, --valid-every,\n"
                                           "--checkpoint-every and --keep (these four are kept in run.json for later resumes)")->group(run);
    cmd->add_flag("--force", c->force, "Start over in an --out that holds another run: once this run's inputs are read, deletes\n"
                                         "the files training wrote there (model, checkpoints, metrics, ...), not the user's own")->group(run);
    cmd->add_flag("--check-nan", c->check_nan, "On a non-finite loss or gradient, name the first op that produced it")->group(run);
    cmd->add_flag("--overfit-batch", c->overfit_batch,
                  "Train every step on one batch, the first pairs of --train-src/--train-tgt that fit --batch-tokens\n"
                  "(no shuffling; dropout as configured). The loss must fall to about 0 (with --label-smoothing 0;\n"
                  "otherwise the nll does): a debugging habit. Needs --max-steps or --time-budget")->group(run);

    cmd->callback([cmd, c, preset, layers, strings, config_file]() {
        // Sets an option the command line left unset, as if it had been given.
        auto fill = [cmd](const std::string& name, const std::vector<std::string>& values, const std::string& from) {
            CLI::Option* o = cmd->get_option_no_throw("--" + name);
            if (!o || name == "config" || name == "preset")
                throw std::invalid_argument(from + ": '" + name + "' is not a setting of tapeformer train (see --help)");
            if (o->count() > 0) return;
            o->clear();
            for (const auto& v : values) o->add_result(v);
            try {
                o->run_callback();
            } catch (const CLI::Error& e) {
                throw std::invalid_argument(from + ": " + name + ": " + e.what());
            }
        };
        // --resume continues the run's own settings: --config and --preset fill nothing then.
        if (!config_file->empty() && !c->resume) {
            for (const CLI::ConfigItem& item : CLI::ConfigTOML().from_file(*config_file)) {
                if (item.name == "++" || item.name == "--") continue;  // section markers
                if (!item.parents.empty() && !(item.parents.size() == 1 && item.parents[0] == "train"))
                    throw std::invalid_argument(*config_file + ": section [" + item.parents[0] + "] is not [train]");
                fill(item.name, item.inputs, *config_file);
            }
        }
        // A preset fills what neither the command line nor --config set.
        if (!preset->empty() && !c->resume) {
            const auto all = presets();
            for (const auto& [name, value] : all.at(*preset).values) fill(name, {value}, "preset " + *preset);
        }
        TrainConfig& cfg = *c;
        // The task presets read files `tapeformer data` writes: say how to make them rather than "cannot open".
        if ((*preset == "copy" || *preset == "reverse") && !c->resume &&
            cfg.data.train_src == "data/" + *preset + "/train.src" && !std::ifstream(cfg.data.train_src))
            throw std::invalid_argument("preset " + *preset + " reads data/" + *preset + "/train.src, which does not exist: write "
                                        "the task first with: tapeformer data " + *preset + " --out data/" + *preset);
        if (*layers) cfg.model.enc_layers = cfg.model.dec_layers = *layers;
        if (cmd->get_option("--attention-dropout")->count() == 0) cfg.model.attention_dropout = cfg.model.dropout;
        if (cmd->get_option("--activation-dropout")->count() == 0) cfg.model.activation_dropout = cfg.model.dropout;
        cfg.data.tokenizer = parse_tokenizer_kind((*strings)["tokenizer"]);
        cfg.model.norm = parse_norm_position((*strings)["norm"]);
        cfg.model.activation = parse_activation((*strings)["activation"]);
        cfg.model.tie = parse_tying((*strings)["tie"]);
        cfg.model.positional = parse_positional((*strings)["positional"]);
        cfg.optim.schedule.kind = parse_schedule_kind((*strings)["schedule"]);
        cfg.optim.schedule.d_model = cfg.model.d_model;
        if (cfg.optim.schedule.total_steps == 0) cfg.optim.schedule.total_steps = cfg.max_steps;
        cfg.threads = num_threads();  // as set by the global --threads (default: all cores)
        if (cfg.resume) {
            // What may change when a run is resumed: where it stops and what it logs, validates and keeps,
            // none of which changes a number it computes. The rest is the run's and is named as ignored.
            auto given = [cmd](const char* name) { return cmd->get_option(name)->count() > 0; };
            if (given("--log-every")) cfg.resume_changes.log_every = cfg.log_every;
            if (given("--valid-every")) cfg.resume_changes.valid_every = cfg.valid_every;
            if (given("--checkpoint-every")) cfg.resume_changes.checkpoint_every = cfg.checkpoint_every;
            if (given("--keep")) cfg.resume_changes.keep = cfg.keep;
            const std::set<std::string> applied = {"--out", "--resume", "--force", "--check-nan", "--max-steps", "--epochs",
                                                   "--time-budget", "--log-every", "--valid-every", "--checkpoint-every",
                                                   "--keep"};
            std::string ignored;
            for (const CLI::Option* o : cmd->get_options())
                if (o->count() && applied.count(o->get_name()) == 0) ignored += " " + o->get_name();
            if (!ignored.empty())
                std::cerr << "tapeformer: note: --resume keeps the run's own settings (the seed, the model, the data "
                             "and how the best model is chosen cannot change mid-run); ignored:"
                          << ignored << "\n";
        } else {
            cfg.resolved_config_toml = to_toml(cfg);
        }
        const TrainResult r = train(cfg, std::cerr, isatty(STDERR_FILENO) != 0);
        command_exit_code() = r.interrupted ? 130 : 0;
    });
}

TF_NAMESPACE_END
