// json_integer (json_integer.h): integers from JSON files tapeformer reads back (a checkpoint's training
// state, run.json, state.json, metrics.jsonl) are JSON integers that fit their type, or one error naming
// the key; never a double cast to an integer (out of range that is undefined behaviour, which the run_state
// fuzz target hit with "dropout_offset": 8.9e128).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tapeformer/run/checkpoint.h"
#include "run/json_integer.h"

using nlohmann::json;

TEST_CASE("json_integer accepts JSON integers that fit the type and refuses everything else, naming the key", "[checkpoint][fuzz]") {
    CHECK(tf::json_integer<std::int64_t>(json::parse("-9223372036854775808"), "k") == INT64_MIN);
    CHECK(tf::json_integer<std::int64_t>(json::parse("9223372036854775807"), "k") == INT64_MAX);
    CHECK(tf::json_integer<std::uint64_t>(json::parse("18446744073709551615"), "k") == UINT64_MAX);
    CHECK(tf::json_integer<int>(json::parse("3"), "k") == 3);
    for (const char* bad : {"9223372036854775808", "1e300", "2.5", "8.0", "\"7\"", "null", "true", "[1]"})
        CHECK_THROWS_WITH(tf::json_integer<std::int64_t>(json::parse(bad), "step"),
                          Catch::StartsWith("step is ") && Catch::Contains("not an integer in"));
    CHECK_THROWS_WITH(tf::json_integer<std::uint64_t>(json::parse("-1"), "dropout_offset"),
                      Catch::Contains("dropout_offset is -1"));
    CHECK_THROWS(tf::json_integer<int>(json::parse("2147483648"), "format"));
    CHECK_THROWS(tf::json_integer<int>(json::parse("-2147483649"), "format"));
}

TEST_CASE("a checkpoint's training state with a number out of its integer's range is refused, naming the key", "[checkpoint][fuzz]") {
    tf::TrainState s;
    s.step = 2;
    json j = json::parse(tf::to_json(s));
    REQUIRE_NOTHROW(tf::train_state_from_json(j.dump()));
    j["dropout_offset"] = 8.9e128;
    CHECK_THROWS_WITH(tf::train_state_from_json(j.dump()), Catch::Contains("dropout_offset"));
    j = json::parse(tf::to_json(s));
    j["epoch"] = 0.5;
    CHECK_THROWS_WITH(tf::train_state_from_json(j.dump()), Catch::Contains("epoch"));
}

TEST_CASE("a checkpoint's log window round-trips, may be absent (older checkpoints), and is refused when impossible",
          "[checkpoint][fuzz]") {
    tf::TrainState s;
    s.step = 5;
    s.log_window = {7.5, 6.25, 0.5, 30, 2};
    const tf::TrainState back = tf::train_state_from_json(tf::to_json(s));
    CHECK(back.log_window.loss == 7.5);
    CHECK(back.log_window.nll == 6.25);
    CHECK(back.log_window.seconds == 0.5);
    CHECK(back.log_window.tokens == 30);
    CHECK(back.log_window.steps == 2);
    json j = json::parse(tf::to_json(s));
    j.erase("log_window");
    CHECK(tf::train_state_from_json(j.dump()).log_window.steps == 0);
    for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
             {"steps", 6}, {"steps", -1}, {"tokens", -3}, {"loss", -1.0}, {"nll", nullptr}, {"seconds", 1.5e308 * 10}}) {
        INFO(key << " = " << value.dump());
        j = json::parse(tf::to_json(s));
        j["log_window"][key] = value;
        CHECK_THROWS_WITH(tf::train_state_from_json(j.dump()), Catch::Contains("log_window") || Catch::Contains("malformed"));
    }
}
