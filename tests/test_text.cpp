// Reading parallel and single text files: trimming, empty pairs, UTF-8 checks and the error messages.
#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "tapeformer/data/text.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no exception)";
}

}  // namespace

TEST_CASE("read_parallel trims lines, strips \\r and skips pairs with an empty side", "[text]") {
    TempDir dir;
    std::string src = write_file(dir, "a.de", "\xEF\xBB\xBF" "ein Haus\r\n  zwei  \n\n\t\nvier\r\nfünf");
    std::string tgt = write_file(dir, "a.en", "a house\r\ntwo\nthree\n \n\nfive\n");
    tf::ParallelText text = tf::read_parallel(src, tgt);
    REQUIRE(text.size() == 3);
    CHECK(text.source == std::vector<std::string>{"ein Haus", "zwei", "fünf"});
    CHECK(text.target == std::vector<std::string>{"a house", "two", "five"});
    CHECK(text.stats.pairs_read == 6);
    CHECK(text.stats.empty_skipped == 3);
    CHECK(text.stats.kept() == 3);
    text.stats.too_long = 1;
    CHECK(text.stats.summary() == "kept 2 of 6 pairs (skipped 3 empty pairs, filtered 1 over-long pairs)");
}

TEST_CASE("read_parallel names both files and both line counts when they differ", "[text]") {
    TempDir dir;
    std::string src = write_file(dir, "train.de", "a\nb\nc\n");
    std::string tgt = write_file(dir, "train.en", "a\nb\n");
    std::string msg = error_of([&] { tf::read_parallel(src, tgt); });
    CHECK_THAT(msg, Catch::Contains(src) && Catch::Contains(tgt) && Catch::Contains("3 lines") &&
                        Catch::Contains("has 2"));
}

TEST_CASE("invalid UTF-8 is reported with the file and the 1-based line", "[text]") {
    TempDir dir;
    std::string src = write_file(dir, "bad.de", "gut\nauch gut\nschl\xFF" "cht\n");
    std::string tgt = write_file(dir, "ok.en", "good\nalso good\nbad\n");
    std::string msg = error_of([&] { tf::read_parallel(src, tgt); });
    CHECK_THAT(msg, Catch::Contains(src + ":3:") && Catch::Contains("invalid UTF-8") && Catch::Contains("0xFF"));
    CHECK_THAT(error_of([&] { tf::read_lines(src); }), Catch::Contains(src + ":3:"));
}

TEST_CASE("a missing or unreadable file is reported with its path and the reason", "[text]") {
    TempDir dir;
    std::string missing = (dir.path / "nope.txt").string();
    std::string ok = write_file(dir, "ok.txt", "x\n");
    CHECK_THAT(error_of([&] { tf::read_parallel(missing, ok); }),
               Catch::Contains(missing) && Catch::Contains("No such file"));
    CHECK_THAT(error_of([&] { tf::read_parallel(ok, missing); }), Catch::Contains(missing));
    CHECK_THAT(error_of([&] { tf::read_lines(dir.path.string()); }), Catch::Contains("Is a directory"));
}

TEST_CASE("read_lines keeps empty lines so output can be written line for line", "[text]") {
    TempDir dir;
    std::string path = write_file(dir, "in.txt", "one \r\n\n  three\n");
    CHECK(tf::read_lines(path) == std::vector<std::string>{"one", "", "three"});
    std::istringstream in("a\n\nb");
    CHECK(tf::read_lines(in, "<stdin>") == std::vector<std::string>{"a", "", "b"});
    CHECK(tf::read_lines(write_file(dir, "empty.txt", "")).empty());
}

TEST_CASE("CR-only line endings are refused with the line and column, not read as one line", "[text]") {
    TempDir dir;
    std::string lines;
    for (int i = 0; i < 20; ++i) lines += "sentence " + std::to_string(i) + "\r";
    const std::string path = write_file(dir, "mac.txt", lines);
    CHECK_THAT(error_of([&] { tf::read_lines(path); }),
               Catch::Contains(path + ":1: a carriage return (\\r) inside the line at column 11") &&
                   Catch::Contains("tr '\\r' '\\n'"));
    const std::string ok = write_file(dir, "other.txt", std::string(20, '\n'));
    CHECK_THAT(error_of([&] { tf::read_parallel(ok, path); }), Catch::Contains(path + ":1: a carriage return"));
    // \r\n endings and a trailing \r stay accepted.
    CHECK(tf::read_lines(write_file(dir, "dos.txt", "a b\r\nc\r\n  d \r")) == std::vector<std::string>{"a b", "c", "d"});
}

TEST_CASE("find_invalid_utf8 accepts well-formed UTF-8 and points at the first bad byte", "[text]") {
    const auto npos = std::string_view::npos;
    CHECK(tf::find_invalid_utf8("plain ascii") == npos);
    CHECK(tf::find_invalid_utf8("Grüße, 日本語, 😀") == npos);
    CHECK(tf::find_invalid_utf8("\xF4\x8F\xBF\xBF") == npos);   // U+10FFFF, the last code point
    CHECK(tf::find_invalid_utf8("ab\x80") == 2);                // lone continuation byte
    CHECK(tf::find_invalid_utf8("a\xC0\x80") == 1);             // overlong NUL
    CHECK(tf::find_invalid_utf8("\xE0\x80\xAF") == 0);          // overlong '/'
    CHECK(tf::find_invalid_utf8("x\xED\xA0\x80") == 1);         // UTF-16 surrogate D800
    CHECK(tf::find_invalid_utf8("\xF4\x90\x80\x80") == 0);      // above U+10FFFF
    CHECK(tf::find_invalid_utf8("ok\xE2\x82") == 2);            // truncated euro sign
    CHECK(tf::find_invalid_utf8("\xE2\x82\x41") == 0);          // bad continuation
}

TEST_CASE("trim removes ASCII whitespace at both ends only", "[text]") {
    CHECK(tf::trim(" \t a b \r\n") == "a b");
    CHECK(tf::trim("   ").empty());
    CHECK(tf::trim("x") == "x");
}
