// Exact-match accuracy (metrics/exact_match.h): counted by hand on a few lines.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "tapeformer/metrics/exact_match.h"

TEST_CASE("exact match: the fraction of lines equal to their reference, surrounding spaces aside", "[metrics]") {
    const tf::ExactMatch m = tf::exact_match({"a b c", " c b a ", "a b", "A b c"}, {"a b c", "c b a", "a b c", "a b c"});
    CHECK(m.matched == 2);  // a prefix ("a b") and another case ("A b c") are wrong
    CHECK(m.total == 4);
    CHECK(m.fraction() == 0.5);
    CHECK(m.format() == "exact match = 50.00% (2/4)");
    CHECK(tf::exact_match({}, {}).fraction() == 0.0);
    CHECK_THROWS_WITH(tf::exact_match({"a"}, {"a", "b"}), "exact_match: 1 hypotheses but 2 references");
}
