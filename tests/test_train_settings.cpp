// The one table of train settings (train_settings.h): every setting survives config.toml, run.json and
// the weights file's metadata unchanged; flags beat --config beat --preset; every number is bounded.
#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "helpers.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/run/train_settings.h"

using namespace tf_test;
using Catch::Contains;

namespace {

// A value for `s` that differs from its value in `c` and is accepted: the test of a round trip must
// change every setting, or a setting that is not written would pass unnoticed.
std::string other_value(const tf::Setting<tf::TrainConfig>& s, const tf::TrainConfig& c) {
    const std::string now = s.get(c);
    switch (s.type) {
        case tf::SettingType::Integer: {
            const long long lo = static_cast<long long>(s.lo) + (s.lo_open ? 1 : 0);
            const long long v = std::stoll(now) == lo + 1 ? lo + 2 : lo + 1;
            return std::to_string(v);
        }
        case tf::SettingType::Real: {
            const double hi = s.hi > 1 ? 0.75 : s.hi * 0.75;  // inside every range in the table
            return tf::setting_detail::format_real(std::stod(now) == hi ? hi / 2 : hi);
        }
        case tf::SettingType::Bool: return now == "true" ? "false" : "true";
        case tf::SettingType::Text:
            // (the per-layer head counts are text of a grammar: counts for everything_changed's 2 + 2 layers of 2 heads)
            if (s.key == "model.head_counts") return "E:1,2;D:2,1;A:1,1";
            return "dir with \"quotes\", a \\ backslash, 'single' and #hash/" + s.name;
        case tf::SettingType::Choice: return s.choices.back() == now ? s.choices.front() : s.choices.back();
    }
    return now;
}

// A config in which every named, stored setting differs from the default.
tf::TrainConfig everything_changed() {
    tf::TrainConfig c;
    for (const auto& s : tf::train_settings())
        if (!s.key.empty()) tf::apply_setting(s, c, other_value(s, tf::TrainConfig{}), s.key);
    return c;
}

void check_same_settings(const tf::TrainConfig& a, const tf::TrainConfig& b) {
    for (const auto& s : tf::train_settings()) {
        if (s.key.empty()) continue;
        INFO(s.key);
        CHECK(s.get(a) == s.get(b));
    }
}

}  // namespace

TEST_CASE("train settings: every setting survives config.toml, run.json and the model metadata", "[train][settings]") {
    const tf::TrainConfig changed = everything_changed();
    const tf::TrainConfig defaults;
    for (const auto& s : tf::train_settings()) {
        if (s.key.empty()) continue;
        INFO(s.key);
        CHECK(s.get(changed) != s.get(defaults));
    }

    SECTION("config.toml, read back as --config") {
        TempDir tmp("settings");
        const std::string path = write_file(tmp, "config.toml", tf::to_toml(changed));
        tf::TrainArguments args;
        args.config_file = path;
        const tf::TrainConfig back = tf::resolve_train_config(args).config;
        // Values with no flag (the vocabulary sizes and special ids) come from the tokenizer, not the file.
        for (const auto& s : tf::train_settings()) {
            if (s.key.empty() || s.name.empty()) continue;
            INFO(s.name);
            CHECK(s.get(back) == s.get(changed));
        }
        CHECK(tf::to_toml(back) == tf::to_toml(changed));
    }
    SECTION("run.json") {
        check_same_settings(tf::train_config_from_json(tf::to_json(changed)), changed);
    }
    SECTION("the weights file's metadata") {
        const tf::ModelConfig back = tf::model_config_from_metadata(tf::to_metadata(changed.model));
        for (const auto& s : tf::model_settings()) {
            INFO(s.key);
            CHECK(s.get(back) == s.get(changed.model));
        }
    }
}

TEST_CASE("train settings: --config refuses a key set at top level and again under [train], naming both lines",
          "[train][settings]") {
    TempDir tmp("settings_twice");
    tf::TrainArguments args;
    args.config_file = write_file(tmp, "twice.toml", "lr = 0.001\nd-model = 32\n[train]\nheads = 2\nlr = 0.002\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args),
                      Contains("twice.toml:5: lr: set again; ") && Contains("twice.toml:1: lr already sets it"));
}

