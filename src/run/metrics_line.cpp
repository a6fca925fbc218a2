// metrics.jsonl's lines, written and read in one place (metrics_line.h).
#include "run/metrics_line.h"

#include <cmath>
#include <cstdint>

TF_NAMESPACE_BEGIN

namespace {
// The numbers of each type of line, by key (valid_bleu and valid_exact are optional, so apart).
using Number = double MetricsLine::*;
const std::pair<const char*, Number> kTrainNumbers[] = {
    {"loss", &MetricsLine::loss}, {"nll", &MetricsLine::nll},           {"ppl", &MetricsLine::ppl},
    {"lr", &MetricsLine::lr},     {"grad_norm", &MetricsLine::grad_norm}, {"tok_per_s", &MetricsLine::tok_per_s},
    {"elapsed", &MetricsLine::elapsed}};
const std::pair<const char*, Number> kValidNumbers[] = {{"valid_loss", &MetricsLine::valid_loss},
                                                        {"valid_nll", &MetricsLine::valid_nll},
                                                        {"valid_ppl", &MetricsLine::valid_ppl},
                                                        {"elapsed", &MetricsLine::elapsed}};
}  // namespace

nlohmann::json to_json(const MetricsLine& m) {
    const bool train = m.type == MetricsLine::Type::Train;
    nlohmann::json j = {{"type", train ? "train" : "valid"}, {"step", m.step}, {"epoch", m.epoch}};
    if (train) {
        for (const auto& [key, field] : kTrainNumbers) j[key] = m.*field;  // NaN and ±inf: null
        if (!std::isnan(m.tokens_per_step)) j["tokens_per_step"] = m.tokens_per_step;
        if (!std::isnan(m.reduce_ms)) j["reduce_ms"] = m.reduce_ms;
        if (!m.layer_grad_norms.empty()) j["layer_grad_norms"] = m.layer_grad_norms;
    } else {
        for (const auto& [key, field] : kValidNumbers) j[key] = m.*field;
        if (m.valid_bleu) j["valid_bleu"] = *m.valid_bleu;
        if (m.valid_exact) j["valid_exact"] = *m.valid_exact;
        if (!m.weights.empty()) j["weights"] = m.weights;
        if (m.best) j["best"] = *m.best;
    }
    return j;
}

std::string metrics_line_problem(const nlohmann::json& j) {
    const auto type = j.find("type");
    if (type == j.end() || !type->is_string()) return "no \"type\" text";
    if (*type != "train" && *type != "valid") return "unknown type " + type->dump() + " (expected \"train\" or \"valid\")";
    const auto step = j.find("step");
    if (step == j.end()) return "no \"step\"";
    if (!step->is_number_unsigned() && !(step->is_number_integer() && step->get<std::int64_t>() >= 0))
        return "\"step\" is " + step->dump() + ", expected a non-negative integer";
    for (const char* key : {"epoch", "loss", "nll", "ppl", "lr", "grad_norm", "tok_per_s", "tokens_per_step", "reduce_ms", "elapsed", "valid_loss",
                            "valid_nll", "valid_ppl", "valid_bleu", "valid_exact"}) {
        const auto it = j.find(key);
        if (it == j.end() || it->is_number()) continue;
        if (it->is_null()) return "\"" + std::string(key) + "\" is null (NaN or infinite when it was written)";
        return "\"" + std::string(key) + "\" is " + std::string(it->type_name()) + " " + it->dump() + ", expected a number";
    }
    const auto norms = j.find("layer_grad_norms");
    if (norms != j.end()) {
        bool pairs = norms->is_array();
        for (const nlohmann::json& p : *norms)
            pairs = pairs && p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_number();
        if (!pairs) return "\"layer_grad_norms\" is not a list of [layer name, norm] pairs";
    }
    return "";
}

MetricsLine metrics_line_from_json(const nlohmann::json& j) {
    MetricsLine m;
    m.type = j.at("type") == "train" ? MetricsLine::Type::Train : MetricsLine::Type::Valid;
    // metrics_line_problem let through only a non-negative integer; one past int64 reads as its maximum.
    const nlohmann::json& step = j.at("step");
    m.step = step.is_number_unsigned() && step.get<std::uint64_t>() > std::uint64_t(INT64_MAX) ? INT64_MAX
                                                                                                : step.get<std::int64_t>();
    if (const auto e = j.find("epoch"); e != j.end() && e->is_number_integer() && e->get<std::int64_t>() > 0)
        m.epoch = e->get<std::int64_t>();  // tapeformer writes an integer; another number reads as absent
    auto read = [&](const char* key, Number field) {
        if (const auto it = j.find(key); it != j.end()) m.*field = it->get<double>();
    };
    for (const auto& [key, field] : kTrainNumbers) read(key, field);
    for (const auto& [key, field] : kValidNumbers) read(key, field);
    if (const auto it = j.find("valid_bleu"); it != j.end()) m.valid_bleu = it->get<double>();
    if (const auto it = j.find("valid_exact"); it != j.end()) m.valid_exact = it->get<double>();
    if (const auto it = j.find("layer_grad_norms"); it != j.end())
        for (const nlohmann::json& p : *it) m.layer_grad_norms.emplace_back(p[0].get<std::string>(), p[1].get<double>());
    if (const auto it = j.find("weights"); it != j.end() && it->is_string()) m.weights = it->get<std::string>();
    if (const auto it = j.find("best"); it != j.end() && it->is_boolean()) m.best = it->get<bool>();
    return m;
}

TF_NAMESPACE_END
