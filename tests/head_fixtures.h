// What the head-study tests share: a tiny model configuration with 2+1 layers and 4 heads, random
// sentence pairs of its vocabulary, and a tiny model trained by the CLI.
#pragma once
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tapeformer/study/heads.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/random.h"
#include "helpers.h"

namespace tf_test {

// V 20, C 16, H 4 (D 4), F 24, 2 encoder and 1 decoder layers, no dropout.
inline tf::ModelConfig tiny_head_model() {
    tf::ModelConfig c = tiny_model_config(20, 16, 4, 24, 2, 1, 24);
    c.dropout = c.attention_dropout = c.activation_dropout = 0;
    return c;
}

// n pairs of 2-9 words each, ids 4..19 (above the special ids), from `seed`.
inline std::vector<tf::Example> random_examples(int n, std::uint64_t seed) {
    tf::Rng rng(seed);
    std::vector<tf::Example> out(static_cast<std::size_t>(n));
    for (auto& e : out) {
        e.src.resize(2 + rng.below(8));
        e.tgt.resize(2 + rng.below(8));
        for (auto& x : e.src) x = 4 + std::int32_t(rng.below(16));
        for (auto& x : e.tgt) x = 4 + std::int32_t(rng.below(16));
    }
    return out;
}

// The study's entry for the head named `name` ("E:0:1"); fails the case when there is none.
inline const tf::HeadStats& find_head(const tf::HeadReport& r, const std::string& name) {
    for (const auto& h : r.heads)
        if (h.id.str() == name) return h;
    FAIL("no head " << name);
    return r.heads.front();
}

// A 1+1-layer model (C 16, 2 heads) trained by the CLI for `steps` steps on data/toy/valid; returns its dir.
inline std::string train_tiny_model(const TempDir& tmp, int steps) {
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/", model = tmp / "model";
    const std::string train = shell_quote(TF_CLI) + " --threads 1 train --train-src " + shell_quote(toy + "valid.src") +
                              " --train-tgt " + shell_quote(toy + "valid.tgt") +
                              " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --layers 1 --max-steps " +
                              std::to_string(steps) + " --out " + shell_quote(model) + " >/dev/null 2>&1";
    REQUIRE(std::system(train.c_str()) == 0);
    return model;
}

}  // namespace tf_test
