// Batches: the padded layout (source + EOS, BOS + target, target + EOS), the token budget, and the
// epoch plans of the Batcher (every example once, reproducible per (seed, epoch), little padding).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "tapeformer/data/batch.h"

namespace {

// `n` examples with lengths drawn from [1, max_len] by a fixed linear congruential generator; token ids
// encode (example, position) so rows can be traced back: id = 4 + (i * 7 + k) % 50.
std::vector<tf::Example> random_examples(int n, int max_len, std::uint32_t seed) {
    std::uint32_t x = seed;
    auto next = [&] { return (x = x * 1664525u + 1013904223u) >> 8; };
    std::vector<tf::Example> examples(n);
    for (int i = 0; i < n; ++i) {
        int s = 1 + static_cast<int>(next() % max_len), t = 1 + static_cast<int>(next() % max_len);
        for (int k = 0; k < s; ++k) examples[i].src.push_back(4 + (i * 7 + k) % 50);
        for (int k = 0; k < t; ++k) examples[i].tgt.push_back(4 + (i * 5 + k) % 50);
    }
    return examples;
}

// Checks that row r of `b` holds examples[b.index[r]] in the conventions of batch.h.
void check_layout(const tf::Batch& b, const std::vector<tf::Example>& examples) {
    REQUIRE(b.src.size() == static_cast<std::size_t>(b.B) * b.S);
    REQUIRE(b.dec_in.size() == static_cast<std::size_t>(b.B) * b.T);
    REQUIRE(b.target.size() == static_cast<std::size_t>(b.B) * b.T);
    std::int64_t src_tokens = 0, tgt_tokens = 0;
    for (int r = 0; r < b.B; ++r) {
        const tf::Example& e = examples[b.index[r]];
        std::vector<std::int32_t> src(b.src.begin() + r * b.S, b.src.begin() + (r + 1) * b.S);
        std::vector<std::int32_t> in(b.dec_in.begin() + r * b.T, b.dec_in.begin() + (r + 1) * b.T);
        std::vector<std::int32_t> out(b.target.begin() + r * b.T, b.target.begin() + (r + 1) * b.T);
        std::vector<std::int32_t> want_src = e.src, want_in = {tf::kBosId}, want_out = e.tgt;
        want_src.push_back(tf::kEosId);
        want_src.resize(b.S, tf::kPadId);
        want_in.insert(want_in.end(), e.tgt.begin(), e.tgt.end());
        want_in.resize(b.T, tf::kPadId);
        want_out.push_back(tf::kEosId);
        want_out.resize(b.T, tf::kPadId);
        CHECK(src == want_src);
        CHECK(in == want_in);
        CHECK(out == want_out);
        CHECK(b.src_len[r] == static_cast<std::int32_t>(e.src.size()) + 1);
        CHECK(b.tgt_len[r] == static_cast<std::int32_t>(e.tgt.size()) + 1);
        src_tokens += std::count_if(src.begin(), src.end(), [](std::int32_t id) { return id != tf::kPadId; });
        tgt_tokens += std::count_if(out.begin(), out.end(), [](std::int32_t id) { return id != tf::kPadId; });
    }
    CHECK(b.num_src_tokens == src_tokens);
    CHECK(b.num_tgt_tokens == tgt_tokens);
}

}  // namespace

TEST_CASE("make_batch pads on the right and shifts the target by one against the decoder input", "[batch]") {
    std::vector<tf::Example> examples = {{{10, 11, 12}, {20}}, {{13}, {21, 22, 23}}};
    tf::Batch b = tf::make_batch(examples, {1, 0});
    CHECK(b.B == 2);
    CHECK(b.S == 4);
    CHECK(b.T == 4);
    CHECK(b.src == std::vector<std::int32_t>{13, 2, 0, 0, /**/ 10, 11, 12, 2});
    CHECK(b.dec_in == std::vector<std::int32_t>{1, 21, 22, 23, /**/ 1, 20, 0, 0});
    CHECK(b.target == std::vector<std::int32_t>{21, 22, 23, 2, /**/ 20, 2, 0, 0});
    CHECK(b.src_len == std::vector<std::int32_t>{2, 4});
    CHECK(b.tgt_len == std::vector<std::int32_t>{4, 2});
    CHECK(b.index == std::vector<std::int64_t>{1, 0});
    CHECK(b.num_src_tokens == 6);
    CHECK(b.num_tgt_tokens == 6);
    check_layout(b, examples);
}

