// Checkpoint averaging (average.h): one model loaded at a time, its weights added into double sums.
#include "tapeformer/run/average.h"

#include <filesystem>
#include <stdexcept>

#include "tapeformer/model_settings.h"

TF_NAMESPACE_BEGIN

namespace {

namespace fs = std::filesystem;

// What average_models remembers of each model it added: enough to tell whether the next one is the
// same weights again or another run's.
struct Added {
    std::string path, weights_path, dir;
    RunStamp stamp;
};

std::string run_text(const Added& a) {
    return a.stamp.run_id.empty() ? "no run id (written before run ids; run directory " + a.dir + ")" : "run " + a.stamp.run_id;
}

bool same_file(const std::string& a, const std::string& b) {
    std::error_code ec;
    return fs::equivalent(a, b, ec);
}

// Refuses `b` when it holds weights already added as `a`, or (without mix_runs) another run's.
void check_can_add(const Added& a, const Added& b, bool mix_runs) {
    if (same_file(a.weights_path, b.weights_path))
        throw std::runtime_error(b.path + ": the same file as " + a.path + " (" + a.weights_path + "); it would count twice");
    if (!a.stamp.run_id.empty() && a.stamp.run_id == b.stamp.run_id && a.stamp.step >= 0 && a.stamp.step == b.stamp.step)
        throw std::runtime_error(b.path + ": the same weights as " + a.path + " (run " + a.stamp.run_id + ", step " +
                                 std::to_string(a.stamp.step) + "); they would count twice");
    const bool same_run = a.stamp.run_id.empty() && b.stamp.run_id.empty() ? same_file(a.dir, b.dir)
                                                                            : a.stamp.run_id == b.stamp.run_id;
    if (!same_run && !mix_runs)
        throw std::runtime_error(b.path + " is of " + run_text(b) + ", " + a.path + " of " + run_text(a) +
                                 ": only checkpoints of one run are averaged; give --mix-runs to average different runs");
}

}  // namespace

ModelBundle average_models(const std::vector<std::string>& paths, bool mix_runs) {
    if (paths.empty()) throw std::invalid_argument("average_models: no model to average");
    ModelBundle mean = load_model_dir(paths.front());
    std::vector<Added> added = {{paths.front(), mean.weights_path, mean.dir, mean.stamp}};
    const auto config = to_metadata(mean.model->config);
    const std::string tokenizer = tokenizer_hash(mean.tokenizers);
    ParamList params = unique_parameters(mean.model->parameters());
    std::vector<std::vector<double>> sums(params.size());
    auto add = [&](const ParamList& from) {
        for (std::size_t i = 0; i < params.size(); ++i) {
            const real* x = from[i].tensor.data();
            std::vector<double>& sum = sums[i];
            sum.resize(static_cast<std::size_t>(from[i].tensor.numel()), 0.0);
            for (std::size_t j = 0; j < sum.size(); ++j) sum[j] += double(x[j]);
        }
    };
    add(params);
    for (std::size_t k = 1; k < paths.size(); ++k) {
        const ModelBundle other = load_model_dir(paths[k]);
        if (to_metadata(other.model->config) != config)
            throw std::runtime_error(paths[k] + ": another model configuration than " + paths.front() +
                                     "'s; only checkpoints of one run can be averaged");
        if (tokenizer_hash(other.tokenizers) != tokenizer)
            throw std::runtime_error(paths[k] + ": another tokenizer than " + paths.front() +
                                     "'s; only checkpoints of one run can be averaged");
        const Added next{paths[k], other.weights_path, other.dir, other.stamp};
        for (const Added& a : added) check_can_add(a, next, mix_runs);
        added.push_back(next);
        add(unique_parameters(other.model->parameters()));
    }
    const double n = double(paths.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
        real* w = params[i].tensor.data();
        for (std::size_t j = 0; j < sums[i].size(); ++j) w[j] = real(sums[i][j] / n);
    }
    mean.note.clear();
    bool one_run = true;
    for (const Added& a : added) one_run = one_run && a.stamp.run_id == added.front().stamp.run_id;
    mean.stamp = RunStamp{one_run ? added.front().stamp.run_id : "", -1, ""};
    return mean;
}

std::vector<std::string> newest_checkpoints(const std::string& dir, int last) {
    const std::vector<std::string> names = checkpoints_on_disk(dir);
    if (last < 1 || static_cast<std::size_t>(last) > names.size())
        throw std::runtime_error("'" + dir + "' holds " + std::to_string(names.size()) + " checkpoints, cannot average the last " +
                                 std::to_string(last) + " (train with --keep N or --keep-every N to keep more)");
    std::vector<std::string> paths;
    for (std::size_t i = names.size() - static_cast<std::size_t>(last); i < names.size(); ++i)
        paths.push_back((std::filesystem::path(dir) / names[i]).string());
    return paths;
}

TF_NAMESPACE_END
