// The training loop. See train.h for what it does and checkpoint.h for what it writes.
#include "tapeformer/run/train.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/distributed.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/data/text.h"
#include "tapeformer/data/vocab.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/io.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/reference_ops.h"
#include "run/json_integer.h"
#include "run/metrics_line.h"
#include "tapeformer/run/train_settings.h"
#include "tapeformer/run/train_step.h"
#include "run/run_directory.h"
#include "run/signals.h"

TF_NAMESPACE_BEGIN

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---- the run's data files ----------------------------------------------------------------------------------

namespace {

// The size and CRC-32C of the file at `path` now.
DataFile data_file(const std::string& path) {
    const std::string bytes = read_file(path);
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", crc32c(bytes));
    return DataFile{path, static_cast<std::int64_t>(bytes.size()), std::string("crc32c:") + hex};
}

std::string data_file_text(const DataFile& f) { return std::to_string(f.bytes) + " bytes, " + f.crc32c; }

// ---- small helpers ---------------------------------------------------------------------------------------

std::string clock_text(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "--:--";
    const long s = static_cast<long>(seconds + 0.5);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
    return buf;
}

// ---- report data: per-layer gradient norms, the overfit batch ----------------------------------------------

// The module a parameter belongs to, for per-layer gradient norms: "encoder.layers.0" for every parameter of
// that layer, otherwise the name without its last part ("src_embed.weight" -> "src_embed").
std::string layer_of(const std::string& name) {
    for (const char* stack : {"encoder.layers.", "decoder.layers."}) {
        const std::string p = stack;
        if (name.rfind(p, 0) == 0) return name.substr(0, name.find('.', p.size()));
    }
    const std::size_t dot = name.rfind('.');
    return dot == std::string::npos ? name : name.substr(0, dot);
}

// ‖∂L/∂θ‖₂ of each layer's parameters (layer_of), in parameter order, a tied tensor counted once under its
// first name. Read before clipping: the gradient the loss gave, for the report's post- vs pre-norm lesson.
std::vector<std::pair<std::string, double>> layer_grad_norms(const ParamList& params) {
    std::vector<std::pair<std::string, double>> norms;
    for (const NamedTensor& p : unique_parameters(params)) {
        if (!p.tensor.has_grad()) continue;
        const std::string layer = layer_of(p.name);
        if (norms.empty() || norms.back().first != layer) norms.push_back({layer, 0});
        const real* g = p.tensor.grad();
        double sum = 0;
        for (std::int64_t i = 0, n = p.tensor.numel(); i < n; ++i) sum += double(g[i]) * double(g[i]);
        norms.back().second += sum;  // squared until the end
    }
    for (auto& entry : norms) entry.second = std::sqrt(entry.second);
    return norms;
}

// --overfit-batch: the first training pairs in file order (no shuffling, no length sorting) that fit one
// batch of the token budget, B · max(S, T) ≤ batch_tokens.
std::vector<std::int64_t> first_batch(const std::vector<Example>& examples, std::int64_t batch_tokens) {
    std::vector<std::int64_t> rows;
    std::int64_t longest = 0;
    for (std::size_t i = 0; i < examples.size(); ++i) {
        const std::int64_t len = std::int64_t(std::max(examples[i].src.size(), examples[i].tgt.size())) + 1;
        if (std::int64_t(rows.size() + 1) * std::max(longest, len) > batch_tokens) break;
        longest = std::max(longest, len);
        rows.push_back(std::int64_t(i));
    }
    return rows;
}

}  // namespace


// ---- the trainer -----------------------------------------------------------------------------------------

namespace {

constexpr int kTokenizerThreads = 2;  // SentencePiece's trainer threads, whatever --threads says

// The watchers (train.h) that watch one step, and the one observer its forward gets: the watcher's own
// when one watches, a fan-out to each when several do, none when none does.
class WatchersOfStep : public ForwardObserver {
public:
    WatchersOfStep(const std::vector<StepWatcher*>& all, std::int64_t step) {
        for (StepWatcher* w : all)
            if (ForwardObserver* o = w->observe(step)) watching_.push_back(Watching{w, o});
    }
    ForwardObserver* observer() {
        if (watching_.empty()) return nullptr;
        return watching_.size() == 1 ? watching_[0].observer : this;
    }
    void probe(const void* module, const char* type, const char* name, const Tensor& value) override {
        for (const Watching& w : watching_) w.observer->probe(module, type, name, value);
    }
    void after_backward(const WatchedStep& step) {
        for (const Watching& w : watching_) w.watcher->after_backward(step);
    }

private:
    struct Watching {
        StepWatcher* watcher;
        ForwardObserver* observer;  // what it listens to this step's forward with
    };
    std::vector<Watching> watching_;
};

class Trainer {
public:
    Trainer(TrainConfig config, std::ostream& log, bool bar, std::vector<StepWatcher*> watchers)
        : c_(std::move(config)), log_(log), bar_(bar), watchers_(std::move(watchers)) {}
    TrainResult run();

private:
    // Everything is read and checked before anything is written: a typo in a flag or a file name leaves
    // the directory as it was, even with --force.
    void prepare_directory();  // the run's settings (--resume: run.json, and which checkpoint to continue)
    void prepare_data();       // the corpus read and the tokenizer trained (--init-from: the model's), in memory
    void read_init_model();    // --init-from: the model, its settings and its tokenizer
    void build_model();        // the model, and with --resume its checkpoint loaded
    void start_writing();      // only now: --force's deletions, the tokenizer, run.json, metrics.jsonl
    void lock_directory();
    std::string resume_checkpoint();
    void check_data_files();  // --resume: the data files are the ones the run started with
    void check_run_settings(const std::string& path, const RunStamp& stamp) const;
    void check_reachable(const std::string& path) const;
    void train_step(const std::vector<Batch>& micro);  // one optimizer step on a global batch
    std::int64_t steps_per_epoch() const;  // ⌈batches per epoch / --accumulate⌉
    std::int64_t steps_into_epoch() const;  // the optimizer steps the epoch has taken so far
    void log_progress(bool force_line, bool interrupted = false);
    void validate_before_training();  // step 0's validation loss: where the curves start
    bool validate();  // false when a signal interrupted it (nothing of it kept: the run still owes it)
    void validate_now(const ProgressFn& after_each_batch);  // validate()'s work
    void checkpoint();              // writes one unless the newest already holds this state
    void note_stop_time(double save_seconds);  // an MPI job: whether mpirun leaves Ctrl-C time to save
    bool unsaved_changes() const;  // state_ differs from what the newest checkpoint holds
    double eta_seconds() const;
    double run_progress() const;  // the fraction of the run done, by the nearest stop (0 to 1)
    double step_lr() const;        // the learning rate of the next step: the schedule's, times the cooldown
    void write_metrics(const MetricsLine& line);
    void check_ranks() const;  // an MPI job: every rank has at least one micro-batch of each global batch
    StopReason stop_reason();  // the first stopping rule reached; in a job, the ranks' common one
    bool writer() const { return ranks_->rank() == 0; }  // rank 0 alone writes the run's files

    TrainConfig c_;
    std::ostream& log_;
    bool bar_;
    std::vector<StepWatcher*> watchers_;  // studies above the loop (train.h), shown the steps they ask for
    Communicator* ranks_ = nullptr;      // this process, or the ranks of an MPI job that train together
    std::string dir_;
    RunLock lock_;
    std::string resume_from_;  // --resume: the checkpoint to load ("" = start the run from step 0)
    std::string updated_run_json_;  // --resume with ResumeChanges: run.json with them ("" = unchanged)
    RunIdentity identity_;          // the run's id and data files (new: made here; --resume: run.json's)

