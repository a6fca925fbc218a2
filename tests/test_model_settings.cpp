// The model's settings table (model_settings.h): the weights file's metadata written and read through it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/model_settings.h"
#include "helpers.h"

using namespace tf;

namespace {
ModelConfig small_config() { return tf_test::tiny_model_config(20, 16, 4, 32, 2, 2, 32); }  // V, C, H, F, layers, positions
}  // namespace

TEST_CASE("model config: metadata round trip", "[nn][settings]") {
    ModelConfig c = small_config();
    c.norm = NormPosition::Pre;
    c.activation = Activation::GELU;
    c.tie = Tying::Decoder;
    c.dropout = 0.25;
    ModelConfig d = model_config_from_metadata(to_metadata(c));
    CHECK(to_metadata(d) == to_metadata(c));
    CHECK(d.norm == NormPosition::Pre);
    CHECK(d.dropout == 0.25);
    auto bad = to_metadata(c);
    bad["d_model"] = "sixteen";
    CHECK_THROWS_WITH(model_config_from_metadata(bad), Catch::Contains("d_model") && Catch::Contains("sixteen"));
}

TEST_CASE("model settings: the table's bounds are those ModelConfig::validate checks", "[nn][settings]") {
    // Each number of the table, set in code just outside its range: validate() refuses it with the range
    // the flags and the metadata reader show (Setting::expected), so the two cannot drift apart.
    using Set = void (*)(ModelConfig&, double);
    const std::vector<std::pair<std::string, Set>> numbers = {
        {"src_vocab", [](ModelConfig& c, double v) { c.src_vocab = std::int64_t(v); }},
        {"tgt_vocab", [](ModelConfig& c, double v) { c.tgt_vocab = std::int64_t(v); }},
        {"d_model", [](ModelConfig& c, double v) { c.d_model = std::int64_t(v); }},
        {"heads", [](ModelConfig& c, double v) { c.heads = std::int64_t(v); }},
        {"ffn", [](ModelConfig& c, double v) { c.ffn = std::int64_t(v); }},
        {"enc_layers", [](ModelConfig& c, double v) { c.enc_layers = std::int64_t(v); }},
        {"dec_layers", [](ModelConfig& c, double v) { c.dec_layers = std::int64_t(v); }},
        {"dropout", [](ModelConfig& c, double v) { c.dropout = v; }},
        {"attention_dropout", [](ModelConfig& c, double v) { c.attention_dropout = v; }},
        {"activation_dropout", [](ModelConfig& c, double v) { c.activation_dropout = v; }},
        {"max_len", [](ModelConfig& c, double v) { c.max_len = std::int64_t(v); }},
        {"window", [](ModelConfig& c, double v) { c.window = std::int64_t(v); }},
        {"pad_id", [](ModelConfig& c, double v) { c.pad_id = std::int32_t(v); }},
        {"bos_id", [](ModelConfig& c, double v) { c.bos_id = std::int32_t(v); }},
        {"eos_id", [](ModelConfig& c, double v) { c.eos_id = std::int32_t(v); }},
    };
    std::size_t in_table = 0;
    for (const auto& s : model_settings())
        in_table += s.type == SettingType::Integer || s.type == SettingType::Real;
    CHECK(in_table == numbers.size());  // a number added to the table is added here too
    for (const auto& [key, set] : numbers) {
        const Setting<ModelConfig>* s = find_setting(model_settings(), key, /*by_key=*/true);
        REQUIRE(s);
        const double step = s->type == SettingType::Integer ? 1 : 0.5;
        for (double outside : {s->lo_open ? s->lo : s->lo - step, s->hi_open ? s->hi : s->hi + step}) {
            ModelConfig c = small_config();
            set(c, outside);
            CAPTURE(key, outside);
            CHECK_THROWS_WITH(c.validate(), Catch::StartsWith("model config: " + key + " must be " + s->expected() + ", got "));
        }
        ModelConfig c = small_config();  // and the value the table shows is the value validate() names
        set(c, s->hi_open ? s->hi : s->hi + step);
        try {
            c.validate();
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).substr(std::string(e.what()).rfind(' ') + 1) == s->get(c));
        }
    }
}
