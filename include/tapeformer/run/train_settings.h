// What a training run is told: TrainConfig (plain structs with commented defaults) and its checks, every
// setting of `tapeformer train` in one table (train_settings()), and what is built from it: the merge of
// preset, config file and flags into a TrainConfig, the config.toml a run writes, and run.json, written
// and read back (load_run_config). The trainer that runs it is train.h.
//
//   precedence:  command-line flags  >  --config FILE  >  --preset NAME  >  the defaults below
//   --layers N   sets --enc-layers and --dec-layers; given with either of them in the same place
//                (the command line, one file, one preset) it is refused
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/schedule.h"
#include "tapeformer/settings.h"

TF_NAMESPACE_BEGIN

struct DataConfig {
    std::string train_src, train_tgt;  // required
    std::string valid_src, valid_tgt;  // optional: validation loss, greedy BLEU and best-model selection
    TokenizerKind tokenizer = TokenizerKind::bpe;  // word (whitespace) or SentencePiece bpe / unigram
    bool joint_vocab = true;           // one vocabulary for both sides (needed for tie = all)
    std::int32_t vocab_size = 8000;    // SentencePiece: exact; word: upper bound (0 = every word)
    std::int32_t max_len = 100;        // training pairs with more tokens on either side are filtered out
    std::int64_t batch_tokens = 4096;  // padded tokens per batch: B · max(S, T) ≤ batch_tokens
};

struct OptimConfig {
    std::string optimizer = "adam";    // adam, adamw, sgd
    double beta1 = 0.9, beta2 = 0.98, eps = 1e-9;  // the paper's Adam settings
    double weight_decay = 0;
    double momentum = 0;               // sgd only
    double clip = 1.0;                 // global gradient-norm clipping (0 = off)
    std::int64_t accumulate = 1;       // micro-batches whose gradients each optimizer step sums (--accumulate):
                                       // one step = N consecutive batches of the epoch's order, one global batch
    double label_smoothing = 0.1;
    double ema = 0;                    // decay of the weight average that validation scores and the model
                                       // keeps (WeightAverage, optim.h); 0 = none: the last step's weights
    Schedule schedule;                 // Noam by default: lr = factor · C^-0.5 · min(s^-0.5, s · w^-1.5)
    double cooldown = 0;               // over this last fraction of the run the schedule's lr falls linearly to 0
                                       // (cooldown_factor, schedule.h): of its steps or of its time budget,
                                       // whichever stop is nearer; 0 = none. Not with cosine or linear
};

struct TrainConfig {
    ModelConfig model;                 // vocab sizes and pad/bos/eos are filled in from the tokenizer
    DataConfig data;
    OptimConfig optim;
    std::string out_dir;               // the model directory (see checkpoint.h)
    std::uint64_t seed = 1;            // initialisation, dropout, batch order, tokenizer sampling
    int threads = 0;                   // 0 = all cores
    Precision precision = Precision::AUTO;  // of the matrix products (blas.h); a run resolves AUTO (auto_precision)

    // Stopping: whichever comes first; at least one must be set.
    std::int64_t max_steps = 0;
    std::int64_t epochs = 0;
    double time_budget_minutes = 0;    // training time; validation and checkpoints are not counted

    std::int64_t log_every = 100;      // steps between log lines / metrics.jsonl entries
    std::int64_t valid_every = 1000;   // steps between validations (0 = only at the end of each epoch)
    std::int64_t checkpoint_every = 1000;  // steps between checkpoints (always one at the end)
    int keep = 3;                      // step checkpoints kept in DIR/checkpoints
    std::int64_t keep_every = 0;       // also keep every N-th step's checkpoint for good (0 = none), so
                                       // that heads, eval, ... can be run across training
    std::int64_t log_heads_every = 0;  // steps between DIR/heads.jsonl entries (0 = none): per-head batch
                                       // importance, gradient norms and attention entropy of that step,
                                       // written by the head-log watcher (HeadLogWatcher, a study) that the CLI
                                       // passes to train(); the run itself only truncates it on --resume
    bool valid_bleu = true;            // validation also decodes (greedy) and scores BLEU; best = highest BLEU
    std::int64_t valid_bleu_sentences = 0;  // decode only the first N validation sentences (0 = all)
    std::string init_from;             // fine-tuning: a model directory (or checkpoint) whose model, weights
                                       // and tokenizer the run starts from; the model settings are its own but
                                       // for the dropouts ("" = a new model; heads prune --save's smaller models)
    bool overfit_batch = false;        // train on one batch, the first pairs of the training file, every step
                                       // (a debugging habit: the loss must fall to about 0); needs max_steps or
                                       // time_budget_minutes

    bool resume = false;               // continue the run in out_dir (its run.json settings)
    bool force = false;                // start over in a directory that holds another run (deletes only
                                       // the files training writes, once the new run's inputs are read)
    // With resume: settings of this call that replace the run's own, in run.json too (unset: the run's).
    // They change no number the training computes. The others cannot change mid-run: the seed, the model,
    // the data and the validation score that picks the best model (valid_bleu, valid_bleu_sentences).
    struct ResumeChanges {
        std::optional<std::int64_t> log_every, valid_every, checkpoint_every;
        std::optional<int> keep;
        // Stopping rules given to this call, 0 included ("--time-budget 0": no limit any more); a non-zero
        // max_steps, epochs or time_budget_minutes of this config replaces the run's too.
        std::optional<std::int64_t> max_steps, epochs;
        std::optional<double> time_budget_minutes;
    } resume_changes;
    bool check_nan = false;            // on a non-finite loss, name the first op that produced it

