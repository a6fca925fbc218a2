// Model weights, training checkpoints and model directories. See checkpoint.h for the layout.
#include "tapeformer/run/checkpoint.h"
#include "run/json_integer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <tuple>

#include "tapeformer/data/vocab.h"
#include "tapeformer/error.h"
#include "tapeformer/io.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/safetensors.h"

TF_NAMESPACE_BEGIN

namespace fs = std::filesystem;

namespace {

const char* kFormatKey = "tapeformer.format";
const char* kKindKey = "tapeformer.kind";
const char* kStateKey = "tapeformer.train_state";
const char* kOptimPrefix = "optim.";
const char* kAveragePrefix = "ema.";
const char* kTokenizerKey = "tapeformer.tokenizer";
const char* kRunIdKey = "tapeformer.run_id";
const char* kStepKey = "tapeformer.step";    // model files: the step whose weights they hold
const char* kRunJsonKey = "tapeformer.run";  // checkpoints: run.json when written

std::string crc_text(std::uint32_t crc) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", crc);
    return std::string("crc32c:") + hex;
}

// The bytes Tokenizer::save writes for `t`: vocab.txt's lines, or spm.model as is.
std::string tokenizer_file_bytes(const Tokenizer& t) {
    if (const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&t)) return sp->serialized_model();
    std::string text;
    for (std::int32_t id = 0; id < t.vocab_size(); ++id) text += t.id_to_piece(id) + '\n';
    return text;
}

std::map<std::string, std::string> model_metadata(const Transformer& model, const char* kind,
                                                  const std::string& tokenizer_hash, const std::string& run_id) {
    std::map<std::string, std::string> meta = to_metadata(model.config);
    meta[kFormatKey] = std::to_string(kCheckpointFormat);
    meta[kKindKey] = kind;
    if (!tokenizer_hash.empty()) meta[kTokenizerKey] = tokenizer_hash;
    if (!run_id.empty()) meta[kRunIdKey] = run_id;
    return meta;
}

std::string metadata_or(const SafetensorsFile& file, const char* key, const std::string& otherwise = "") {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? otherwise : it->second;
}

// The step a file's weights are of: a checkpoint's training state, a model file's "tapeformer.step";
// −1 when it records none. Only read to tell two files of one run apart (average), so a state that does
// not parse counts as none here; resuming from it refuses it (load_training_checkpoint).
std::int64_t recorded_step(const SafetensorsFile& file) {
    try {
        if (auto state = file.metadata.find(kStateKey); state != file.metadata.end())
            return json_integer<std::int64_t>(nlohmann::json::parse(state->second).at("step"), "step");
        if (auto step = file.metadata.find(kStepKey); step != file.metadata.end())
            return json_integer<std::int64_t>(nlohmann::json::parse(step->second), kStepKey);
    } catch (const std::exception&) {
    }
    return -1;
}

// The special ids of tapeformer's tokenizers (vocab.h: <pad>=0, <s>=1, </s>=2 in every vocabulary) are no
// tensor's shape, so an edited pad_id would pass every shape check and silently change the loss and decoding.
void check_special_ids(const std::string& path, const ModelConfig& config) {
    for (auto [name, id, expected] : {std::tuple<const char*, std::int32_t, std::int32_t>{"pad_id", config.pad_id, kPadId},
                                      {"bos_id", config.bos_id, kBosId}, {"eos_id", config.eos_id, kEosId}})
        if (id != expected)
            throw std::runtime_error(path + ": model setting " + name + " is " + std::to_string(id) + ", but the tokenizer's " +
                                     kSpecialPieces[expected] + " is id " + std::to_string(expected) + " (the metadata was edited)");
}

