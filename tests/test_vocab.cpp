// Word vocabularies: special ids, deterministic order, min_count / max_size, and the vocab.txt format.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "tapeformer/data/vocab.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

tf::WordCounts counts_of(const std::vector<std::string_view>& sentences) {
    tf::WordCounts counts;
    tf::count_words(sentences, counts);
    return counts;
}

}  // namespace

TEST_CASE("a new vocabulary holds the four special pieces at their fixed ids", "[vocab]") {
    tf::Vocab v;
    REQUIRE(v.size() == 4);
    CHECK(v.piece(tf::kPadId) == "<pad>");
    CHECK(v.piece(tf::kBosId) == "<s>");
    CHECK(v.piece(tf::kEosId) == "</s>");
    CHECK(v.piece(tf::kUnkId) == "<unk>");
    CHECK(v.id("anything") == tf::kUnkId);
    CHECK_THROWS_AS(v.piece(4), std::out_of_range);
    CHECK_THROWS_AS(v.piece(-1), std::out_of_range);
}

TEST_CASE("split_words splits at any run of ASCII whitespace", "[vocab]") {
    CHECK(tf::split_words("  a\tbb \r\n c ") == std::vector<std::string_view>{"a", "bb", "c"});
    CHECK(tf::split_words("   ").empty());
}

TEST_CASE("Vocab::build orders by count, then bytes, and applies min_count and max_size", "[vocab]") {
    // counts: the 3, a 2, cat 2, dog 2, zebra 1, <pad> (a word spelled like a special piece) 5
    tf::WordCounts counts = counts_of({"the cat the dog", "a cat a dog the", "zebra <pad> <pad> <pad> <pad> <pad>"});
    tf::Vocab all = tf::Vocab::build(counts, 1, 0);
    REQUIRE(all.size() == 9);
    std::vector<std::string> order;
    for (std::int32_t id = tf::kFirstRealId; id < all.size(); ++id) order.push_back(all.piece(id));
    CHECK(order == std::vector<std::string>{"the", "a", "cat", "dog", "zebra"});
    CHECK(all.id("cat") == 6);
    CHECK(all.id("<pad>") == tf::kPadId);  // the special itself, not a second entry

    tf::Vocab frequent = tf::Vocab::build(counts, 2, 0);
    CHECK(frequent.size() == 8);
    CHECK(frequent.id("zebra") == tf::kUnkId);

    tf::Vocab small = tf::Vocab::build(counts, 1, 6);
    CHECK(small.size() == 6);
    CHECK(small.id("a") == 5);
    CHECK(small.id("cat") == tf::kUnkId);

    CHECK_THROWS_AS(tf::Vocab::build(counts, 1, 3), std::invalid_argument);
}

TEST_CASE("Vocab::build does not depend on the order sentences were counted in", "[vocab]") {
    tf::Vocab a = tf::Vocab::build(counts_of({"x y z w", "y z", "q r s"}), 1, 0);
    tf::Vocab b = tf::Vocab::build(counts_of({"q r s", "z y", "w z y x"}), 1, 0);
    REQUIRE(a.size() == b.size());
    for (std::int32_t id = 0; id < a.size(); ++id) CHECK(a.piece(id) == b.piece(id));
}

TEST_CASE("vocab.txt round trip, and readable errors for malformed files", "[vocab]") {
    TempDir dir;
    tf::Vocab v = tf::Vocab::build(counts_of({"Grüße aus Köln", "aus Köln"}), 1, 0);
    std::string path = (dir.path / "vocab.txt").string();
    v.save(path);
    tf::Vocab back = tf::Vocab::load(path);
    REQUIRE(back.size() == v.size());
    for (std::int32_t id = 0; id < v.size(); ++id) CHECK(back.piece(id) == v.piece(id));

    auto write = [&](const std::string& name, const std::string& text) {
        std::ofstream((dir.path / name).string(), std::ios::binary) << text;
        return (dir.path / name).string();
    };
    auto message = [](const std::string& p) {
        try {
            tf::Vocab::load(p);
        } catch (const std::exception& e) {
            return std::string(e.what());
        }
        return std::string("(no exception)");
    };
    std::string wrong_head = write("head.txt", "<pad>\n<unk>\n</s>\n<s>\nx\n");
    CHECK_THAT(message(wrong_head), Catch::Contains(wrong_head + ":2:") && Catch::Contains("<s>"));
    std::string dup = write("dup.txt", "<pad>\n<s>\n</s>\n<unk>\nx\ny\nx\n");
    CHECK_THAT(message(dup), Catch::Contains(dup + ":7:") && Catch::Contains("duplicate"));
    std::string space = write("space.txt", "<pad>\n<s>\n</s>\n<unk>\na b\n");
    CHECK_THAT(message(space), Catch::Contains(space + ":5:") && Catch::Contains("whitespace"));
    CHECK_THAT(message(write("short.txt", "<pad>\n<s>\n")), Catch::Contains("fewer than the four"));
    CHECK_THAT(message((dir.path / "missing.txt").string()),
               Catch::Contains("missing.txt") && Catch::Contains("No such file"));
}

TEST_CASE("a vocab.txt that is a directory is named as a directory, not an I/O error", "[vocab]") {
    TempDir dir;
    const std::string path = (dir.path / "vocab.txt").string();
    fs::create_directories(path);
    std::string message = "(no exception)";
    try {
        tf::Vocab::load(path);
    } catch (const std::exception& e) {
        message = e.what();
    }
    CHECK(message == "cannot read '" + path + "': Is a directory");
}
