// The training loop: read a parallel corpus, build or load the tokenizer, batch by token budget, train
// with label-smoothed cross-entropy, validate, checkpoint, resume exactly.
//
//   for each batch:  logits = model(src, dec_in)            forward, recorded on the tape
//                    loss   = CE_ε(logits, target)          label-smoothed, pad ignored
//                    zero_grad; backward(loss)              the tape in reverse
//                    clip ‖g‖ to max_norm; optimizer.step(lr(step))     one step: train_step.h
//
// The CLI (`tapeformer train`) only fills a TrainConfig (train_settings.h) and calls train(), with the
// step watchers (below) of the studies that look at training from above, such as the head log.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/optim.h"
#include "tapeformer/schedule.h"

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
    double label_smoothing = 0.1;
    double ema = 0;                    // decay of the weight average that validation scores and the model
                                       // keeps (WeightAverage, optim.h); 0 = none: the last step's weights
    Schedule schedule;                 // Noam by default: lr = factor · C^-0.5 · min(s^-0.5, s · w^-1.5)
};

struct TrainConfig {
    ModelConfig model;                 // vocab sizes and pad/bos/eos are filled in from the tokenizer
    DataConfig data;
    OptimConfig optim;
    std::string out_dir;               // the model directory (see checkpoint.h)
    std::uint64_t seed = 1;            // initialisation, dropout, batch order, tokenizer sampling
    int threads = 0;                   // 0 = all cores
    Precision precision = Precision::FP32;  // of the matrix products (blas.h); bf16 runs fp32 on a CPU without it

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

// Why a run stopped: the first stopping rule it reached, or a signal.
enum class StopReason { none, max_steps, epochs, time_budget, interrupted };
const char* to_string(StopReason reason);  // the log line's words: "max steps", "epochs", "time budget", "interrupted"

struct TrainResult {
    std::int64_t steps = 0;
    double train_seconds = 0;
    double last_loss = 0;
    double best_valid_bleu = -1;   // −1 when not measured
    double best_valid_loss = -1;
    StopReason stop_reason = StopReason::none;
    bool interrupted = false;      // SIGINT/SIGTERM: a checkpoint was saved, --resume continues
};

struct Batch;  // data/batch.h

// What a watcher is shown of one step it watches, after the backward and before clipping: the parameters'
// gradients are those of this batch's loss (the mean over its target tokens, label-smoothed, dropout on),
// the weights those its forward used.
struct WatchedStep {
    std::int64_t step;           // 1-based, as in metrics.jsonl
    std::int64_t epoch;          // 1-based, as in metrics.jsonl
    const Batch& batch;
    const LossReport& report;    // the step's loss, nll and target tokens
    Transformer& model;
};

// A study that looks at some training steps from above the loop, which knows it only as this (the head
// log of `train --log-heads-every`, HeadLogWatcher, is one). Before each step's forward the loop asks
// every watcher whether it watches that step; one that does listens to the forward's probes (its observer
// goes into Pass::observer) and is shown the step after the backward. A watcher changes no number the
// training computes.
class StepWatcher {
public:
    virtual ~StepWatcher() = default;
    // Once, after the run has read and checked its inputs, when it starts writing to its directory: the
    // run's settings (on --resume its own, from run.json), out_dir among them.
    virtual void start(const TrainConfig& run) = 0;
    // Before step `step`'s forward (1-based): the observer that listens to it, or nullptr when this step
    // is not watched.
    virtual ForwardObserver* observe(std::int64_t step) = 0;
    // After the backward of a step that observe() watched.
    virtual void after_backward(const WatchedStep& step) = 0;
};

// Trains as configured, logging to `log` (a live progress bar when `log` is a terminal's stderr, plain
// lines otherwise), and showing the steps they ask for to `watchers` (not owned; none by default).
// Throws std::runtime_error / std::invalid_argument with one readable line on bad input or a non-finite
// loss; whatever checkpoint was written last stays intact.
TrainResult train(TrainConfig config, std::ostream& log, bool progress_bar,
                  const std::vector<StepWatcher*>& watchers = {});

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

// Reads, validates and returns DIR/run.json (for --resume), and with `identity` the run's identity.
TrainConfig load_run_config(const std::string& dir, RunIdentity* identity = nullptr);

// Whether `name`, a path relative to a run directory ("model.safetensors", "checkpoints/step-N.safetensors"),
// is one of the files training writes there: the files no other command's output may replace.
bool is_run_file(const std::string& name);

TF_NAMESPACE_END