// Refuses files without our format key or of another version, naming both versions.
void check_format(const SafetensorsFile& file, const char* kind) {
    auto it = file.metadata.find(kFormatKey);
    if (it == file.metadata.end())
        throw std::runtime_error(file.path + ": not a tapeformer " + kind + " (no '" + kFormatKey +
                                 "' in its metadata); was it written by another program?");
    if (it->second != std::to_string(kCheckpointFormat))
        throw std::runtime_error(file.path + ": written by another version of tapeformer (format " + it->second +
                                 ", this build reads format " + std::to_string(kCheckpointFormat) + ")");
    // Every file tapeformer writes carries a checksum of all its bytes, metadata included (safetensors.h):
    // one without it was edited or written by something else, and its settings cannot be trusted.
    if (!file.metadata.count(kSafetensorsChecksumKey))
        throw std::runtime_error(file.path + ": no checksum ('" + kSafetensorsChecksumKey + "') in its metadata, which " +
                                 "every file tapeformer writes carries; the file was edited or written by another program");
    auto k = file.metadata.find(kKindKey);
    if (k == file.metadata.end() || k->second != kind)
        throw std::runtime_error(file.path + ": expected a tapeformer " + kind + ", found '" +
                                 (k == file.metadata.end() ? std::string("?") : k->second) + "'");
}

// The model's config as stored must equal the config the model was built with.
void check_same_config(const SafetensorsFile& file, const Transformer& model) {
    const ModelConfig stored = model_config_from_metadata(file.metadata);
    const auto a = to_metadata(stored), b = to_metadata(model.config);
    for (const auto& [key, value] : b)
        if (a.at(key) != value)
            throw std::runtime_error(file.path + ": model setting " + key + " is " + a.at(key) + " in the file but " +
                                     value + " in this run");
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + ")";
}

// The settings in the metadata must describe the tensors in the file. Checked before a model of that
// config is allocated: metadata edited to d_model 16384 (and the checksum recomputed) is refused in one
// line naming the file, the setting and the tensor, not after allocating gigabytes or by std::bad_alloc.
// `weights` holds the model's tensors only (a checkpoint's optimizer state split off).
void check_config_fits_tensors(const SafetensorsFile& weights, const ModelConfig& config) {
    const std::map<std::string, std::string> value = to_metadata(config);  // "d_model" -> "32"
    auto setting = [&](const std::string& key) { return "model setting " + key + " " + value.at(key); };
    std::set<std::string> expected;
    for (const ParameterShape& p : config.parameter_shapes()) {
        expected.insert(p.name);
        auto it = weights.tensors.find(p.name);
        if (it == weights.tensors.end()) {
            if (p.exists_because.empty()) fail<std::runtime_error>(weights.path, "no tensor '" + p.name + "'");
            fail<std::runtime_error>(weights.path, setting(p.exists_because) + " needs tensor '" + p.name + "', which the file lacks");
        }
        const std::vector<std::int64_t>& shape = it->second.shape;
        if (shape == p.shape) continue;
        std::size_t d = 0;  // the first extent that differs names the setting (a wrong rank: the first one's)
        while (shape.size() == p.shape.size() && shape[d] == p.shape[d]) ++d;
        fail<std::runtime_error>(weights.path, setting(p.dims_from[d]) + " does not fit tensor '" + p.name + "' of shape " +
                                               shape_text(shape) + " (the metadata's settings give " + shape_text(p.shape) + ")");
    }
    // A tensor the config has no place for: the setting that would give a model that tensor (more layers,
    // output_bias, pre-norm, learned positions, additive attention, LayerNorm) is the one the metadata got wrong.
    for (const auto& [name, entry] : weights.tensors) {
        if (expected.count(name)) continue;
        ModelConfig widest = config;
        widest.enc_layers = widest.dec_layers = ModelConfig::kMaxLayers;
        widest.output_bias = true;
        widest.norm = NormPosition::Pre;
        widest.positional = PositionalKind::Learned;
        widest.attention = AttentionScore::Additive;
        widest.window = 0;            // (a window only with local attention)
        widest.score_scaling = true;  // (additive scores have no scaling to switch off)
        widest.layer_norm = true;
        for (const ParameterShape& p : widest.parameter_shapes())
            if (p.name == name && !p.exists_because.empty())
                fail<std::runtime_error>(weights.path, "tensor '" + name + "' is in the file, but " + setting(p.exists_because) +
                                                       " gives the model no such tensor");
        fail<std::runtime_error>(weights.path, "unexpected tensor '" + name + "' (no model setting gives a model that tensor)");
    }
}

