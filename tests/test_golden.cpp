// The model against PyTorch: fixtures written by tests/golden/make_golden.py (nn.TransformerEncoderLayer /
// DecoderLayer computed in float64) must match our float32 logits, loss and every parameter's gradient to
// a relative error of 1e-4, measured per tensor as max|ours − theirs| / max|theirs|.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tapeformer/model_settings.h"
#include "tapeformer/autograd.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/safetensors.h"

using namespace tf;

namespace {

double relative_error(const std::vector<real>& ours, const std::vector<real>& theirs) {
    REQUIRE(ours.size() == theirs.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) {
        diff = std::max(diff, std::fabs(double(ours[i]) - double(theirs[i])));
        scale = std::max(scale, std::fabs(double(theirs[i])));
    }
    return diff / std::max(scale, 1e-30);
}

std::vector<std::int32_t> flat(const nlohmann::json& rows, std::int64_t& B, std::int64_t& T) {
    std::vector<std::int32_t> out;
    B = static_cast<std::int64_t>(rows.size());
    T = static_cast<std::int64_t>(rows.at(0).size());
    for (const auto& row : rows)
        for (const auto& v : row) out.push_back(v.get<std::int32_t>());
    return out;
}

void check_config(const std::string& name) {
    const std::string dir = std::string(TF_SOURCE_DIR) + "/tests/golden/" + name + "/";
    const SafetensorsFile weights = load_safetensors(dir + "weights.safetensors");
    const SafetensorsFile expected = load_safetensors(dir + "outputs.safetensors");
    std::ifstream batch_file(dir + "batch.json");
    const nlohmann::json batch = nlohmann::json::parse(batch_file);

    Transformer model(model_config_from_metadata(weights.metadata));
    load_into(model.parameters(), weights);
    std::int64_t B, S, T, B2, T2;
    const auto src = flat(batch.at("src"), B, S);
    const auto dec_in = flat(batch.at("dec_in"), B2, T);
    const auto target = flat(batch.at("target"), B2, T2);

    // Evaluation pass (no dropout), recorded so that backward can run.
    tape().clear();
    Tensor memory = model.encode(src, B, S, Pass{});
    Tensor logits = model.project(model.decode(dec_in, B, T, memory, src, S, Pass{}));
    LossReport report;
    Tensor loss = sequence_loss(logits, target, model.config.pad_id,
                                real(std::stod(weights.metadata.at("label_smoothing"))), &report);
    backward(loss);

    INFO("config " << name);
    CHECK(relative_error(memory.to_vector(), expected.tensors.at("encoder_out").values) <= 1e-4);
    CHECK(relative_error(logits.to_vector(), expected.tensors.at("logits").values) <= 1e-4);
    CHECK(std::fabs(report.loss - expected.tensors.at("loss").values[0]) <= 1e-4 * std::fabs(expected.tensors.at("loss").values[0]));
    CHECK(std::fabs(report.nll - expected.tensors.at("nll").values[0]) <= 1e-4 * std::fabs(expected.tensors.at("nll").values[0]));
    int compared = 0;
    for (const auto& p : model.parameters()) {
        INFO("gradient of " << p.name);
        const auto it = expected.tensors.find("grad." + p.name);
        REQUIRE(it != expected.tensors.end());
        CHECK(relative_error(p.tensor.grad_vector(), it->second.values) <= 1e-4);
        ++compared;
    }
    CHECK(compared == static_cast<int>(weights.tensors.size()));  // every PyTorch parameter has one of ours
}

}  // namespace

TEST_CASE("golden: post-norm, untied, ReLU matches PyTorch", "[golden]") { check_config("post_untied"); }
TEST_CASE("golden: pre-norm, decoder-tied, GELU matches PyTorch", "[golden]") { check_config("pre_tied_decoder"); }
TEST_CASE("golden: post-norm, all tied matches PyTorch", "[golden]") { check_config("post_tied_all"); }