TEST_CASE("encode_parallel drops and counts pairs longer than max_len on either side", "[batch]") {
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    tf::ParallelText text;
    text.source = {"a b", "a b c d", "a", "a b c"};
    text.target = {"x", "x", "x y z w", "x y z"};
    text.stats.pairs_read = 6;
    text.stats.empty_skipped = 2;
    tf::TokenizerPair tok = tf::TokenizerPair::train(text.source, text.target, options);
    tf::EncodedCorpus corpus = tf::encode_parallel(text, tok, 3);
    REQUIRE(corpus.examples.size() == 2);
    CHECK(corpus.examples[0].src == tok.source->encode("a b"));
    CHECK(corpus.examples[1].tgt == tok.target->encode("x y z"));
    CHECK(corpus.stats.too_long == 2);
    CHECK(corpus.stats.empty_skipped == 2);
    CHECK(corpus.stats.kept() == 2);
    CHECK(tf::encode_parallel(text, tok, 0).examples.size() == 4);  // 0 = no limit
    CHECK(tf::encode_lines({"a b", "", "zzz"}, *tok.source) ==
          std::vector<std::vector<std::int32_t>>{tok.source->encode("a b"), {}, {tf::kUnkId}});
}

TEST_CASE("Batcher: every example once per epoch, budget kept, layout right", "[batch]") {
    std::vector<tf::Example> examples = random_examples(1000, 40, 1);
    tf::BatcherOptions options;
    options.batch_tokens = 300;
    options.seed = 42;
    tf::Batcher batcher(examples, options);
    REQUIRE(batcher.num_examples() == 1000);
    for (std::int64_t epoch : {0, 1, 7}) {
        std::vector<tf::Batch> batches = batcher.epoch_batches(epoch);
        CHECK(static_cast<std::int64_t>(batches.size()) == batcher.num_batches());
        std::vector<int> seen(examples.size(), 0);
        for (const tf::Batch& b : batches) {
            CHECK(b.B >= 1);
            CHECK(std::int64_t(b.B) * std::max(b.S, b.T) <= options.batch_tokens);
            check_layout(b, examples);
            for (std::int64_t i : b.index) ++seen[i];
        }
        CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
}

TEST_CASE("Batcher: the order is a pure function of (seed, epoch)", "[batch]") {
    std::vector<tf::Example> examples = random_examples(500, 30, 2);
    tf::BatcherOptions options;
    options.batch_tokens = 256;
    options.seed = 7;
    tf::Batcher a(examples, options), b(examples, options);
    CHECK(a.epoch_plan(3) == b.epoch_plan(3));  // two instances, e.g. before and after a restart
    CHECK(a.epoch_plan(3) == a.epoch_plan(3));
    CHECK(a.epoch_plan(0) != a.epoch_plan(1));
    CHECK(a.epoch_plan(1) != a.epoch_plan(2));
    options.seed = 8;
    CHECK(tf::Batcher(examples, options).epoch_plan(3) != a.epoch_plan(3));
    // Ties among equal lengths are broken at random too, so the groups themselves change between epochs.
    auto groups = [](std::vector<std::vector<std::int64_t>> plan) {
        for (auto& g : plan) std::sort(g.begin(), g.end());
        return std::set<std::vector<std::int64_t>>(plan.begin(), plan.end());
    };
    CHECK(groups(a.epoch_plan(0)) != groups(a.epoch_plan(1)));
}

TEST_CASE("Batcher: length bucketing keeps padding small", "[batch]") {
    // Lengths as in real translation data: the target about as long as the source, give or take 3.
    std::vector<tf::Example> examples = random_examples(2000, 50, 3);
    std::uint32_t x = 5;
    for (tf::Example& e : examples) {
        x = x * 1664525u + 1013904223u;
        int len = std::max<int>(1, static_cast<int>(e.src.size()) + static_cast<int>((x >> 8) % 7) - 3);
        e.tgt.resize(len, 4);
    }
    tf::BatcherOptions options;
    options.batch_tokens = 1024;
    tf::Batcher batcher(examples, options);
    std::int64_t src_real = 0, src_padded = 0, tgt_real = 0, tgt_padded = 0;
    for (const tf::Batch& b : batcher.epoch_batches(0)) {
        src_real += b.num_src_tokens;
        src_padded += std::int64_t(b.B) * b.S;
        tgt_real += b.num_tgt_tokens;
        tgt_padded += std::int64_t(b.B) * b.T;
    }
    // Batches of 20 in input order would pad about 45% of source positions.
    CHECK(double(src_padded - src_real) / double(src_padded) < 0.10);
    CHECK(double(tgt_padded - tgt_real) / double(tgt_padded) < 0.10);
}

TEST_CASE("Batcher options: max_sentences, no shuffle, and an example larger than the budget", "[batch]") {
    std::vector<tf::Example> examples = random_examples(300, 20, 4);
    tf::BatcherOptions options;
    options.batch_tokens = 10000;
    options.max_sentences = 16;
    for (const auto& group : tf::Batcher(examples, options).epoch_plan(0)) CHECK(group.size() <= 16);

    options.shuffle = false;
    tf::Batcher ordered(examples, options);
    CHECK(ordered.epoch_plan(0) == ordered.epoch_plan(5));
    std::vector<std::int64_t> flat;
    for (const auto& group : ordered.epoch_plan(0)) flat.insert(flat.end(), group.begin(), group.end());
    auto longer_side = [&](std::int64_t i) { return std::max(examples[i].src.size(), examples[i].tgt.size()); };
    CHECK(std::is_sorted(flat.begin(), flat.end(),
                         [&](std::int64_t a, std::int64_t b) { return longer_side(a) < longer_side(b); }));

    options = tf::BatcherOptions{};
    options.batch_tokens = 15;  // examples have up to 20 + 1 positions
    CHECK_THROWS_WITH(tf::Batcher(examples, options),
                      Catch::Contains("batch_tokens 15") && Catch::Contains("max_len"));
    CHECK(tf::Batcher({}, tf::BatcherOptions{}).num_batches() == 0);
}

TEST_CASE("inference_batches sort by source length and carry the input positions", "[batch]") {
    std::vector<std::vector<std::int32_t>> sources = {
        {5, 6, 7, 8, 9}, {5}, {}, {5, 6}, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}};
    std::vector<tf::Batch> batches = tf::inference_batches(sources, 8);
    std::vector<int> seen(sources.size(), 0);
    std::vector<std::int64_t> order;
    for (const tf::Batch& b : batches) {
        CHECK(b.T == 0);
        CHECK(b.dec_in.empty());
        CHECK((std::int64_t(b.B) * b.S <= 8 || b.B == 1));  // the 11-position source gets a batch of its own
        for (int r = 0; r < b.B; ++r) {
            const std::vector<std::int32_t>& s = sources[b.index[r]];
            std::vector<std::int32_t> row(b.src.begin() + r * b.S, b.src.begin() + (r + 1) * b.S);
            std::vector<std::int32_t> want = s;
            want.push_back(tf::kEosId);
            want.resize(b.S, tf::kPadId);
            CHECK(row == want);
            ++seen[b.index[r]];
            order.push_back(b.index[r]);
        }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    CHECK(order == std::vector<std::int64_t>{2, 1, 3, 0, 4});
    CHECK(tf::inference_batches(sources, 1000, 2).size() == 3);
}