// A training checkpoint's tensors split into the model's weights, the optimizer's state (prefix dropped)
// and the weight average (empty without --ema; names kept: "ema.<parameter>").
struct CheckpointParts {
    SafetensorsFile weights, optim, average;
};
CheckpointParts split_checkpoint(const SafetensorsFile& file) {
    CheckpointParts parts;
    parts.weights.path = parts.optim.path = parts.average.path = file.path;
    for (const auto& [name, entry] : file.tensors) {
        if (name.rfind(kOptimPrefix, 0) == 0) parts.optim.tensors[name.substr(std::string(kOptimPrefix).size())] = entry;
        else if (name.rfind(kAveragePrefix, 0) == 0) parts.average.tensors[name] = entry;
        else parts.weights.tensors[name] = entry;
    }
    return parts;
}

// A checkpoint's state entries as NamedTensors ("m" of "optim.adam.m.x" ..., or "ema.x").
std::vector<NamedTensor> state_entries(const SafetensorsFile& part) {
    std::vector<NamedTensor> out;
    for (const auto& [name, entry] : part.tensors) out.push_back({name, part.tensor(name)});
    return out;
}

}  // namespace

std::string checkpoint_name(std::int64_t step) {
    char name[64];
    std::snprintf(name, sizeof name, "checkpoints/step-%08lld.safetensors", static_cast<long long>(step));
    return name;
}

std::int64_t checkpoint_step(const std::string& name) {
    const std::string prefix = "checkpoints/step-", suffix = ".safetensors";
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return -1;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() < 8 || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    const std::int64_t step = std::stoll(digits);
    return checkpoint_name(step) == name ? step : -1;  // one spelling per step
}

std::vector<std::string> checkpoints_on_disk(const std::string& dir) {
    std::vector<std::pair<std::int64_t, std::string>> found;
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(dir) / "checkpoints", ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = "checkpoints/" + it->path().filename().string();
        const std::int64_t step = checkpoint_step(name);
        if (step >= 0 && it->is_regular_file(ec)) found.emplace_back(step, name);
    }
    std::sort(found.begin(), found.end());
    std::vector<std::string> names;
    for (auto& f : found) names.push_back(std::move(f.second));
    return names;
}

std::string to_json(const TrainState& s) {
    nlohmann::json j = {{"step", s.step},
                        {"epoch", s.epoch},
                        {"batch_in_epoch", s.batch_in_epoch},
                        {"dropout_offset", s.dropout_offset},
                        {"best_score", s.best_score},
                        {"best_step", s.best_step},
                        {"valid_step", s.valid_step},
                        {"train_seconds", s.train_seconds},
                        {"target_tokens", s.target_tokens},
                        {"skipped_empty", s.skipped_empty},
                        {"filtered_long", s.filtered_long},
                        {"log_window", {{"loss", s.log_window.loss},
                                        {"nll", s.log_window.nll},
                                        {"seconds", s.log_window.seconds},
                                        {"tokens", s.log_window.tokens},
                                        {"steps", s.log_window.steps}}}};
    return j.dump();
}

