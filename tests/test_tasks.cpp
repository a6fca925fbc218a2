// The copy and reverse tasks (data/tasks.h): their definitions (lengths, symbols, target = source or its
// reversal), determinism pinned by checksums so that a change of generator shows up on every machine,
// option checks, and the CLI's `data copy` / `data reverse`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/data/tasks.h"
#include "tapeformer/io.h"
#include "helpers.h"

using namespace tf_test;

namespace {

std::vector<int> symbols_of(const std::string& line) {
    std::istringstream in(line);
    std::vector<int> out;
    int x;
    while (in >> x) out.push_back(x);
    return out;
}

std::string all_src(const std::vector<tf::SequencePair>& pairs) {
    std::string s;
    for (const auto& p : pairs) s += p.src + '\n';
    return s;
}

}  // namespace

TEST_CASE("tasks: reverse pairs are the source reversed, with JoeyNMT's symbols and lengths", "[tasks]") {
    const auto opt = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::reverse);
    const tf::SequenceTaskData d = tf::generate_sequence_task(opt);
    CHECK(d.train.size() == 50000);
    CHECK(d.valid.size() == 1000);
    CHECK(d.test.size() == 1000);
    std::set<int> seen_symbols, train_lengths, eval_lengths;
    for (const auto* split : {&d.train, &d.valid, &d.test})
        for (const auto& p : *split) {
            std::vector<int> src = symbols_of(p.src), tgt = symbols_of(p.tgt);
            std::reverse(src.begin(), src.end());
            REQUIRE(src == tgt);
            for (int x : tgt) seen_symbols.insert(x);
            (split == &d.train ? train_lengths : eval_lengths).insert(int(tgt.size()));
        }
    CHECK(*seen_symbols.begin() == 0);
    CHECK(*seen_symbols.rbegin() == 49);
    CHECK(seen_symbols.size() == 50);
    CHECK(*train_lengths.begin() == 1);
    CHECK(*train_lengths.rbegin() == 25);
    CHECK(train_lengths.size() == 25);      // every length occurs
    CHECK(*eval_lengths.rbegin() == 30);    // longer than any training sequence
}

TEST_CASE("tasks: copy pairs are 10 symbols from 1..10, the target equal to the source", "[tasks]") {
    const tf::SequenceTaskData d = tf::generate_sequence_task(tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::copy));
    CHECK(d.train.size() == 20000);
    std::set<int> seen;
    for (const auto& p : d.train) {
        REQUIRE(p.src == p.tgt);
        const auto s = symbols_of(p.src);
        REQUIRE(s.size() == 10);
        seen.insert(s.begin(), s.end());
    }
    CHECK(seen == std::set<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
}

TEST_CASE("tasks: the same seed gives the same bytes on every machine, another seed others", "[tasks]") {
    // The checksums pin the generator (counter-based hashing, no std:: distributions): a standard library
    // or a CPU that drew differently would change them.
    auto crc = [](tf::SequenceTask task, std::uint64_t seed) {
        auto opt = tf::SequenceTaskOptions::defaults_for(task);
        opt.seed = seed;
        return tf::crc32c(all_src(tf::generate_sequence_task(opt).train));
    };
    CHECK(crc(tf::SequenceTask::reverse, 1) == crc(tf::SequenceTask::reverse, 1));
    CHECK(crc(tf::SequenceTask::reverse, 1) != crc(tf::SequenceTask::reverse, 2));
    CHECK(crc(tf::SequenceTask::reverse, 1) == 0x639195c4u);
    CHECK(crc(tf::SequenceTask::copy, 1) == 0x18d65726u);
}

TEST_CASE("tasks: bad options are rejected naming the option", "[tasks]") {
    auto error = [](auto change) {
        auto opt = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::reverse);
        change(opt);
        try {
            tf::generate_sequence_task(opt);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK_THAT(error([](auto& o) { o.train = 0; }), Catch::Contains("--train"));
    CHECK_THAT(error([](auto& o) { o.symbols = 0; }), Catch::Contains("--symbols"));
    CHECK_THAT(error([](auto& o) { o.train_max_len = 0; }), Catch::Contains("--train-max-len"));
    CHECK_THAT(error([](auto& o) { o.eval_min_len = 40; }), Catch::Contains("--eval-max-len"));
}

TEST_CASE("tasks: tapeformer data reverse writes six aligned files, a bad value is one line on stderr", "[tasks][cli]") {
    TempDir tmp;
    const std::string out = tmp / "rev";
    const std::string cmd = shell_quote(TF_CLI) + " data reverse --out " + shell_quote(out) +
                            " --train 200 --valid 20 --test 20 2>" + shell_quote(tmp / "err");
    REQUIRE(std::system(cmd.c_str()) == 0);
    for (const char* split : {"train", "valid", "test"}) {
        const auto src = split_lines(read_all(out + "/" + split + ".src"));
        const auto tgt = split_lines(read_all(out + "/" + split + ".tgt"));
        CHECK(src.size() == (std::string(split) == "train" ? 200u : 20u));
        CHECK(src.size() == tgt.size());
    }
    const std::string bad = shell_quote(TF_CLI) + " data copy --out " + shell_quote(tmp / "copy") + " --train -3 2>" +
                            shell_quote(tmp / "err");
    CHECK(std::system(bad.c_str()) != 0);
    const auto err = split_lines(read_all(tmp / "err"));
    REQUIRE(err.size() == 1);
    CHECK_THAT(err[0], Catch::Contains("--train"));
    CHECK_FALSE(std::filesystem::exists(tmp / "copy"));  // nothing written on bad input
}
