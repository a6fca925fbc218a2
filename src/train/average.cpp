// Checkpoint averaging (average.h): one model loaded at a time, its weights added into double sums.
#include "tapeformer/average.h"

#include <filesystem>
#include <stdexcept>

TF_NAMESPACE_BEGIN

ModelBundle average_models(const std::vector<std::string>& paths) {
    if (paths.empty()) throw std::invalid_argument("average_models: no model to average");
    ModelBundle mean = load_model_dir(paths.front());
    const auto config = mean.model->config.to_metadata();
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
        if (other.model->config.to_metadata() != config)
            throw std::runtime_error(paths[k] + ": another model configuration than " + paths.front() +
                                     "'s; only checkpoints of one run can be averaged");
        if (tokenizer_hash(other.tokenizers) != tokenizer)
            throw std::runtime_error(paths[k] + ": another tokenizer than " + paths.front() +
                                     "'s; only checkpoints of one run can be averaged");
        add(unique_parameters(other.model->parameters()));
    }
    const double n = double(paths.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
        real* w = params[i].tensor.data();
        for (std::size_t j = 0; j < sums[i].size(); ++j) w[j] = real(sums[i][j] / n);
    }
    mean.note.clear();
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
