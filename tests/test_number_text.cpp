// number_text.h: the one strict reading of a number a person typed (settings, flags, heads prune --step):
// the whole text or nothing, and a value past its type reported apart from a malformed one.
#include <catch2/catch.hpp>

#include <string>

#include "tapeformer/number_text.h"

using tf::NumberRead;

TEST_CASE("number text: integers are read whole, a blank or a stray character anywhere is refused", "[settings][number_text]") {
    long long v = 7;
    CHECK(tf::read_integer("42", v) == NumberRead::ok);
    CHECK(v == 42);
    CHECK(tf::read_integer("-9223372036854775808", v) == NumberRead::ok);
    CHECK(v == -9223372036854775807LL - 1);
    CHECK(tf::read_integer("+3", v) == NumberRead::ok);
    CHECK(v == 3);
    for (const char* bad : {"", " 1", "1 ", "1\n", "\t1", "1x", "0x10", "1.5", "1e3", "-", "abc"}) {
        INFO("'" << bad << "'");
        v = 7;
        CHECK(tf::read_integer(bad, v) == NumberRead::not_a_number);
        CHECK(v == 7);  // left as it was
    }
    CHECK(tf::read_integer("9223372036854775808", v) == NumberRead::out_of_range);
    CHECK(tf::read_integer("-99999999999999999999", v) == NumberRead::out_of_range);
    CHECK(v == 7);
}

TEST_CASE("number text: an unsigned integer is never a wrapped negative one", "[settings][number_text]") {
    unsigned long long v = 7;
    CHECK(tf::read_unsigned("18446744073709551615", v) == NumberRead::ok);
    CHECK(v == 18446744073709551615ULL);
    CHECK(tf::read_unsigned("-1", v) == NumberRead::not_a_number);
    CHECK(tf::read_unsigned(" 1", v) == NumberRead::not_a_number);
    CHECK(tf::read_unsigned("18446744073709551616", v) == NumberRead::out_of_range);
    CHECK(v == 18446744073709551615ULL);
}

TEST_CASE("number text: reals are read whole and finite", "[settings][number_text]") {
    double v = 7;
    CHECK(tf::read_real("0.1", v) == NumberRead::ok);
    CHECK(v == 0.1);
    CHECK(tf::read_real("-2e-3", v) == NumberRead::ok);
    CHECK(v == -2e-3);
    for (const char* bad : {"", " 0.1", "0.1 ", "0.1%", "1,5", "x"}) {
        INFO("'" << bad << "'");
        CHECK(tf::read_real(bad, v) == NumberRead::not_a_number);
    }
    for (const char* big : {"inf", "-inf", "nan", "1e999"}) {
        INFO(big);
        CHECK(tf::read_real(big, v) == NumberRead::out_of_range);
    }
    CHECK(v == -2e-3);
}