    TokenizerPair tokenizers_;
    std::unique_ptr<Transformer> init_from_;  // --init-from: the model the run starts from (moved into model_)
    std::unique_ptr<Batcher> batcher_;
    std::vector<std::int64_t> overfit_rows_;  // --overfit-batch: the one batch every step trains on
    std::vector<Example> valid_examples_;
    std::vector<std::string> valid_src_lines_, valid_ref_lines_;
    std::unique_ptr<Transformer> model_;
    std::unique_ptr<Optimizer> optimizer_;
    std::unique_ptr<WeightAverage> average_;  // --ema: what validation scores and model.safetensors holds
    Rng dropout_rng_;
    TrainState state_;
    Manifest manifest_;
    std::ofstream metrics_;
    TrainResult result_;

    // For the next log line (the steps it averages are state_.log_window).
    double last_grad_norm_ = 0, last_lr_ = 0;
    double reduce_seconds_ = 0;  // in the ranks' gradient exchange, over the log window's steps
    double last_step_seconds_ = 0;  // the newest step's time (note_stop_time)
    bool stop_time_noted_ = false;  // note_stop_time has looked (once a run)
    std::vector<std::pair<std::string, double>> layer_grad_norms_;  // of the last log step, before clipping
    TrainState checkpointed_ = no_checkpoint();  // what the newest checkpoint holds (step −1: none yet)
    static TrainState no_checkpoint() {
        TrainState s;
        s.step = -1;
        return s;
    }
    Clock::time_point last_bar_ = Clock::now();
};

// The highest step metrics.jsonl records (0 when none).
std::int64_t last_logged_step(const std::string& path) {
    std::ifstream in(path);
    std::int64_t last = 0;
    for (std::string line; std::getline(in, line);) {
        try {
            last = std::max(last, json_integer<std::int64_t>(nlohmann::json::parse(line).at("step"), "step"));
        } catch (const std::exception&) {
            // a line cut short by a crash
        }
    }
    return last;
}

void Trainer::lock_directory() {
    if (!writer()) return;
    lock_.acquire(dir_);
    if (const int n = remove_stale_temp_files(dir_))
        log_ << "removed " << n << " temporary file" << (n == 1 ? "" : "s") << " left in " << dir_
             << " by a write that was killed\n";
}

void Trainer::prepare_directory() {
    dir_ = c_.out_dir;
    std::error_code ec;
    if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
        throw std::runtime_error("--out '" + dir_ + "' exists and is not a directory");
    if (c_.resume) {
        // Settings come from the run itself; the stopping rules, threads and the run-time settings of
        // this call (TrainConfig::ResumeChanges) extend it.
        TrainConfig stored = load_run_config(dir_, &identity_);
        lock_directory();
        const std::int64_t first_checkpoint = stored.checkpoint_every;
        const TrainConfig::ResumeChanges& change = c_.resume_changes;
        if (change.log_every) stored.log_every = *change.log_every;
        if (change.valid_every) stored.valid_every = *change.valid_every;
        if (change.checkpoint_every) stored.checkpoint_every = *change.checkpoint_every;
        if (change.keep) stored.keep = *change.keep;
        // Changed settings stay for later resumes: a plain --resume after --keep 10 must not prune to 3.
        const std::string updated = run_json(stored, identity_);
        if (updated != read_file((fs::path(dir_) / "run.json").string())) updated_run_json_ = updated;
        // A stopping rule set here replaces the run's; the CLI also passes one given as 0 (no limit).
        stored.max_steps = change.max_steps.value_or(c_.max_steps ? c_.max_steps : stored.max_steps);
        stored.epochs = change.epochs.value_or(c_.epochs ? c_.epochs : stored.epochs);
        stored.time_budget_minutes =
            change.time_budget_minutes.value_or(c_.time_budget_minutes ? c_.time_budget_minutes : stored.time_budget_minutes);
        if (!stored.max_steps && !stored.epochs && !stored.time_budget_minutes)
            throw std::invalid_argument("--resume: with these flags the run would have no stopping rule left; give "
                                        "--max-steps, --epochs or --time-budget a value above 0");
        stored.threads = c_.threads;
        stored.check_nan = c_.check_nan;
        stored.resume = true;
        c_ = stored;
        check_schedule_covers_run(c_, true);  // a larger --max-steps must not train at lr 0
        if (fs::exists(fs::path(dir_) / "state.json", ec)) manifest_ = read_manifest(dir_);
        resume_from_ = resume_checkpoint();
        // A run stopped before its first checkpoint has run.json but no checkpoint: it starts again from
        // step 0 with its own settings and tokenizer, which gives the run it would have been. Not when it
        // had got past its first checkpoint: then its checkpoints are gone, and starting over would replace
        // its model.safetensors and metrics.jsonl.
        const std::int64_t logged = last_logged_step((fs::path(dir_) / "metrics.jsonl").string());
        if (resume_from_.empty() && logged > first_checkpoint)
            throw std::runtime_error("cannot resume: " + dir_ + "/metrics.jsonl records step " + std::to_string(logged) +
                                     ", past the run's first checkpoint (step " + std::to_string(first_checkpoint) +
                                     "), but " + dir_ + "/checkpoints holds none; put them back, or start the run over "
                                     "with --force (without --resume)");
        return;
    }
    if (!holds_run(dir_) && !c_.force) {
        // Not a run, but a file of the name a run writes (a user's vocab.txt or config.toml): never replaced
        // without being asked.
        if (const std::string f = first_run_file_in(dir_); !f.empty())
            throw std::runtime_error("--out '" + dir_ + "' holds " + f + ", which this run would replace: move it "
                                     "away, choose another --out, or give --force to replace it");
    }
    if (holds_run(dir_)) {
        if (!c_.force)
            throw std::runtime_error("'" + dir_ + "' already holds a training run: continue it with --resume, start over with "
                                     "--force (deletes the files it wrote, once this run's inputs are read), or choose another --out");
        lock_directory();  // a run in progress there is refused now, not after reading the data
    }
    // A new run: its own id, and its data files by absolute path, so that --resume from another working
    // directory reads the same files (prepare_data records their size and CRC).
    identity_.run_id = new_run_id();
    for (const DataSlot& d : kDataSlots) {
        std::string& path = c_.data.*d.path;
        if (!path.empty()) path = fs::absolute(path).lexically_normal().string();
    }
}

void Trainer::check_data_files() {
    const std::string run_json_path = (fs::path(dir_) / "run.json").string();
    for (const DataSlot& d : kDataSlots) {
        const std::string& path = c_.data.*d.path;
        auto recorded = identity_.data.find(d.key);
        if (recorded == identity_.data.end()) {
            if (path.empty()) continue;
            throw std::runtime_error(run_json_path + ": data." + d.key + " '" + path + "' is not a file the run started with " +
                                     "(data_files records no size and CRC for it: run.json was edited, or it was not a regular " +
                                     "file, such as a pipe, which cannot be read again); restore run.json or start a new run");
        }
        const DataFile& then = recorded->second;
        if (path.empty())
            throw std::runtime_error(run_json_path + ": data." + d.key + " is empty, but the run started with " + d.flag + " " +
                                     then.path + "; restore run.json");
        std::error_code ec;
        if (!fs::is_regular_file(path, ec))
            throw std::runtime_error("the run's " + std::string(d.flag) + ", " + path + ", is gone (moved or deleted?): put it back, "
                                     "or set data." + d.key + " in " + run_json_path + " to where it is now");
        const DataFile now = data_file(path);
        if (now.bytes != then.bytes || now.crc32c != then.crc32c)
            throw std::runtime_error(path + " (" + d.flag + ") is not the file the run started with: it has " + data_file_text(now) +
                                     ", the run recorded " + data_file_text(then) + " (changed, shuffled or replaced); "
                                     "restore it, or start a new run");
    }
}

// The checkpoint --resume continues from: the newest one state.json lists that is on disk (after a damaged
// last checkpoint was refused, the user may have deleted it); without state.json, or when it lists none
// on disk, the newest checkpoint on disk. "" when there is none: the run stopped before its first one.
// A damaged file is never skipped silently: loading it fails, naming it and the older one.
std::string Trainer::resume_checkpoint() {
    for (auto it = manifest_.kept.rbegin(); it != manifest_.kept.rend(); ++it) {
        if (!fs::exists(fs::path(dir_) / *it)) continue;
        if (*it != manifest_.last)
            log_ << "the last checkpoint " << manifest_.last << " is gone; resuming from the newest kept one, " << *it
                 << "\n";
        manifest_.kept.erase(it.base(), manifest_.kept.end());
        manifest_.last = manifest_.kept.back();
        return manifest_.last;
    }
    const std::vector<std::string> on_disk = checkpoints_on_disk(dir_);
    if (on_disk.empty()) {
        if (manifest_.kept.empty()) return "";
        throw std::runtime_error("cannot resume: none of the checkpoints listed in " + dir_ +
                                 "/state.json is on disk; start the run over with --force (without --resume)");
    }
    log_ << dir_ << "/state.json "
         << (fs::exists(fs::path(dir_) / "state.json") ? "lists no checkpoint on disk" : "is missing")
         << "; resuming from the newest checkpoint on disk, " << on_disk.back() << "\n";
    manifest_.kept = on_disk;
    manifest_.last = on_disk.back();
    return manifest_.last;
}

void Trainer::prepare_data() {
    if (c_.resume && !identity_.run_id.empty()) check_data_files();
    if (c_.resume && identity_.run_id.empty())
        log_ << "this run was started before runs had ids: its settings and data files are not checked against its "
                "checkpoints (start it over to have them checked)\n";
    // Every input file is read before any work, so that a wrong name fails at once.
    // A decoder-only model reads one text: each non-empty line is an example, BOS + tokens -> tokens + EOS,
    // read here as a "pair" of the line with itself whose source side is then dropped.
    if (!c_.resume && !c_.init_from.empty()) read_init_model();
    const bool lm = c_.model.decoder_only();
    const ParallelText train_text = read_parallel(c_.data.train_src, lm ? c_.data.train_src : c_.data.train_tgt);
    ParallelText valid_text;
    if (!c_.data.valid_src.empty())
        valid_text = read_parallel(c_.data.valid_src, lm ? c_.data.valid_src : c_.data.valid_tgt);
    if (c_.resume) {
        tokenizers_ = TokenizerPair::load(dir_);
    } else if (!init_from_) {  // (--init-from: the model's own tokenizer, read_init_model)
        TokenizerOptions opt;
        opt.kind = c_.data.tokenizer;
        opt.joint = c_.data.joint_vocab || lm;  // a decoder-only model has one side
        opt.vocab_size = c_.data.vocab_size;
        opt.seed = c_.seed;
        // A fixed count, not --threads: SentencePiece's unigram trainer adds up per-thread sums, so its
        // vocabulary (and every loss after it) would depend on the thread count.
        opt.num_threads = kTokenizerThreads;
        log_ << "training a " << to_string(c_.data.tokenizer) << " tokenizer (" << (opt.joint ? "joint" : "separate")
             << " vocabulary" << (c_.data.vocab_size ? ", " + std::to_string(c_.data.vocab_size) + " entries" : "") << ")\n";
        // (decoder-only: the text once, not as both sides of a joint vocabulary)
        tokenizers_ = TokenizerPair::train(lm ? std::vector<std::string>() : train_text.source, train_text.target, opt);
    }
    if (!c_.resume) {
        // Regular files only: a pipe (--train-src <(zcat ...)) has been read and cannot be read again, nor
        // resumed from the same bytes.
        std::error_code ec;
        for (const DataSlot& d : kDataSlots)
            if (fs::is_regular_file(c_.data.*d.path, ec)) identity_.data[d.key] = data_file(c_.data.*d.path);
    }
    EncodedCorpus train = encode_parallel(train_text, tokenizers_, c_.data.max_len);
    if (lm)
        for (Example& e : train.examples) e.src.clear();  // no encoder: a batch's src is just EOS, never read
    if (train.examples.empty())
        throw std::runtime_error("no training pairs left from '" + c_.data.train_src + "' after filtering (" +
                                 train.stats.summary() + ")");
    state_.skipped_empty = train.stats.empty_skipped;
    state_.filtered_long = train.stats.too_long;
    log_ << "training data: " << train.stats.summary() << "\n";
    BatcherOptions bo;
    bo.batch_tokens = c_.data.batch_tokens;
    bo.seed = c_.seed;
    batcher_ = std::make_unique<Batcher>(std::move(train.examples), bo);
    if (c_.overfit_batch) {
        overfit_rows_ = first_batch(batcher_->examples(), c_.data.batch_tokens);
        const Batch b = batcher_->batch(overfit_rows_);
        log_ << "--overfit-batch: every step trains on the first " << b.B << " pair" << (b.B == 1 ? "" : "s")
             << " of the training file (" << b.num_tgt_tokens << " target tokens); the loss should fall to about "
             << (c_.optim.label_smoothing > 0 ? "the label-smoothing floor (the nll to 0)" : "0") << "\n";
    }

    if (!c_.data.valid_src.empty()) {
        EncodedCorpus valid = encode_parallel(valid_text, tokenizers_, c_.data.max_len);
        if (lm)
            for (Example& e : valid.examples) e.src.clear();
        // Validation on none of the pairs would never choose a best model: refuse, as for training data.
        if (valid.examples.empty())
            throw std::runtime_error("no validation pairs left from '" + c_.data.valid_src + "' after filtering (" +
                                     valid.stats.summary() + "); raise --max-len or check the files");
        if (valid.stats.too_long > 0)
            log_ << "warning: " << valid.stats.too_long << " validation pairs have more than --max-len " << c_.data.max_len
                 << " tokens on a side and are not validated on\n";
        valid_examples_ = std::move(valid.examples);
        valid_src_lines_ = valid_text.source;
        valid_ref_lines_ = valid_text.target;
        if (c_.valid_bleu_sentences > 0 && static_cast<std::int64_t>(valid_src_lines_.size()) > c_.valid_bleu_sentences) {
            valid_src_lines_.resize(c_.valid_bleu_sentences);
            valid_ref_lines_.resize(c_.valid_bleu_sentences);
        }
        log_ << "validation data: " << valid.stats.summary() << "\n";
    }
}

// Fine-tuning (--init-from DIR): the run's model is DIR's, settings and weights, and so is its tokenizer; of
// the model settings only the dropouts are this run's (a fine-tuning recipe may change them). The rest of
// the run (data, optimiser, schedule, seed of the batch order and dropout) is this call's, from step 0.
void Trainer::read_init_model() {
    ModelBundle bundle = load_model_dir(c_.init_from);
    ModelConfig m = bundle.model->config;
    m.dropout = c_.model.dropout;
    m.attention_dropout = c_.model.attention_dropout;
    m.activation_dropout = c_.model.activation_dropout;
    if (c_.data.max_len + 2 > m.max_len)
        throw std::runtime_error("--init-from '" + c_.init_from + "': its model covers " + std::to_string(m.max_len) +
                                 " positions, fewer than --max-len " + std::to_string(c_.data.max_len) + " + 2 needs; lower --max-len to " +
                                 std::to_string(m.max_len - 2));
    c_.model = m;
    tokenizers_ = std::move(bundle.tokenizers);
    init_from_ = std::move(bundle.model);
    log_ << "initialised from " << c_.init_from << " (" << bundle.weights_path << "): its model settings and tokenizer"
         << (m.heads_removed() ? ", heads per layer " + m.head_counts_text() : "") << "\n";
}

void Trainer::build_model() {
    ModelConfig& m = c_.model;
    m.src_vocab = tokenizers_.source->vocab_size();  // decoder-only: the one tokenizer's, unused
    m.tgt_vocab = tokenizers_.target->vocab_size();
    m.pad_id = kPadId;
    m.bos_id = kBosId;
    m.eos_id = kEosId;
    // Decoding may run longer than training sentences: the positional table covers the decode cap too.
    m.max_len = std::max<std::int64_t>(m.max_len, c_.data.max_len + 2);
    model_ = std::make_unique<Transformer>(m, c_.seed);
    if (init_from_) {  // its weights, name by name (the same settings give the same names and shapes)
        const ParamList from = init_from_->parameters(), to = model_->parameters();
        for (std::size_t i = 0; i < to.size(); ++i) {
            Tensor dst = to[i].tensor;
            if (from.at(i).name != to[i].name || !(from[i].tensor.shape() == dst.shape()))
                throw std::logic_error("--init-from: parameter " + to[i].name + " differs from the model read");
            std::copy(from[i].tensor.data(), from[i].tensor.data() + dst.numel(), dst.data());
        }
        init_from_.reset();
    }
    const ParamList params = model_->parameters();
    AdamOptions ao{c_.optim.beta1, c_.optim.beta2, c_.optim.eps, c_.optim.weight_decay};
    if (c_.optim.optimizer == "adam") optimizer_ = std::make_unique<Adam>(params, ao);
    else if (c_.optim.optimizer == "adamw") optimizer_ = std::make_unique<AdamW>(params, ao);
    else optimizer_ = std::make_unique<Sgd>(params, SgdOptions{c_.optim.momentum, 0, false, c_.optim.weight_decay});
    if (c_.optim.ema > 0) average_ = std::make_unique<WeightAverage>(params, c_.optim.ema);
    c_.optim.schedule.d_model = m.d_model;
    dropout_rng_ = Rng(hash64(c_.seed, 0xD409));

    if (c_.resume && resume_from_.empty()) {
        log_ << "no checkpoint in " << dir_ << " yet (the run stopped before its first one): starting it from step 0\n";
    } else if (c_.resume) {
        const std::string path = (fs::path(dir_) / resume_from_).string();
        const auto prev_stats = std::make_pair(state_.skipped_empty, state_.filtered_long);
        try {
            RunStamp stamp;
            state_ = load_training_checkpoint(path, *model_, *optimizer_, tokenizer_hash(tokenizers_), average_.get(), &stamp);
            if (stamp.run_id != identity_.run_id)
                throw std::runtime_error(path + ": a checkpoint of another run (" +
                                         (stamp.run_id.empty() ? std::string("no run id") : "run id " + stamp.run_id) + "; this run, " +
                                         dir_ + "/run.json, is " +
                                         (identity_.run_id.empty() ? std::string("of no run id") : "run " + identity_.run_id) +
                                         "); move it out of " + dir_ + "/checkpoints");
            check_run_settings(path, stamp);
            // The state must be the one this file's name and this run's data allow.
            if (state_.step != checkpoint_step(resume_from_))
                throw std::runtime_error(path + ": its training state is at step " + std::to_string(state_.step) +
                                         ", not at the step its name gives (" + std::to_string(checkpoint_step(resume_from_)) + ")");
            if (state_.batch_in_epoch > batcher_->num_batches())
                throw std::runtime_error(path + ": its training state is at batch " + std::to_string(state_.batch_in_epoch) +
                                         " of an epoch, but the run's training data gives " +
                                         std::to_string(batcher_->num_batches()) + " batches per epoch");
            check_reachable(path);
        } catch (const std::runtime_error& e) {
            if (manifest_.kept.size() < 2) throw;
            const std::string& older = manifest_.kept[manifest_.kept.size() - 2];
            throw std::runtime_error(std::string(e.what()) +
                                     " (an older checkpoint is kept: delete this file and --resume continues from " + older + ")");
        }
        std::tie(state_.skipped_empty, state_.filtered_long) = prev_stats;
        dropout_rng_.offset = state_.dropout_offset;
        checkpointed_ = state_;
        log_ << "resuming from " << path << " (step " << state_.step << ", epoch " << state_.epoch + 1 << ")\n";
    }
    std::string off;  // the parts of the paper's model switched off, as their flags
    for (const std::string& flag : switched_off_parts(m)) off += ", " + flag;
    const std::string layers = m.decoder_only() ? "decoder-only, " + std::to_string(m.dec_layers)
                                                : std::to_string(m.enc_layers) + "+" + std::to_string(m.dec_layers);
    const std::string vocab = m.decoder_only() ? std::to_string(m.tgt_vocab) : std::to_string(m.src_vocab) + "/" + std::to_string(m.tgt_vocab);
    log_ << "model: " << model_->parameter_count() << " parameters (d_model " << m.d_model << ", " << m.heads << " heads"
         << (m.heads_removed() ? " (per layer " + m.head_counts_text() + ")" : "") << ", ffn "
         << m.ffn << ", " << layers << " layers, " << to_string(m.norm) << "-norm, tie "
         << to_string(m.tie) << ", vocab " << vocab << off << "); " << batcher_->num_batches() << " batches per epoch"
         << (c_.optim.accumulate > 1 ? " (" + std::to_string(steps_per_epoch()) + " optimizer steps of --accumulate " +
                                            std::to_string(c_.optim.accumulate) + ")"
                                      : std::string())
         << "; " << num_threads() << (num_threads() == 1 ? " thread" : " threads")
         << (precision() == Precision::BF16 ? "; bf16 products" : "")
         << (reference_mode() ? "; reference ops (src/reference_ops.cpp)" : "") << "; lr " << c_.optim.schedule.describe()
         << (c_.optim.cooldown > 0 ? ", cooling down to 0 over the run's last " + fmt("%g", 100 * c_.optim.cooldown) + "%" : std::string())
         << (average_ ? "; validates a weight average (ema " + fmt("%g", c_.optim.ema) + ")" : std::string()) << "\n";
}

// The settings that decide the run (all but those may_change_mid_run) must be those the checkpoint was
// trained with, and so must the data files' records: an edited run.json (another seed, other data)
// would otherwise continue silently into other losses. A checkpoint without run.json (written before
// checkpoints kept it) has nothing to compare with.
void Trainer::check_run_settings(const std::string& path, const RunStamp& stamp) const {
    if (stamp.run_json.empty()) return;
    const std::string run_json_path = (fs::path(dir_) / "run.json").string();
    TrainConfig then;
    RunIdentity then_identity;
    try {
        then = train_config_from_json(stamp.run_json);
        then_identity = run_identity_from_json(stamp.run_json);
    } catch (const std::exception& e) {
        throw std::runtime_error(path + ": the run.json it keeps cannot be read: " + e.what());
    }
    const std::string fix = ": the settings that decide a run cannot change mid-run; restore run.json, or start a new run";
    for (const Setting<TrainConfig>& s : train_settings()) {
        if (s.key.empty() || may_change_mid_run(s.key)) continue;
        const std::string now = s.get(c_), before = s.get(then);
        if (now != before)
            throw std::runtime_error(run_json_path + ": " + s.key + (s.name.empty() ? "" : " (--" + s.name + ")") + " is " + now +
                                     ", but " + path + " was trained with " + before + fix);
    }
    for (const DataSlot& d : kDataSlots) {
        const auto a = identity_.data.find(d.key);
        const auto b = then_identity.data.find(d.key);
        const std::string now = a == identity_.data.end() ? "none" : data_file_text(a->second);
        const std::string before = b == then_identity.data.end() ? "none" : data_file_text(b->second);
        if (now != before)
            throw std::runtime_error(run_json_path + ": data_files." + d.key + " (" + d.flag + ") records " + now + ", but " + path +
                                     " was trained on " + before + fix);
    }
}

// A training state the run reaches, checked against itself (train_state_from_json) and here against the
// run's settings and data: its checksum only shows that nothing was corrupted, and a program that edits
// the state can recompute it.
void Trainer::check_reachable(const std::string& path) const {
    const TrainState& s = state_;
    auto refuse = [&](const std::string& what) { throw std::runtime_error(path + ": its training state " + what + ", which this run does not reach"); };
    const std::int64_t batches = batcher_->num_batches();
    if (c_.overfit_batch) {
        if (s.epoch != 0 || s.batch_in_epoch != 0)
            refuse("is at epoch " + std::to_string(s.epoch + 1) + ", batch " + std::to_string(s.batch_in_epoch) +
                   " (--overfit-batch trains one endless epoch)");
    } else if (s.batch_in_epoch % c_.optim.accumulate != 0 && s.batch_in_epoch != batches) {
        refuse("is at batch " + std::to_string(s.batch_in_epoch) + " of an epoch, inside a global batch of --accumulate " +
               std::to_string(c_.optim.accumulate));
    } else if (const std::int64_t before = s.step - steps_into_epoch(), per = steps_per_epoch();
               before % per != 0 || before / per != s.epoch) {
        // Each global batch is one step: step = epoch · steps per epoch + steps into the epoch.
        refuse("is at epoch " + std::to_string(s.epoch + 1) + ", batch " + std::to_string(s.batch_in_epoch) + " of it at step " +
               std::to_string(s.step) + " (with " + std::to_string(per) + " steps per epoch, step " + std::to_string(s.step) +
               " is epoch " + std::to_string(before / per + 1) + ")");
    }
    if (valid_examples_.empty() && (s.valid_step >= 0 || s.best_step >= 0))
        refuse("records a validation at step " + std::to_string(std::max(s.valid_step, s.best_step)) + " (the run has no validation data)");
    if (s.best_step < 0 && s.best_score != 0) refuse("has a best score without a validation");
    if (s.best_step >= 0 && (c_.valid_bleu ? s.best_score < 0 || s.best_score > 100 : s.best_score > 0))
        refuse("has best score " + fmt("%g", s.best_score) + (c_.valid_bleu ? " (a BLEU is between 0 and 100)" : " (-loss is at most 0)"));
    // Every step trains on at least one target token (each row ends with EOS) and at most --batch-tokens in
    // each of its --accumulate batches.
    const std::int64_t step_tokens = c_.data.batch_tokens * c_.optim.accumulate;
    if (s.target_tokens < s.step || (s.step > 0 && (s.target_tokens - 1) / step_tokens >= s.step))
        refuse("counts " + std::to_string(s.target_tokens) + " target tokens in " + std::to_string(s.step) + " steps of at most " +
               std::to_string(step_tokens));
    const TrainState::LogWindow& w = s.log_window;
    if (w.tokens < w.steps || w.tokens > s.target_tokens || w.seconds > s.train_seconds)
        refuse("has a log window of " + std::to_string(w.steps) + " steps, " + std::to_string(w.tokens) + " tokens and " +
               fmt("%g", w.seconds) + " s in a run of " + std::to_string(s.target_tokens) + " tokens and " + fmt("%g", s.train_seconds) + " s");
}

void Trainer::start_writing() {
    if (!writer()) return;
    std::error_code ec;
    if (!lock_.held()) {
        fs::create_directories(dir_, ec);
        if (ec) throw std::runtime_error("cannot create '" + dir_ + "': " + ec.message());
        lock_directory();
    }
    if (!c_.resume) {
        if (holds_run(dir_)) {  // with --force (prepare_directory refused it otherwise)
            log_ << "--force: deleting the previous run's files in " << dir_ << "\n";
            remove_run_files(dir_);
        }
        tokenizers_.save(dir_);
        write_file_atomic((fs::path(dir_) / "run.json").string(), run_json(c_, identity_));
        write_file_atomic((fs::path(dir_) / "config.toml").string(), to_toml(c_));
    }
    if (!updated_run_json_.empty()) write_file_atomic((fs::path(dir_) / "run.json").string(), updated_run_json_);
    fs::create_directories(fs::path(dir_) / "checkpoints", ec);
    if (ec) throw std::runtime_error("cannot create '" + dir_ + "/checkpoints': " + ec.message());
    const std::string metrics = (fs::path(dir_) / "metrics.jsonl").string();
    // A resumed run continues from its checkpoint's step; one with no checkpoint starts over and keeps no
    // line (not even step 0's validation, which it writes again).
    const std::int64_t kept_step = resume_from_.empty() ? -1 : state_.step;
    if (c_.resume) truncate_metrics(metrics, kept_step);
    metrics_.open(metrics, std::ios::app);
    if (!metrics_) throw std::runtime_error("cannot write '" + metrics + "'");
    // heads.jsonl is written by the head-log watcher (HeadLogWatcher, a study), but which lines a resumed run
    // keeps is the run's to say, as for metrics.jsonl.
    if (c_.resume && c_.log_heads_every) truncate_metrics((fs::path(dir_) / "heads.jsonl").string(), kept_step);
    for (StepWatcher* w : watchers_) w->start(c_);
}

void Trainer::write_metrics(const MetricsLine& line) {
    if (!writer()) return;
    metrics_ << to_json(line).dump() << "\n";
    metrics_.flush();
    if (!metrics_) throw std::runtime_error("cannot write '" + dir_ + "/metrics.jsonl' (is the disk full?)");
}

std::int64_t Trainer::steps_per_epoch() const {
    return (batcher_->num_batches() + c_.optim.accumulate - 1) / c_.optim.accumulate;
}

std::int64_t Trainer::steps_into_epoch() const {
    return (state_.batch_in_epoch + c_.optim.accumulate - 1) / c_.optim.accumulate;
}

// One step of the library's (train_step.h) on the global batch `micro` (--accumulate batches, fewer at an
// epoch's end), and the run's bookkeeping around it: the step count, the dropout stream's position, the log
// window; the watchers of the step (train.h, shown the first micro-batch) and, at --log-every steps, the
// metrics line's layer_grad_norms read the gradients before clipping.
void Trainer::train_step(const std::vector<Batch>& micro) {
    const Batch& b = micro.front();
    const auto t0 = Clock::now();
    StepSettings settings;
    settings.lr = step_lr();
    ++state_.step;
    settings.step = state_.step;
    settings.label_smoothing = c_.optim.label_smoothing;
    settings.clip = c_.optim.clip;
    settings.fuse_attention = true;  // the same numbers as the composed ops (ops.h attention_heads), faster
    WatchersOfStep watching(watchers_, state_.step);
    settings.observer = watching.observer();
    settings.check_nan = c_.check_nan;
    StepHooks hooks;
    hooks.before_update = [&](const StepResult& r) {
        watching.after_backward(WatchedStep{state_.step, state_.epoch + 1, b, r.loss, *model_});  // gradients before clipping
        if (state_.step % c_.log_every == 0) layer_grad_norms_ = layer_grad_norms(optimizer_->params());
    };
    StepResult step;
    try {
        std::vector<StepBatch> global;
        for (const Batch& m : micro) global.push_back(StepBatch{m.src, m.dec_in, m.target, m.B, m.S, m.T});
        step = tf::train_step(StepParts{*model_, *optimizer_, average_.get(), &dropout_rng_, ranks_}, global, settings, hooks);
    } catch (const NonFiniteStep& e) {
        const std::string where = c_.check_nan ? "; " + e.where : " (run with --check-nan to find the op)";
        throw std::runtime_error("non-finite " + e.value + " at step " + std::to_string(e.step) + where +
                                 (e.of_loss ? "; the last checkpoint stays intact — try a lower learning rate or --clip"
                                            : "; the last checkpoint stays intact"));
    }
    const LossReport& report = step.loss;
    last_grad_norm_ = step.grad_norm;
    reduce_seconds_ += step.reduce_seconds;
    state_.dropout_offset = dropout_rng_.offset;
    state_.target_tokens += report.tokens;

    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    last_step_seconds_ = seconds;
    state_.train_seconds += seconds;
    TrainState::LogWindow& window = state_.log_window;
    window.seconds += seconds;
    window.loss += report.loss * double(report.tokens);
    window.nll += report.nll * double(report.tokens);
    window.tokens += report.tokens;
    ++window.steps;
    last_lr_ = settings.lr;
    result_.last_loss = report.loss;
}

// The fraction of the run done before the next step, by whichever stop is nearer: --max-steps, --epochs or
// --time-budget (by the clock). The progress bar shows it; the cooldown follows it.
double Trainer::run_progress() const {
    double done = 0;
    if (c_.max_steps) done = std::max(done, double(state_.step) / double(c_.max_steps));
    if (c_.epochs) {
        const std::int64_t total = c_.epochs * steps_per_epoch();
        done = std::max(done, double(state_.epoch * steps_per_epoch() + steps_into_epoch()) / double(total));
    }
    if (c_.time_budget_minutes) done = std::max(done, state_.train_seconds / (c_.time_budget_minutes * 60));
    return std::clamp(done, 0.0, 1.0);
}

// The next step's learning rate. Under mpirun a cooldown by the clock follows rank 0's progress, so that
// every rank takes the same step.
double Trainer::step_lr() const {
    const double lr = c_.optim.schedule.lr_at(state_.step + 1);
    if (c_.optim.cooldown == 0) return lr;
    double done = run_progress();
    if (ranks_->size() > 1 && c_.time_budget_minutes) {
        constexpr double kScale = 0x1.0p40;  // the broadcast carries an integer: progress in steps of 2^-40
        done = double(ranks_->from_rank0(static_cast<std::int64_t>(done * kScale))) / kScale;
    }
    return lr * cooldown_factor(done, c_.optim.cooldown);
}

double Trainer::eta_seconds() const {
    const TrainState::LogWindow& window = state_.log_window;
    const double per_step = window.steps ? window.seconds / double(window.steps) : 0;
    double eta = std::numeric_limits<double>::infinity();
    if (c_.max_steps) eta = std::min(eta, double(c_.max_steps - state_.step) * per_step);
    if (c_.epochs) {
        const std::int64_t total = c_.epochs * steps_per_epoch();
        const std::int64_t done = state_.epoch * steps_per_epoch() + steps_into_epoch();
        eta = std::min(eta, double(total - done) * per_step);
    }
    if (c_.time_budget_minutes) eta = std::min(eta, c_.time_budget_minutes * 60 - state_.train_seconds);
    return eta;
}

// A metrics line every --log-every steps, averaging the steps since the last one (state_.log_window), and
// at the end of the run. An interrupted run only prints the window so far: the window stays in the
// checkpoint, and the resumed run writes the line at the same step as the uninterrupted run would.
void Trainer::log_progress(bool force_line, bool interrupted) {
    if (!writer()) return;
    TrainState::LogWindow& window = state_.log_window;
    const bool at_log_step = state_.step % c_.log_every == 0;
    if (!at_log_step && !force_line) {
        // The live bar: redraw at most ten times a second.
        if (bar_ && Clock::now() - last_bar_ > std::chrono::milliseconds(100) && window.tokens > 0) {
            last_bar_ = Clock::now();
            const int width = 20, filled = static_cast<int>(run_progress() * width);
            const double loss = window.loss / double(window.tokens), nll = window.nll / double(window.tokens);
            log_ << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << state_.step
                 << " | ep " << state_.epoch + 1 << " | loss " << fmt("%.3f", loss) << " | ppl " << fmt("%.2f", std::exp(nll))
                 << " | lr " << fmt("%.2e", last_lr_) << " | " << fmt("%.0f", double(window.tokens) / window.seconds)
                 << " tok/s | ETA " << clock_text(eta_seconds()) << std::flush;
        }
        return;
    }
    if (window.tokens == 0) return;
    const double loss = window.loss / double(window.tokens), nll = window.nll / double(window.tokens);
    const double tok_s = double(window.tokens) / window.seconds;
    if (bar_) log_ << "\r\033[K";
    log_ << "step " << state_.step << " | epoch " << state_.epoch + 1 << " | loss " << fmt("%.4f", loss) << " | nll "
         << fmt("%.4f", nll) << " | ppl " << fmt("%.2f", std::exp(nll)) << " | lr " << fmt("%.3e", last_lr_) << " | |g| "
         << fmt("%.3f", last_grad_norm_) << " | " << fmt("%.0f", tok_s) << " tgt tok/s"
         << (ranks_->size() > 1 ? " | reduce " + fmt("%.2f", 1e3 * reduce_seconds_ / double(window.steps)) + " ms/step" : "")
         << " | " << clock_text(state_.train_seconds)
         << " elapsed | ETA " << clock_text(eta_seconds()) << (interrupted ? " (interrupted)" : "") << "\n";
    if (interrupted) return;
    MetricsLine line;
    line.type = MetricsLine::Type::Train;
    line.step = state_.step;
    line.epoch = state_.epoch + 1;
    line.loss = loss, line.nll = nll, line.ppl = std::exp(nll);
    line.lr = last_lr_, line.grad_norm = last_grad_norm_, line.tok_per_s = tok_s, line.elapsed = state_.train_seconds;
    line.tokens_per_step = double(window.tokens) / double(window.steps);  // target tokens of an optimizer step
    if (ranks_->size() > 1) line.reduce_ms = 1e3 * reduce_seconds_ / double(window.steps);
    reduce_seconds_ = 0;
    // [[layer, ‖g‖], ...] of this step, before clipping (tapeformer report draws them); only at log steps.
    if (state_.step % c_.log_every == 0) line.layer_grad_norms = layer_grad_norms_;
    layer_grad_norms_.clear();
    write_metrics(line);
    window = TrainState::LogWindow{};
}

// The validation loss of the weights before the first step, so that the validation curves start where
// training does (about ln V for a fresh model: every token equally likely). Only a loss, of the same
// weights validation scores (--ema: their average, equal to them at step 0): it decodes nothing, chooses
// no best model and saves nothing, so the run's checkpoints and best model are those of a run without it.
// A signal during it leaves no line.
void Trainer::validate_before_training() {
    if (!writer() || valid_examples_.empty() || state_.step != 0) return;
    struct Interrupted {};
    const ProgressFn stop_on_signal = [](std::int64_t, std::int64_t) {
        if (interrupt_signal()) throw Interrupted{};
    };
    LossReport loss;
    try {
        const AveragedWeightsScope averaged(average_.get());
        loss = teacher_forced_loss(*model_, valid_examples_, c_.data.batch_tokens, c_.optim.label_smoothing, stop_on_signal);
    } catch (const Interrupted&) {
        return;
    }
    MetricsLine line;
    line.type = MetricsLine::Type::Valid;
    line.step = 0;
    line.epoch = 1;
    line.valid_loss = loss.loss, line.valid_nll = loss.nll, line.valid_ppl = loss.ppl, line.elapsed = 0;
    line.weights = average_ ? "ema" : "last";
    write_metrics(line);
    log_ << "validation before training | loss " << fmt("%.4f", loss.loss) << " | nll " << fmt("%.4f", loss.nll)
         << " | ppl " << fmt("%.2f", loss.ppl)
         << (c_.init_from.empty() ? " (a model that knows nothing: nll ln V = " + fmt("%.4f", std::log(double(model_->config.tgt_vocab))) + ")"
                                  : " (the model of --init-from)")
         << "\n";
}

// A signal during validation ends it after the batch under way: a large validation set must not keep a
// Ctrl-C waiting for minutes. Nothing of an interrupted validation is kept (valid_step stays as it was),
// so the checkpoint still owes it and the resumed run validates this step first.
bool Trainer::validate() {
    // In a job, rank 0 validates alone (the others wait for it in the next step's exchange).
    if (!writer() || valid_examples_.empty() || state_.valid_step == state_.step) return true;
    if (bar_) log_ << "\r\033[K";
    log_ << "validating at step " << state_.step << " (" << valid_examples_.size() << " pairs"
         << (c_.valid_bleu ? ", BLEU of " + std::to_string(valid_src_lines_.size()) + " sentences" : std::string()) << ")\n";
    struct Interrupted {};
    const ProgressFn stop_on_signal = [](std::int64_t, std::int64_t) {
        if (interrupt_signal()) throw Interrupted{};
    };
    try {
        validate_now(stop_on_signal);
    } catch (const Interrupted&) {
        log_ << "validation at step " << state_.step << " interrupted; a resumed run validates this step first\n";
        return false;
    }
    return true;
}

void Trainer::validate_now(const ProgressFn& after_each_batch) {
    const auto t0 = Clock::now();
    const AveragedWeightsScope averaged(average_.get());  // --ema: the average is what is scored and kept
    const LossReport loss =
        teacher_forced_loss(*model_, valid_examples_, c_.data.batch_tokens, c_.optim.label_smoothing, after_each_batch);
    MetricsLine line;
    line.type = MetricsLine::Type::Valid;
    line.step = state_.step;
    line.epoch = state_.epoch + 1;
    line.valid_loss = loss.loss, line.valid_nll = loss.nll, line.valid_ppl = loss.ppl, line.elapsed = state_.train_seconds;
    line.weights = average_ ? "ema" : "last";
    double score = -loss.loss;
    std::string bleu_text;
    if (c_.valid_bleu) {
        const auto hyps = translate_lines(*model_, tokenizers_, valid_src_lines_, DecodeOptions{}, c_.data.batch_tokens,
                                          after_each_batch);
        std::vector<std::string> refs;
        for (const auto& r : valid_ref_lines_) refs.emplace_back(trim(r));
        const BleuScore bleu = corpus_bleu(hyps, refs);
        const ExactMatch exact = exact_match(hyps, refs);
        line.valid_bleu = bleu.score;
        line.valid_exact = exact.fraction();
        score = bleu.score;
        bleu_text = " | greedy BLEU " + fmt("%.2f", bleu.score) + " | exact " + std::to_string(exact.matched) + "/" +
                    std::to_string(exact.total);
        result_.best_valid_bleu = std::max(result_.best_valid_bleu, bleu.score);
    }
    state_.valid_step = state_.step;  // done: from here on nothing can be interrupted
    result_.best_valid_loss = result_.best_valid_loss < 0 ? loss.loss : std::min(result_.best_valid_loss, loss.loss);
    const bool improved = state_.best_step < 0 || score > state_.best_score;
    if (improved) {
        state_.best_score = score;
        state_.best_step = state_.step;
        save_model_weights((fs::path(dir_) / "model.safetensors").string(), *model_, tokenizer_hash(tokenizers_),
                           RunStamp{identity_.run_id, state_.step, ""});
    }
    line.best = improved;
    write_metrics(line);
    log_ << "valid @ step " << state_.step << (average_ ? " (weight average)" : "") << " | loss " << fmt("%.4f", loss.loss) << " | nll " << fmt("%.4f", loss.nll)
         << " | ppl " << fmt("%.2f", loss.ppl) << bleu_text << (improved ? " | new best, saved model.safetensors" : "")
         << " (" << fmt("%.1f", std::chrono::duration<double>(Clock::now() - t0).count()) << " s)\n";
}

// Not only the step: a validation, the end of an epoch or the run's last metrics line after the checkpoint
// at this step changes what a resumed run must do, so the checkpoint is written again.
bool Trainer::unsaved_changes() const {
    const TrainState &now = state_, &saved = checkpointed_;
    return now.step != saved.step || now.epoch != saved.epoch || now.batch_in_epoch != saved.batch_in_epoch ||
           now.valid_step != saved.valid_step || now.best_step != saved.best_step ||
           now.log_window.steps != saved.log_window.steps;
}

void Trainer::checkpoint() {
    if (!writer() || !unsaved_changes()) return;
    const auto t0 = Clock::now();
    checkpointed_ = state_;
    const std::string name = checkpoint_name(state_.step);
    save_training_checkpoint((fs::path(dir_) / name).string(), *model_, *optimizer_, state_, tokenizer_hash(tokenizers_),
                             average_.get(), RunStamp{identity_.run_id, -1, run_json(c_, identity_)});
    // Until a validation has chosen the best weights (and always without validation data), the weights to
    // use are the last ones (their average, with --ema): a run killed before its first validation still
    // leaves a usable model.
    if (valid_examples_.empty() || state_.best_step < 0) {
        const AveragedWeightsScope averaged(average_.get());
        save_model_weights((fs::path(dir_) / "model.safetensors").string(), *model_, tokenizer_hash(tokenizers_),
                           RunStamp{identity_.run_id, state_.step, ""});
    }
    manifest_.last = name;
    manifest_.kept.erase(std::remove(manifest_.kept.begin(), manifest_.kept.end(), name), manifest_.kept.end());
    manifest_.kept.push_back(name);
    std::vector<std::string> dropped;
    while (static_cast<int>(manifest_.kept.size()) > c_.keep) {
        dropped.push_back(manifest_.kept.front());
        manifest_.kept.erase(manifest_.kept.begin());
    }
    write_manifest(dir_, manifest_, state_);  // only now is the new checkpoint the one to resume from
    std::error_code ec;
    // --keep-every: those steps' checkpoints stay on disk when they leave the rotation.
    auto kept_for_good = [&](const std::string& f) { return c_.keep_every && checkpoint_step(f) % c_.keep_every == 0; };
    for (const auto& f : dropped)
        if (!kept_for_good(f)) fs::remove(fs::path(dir_) / f, ec);
    // Older checkpoints that a kill between state.json and the pruning above left behind.
    const std::int64_t oldest_kept = checkpoint_step(manifest_.kept.front());
    for (const std::string& f : checkpoints_on_disk(dir_))
        if (checkpoint_step(f) < oldest_kept && !kept_for_good(f)) fs::remove(fs::path(dir_) / f, ec);
    note_stop_time(std::chrono::duration<double>(Clock::now() - t0).count());
}

// On Ctrl-C mpirun sends the ranks SIGTERM and, odls_base_sigkill_timeout seconds later, SIGKILL (README):
// within that time the ranks finish the step under way and rank 0 writes its checkpoint. After the run's
// first checkpoint, rank 0 says once if a step and a checkpoint took more than half of it.
void Trainer::note_stop_time(double save_seconds) {
    if (ranks_->size() == 1 || stop_time_noted_) return;
    stop_time_noted_ = true;
    const double needed = last_step_seconds_ + save_seconds, timeout = mpirun_kill_timeout_seconds();
    if (needed <= timeout / 2) return;
    const int enough = int(std::ceil(std::max(5.0, 2 * needed)));
    log_ << "note: on Ctrl-C mpirun gives the ranks odls_base_sigkill_timeout = " << fmt("%g", timeout)
         << " s to finish their step and save; a step and a checkpoint took " << fmt("%.1f", needed)
         << " s here, so Ctrl-C would not save: start mpirun with --mca odls_base_sigkill_timeout " << enough << "\n";
}

// An MPI job of R ranks deals each global batch's --accumulate micro-batches to its ranks: each needs one.
void Trainer::check_ranks() const {
    const int size = ranks_->size();
    if (size > 1 && c_.optim.accumulate < size)
        throw std::invalid_argument("--accumulate " + std::to_string(c_.optim.accumulate) + " under mpirun -np " +
                                    std::to_string(size) + ": a global batch of --accumulate micro-batches is dealt to the " +
                                    std::to_string(size) + " ranks, each needs at least one; give --accumulate " +
                                    std::to_string(size) + " (or a multiple of it)");
}

// A signal on any rank stops them all at this step boundary; the time budget is rank 0's clock.
StopReason Trainer::stop_reason() {
    StopReason reason = StopReason::none;
    if (interrupt_signal()) reason = StopReason::interrupted;
    else if (c_.max_steps && state_.step >= c_.max_steps) reason = StopReason::max_steps;
    else if (c_.time_budget_minutes && state_.train_seconds >= c_.time_budget_minutes * 60) reason = StopReason::time_budget;
    else if (c_.epochs && state_.epoch >= c_.epochs) reason = StopReason::epochs;
    if (ranks_->size() == 1) return reason;
    if (ranks_->max(reason == StopReason::interrupted)) return StopReason::interrupted;
    return static_cast<StopReason>(ranks_->from_rank0(static_cast<std::int64_t>(reason)));
}

TrainResult Trainer::run() {
    if (c_.precision == Precision::INT8)
        throw std::invalid_argument("precision int8 is for decoding (translate, eval, bench train --eval-greedy); "
                                    "train multiplies in fp32 or bf16");
    if (reference_mode() && c_.precision == Precision::BF16)
        throw std::invalid_argument("precision bf16: reference mode multiplies in fp32 with three loops; run without one of them");
    ranks_ = &world();
    set_threads(c_.threads);  // --threads: per rank
    // From the start: reading data and training a tokenizer can take minutes.
    SignalScope signals(num_threads(), /*announce=*/writer());
    // The run's precision (its own on --resume), for this run only.
    struct RestoreFp32 {
        ~RestoreFp32() { set_precision(Precision::FP32); }
    } restore_fp32;
    // Every rank reads and checks the inputs; only when all of them could does rank 0 write anything. The
    // first rank that could not reports why; the others end without a second message.
    std::exception_ptr failure;
    try {
        prepare_directory();
        prepare_data();  // (--init-from: the model's settings, its width among them, come from there)
        if (c_.precision == Precision::AUTO) {  // (before run.json is written: it records the choice)
            std::string why;
            c_.precision = auto_precision(c_.model.d_model, why);
            if (c_.precision == Precision::BF16) log_ << why << "\n";  // (fp32, as before auto, goes unsaid)
        }
        if (const std::string note = set_precision(c_.precision); !note.empty()) log_ << note << "\n";
        build_model();
        check_ranks();
    } catch (...) {
        failure = std::current_exception();
    }
    const int size = ranks_->size();
    const std::int64_t first_failed = ranks_->min(failure ? ranks_->rank() : size);
    if (first_failed < size) job_ends_on_every_rank();
    if (failure && first_failed == ranks_->rank()) std::rethrow_exception(failure);
    if (first_failed < size) throw AnotherRankFailed(int(first_failed));
    if (ranks_->max(interrupt_signal())) {  // nothing written yet: end here, leaving the directory as it was
        log_ << "interrupted before training started; nothing was written to " << dir_ << "\n";
        result_.stop_reason = StopReason::interrupted;
        result_.steps = state_.step;
        return result_;
    }
    start_writing();
    validate_before_training();
    const std::int64_t first_step = state_.step;

    auto end_epoch = [&]() {
        ++state_.epoch;
        state_.batch_in_epoch = 0;
        if (c_.valid_every == 0) validate();
    };
    // A checkpoint at an epoch's last batch was saved before the epoch ended: a resumed run ends it first,
    // as the run did, whatever its stopping rule says.
    if (state_.batch_in_epoch >= batcher_->num_batches()) end_epoch();
    // A validation interrupted by a signal is owed: the resumed run makes it before its next step.
    const bool validation_due = c_.valid_every ? state_.step > 0 && state_.step % c_.valid_every == 0
                                               : state_.epoch > 0 && state_.batch_in_epoch == 0;
    if (c_.resume && validation_due) validate();
    // The global batch at the run's data position (epoch, batch_in_epoch): the --accumulate batches of the
    // epoch's plan from batch_in_epoch on, or those left when the epoch has fewer (its last global batch is
    // shorter; the next epoch starts a global batch of its own); --overfit-batch: the one batch, in one
    // endless epoch (validate() asks for --max-steps or --time-budget, and --accumulate 1).
    std::vector<std::vector<std::int64_t>> plan;  // epoch_plan(plan_epoch)
    std::int64_t plan_epoch = -1;
    auto next_global_batch = [&]() {
        if (c_.overfit_batch) return std::vector<Batch>{batcher_->batch(overfit_rows_)};
        if (plan_epoch != state_.epoch) {
            plan = batcher_->epoch_plan(state_.epoch);
            plan_epoch = state_.epoch;
        }
        const std::int64_t end = std::min(state_.batch_in_epoch + c_.optim.accumulate, batcher_->num_batches());
        std::vector<Batch> micro;
        for (std::int64_t i = state_.batch_in_epoch; i < end; ++i) micro.push_back(batcher_->batch(plan[i]));
        return micro;
    };
    StopReason reason = stop_reason();
    while (reason == StopReason::none) {
        const std::vector<Batch> global = next_global_batch();
        train_step(global);
        if (!c_.overfit_batch) state_.batch_in_epoch += std::int64_t(global.size());
        log_progress(false);
        if (c_.valid_every && state_.step % c_.valid_every == 0) validate();
        if (state_.step % c_.checkpoint_every == 0 || (c_.keep_every && state_.step % c_.keep_every == 0)) checkpoint();
        reason = stop_reason();
        // The epoch ends after its last batch's checkpoint (the resumed run ends it, above).
        if (!c_.overfit_batch && state_.batch_in_epoch >= batcher_->num_batches()) {
            end_epoch();
            if (reason == StopReason::none) reason = stop_reason();
        }
    }
    log_progress(true, reason == StopReason::interrupted);
    // The run ends with a validation of its last weights (unless interrupted: the resumed run owes it).
    if (reason != StopReason::interrupted && !validate()) reason = StopReason::interrupted;
    if (c_.resume && state_.step == first_step && !unsaved_changes() && reason != StopReason::interrupted) {
        // Resumed a run that had already reached its stopping rule and validated: nothing to rewrite.
        log_ << "the run in " << dir_ << " already reached its stopping rule at step " << state_.step
             << "; extend it with --max-steps, --epochs or --time-budget\n";
        result_.steps = state_.step;
        result_.stop_reason = reason;
        return result_;
    }
    checkpoint();
    result_.steps = state_.step;
    result_.train_seconds = state_.train_seconds;
    result_.stop_reason = reason;
    if (result_.interrupted())
        log_ << "interrupted at step " << state_.step << "; checkpoint saved. Resume with: tapeformer train --out " << dir_
             << " --resume\n";
    else
        log_ << "stopped after " << state_.step << " steps (" << to_string(reason) << "), " << clock_text(state_.train_seconds)
             << " of training" << (state_.best_step >= 0 ? "; best validation at step " + std::to_string(state_.best_step) : "")
             << "; model: " << (fs::path(dir_) / "model.safetensors").string() << "\n";
    return result_;
}

}  // namespace

const char* to_string(StopReason reason) {
    switch (reason) {
        case StopReason::none: return "none";
        case StopReason::max_steps: return "max steps";
        case StopReason::epochs: return "epochs";
        case StopReason::time_budget: return "time budget";
        case StopReason::interrupted: return "interrupted";
    }
    return "?";
}

TrainResult train(TrainConfig config, std::ostream& log, bool progress_bar, const std::vector<StepWatcher*>& watchers) {
    config.validate();
    // In an MPI job the ranks but rank 0 train quietly: no log, no watchers (they write files).
    static std::ostream quiet(nullptr);
    const bool rank0 = world().rank() == 0;
    Trainer trainer(std::move(config), rank0 ? log : quiet, rank0 && progress_bar,
                    rank0 ? watchers : std::vector<StepWatcher*>{});
    return trainer.run();
}

TF_NAMESPACE_END