TrainState train_state_from_json(const std::string& text) {
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        TrainState s;
        s.step = json_integer<std::int64_t>(j.at("step"), "step");
        s.epoch = json_integer<std::int64_t>(j.at("epoch"), "epoch");
        s.batch_in_epoch = json_integer<std::int64_t>(j.at("batch_in_epoch"), "batch_in_epoch");
        s.dropout_offset = json_integer<std::uint64_t>(j.at("dropout_offset"), "dropout_offset");
        s.best_score = j.at("best_score").get<double>();
        s.best_step = json_integer<std::int64_t>(j.at("best_step"), "best_step");
        s.valid_step = json_integer_or<std::int64_t>(j, "valid_step", -1);
        s.train_seconds = j.at("train_seconds").get<double>();
        s.target_tokens = json_integer<std::int64_t>(j.at("target_tokens"), "target_tokens");
        s.skipped_empty = json_integer_or<std::int64_t>(j, "skipped_empty", 0);
        s.filtered_long = json_integer_or<std::int64_t>(j, "filtered_long", 0);
        if (j.contains("log_window")) {  // absent in checkpoints from before it was kept: an empty window
            const nlohmann::json& w = j.at("log_window");
            s.log_window.loss = w.at("loss").get<double>();
            s.log_window.nll = w.at("nll").get<double>();
            s.log_window.seconds = w.at("seconds").get<double>();
            s.log_window.tokens = json_integer<std::int64_t>(w.at("tokens"), "log_window.tokens");
            s.log_window.steps = json_integer<std::int64_t>(w.at("steps"), "log_window.steps");
        }
        // Values no run reaches: a resumed run would act on them (skip a validation it owes, report
        // a best step from its future, a negative time), so they are refused here.
        auto refuse = [](const std::string& what) { throw std::runtime_error(what); };
        if (s.step < 0 || s.epoch < 0 || s.batch_in_epoch < 0) refuse("negative position");
        // Every epoch took a step at least (train.cpp checks the exact count against the run's batches
        // per epoch): epoch 10^15 at step 3 is no state a run reaches.
        if (s.epoch > s.step)
            refuse("epoch " + std::to_string(s.epoch) + " is past step " + std::to_string(s.step) + " (every epoch takes a step)");
        if (s.best_step < -1 || s.best_step > s.step)
            refuse("best_step " + std::to_string(s.best_step) + " is not -1 or a step up to step " + std::to_string(s.step));
        if (s.valid_step < -1 || s.valid_step > s.step)
            refuse("valid_step " + std::to_string(s.valid_step) + " is not -1 or a step up to step " + std::to_string(s.step));
        if (j.contains("valid_step") && s.best_step > s.valid_step)  // the best is one of the validations, the last of which is valid_step
            refuse("best_step " + std::to_string(s.best_step) + " is after the last validation, valid_step " +
                   std::to_string(s.valid_step));
        if (!std::isfinite(s.train_seconds) || s.train_seconds < 0)
            refuse("train_seconds " + std::to_string(s.train_seconds) + " is not a time");
        if (!std::isfinite(s.best_score)) refuse("best_score is not finite");
        for (auto [key, count] : {std::pair<const char*, std::int64_t>{"target_tokens", s.target_tokens},
                                  {"skipped_empty", s.skipped_empty}, {"filtered_long", s.filtered_long}})
            if (count < 0) refuse(std::string(key) + " " + std::to_string(count) + " is negative");
        const TrainState::LogWindow& w = s.log_window;
        for (auto [key, sum] : {std::pair<const char*, double>{"loss", w.loss}, {"nll", w.nll}, {"seconds", w.seconds}})
            if (!std::isfinite(sum) || sum < 0) refuse(std::string("log_window.") + key + " is not a finite sum >= 0");
        if (w.tokens < 0 || w.steps < 0 || w.steps > s.step)
            refuse("log_window covers " + std::to_string(w.steps) + " steps and " + std::to_string(w.tokens) +
                   " tokens at step " + std::to_string(s.step));
        return s;
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string("training state is malformed: ") + e.what());
    }
}

std::string tokenizer_hash(const TokenizerPair& tokenizers) {
    std::uint32_t crc = crc32c(tokenizers.joint() ? "joint\n" : "separate\n");
    crc = crc32c(tokenizer_file_bytes(*tokenizers.source), crc);
    if (!tokenizers.joint()) crc = crc32c(tokenizer_file_bytes(*tokenizers.target), crc);
    return crc_text(crc);
}

std::string new_run_id() {
    std::random_device device;
    std::string id;
    for (int i = 0; i < 4; ++i) {  // 4 × 32 bits
        char hex[9];
        std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(device()));
        id += hex;
    }
    return id;
}

