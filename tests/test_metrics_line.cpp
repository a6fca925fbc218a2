// metrics.jsonl's lines (run/metrics_line.h): the bytes the trainer writes, and the report reading back
// exactly what was written, through the same description.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "run/metrics_line.h"

using namespace tf;

TEST_CASE("metrics line: a training and a validation line are written as before, keys sorted, and read back", "[report]") {
    MetricsLine t;
    t.type = MetricsLine::Type::Train;
    t.step = 10, t.epoch = 1;
    t.loss = 2.0, t.nll = 1.5, t.ppl = 4.5, t.lr = 0.001, t.grad_norm = 0.25, t.tok_per_s = 100, t.elapsed = 1.5;
    t.layer_grad_norms = {{"encoder.layers.0", 0.5}};
    CHECK(to_json(t).dump() ==
          R"({"elapsed":1.5,"epoch":1,"grad_norm":0.25,"layer_grad_norms":[["encoder.layers.0",0.5]],"loss":2.0,)"
          R"("lr":0.001,"nll":1.5,"ppl":4.5,"step":10,"tok_per_s":100.0,"type":"train"})");
    MetricsLine v;
    v.type = MetricsLine::Type::Valid;
    v.step = 20, v.epoch = 2;
    v.valid_loss = 3.0, v.valid_nll = 2.5, v.valid_ppl = 12.0, v.elapsed = 9.0, v.weights = "ema", v.best = true;
    CHECK(to_json(v).dump() == R"({"best":true,"elapsed":9.0,"epoch":2,"step":20,"type":"valid","valid_loss":3.0,)"
                               R"("valid_nll":2.5,"valid_ppl":12.0,"weights":"ema"})");
    v.valid_bleu = 31.25;
    CHECK(to_json(v).dump().find(R"("valid_bleu":31.25)") != std::string::npos);
    v.valid_exact = 0.75;
    CHECK(to_json(v).dump().find(R"("valid_exact":0.75)") != std::string::npos);

    for (const MetricsLine& m : {t, v}) {
        const nlohmann::json j = to_json(m);
        REQUIRE(metrics_line_problem(j).empty());
        CHECK(to_json(metrics_line_from_json(j)) == j);
    }
    const MetricsLine back = metrics_line_from_json(to_json(v));
    CHECK(back.valid_bleu == 31.25);
    CHECK(back.valid_exact == 0.75);
    CHECK(std::isnan(back.loss));  // a validation line has no training loss
}

TEST_CASE("metrics line: a non-finite loss is written as null and the reader names it", "[report]") {
    MetricsLine t;
    t.step = 3;
    t.loss = std::numeric_limits<double>::infinity();
    const std::string text = to_json(t).dump();
    CHECK(text.find(R"("loss":null)") != std::string::npos);
    CHECK(metrics_line_problem(nlohmann::json::parse(text)) == "\"loss\" is null (NaN or infinite when it was written)");
    CHECK(metrics_line_problem(nlohmann::json{{"type", "train"}, {"step", -1}}) ==
          "\"step\" is -1, expected a non-negative integer");
    CHECK(metrics_line_problem(nlohmann::json{{"type", "valid"}, {"step", 1}, {"valid_exact", "all"}}) ==
          "\"valid_exact\" is string \"all\", expected a number");
}
