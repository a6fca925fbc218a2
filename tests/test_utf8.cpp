// UTF-8 (data/utf8.h): the one decoder behind the text reader's validation and BLEU's code points, so a
// line the reader accepts decodes without a single U+FFFD, and every ill-formed byte is caught by both.
#include <catch2/catch.hpp>

#include <string>

#include "tapeformer/data/utf8.h"

using tf::decode_utf8;
using tf::decode_utf8_at;
using tf::find_invalid_utf8;

TEST_CASE("utf8: code points of one- to four-byte characters, and back", "[utf8]") {
    const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀
    CHECK(decode_utf8(s) == U"a\u00E9\u20AC\U0001F600");
    CHECK(decode_utf8_at(s, 1).code_point == 0xE9);
    CHECK(decode_utf8_at(s, 1).length == 2);
    CHECK(decode_utf8_at(s, 6).length == 4);
    CHECK(find_invalid_utf8(s) == std::string::npos);
    // Every boundary of every length encodes and decodes to itself.
    for (char32_t cp : {0x0U, 0x7FU, 0x80U, 0x7FFU, 0x800U, 0xD7FFU, 0xE000U, 0xFFFFU, 0x10000U, 0x10FFFFU}) {
        std::string bytes;
        tf::append_utf8(bytes, cp);
        INFO(std::hex << std::uint32_t(cp));
        CHECK(decode_utf8(bytes) == std::u32string(1, cp));
        CHECK(find_invalid_utf8(bytes) == std::string::npos);
    }
}

TEST_CASE("utf8: ill-formed bytes are found by the reader and become U+FFFD, one per byte", "[utf8]") {
    struct Case {
        const char* what;
        std::string bytes;  // "x" + the bad sequence + "y"
    };
    for (const Case& c : {Case{"stray continuation byte", "x\x80y"}, Case{"overlong '/' (C0 AF)", "x\xC0\xAFy"},
                          Case{"overlong 3-byte (E0 80 AF)", "x\xE0\x80\xAFy"}, Case{"surrogate D800 (ED A0 80)", "x\xED\xA0\x80y"},
                          Case{"above U+10FFFF (F4 90 80 80)", "x\xF4\x90\x80\x80y"}, Case{"F5 never starts a character", "x\xF5y"},
                          Case{"cut short (E2 82 then y)", "x\xE2\x82y"}}) {
        INFO(c.what);
        CHECK(find_invalid_utf8(c.bytes) == 1);
        CHECK(decode_utf8_at(c.bytes, 1).length == 0);
        const std::u32string cps = decode_utf8(c.bytes);
        CHECK(cps.front() == U'x');
        CHECK(cps.back() == U'y');
        CHECK(cps.size() == c.bytes.size());  // every byte of the bad sequence is one U+FFFD
        for (std::size_t i = 1; i + 1 < cps.size(); ++i) CHECK(cps[i] == 0xFFFD);
    }
    CHECK(find_invalid_utf8("ok\xE2\x82") == 2);  // cut short by the end of the text
}