void save_model_weights(const std::string& path, const Transformer& model, const std::string& tokenizer_hash,
                        const RunStamp& stamp) {
    auto meta = model_metadata(model, "model", tokenizer_hash, stamp.run_id);
    if (stamp.step >= 0) meta[kStepKey] = std::to_string(stamp.step);
    save_safetensors(path, model.parameters(), meta, /*with_checksum=*/true);
}

void save_training_checkpoint(const std::string& path, const Transformer& model, const Optimizer& optimizer,
                              const TrainState& state, const std::string& tokenizer_hash, const WeightAverage* average,
                              const RunStamp& stamp) {
    std::vector<NamedTensor> tensors = model.parameters();
    for (NamedTensor& t : optimizer.state()) tensors.push_back({kOptimPrefix + t.name, t.tensor});
    if (average)
        for (NamedTensor& t : average->state()) tensors.push_back(t);  // already "ema.<parameter>"
    auto meta = model_metadata(model, "training checkpoint", tokenizer_hash, stamp.run_id);
    meta[kStateKey] = to_json(state);
    if (!stamp.run_json.empty()) meta[kRunJsonKey] = stamp.run_json;
    save_safetensors(path, tensors, meta, /*with_checksum=*/true);
}

TrainState load_training_checkpoint(const std::string& path, Transformer& model, Optimizer& optimizer,
                                    const std::string& tokenizer_hash, WeightAverage* average, RunStamp* stamp) {
    const SafetensorsFile file = load_safetensors(path);
    check_format(file, "training checkpoint");
    check_same_config(file, model);
    auto stored_hash = file.metadata.find(kTokenizerKey);
    if (!tokenizer_hash.empty() && stored_hash != file.metadata.end() && stored_hash->second != tokenizer_hash)
        throw std::runtime_error(path + ": the run's tokenizer files (vocab.txt / spm.model) are not the ones this "
                                 "checkpoint was trained with (" + kTokenizerKey + " " + stored_hash->second +
                                 ", the files give " + tokenizer_hash + "); restore them");
    auto it = file.metadata.find(kStateKey);
    if (it == file.metadata.end()) throw std::runtime_error(path + ": no training state in the checkpoint");
    TrainState state;
    try {
        state = train_state_from_json(it->second);
    } catch (const std::exception& e) {
        throw std::runtime_error(path + ": " + e.what());
    }
    const CheckpointParts parts = split_checkpoint(file);
    check_config_fits_tensors(parts.weights, model.config);
    if (parts.average.tensors.empty() != (average == nullptr))
        throw std::runtime_error(path + (average ? ": holds no weight average ('ema.*' tensors), which this run (--ema) keeps"
                                                 : ": holds a weight average ('ema.*' tensors), which this run (no --ema) does not keep"));
    load_into(model.parameters(), parts.weights, /*strict=*/true);
    try {
        optimizer.load_state(state_entries(parts.optim));
    } catch (const std::exception& e) {
        throw std::runtime_error(path + ": optimizer state does not fit this run: " + e.what());
    }
    if (average) {
        try {
            average->load_state(state_entries(parts.average));
        } catch (const std::exception& e) {
            throw std::runtime_error(path + ": weight average does not fit this run: " + e.what());
        }
    }
    if (stamp) *stamp = RunStamp{metadata_or(file, kRunIdKey), state.step, metadata_or(file, kRunJsonKey)};
    return state;
}