    void validate() const;             // std::invalid_argument naming the setting
};

// The table: the model's settings (model_settings.h, stored under "model." in run.json) and the
// data, optimisation and run settings. Settings with a name are flags and config.toml keys; settings with
// a key are stored in run.json (the alias --layers has no key).
const std::vector<Setting<TrainConfig>>& train_settings();

// A named set of values that fills in whatever the command line and --config left unset.
struct Preset {
    std::string name, description;
    std::vector<std::pair<std::string, std::string>> values;  // setting name -> value; train-src first
    std::string make_data;  // how to get its data when it is missing ("" = it ships with tapeformer)
};
// toy, copy, reverse, multi30k ($TAPEFORMER_MULTI30K, else ../shared/data/multi30k)
std::vector<Preset> train_presets();

// What a `tapeformer train` call says, before merging.
struct TrainArguments {
    std::vector<std::pair<std::string, std::string>> flags;  // settings given as flags: name -> value
    std::string config_file;                                 // --config ("" = none)
    std::string preset;                                      // --preset ("" = none)
    std::string out_dir;
    bool resume = false, force = false, check_nan = false;
    int threads = 0;
};

struct ResolvedTrainConfig {
    TrainConfig config;
    std::vector<std::string> notes;  // for the user: settings --resume ignores, a surprising --lr
};

// Merges the sources by the precedence above and fills the defaults that follow from other settings
// (attention and activation dropout from --dropout, --total-steps from --max-steps, --lr from
// --schedule). With resume only the stopping rules and what TrainConfig::ResumeChanges lists apply; the
// rest is named in `notes`. Throws std::invalid_argument naming the flag, file:line or preset and the
// value on bad input; does not check how settings fit together (TrainConfig::validate does).
ResolvedTrainConfig resolve_train_config(const TrainArguments& args);

// Throws std::invalid_argument when a cosine or linear schedule decaying to --min-lr 0 ends before the run's
// --max-steps: every step past --total-steps would train at learning rate 0 (config.toml continued with a
// larger --max-steps, or a --resume that raises it). `resumed`: the run keeps its schedule, say so.
void check_schedule_covers_run(const TrainConfig& c, bool resumed);

// DIR/config.toml: every named setting with its value, so `train --config DIR/config.toml` repeats the run.
std::string to_toml(const TrainConfig& c);

std::string to_json(const TrainConfig& c);                    // DIR/run.json's settings
TrainConfig train_config_from_json(const std::string& text);  // std::runtime_error when malformed

// ---- run.json: the settings and the run's identity ----------------------------------------------------

// A data file as the run found it at its start (run.json "data_files"): a resumed run must read the same
// bytes, or the losses differ from the uninterrupted run's.
struct DataFile {
    std::string path;        // where it was at the start, absolute
    std::int64_t bytes = 0;
    std::string crc32c;      // "crc32c:<8 hex digits>" of its bytes
};

// What makes a run this run, beside its settings in run.json, and copied into every checkpoint with them
// (RunStamp, checkpoint.h): --resume continues only a checkpoint of the same run id, settings and data.
struct RunIdentity {
    std::string run_id;  // new_run_id() at the start; "" for a run started before runs had ids (resumed
                         // unchecked: its run.json and checkpoints hold nothing to check against)
    std::map<std::string, DataFile> data;  // "train_src", "train_tgt", "valid_src", "valid_tgt": those given
};

// The data files a run reads, by their run.json key, with their flags.
struct DataSlot {
    const char* key;   // "train_src": data.train_src in run.json, data_files.train_src
    const char* flag;  // "--train-src"
    std::string DataConfig::*path;
};
inline const DataSlot kDataSlots[] = {{"train_src", "--train-src", &DataConfig::train_src},
                                      {"train_tgt", "--train-tgt", &DataConfig::train_tgt},
                                      {"valid_src", "--valid-src", &DataConfig::valid_src},
                                      {"valid_tgt", "--valid-tgt", &DataConfig::valid_tgt}};

// Whether the setting with run.json key `key` may change mid-run: where it stops and what it logs,
// validates and keeps (TrainConfig::ResumeChanges), none of which changes a number the training computes;
// and the data files' paths, whose contents are compared instead (a file moved and named anew in run.json
// is the same data). Every other setting decides the run and must stay what its checkpoints were trained with.
bool may_change_mid_run(const std::string& key);

// DIR/run.json: the settings (to_json) and the run's identity.
std::string run_json(const TrainConfig& c, const RunIdentity& identity);
// The identity in run.json's text; std::runtime_error when malformed.
RunIdentity run_identity_from_json(const std::string& text);

// Reads, validates and returns DIR/run.json (for --resume), and with `identity` the run's identity.
TrainConfig load_run_config(const std::string& dir, RunIdentity* identity = nullptr);

TF_NAMESPACE_END