TEST_CASE("train settings: --config refuses a NUL (\\u0000) in a string, which would cut a path short",
          "[train][settings]") {
    TempDir tmp("settings_nul");
    tf::TrainArguments args;
    args.config_file = write_file(tmp, "nul.toml", "d-model = 32\ntrain-src = \"data/a.src\\u0000.bak\"\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("nul.toml:2: train-src") && Contains("NUL"));
}

TEST_CASE("train settings: config.toml escapes every character of a path (newline, quote, backslash, control) and "
          "--config reads it back", "[train][settings]") {
    TempDir tmp("settings_escape");
    tf::TrainConfig c;
    c.data.train_src = "data/two\nlines \"quoted\" back\\slash\ttab\r\x1b\x7f\u00e9.src";
    c.data.train_tgt = u8"données/'b'.tgt";
    const std::string text = tf::to_toml(c);
    CHECK(text.find("train-src = \"data/two\\nlines \\\"quoted\\\" back\\\\slash\\ttab\\r\\u001B\\u007F\u00e9.src\"\n") !=
          std::string::npos);
    tf::TrainArguments args;
    args.config_file = write_file(tmp, "config.toml", text);
    const tf::TrainConfig back = tf::resolve_train_config(args).config;
    CHECK(back.data.train_src == c.data.train_src);
    CHECK(back.data.train_tgt == c.data.train_tgt);
    CHECK(tf::to_toml(back) == text);
}

TEST_CASE("train settings: a cosine run continued through its config.toml with a larger --max-steps is refused, not "
          "trained at lr 0", "[train][settings]") {
    TempDir tmp("settings_cosine_past");
    tf::TrainConfig run;
    run.optim.schedule.kind = tf::ScheduleKind::Cosine;
    run.optim.schedule.lr = 5e-4;
    run.optim.schedule.warmup = 10;
    run.max_steps = 100;
    run.optim.schedule.total_steps = 100;  // as resolve_train_config filled it from --max-steps
    tf::TrainArguments args;
    args.config_file = write_file(tmp, "config.toml", tf::to_toml(run));
    CHECK(tf::resolve_train_config(args).config.optim.schedule.total_steps == 100);
    args.flags = {{"max-steps", "300"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args),
                      Contains("--max-steps 300 runs past the end of the schedule") && Contains("--total-steps 100") &&
                          Contains("steps 101 to 300 would train at learning rate 0") && Contains("--total-steps 300"));
    args.flags = {{"max-steps", "300"}, {"total-steps", "300"}};
    CHECK(tf::resolve_train_config(args).config.optim.schedule.total_steps == 300);
    args.flags = {{"max-steps", "300"}, {"min-lr", "1e-5"}};  // past the end it trains at the floor: allowed
    CHECK(tf::resolve_train_config(args).config.max_steps == 300);
    run.max_steps = 300;
    CHECK_THROWS_WITH(tf::check_schedule_covers_run(run, true), Contains("--resume --max-steps 300") &&
                                                                    Contains("keeps its schedule"));
}

TEST_CASE("train settings: cosine with only --time-budget asks for --max-steps or --total-steps", "[train][settings]") {
    tf::TrainArguments args;
    args.flags = {{"schedule", "cosine"}, {"time-budget", "5"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args),
                      Contains("--schedule cosine decays over --total-steps") && Contains("give --max-steps or --total-steps") &&
                          !Contains("must be greater than warmup"));
    args.flags = {{"schedule", "linear"}, {"time-budget", "5"}, {"total-steps", "1000"}, {"warmup", "10"}};
    CHECK(tf::resolve_train_config(args).config.optim.schedule.total_steps == 1000);
}

TEST_CASE("train settings: --cooldown is refused with cosine and linear, which decay by themselves", "[train][settings]") {
    tf::TrainArguments args;
    args.flags = {{"schedule", "cosine"}, {"max-steps", "100"}, {"cooldown", "0.2"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args),
                      Contains("--cooldown with --schedule cosine") && Contains("noam, inverse_sqrt and constant"));
    args.flags = {{"schedule", "linear"}, {"max-steps", "100"}, {"cooldown", "0.2"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--cooldown with --schedule linear"));
    args.flags = {{"max-steps", "100"}, {"cooldown", "1"}};  // the whole run cooling down from step 1: refused
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--cooldown") && Contains("1"));
    args.flags = {{"schedule", "inverse_sqrt"}, {"time-budget", "5"}, {"cooldown", "0.2"}};
    CHECK(tf::resolve_train_config(args).config.optim.cooldown == 0.2);
}

TEST_CASE("train settings: a run.json of an older version (model values as text, newer keys absent) is read",
          "[train][settings]") {
    CHECK(tf::find_setting(tf::train_settings(), "precision", /*by_key=*/true)->absent == "fp32");
    const tf::TrainConfig changed = everything_changed();
    nlohmann::json j = nlohmann::json::parse(tf::to_json(changed));
    for (auto& [key, value] : j["model"].items()) value = value.is_string() ? value : nlohmann::json(value.dump());
    for (const auto& s : tf::train_settings()) {  // what older versions did not write
        if (s.required) continue;
        std::string path = "/" + s.key;
        std::replace(path.begin(), path.end(), '.', '/');
        const nlohmann::json::json_pointer key(path);
        j[key.parent_pointer()].erase(key.back());
    }
    const tf::TrainConfig back = tf::train_config_from_json(j.dump());
    for (const auto& s : tf::train_settings()) {
        if (s.key.empty()) continue;
        INFO(s.key);
        // absent: the value older versions ran with (precision: fp32, from before auto), else the default
        const std::string absent = s.absent.empty() ? s.get(tf::TrainConfig{}) : s.absent;
        CHECK(s.get(back) == (s.required ? s.get(changed) : absent));
    }
    // A required value missing, or of the wrong type, is refused naming it.
    nlohmann::json missing = j;
    missing["optim"].erase("lr");
    CHECK_THROWS_WITH(tf::train_config_from_json(missing.dump()), Contains("optim.lr") && Contains("missing"));
    nlohmann::json wrong = j;
    wrong["model"]["heads"] = 2.5;
    CHECK_THROWS_WITH(tf::train_config_from_json(wrong.dump()), Contains("model.heads") && Contains("2.5"));
}

TEST_CASE("train settings: flags beat --config, which beats --preset, --layers is one source's shorthand",
          "[train][settings]") {
    TempDir tmp("settings");
    tf::TrainArguments args;
    args.preset = "toy";
    CHECK(tf::resolve_train_config(args).config.model.d_model == 128);
    args.config_file = write_file(tmp, "a.toml", "d-model = 64\n[train]\nffn = 96\n");
    tf::TrainConfig c = tf::resolve_train_config(args).config;
    CHECK(c.model.d_model == 64);
    CHECK(c.model.ffn == 96);
    CHECK(c.model.heads == 4);  // the preset's
    args.flags = {{"d-model", "32"}};
    CHECK(tf::resolve_train_config(args).config.model.d_model == 32);

    // The preset says --layers 2; a flag for one side overrides that side only.
    args.flags = {{"enc-layers", "3"}};
    c = tf::resolve_train_config(args).config;
    CHECK(c.model.enc_layers == 3);
    CHECK(c.model.dec_layers == 2);
    // In one place, --layers with --enc-layers is a contradiction.
    args.flags = {{"layers", "2"}, {"enc-layers", "3"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--layers") && Contains("--enc-layers"));
    args.flags = {};
    args.config_file = write_file(tmp, "b.toml", "layers = 2\ndec-layers = 1\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("b.toml") && Contains("--layers"));
}

TEST_CASE("train settings: defaults that follow from other settings", "[train][settings]") {
    tf::TrainArguments args;
    args.flags = {{"dropout", "0.3"}, {"max-steps", "50"}};
    tf::ResolvedTrainConfig r = tf::resolve_train_config(args);
    CHECK(r.config.model.attention_dropout == 0.3);
    CHECK(r.config.model.activation_dropout == 0.3);
    CHECK(r.config.optim.schedule.total_steps == 50);
    CHECK(r.config.optim.schedule.lr == 1.0);  // noam: a factor
    CHECK(r.notes.empty());

    args.flags = {{"schedule", "cosine"}, {"max-steps", "50"}, {"warmup", "5"}};
    r = tf::resolve_train_config(args);
    CHECK(r.config.optim.schedule.lr == 5e-4);  // the other schedules: the rate itself
    CHECK(r.notes.empty());
    args.flags.push_back({"lr", "1"});
    r = tf::resolve_train_config(args);
    CHECK(r.config.optim.schedule.lr == 1.0);
    REQUIRE(r.notes.size() == 1);
    CHECK_THAT(r.notes[0], Contains("--lr 1") && Contains("cosine"));
}

TEST_CASE("train settings: --init-from names the model and tokenizer settings it ignores, not the dropouts or a preset's",
          "[train][settings]") {
    TempDir tmp("init_from");
    tf::TrainArguments args;
    args.preset = "toy";  // (sets d-model, layers, tokenizer, vocab-size: unsaid)
    args.flags = {{"init-from", "base"}, {"dropout", "0.3"}, {"lr", "0.5"}};
    CHECK(tf::resolve_train_config(args).notes.empty());
    args.config_file = write_file(tmp, "a.toml", "heads = 2\nlabel-smoothing = 0.2\n");
    args.flags = {{"init-from", "base"}, {"d-model", "64"}, {"layers", "1"}, {"causal-mask", "false"},
                  {"vocab-size", "100"}, {"attention-dropout", "0.2"}};
    const tf::ResolvedTrainConfig r = tf::resolve_train_config(args);
    REQUIRE(r.notes.size() == 1);
    INFO(r.notes[0]);
    CHECK_THAT(r.notes[0], Contains("--init-from trains base's model") && Contains("a.toml:1: heads") &&
                               Contains("--d-model --layers --causal-mask --vocab-size"));
    CHECK_THAT(r.notes[0], !Contains("--dropout") && !Contains("--attention-dropout") && !Contains("preset") &&
                               !Contains("label-smoothing"));
}

TEST_CASE("train settings: every number is range-checked, overflow included, naming where it came from",
          "[train][settings]") {
    for (const auto& s : tf::train_settings()) {
        if (s.name.empty() || (s.type != tf::SettingType::Integer && s.type != tf::SettingType::Real)) continue;
        INFO(s.name);
        tf::TrainArguments args;
        if (s.name != "seed") {  // the seed's bound is the largest int64: one more is the overflow case below
            const std::string above = s.type == tf::SettingType::Integer ? std::to_string(static_cast<long long>(s.hi) + 1)
                                                                         : tf::setting_detail::format_real(s.hi * 2 + 1);
            args.flags = {{s.name, above}};
            CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--" + s.name) && Contains(above));
        }
        args.flags = {{s.name, "-1"}};
        CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--" + s.name) && Contains("-1"));
        for (const char* bad : {"99999999999999999999999", "12abc", "", "nan", "inf"}) {
            args.flags = {{s.name, bad}};
            CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--" + s.name));
        }
    }
    tf::TrainArguments args;
    args.flags = {{"accumulate", "0"}};  // no micro-batch per step
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--accumulate") && Contains("0"));
    args.flags = {{"norm", "middle"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--norm") && Contains("post, pre") && Contains("middle"));
    args.flags = {{"valid-bleu", "maybe"}};
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("--valid-bleu"));
}

TEST_CASE("train settings: a bad config file is refused with its line", "[train][settings]") {
    TempDir tmp("settings");
    tf::TrainArguments args;
    args.config_file = write_file(tmp, "a.toml", "d-model = 32\nwidth = 3\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("a.toml:2: width") && Contains("not a setting"));
    args.config_file = write_file(tmp, "b.toml", "d-model = 32\n[model]\nheads = 2\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("b.toml") && Contains("[model]"));
    args.config_file = write_file(tmp, "c.toml", "d-model = 32\nheads = = 2\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("c.toml:2") && Contains("TOML"));
    args.config_file = write_file(tmp, "d.toml", "heads = 0\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("d.toml:1: heads") && Contains("[1, 1024]"));
    args.config_file = write_file(tmp, "e.toml", "heads = [1, 2]\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("e.toml:1:9") && Contains("not an array"));
    args.config_file = write_file(tmp, "e2.toml", "valid-bleu = [[}\n");  // asserts inside toml++ 3.3
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("e2.toml:1:14") && Contains("not an array"));
    args.config_file = write_file(tmp, "e4.toml", "\xEF\xBB\xBF[# a header that names no table\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("e4.toml:1: a table header"));
    args.config_file = write_file(tmp, "e3.toml", "heads = { a = 1 }\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("e3.toml:1:9") && Contains("not an array"));
    // toml++ 3.3 reaches undefined behaviour on a non-ASCII character where it tests for whitespace (after
    // a value, in a key): refused before it parses. In a comment or a quoted value it is read as written.
    args.config_file = write_file(tmp, "f.toml", "d-model = 32\nmax-steps = 5\xC2\xA1\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("f.toml:2:14") && Contains("non-ASCII"));
    args.config_file = write_file(tmp, "g.toml", "\"\xC2\xA1\" = 5\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("g.toml:1:2") && Contains("non-ASCII"));
    // toml++ scans a malformed value up to a value terminator, past later quotes: only the string right
    // after a line's first '=' may hold one.
    args.config_file = write_file(tmp, "j.toml", "lr = 1e-x = \"\xC2\xA1\"\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("j.toml:1:14") && Contains("non-ASCII"));
    args.config_file = write_file(tmp, "h.toml", "train-src = \"\"\"a\n\xC2\xA1\"\"\"\n");
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("h.toml:1") && Contains("multi-line"));
    args.config_file = write_file(tmp, "i.toml", u8"\uFEFF# données \"\n[train]\ntrain-src = \"données/a \\\"é\\\".src\" # é\n"
                                                   u8"train-tgt = 'données/b.tgt'\n");
    const tf::TrainConfig read = tf::resolve_train_config(args).config;
    CHECK(read.data.train_src == u8"données/a \"é\".src");
    CHECK(read.data.train_tgt == u8"données/b.tgt");
    args.config_file = tmp / "absent.toml";
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("absent.toml"));
    args.config_file = "";
    args.preset = "nonesuch";
    CHECK_THROWS_WITH(tf::resolve_train_config(args), Contains("nonesuch") && Contains("toy"));
}

TEST_CASE("model settings: sizes in an edited weights file are bounded before anything is allocated", "[nn][settings]") {
    const auto meta = tf::to_metadata(tf::ModelConfig{});
    for (const auto& [key, value] : std::map<std::string, std::string>{
             {"ffn", "99999999999999"}, {"max_len", "100000000"}, {"heads", "-4"}, {"d_model", "1e3"}, {"src_vocab", "0"}}) {
        INFO(key);
        auto bad = meta;
        bad[key] = value;
        CHECK_THROWS_WITH(tf::model_config_from_metadata(bad), Contains(key) && Contains(value));
    }
    // Each size within its bounds, all together far too large: refused by validate, not by bad_alloc.
    tf::ModelConfig huge;
    huge.d_model = 16384;
    huge.heads = 16;
    huge.ffn = 262144;
    huge.enc_layers = huge.dec_layers = 64;
    CHECK_THROWS_WITH(huge.validate(), Contains("exceed the limit"));
    CHECK_THROWS_AS(tf::Transformer(huge, 1), std::invalid_argument);
}

TEST_CASE("model settings: parameter_count from the config equals the allocated model's", "[nn][settings]") {
    for (tf::Tying tie : {tf::Tying::None, tf::Tying::Decoder, tf::Tying::All})
        for (tf::NormPosition norm : {tf::NormPosition::Post, tf::NormPosition::Pre})
            for (tf::PositionalKind positional : {tf::PositionalKind::Sinusoidal, tf::PositionalKind::Learned}) {
                tf::ModelConfig c;
                c.src_vocab = c.tgt_vocab = 50;
                if (tie == tf::Tying::None) c.tgt_vocab = 40;
                c.d_model = 16;
                c.heads = 2;
                c.ffn = 24;
                c.enc_layers = 2;
                c.dec_layers = 1;
                c.max_len = 32;
                c.tie = tie;
                c.norm = norm;
                c.positional = positional;
                INFO(tf::to_string(tie) << " " << tf::to_string(norm) << " " << tf::to_string(positional));
                CHECK(c.parameter_count() == tf::Transformer(c, 1).parameter_count());
            }
}

TEST_CASE("model settings: parameter_shapes lists exactly the allocated model's parameters", "[nn][settings]") {
    // What a weights file is checked against before a model is allocated must be what the model allocates.
    for (tf::Tying tie : {tf::Tying::None, tf::Tying::Decoder, tf::Tying::All})
        for (tf::NormPosition norm : {tf::NormPosition::Post, tf::NormPosition::Pre})
            for (tf::PositionalKind positional : {tf::PositionalKind::Sinusoidal, tf::PositionalKind::Learned})
                for (tf::AttentionScore attention : {tf::AttentionScore::Dot, tf::AttentionScore::Additive})
                    for (bool output_bias : {false, true}) {
                        tf::ModelConfig c;
                        c.src_vocab = c.tgt_vocab = 50;
                        if (tie == tf::Tying::None) c.tgt_vocab = 40;
                        c.d_model = 16;
                        c.heads = 4;
                        c.ffn = 24;
                        c.enc_layers = 2;
                        c.dec_layers = 3;
                        c.max_len = 32;
                        c.tie = tie;
                        c.norm = norm;
                        c.positional = positional;
                        c.attention = attention;
                        c.output_bias = output_bias;
                        INFO(tf::to_string(tie) << " " << tf::to_string(norm) << " " << tf::to_string(positional) << " "
                                                << tf::to_string(attention) << " output_bias " << output_bias);
                        const tf::ParamList params = tf::Transformer(c, 1).parameters();
                        const std::vector<tf::ParameterShape> shapes = c.parameter_shapes();
                        REQUIRE(shapes.size() == params.size());
                        for (std::size_t i = 0; i < params.size(); ++i) {
                            INFO(params[i].name);
                            const tf::Shape& s = params[i].tensor.shape();
                            CHECK(shapes[i].name == params[i].name);
                            CHECK(shapes[i].shape == std::vector<std::int64_t>(s.dims.begin(), s.dims.begin() + s.rank));
                            CHECK(shapes[i].dims_from.size() == shapes[i].shape.size());
                        }
                    }
}