ModelBundle load_model_dir(const std::string& path) {
    std::error_code ec;
    // A checkpoint of a run (kept with --keep-every, say) stands for the run at that step: its weights, the
    // run's tokenizers.
    const bool checkpoint_given = fs::is_regular_file(path, ec);
    const fs::path given(path);
    if (checkpoint_given && (given.extension() != ".safetensors" || given.parent_path().filename() != "checkpoints"))
        throw std::runtime_error("--model '" + path + "' is a file; expected a model directory or one of its "
                                 "checkpoints, DIR/checkpoints/step-N.safetensors");
    const std::string dir = checkpoint_given ? given.parent_path().parent_path().string() : path;
    if (!fs::is_directory(dir, ec))
        throw std::runtime_error("model directory '" + dir + "' does not exist (train one with: tapeformer train --out " + dir + " ...)");
    std::string weights_path = (fs::path(dir) / "model.safetensors").string();
    ModelBundle bundle;
    bundle.dir = dir;
    SafetensorsFile file, average;  // average: a checkpoint's weight average (--ema), else empty
    if (!checkpoint_given && fs::exists(weights_path, ec)) {
        file = load_safetensors(weights_path);
        check_format(file, "model");
    } else {
        // A checkpoint asked for, or a run killed before it wrote model.safetensors: its newest checkpoint.
        const std::vector<std::string> checkpoints = checkpoints_on_disk(dir);
        if (!checkpoint_given && checkpoints.empty())
            throw std::runtime_error("'" + dir + "' holds no model.safetensors and no checkpoints/step-N.safetensors: "
                                     "is it a tapeformer model directory? (training writes both at its first checkpoint)");
        weights_path = checkpoint_given ? path : (fs::path(dir) / checkpoints.back()).string();
        const SafetensorsFile checkpoint = load_safetensors(weights_path);
        check_format(checkpoint, "training checkpoint");
        CheckpointParts parts = split_checkpoint(checkpoint);
        file = std::move(parts.weights);
        file.metadata = checkpoint.metadata;
        average = std::move(parts.average);
        if (!checkpoint_given)
            bundle.note = "'" + dir + "' holds no model.safetensors; using the " +
                          (average.tensors.empty() ? "weights" : "averaged weights (--ema)") + " of its newest checkpoint, " + weights_path;
    }
    ModelConfig config;
    try {
        config = model_config_from_metadata(file.metadata);
        config.validate();
    } catch (const std::exception& e) {
        throw std::runtime_error(weights_path + ": " + e.what());
    }
    check_config_fits_tensors(file, config);  // before the model is allocated
    check_special_ids(weights_path, config);
    bundle.weights_path = weights_path;
    bundle.stamp.run_id = metadata_or(file, kRunIdKey);
    bundle.stamp.step = recorded_step(file);
    bundle.model = std::make_unique<Transformer>(config);
    load_into(bundle.model->parameters(), file, /*strict=*/true);
    if (!average.tensors.empty()) {  // the weights the run validated: its average, in place of the last step's
        try {
            WeightAverage loaded(bundle.model->parameters(), /*decay, unused: nothing is updated*/ 0.5);
            loaded.load_state(state_entries(average));
            loaded.swap_into_parameters();
        } catch (const std::exception& e) {
            throw std::runtime_error(weights_path + ": weight average does not fit the model: " + e.what());
        }
    }
    bundle.tokenizers = TokenizerPair::load(dir);
    // The tokenizer the model was trained with, byte for byte: another one of the same size would load
    // and silently translate garbage.
    auto stored_hash = file.metadata.find(kTokenizerKey);
    if (stored_hash != file.metadata.end() && stored_hash->second != tokenizer_hash(bundle.tokenizers))
        throw std::runtime_error("'" + dir + "': the tokenizer files (vocab.txt / spm.model) are not the ones " + weights_path +
                                 " was trained with (" + kTokenizerKey + " " + stored_hash->second + ", the files give " +
                                 tokenizer_hash(bundle.tokenizers) + "); restore them from the training run");
    if (bundle.tokenizers.source->vocab_size() != config.src_vocab ||
        bundle.tokenizers.target->vocab_size() != config.tgt_vocab)
        throw std::runtime_error("'" + dir + "': the tokenizer's vocabulary (" + std::to_string(bundle.tokenizers.source->vocab_size()) +
                                 " / " + std::to_string(bundle.tokenizers.target->vocab_size()) + ") does not match the model's (" +
                                 std::to_string(config.src_vocab) + " / " + std::to_string(config.tgt_vocab) + ")");
    return bundle;
}

TF_NAMESPACE_END
