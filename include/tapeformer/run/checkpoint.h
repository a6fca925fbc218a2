// What a model directory holds, and how it is written and read back.
//
//   DIR/model.safetensors      the weights translate and eval use: best by validation (until the first
//                              validation, and without validation data, those of the last checkpoint),
//                              PyTorch names, model config in __metadata__, the run id and the step,
//                              CRC-32C checksum
//   DIR/vocab.txt | spm.model  the tokenizer(s) (src.* and tgt.* when not joint)
//   DIR/run.json               the resolved training settings (what --resume continues), the run id and
//                              the size and CRC-32C of each data file (train.h RunIdentity)
//   DIR/config.toml            the same as a CLI11 config file: `tapeformer train --config DIR/config.toml`
//   DIR/state.json             the manifest: which checkpoint is the last, which step was best
//   DIR/checkpoints/step-N.safetensors   full training state at step N (weights, optimizer moments, the
//                              weight average with --ema, step, RNG, data position, best score), the run
//                              id and run.json as it was; the newest --keep are kept
//   DIR/metrics.jsonl          one JSON object per logged step and per validation
//   DIR/train.lock             flock-ed by the `train` using DIR, for as long as it runs; holds its pid
//
// Every file is written to a temporary name, fsynced and renamed, so a crash leaves the previous version.
// The checksum of a file catches corruption (a flipped bit, a cut), not a deliberate edit: a program that
// rewrites the metadata can recompute it. What can be checked against something else is checked (the
// settings against the tensors' shapes and the tokenizer, a training state against itself and the run).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/optim.h"

TF_NAMESPACE_BEGIN

// Files of another format version are refused with a message saying so.
constexpr int kCheckpointFormat = 1;

// Where training stands: enough to continue exactly where it stopped.
struct TrainState {
    std::int64_t step = 0;             // optimizer updates done
    std::int64_t epoch = 0;            // current epoch (0-based)
    std::int64_t batch_in_epoch = 0;   // batches of the current epoch already trained on
    std::uint64_t dropout_offset = 0;  // the dropout generator's counter (its seed is the run's seed)
    double best_score = 0;             // best validation score so far (BLEU, or −loss without BLEU)
    std::int64_t best_step = -1;       // step of best_score; −1: no validation yet
    std::int64_t valid_step = -1;      // step of the last validation; −1: none yet (a resumed run that
                                       // stopped before its final validation still owes it)
    double train_seconds = 0;          // training time so far, validation and checkpoints excluded
    std::int64_t target_tokens = 0;    // non-pad target tokens trained on
    std::int64_t skipped_empty = 0, filtered_long = 0;  // corpus statistics, for the log
    // The steps since the last metrics line (a line every --log-every steps averages them): kept in the
    // checkpoint, so that a run resumed between two lines writes the next one as the whole run would.
    struct LogWindow {
        double loss = 0, nll = 0;         // Σ over the steps of the step's mean × its target tokens
        double seconds = 0;
        std::int64_t tokens = 0, steps = 0;
    } log_window;
};
std::string to_json(const TrainState& s);
TrainState train_state_from_json(const std::string& json);  // throws std::runtime_error when malformed

// "crc32c:<8 hex digits>" of the tokenizer files save() writes (vocab.txt or spm.model, src./tgt. when
// separate). Stored in the metadata of every model and checkpoint as "tapeformer.tokenizer", and checked
// by load_model_dir: a model loaded with a tokenizer other than its own is refused.
std::string tokenizer_hash(const TokenizerPair& tokenizers);

// A new run's identity: 32 hex digits, 128 random bits (std::random_device). Two runs with the same
// settings get different ids, so that the files of one are never taken for the other's.
std::string new_run_id();

// Which run wrote a file, kept in its metadata ("tapeformer.run_id", "tapeformer.step", "tapeformer.run")
// and checked where files are combined: --resume (train.cpp) and average (average.h).
struct RunStamp {
    std::string run_id;      // "" = none: written before runs had ids, or an average of several runs
    std::int64_t step = -1;  // model files: the step whose weights they hold (−1: no one step, e.g. an
                             // average); a checkpoint's step is its TrainState's
    std::string run_json;    // checkpoints: the run's run.json when it was written ("" = not recorded)
};

// DIR/model.safetensors: weights only (and tokenizer_hash and the stamp's run id and step, when given).
void save_model_weights(const std::string& path, const Transformer& model, const std::string& tokenizer_hash = "",
                        const RunStamp& stamp = {});
// A training checkpoint: weights, the optimizer's state (names prefixed "optim."), the weight average
// when the run keeps one (--ema: "ema.<parameter>"), the TrainState, the stamp's run id and run.json.
void save_training_checkpoint(const std::string& path, const Transformer& model, const Optimizer& optimizer,
                              const TrainState& state, const std::string& tokenizer_hash = "",
                              const WeightAverage* average = nullptr, const RunStamp& stamp = {});
// Loads weights, optimizer state and (with `average`) the weight average in place and returns the
// TrainState (and with `stamp` the run id and run.json stored with it). Checks format, checksum, names and
// shapes; every problem is one std::runtime_error line naming the file; a checkpoint with a weight average
// loaded without one, or the other way round, too. With `tokenizer_hash` (of the run's tokenizer files), a
// checkpoint trained with another tokenizer is refused.
TrainState load_training_checkpoint(const std::string& path, Transformer& model, Optimizer& optimizer,
                                    const std::string& tokenizer_hash = "", WeightAverage* average = nullptr,
                                    RunStamp* stamp = nullptr);

// The names training gives its checkpoints: "checkpoints/step-00000042.safetensors" (relative to DIR).
std::string checkpoint_name(std::int64_t step);
// The step of a checkpoint_name(), or −1 when `name` is not one (any other path, "..", a user's file).
std::int64_t checkpoint_step(const std::string& name);
// The checkpoints in DIR/checkpoints, by checkpoint_name(), oldest step first.
std::vector<std::string> checkpoints_on_disk(const std::string& dir);

// A trained model ready to use: the network and its tokenizers.
struct ModelBundle {
    std::unique_ptr<Transformer> model;
    TokenizerPair tokenizers;
    std::string dir;
    std::string weights_path;  // the file the weights came from: DIR/model.safetensors or a checkpoint
    RunStamp stamp;            // its run id and step (run_json not kept)
    std::string note;  // non-empty when the weights are not DIR/model.safetensors: says which they are
};
// Reads DIR/model.safetensors and the tokenizers. A run killed before it wrote model.safetensors still has
// its checkpoints: then the weights of the newest one are used, and `note` says so. Errors (missing
// directory or files, a corrupted or truncated file, another format version, a tokenizer that does not
// match the model's vocabulary or special ids) are one std::runtime_error line naming the path and what to do.
// `path` may also be one of the run's checkpoints, DIR/checkpoints/step-N.safetensors: its weights (those
// validation scores: the average of a run with --ema), with DIR's tokenizers (so that every command can be
// run on the checkpoints --keep-every keeps).
ModelBundle load_model_dir(const std::string& path);

TF_NAMESPACE_END
