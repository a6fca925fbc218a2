// Tests of metrics/bleu.h: the 13a tokenizer, corpus BLEU and corpus chrF against sacreBLEU 2.x.
//
// sacreBLEU cannot run here, so its own published figures are the reference: each such case names the
// file it comes from (mjpost/sacrebleu: README.md, test/test_bleu.py, test/test_sentence_bleu.py,
// test/test_chrf.py). The other cases are worked by hand in the comment above them.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/metrics/bleu.h"

namespace {

using Lines = std::vector<std::string>;

// The README example of sacreBLEU 2.x: three system lines and two reference streams.
const Lines kReadmeSys = {"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."};
const Lines kReadmeRefs1 = {"The dog bit the man.", "It was not unexpected.", "The man bit him first."};
const Lines kReadmeRefs2 = {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."};

// Expects `fn` to throw std::invalid_argument whose message contains every string in `parts`.
template <class Fn>
void require_invalid_argument(Fn fn, const std::vector<std::string>& parts) {
    try {
        fn();
        FAIL("expected std::invalid_argument");
    } catch (const std::invalid_argument& e) {
        const std::string msg = e.what();
        for (const std::string& part : parts) {
            INFO("message: " << msg << " | expected to contain: " << part);
            CHECK(msg.find(part) != std::string::npos);
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Tokenizer 13a. Expected strings follow the rules of sacreBLEU's tokenizer_13a.py / tokenizer_re.py.

TEST_CASE("tokenize_13a: punctuation is split off, apostrophes and inner hyphens are not", "[metrics][bleu]") {
    CHECK(tf::tokenize_13a("Hello, world!") == "Hello , world !");
    CHECK(tf::tokenize_13a("He said \"no\".") == "He said \" no \" .");
    CHECK(tf::tokenize_13a("(a) [b] {c} x/y a:b") == "( a ) [ b ] { c } x / y a : b");
    CHECK(tf::tokenize_13a("don't") == "don't");  // ' is outside the punctuation class
    CHECK(tf::tokenize_13a("a--b") == "a--b");    // - is split only after a digit
    CHECK(tf::tokenize_13a("end...") == "end . . .");
}

TEST_CASE("tokenize_13a: periods and commas stay inside numbers", "[metrics][bleu]") {
    // Rule 2 splits . or , after a non-digit; rule 3 splits . or , before a non-digit.
    CHECK(tf::tokenize_13a("It costs $3.50.") == "It costs $ 3.50 .");
    CHECK(tf::tokenize_13a("1,000 people, 2,5 kg.") == "1,000 people , 2,5 kg .");
    CHECK(tf::tokenize_13a("$1,000,000.00!") == "$ 1,000,000.00 !");
    CHECK(tf::tokenize_13a("U.S. and e.g. this") == "U . S . and e . g . this");
    // ".5": the period follows a space (non-digit), so rule 2 splits it even though a digit follows.
    CHECK(tf::tokenize_13a("x.5 .5 3.5. 5,a a,5") == "x . 5 . 5 3.5 . 5 , a a , 5");
}

TEST_CASE("tokenize_13a: a dash is split only after a digit", "[metrics][bleu]") {
    CHECK(tf::tokenize_13a("1990-1995 pre-war 5-year-old") == "1990 - 1995 pre-war 5 - year-old");
    CHECK(tf::tokenize_13a("1-2-3") == "1 - 2 - 3");
}

TEST_CASE("tokenize_13a: <skipped>, -newline, newlines and HTML entities", "[metrics][bleu]") {
    CHECK(tf::tokenize_13a("a <skipped> b") == "a b");
    CHECK(tf::tokenize_13a("well-\nknown\nfact") == "wellknown fact");
    // Entities are replaced in the order &quot; &amp; &lt; &gt;, so "&amp;quot;" ends as "&quot;",
    // which the punctuation rule then splits into "& quot ;".
    CHECK(tf::tokenize_13a("&quot;Hi&quot; &amp; bye &lt;b&gt; &amp;quot;") == "\" Hi \" & bye < b > & quot ;");
}

TEST_CASE("tokenize_13a: UTF-8, Unicode whitespace, empty input", "[metrics][bleu]") {
    // The en dash U+2013 and umlauts are not ASCII punctuation and stay as they are.
    CHECK(tf::tokenize_13a("Über 3,5 Mio. Euro \u2013 schön!") == "Über 3,5 Mio . Euro \u2013 schön !");
    // No-break space U+00A0, ideographic space U+3000 and tab separate words, as in Python's str.split().
    CHECK(tf::tokenize_13a("a\u00A0b\u3000c\td") == "a b c d");
    CHECK(tf::tokenize_13a("") == "");
    CHECK(tf::tokenize_13a("   ") == "");
    // An invalid byte is read as U+FFFD instead of aborting.
    CHECK(tf::tokenize_13a("a\xff") == "a\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------------
// BLEU: figures published by sacreBLEU

TEST_CASE("bleu: sacreBLEU README example with two references", "[metrics][bleu]") {
    // README.md and test/test_bleu.py (test_corpus_bleu_cases, default settings: 48.530827, EPSILON 1e-8).
    const tf::BleuScore s = tf::corpus_bleu_multi_ref(kReadmeSys, {kReadmeRefs1, kReadmeRefs2});
    CHECK(s.score == Approx(48.530827).margin(1e-8));
    CHECK(s.format() == "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)");
    CHECK(s.signature() == "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:tapeformer-reimpl-of-sacrebleu-2");
}

TEST_CASE("bleu: sacreBLEU README example with a variable number of references", "[metrics][bleu]") {
    // README.md, "Variable Number of References": the first reference of line 1 is '' and is ignored.
    const Lines refs1 = {"", "It was not unexpected.", "The man bit him first."};
    const tf::BleuScore s = tf::corpus_bleu_multi_ref(kReadmeSys, {refs1, kReadmeRefs2});
    CHECK(s.format() == "BLEU = 29.44 82.4/42.9/27.3/12.5 (BP = 0.889 ratio = 0.895 hyp_len = 17 ref_len = 19)");
    CHECK(s.nrefs == -1);
    CHECK(s.signature().rfind("nrefs:var|", 0) == 0);
}

TEST_CASE("bleu: empty hypotheses are scored, not removed", "[metrics][bleu]") {
    // test/test_bleu.py: (('', '', ''), _refs, {}, 0.0).
    const tf::BleuScore s = tf::corpus_bleu_multi_ref({"", "", ""}, {kReadmeRefs1, kReadmeRefs2});
    CHECK(s.score == 0.0);
    CHECK(s.sys_len == 0);
    CHECK(s.ref_len == 17);  // closest length to 0 is the shorter reference: 6 + 5 + 6
    CHECK(s.bp == 0.0);
}

TEST_CASE("bleu: sentence with Romanian diacritics (sacreBLEU issue #98)", "[metrics][bleu]") {
    // test/test_sentence_bleu.py: smooth 'exp', tokenize '13a', case-sensitive -> 8.493 (EPSILON 1e-3).
    // That test sets effective_order, which changes nothing here: all four orders have n-grams.
    // Hand check: 13a gives 14 hypothesis and 10 reference tokens. Note "Producția" (t with comma,
    // U+021B) differs from "producţia" (t with cedilla, U+0163) and in case.
    //   counts 5/14 (de, zahăr, în, alb, ;), 2/13 (de zahăr, alb ;), 0/12, 0/11;  BP = 1 (14 > 10)
    //   exp smoothing: p3 = 100 / (2 * 12) = 4.1667, p4 = 100 / (4 * 11) = 2.2727
    //   BLEU = (35.714 * 15.385 * 4.1667 * 2.2727)^(1/4) = 8.493
    const tf::BleuScore s = tf::corpus_bleu({"Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;"},
                                            {"producţia de zahăr brut se exprimă în zahăr alb;"});
    CHECK(s.score == Approx(8.493).margin(1e-3));
    CHECK(s.counts == std::array<int64_t, 4>{5, 2, 0, 0});
    CHECK(s.totals == std::array<int64_t, 4>{14, 13, 12, 11});
    CHECK(s.format() == "BLEU = 8.49 35.7/15.4/4.2/2.3 (BP = 1.000 ratio = 1.400 hyp_len = 14 ref_len = 10)");
}

TEST_CASE("bleu: no matching n-gram at all gives 0 (sacreBLEU issue #141)", "[metrics][bleu]") {
    // test/test_sentence_bleu.py (test_cases_zero_bleu, 'exp') and test/test_bleu.py (test_raw_bleu_cases).
    CHECK(tf::corpus_bleu({"this is a cat"}, {"okay thanks"}).score == 0.0);
    const tf::BleuScore s = tf::corpus_bleu({"this is a test", "another test"}, {"ref1", "ref2"});
    CHECK(s.score == 0.0);
    CHECK(s.precisions == std::array<double, 4>{0.0, 0.0, 0.0, 0.0});
}

TEST_CASE("bleu: clipped counts and totals (sacreBLEU test_statistics)", "[metrics][bleu]") {
    // test/test_bleu.py test_case_statistics: counts [4, 2, 1, 0], totals [6, 5, 4, 3]. (That test uses
    // no tokenizer; this text has no punctuation, so 13a tokenizes it the same way.)
    // "am" occurs twice in the hypothesis but once in the reference: clipped to 1.
    const tf::BleuScore s = tf::corpus_bleu({"am I am a character sequence"}, {"I am a symbol string sequence a a"});
    CHECK(s.counts == std::array<int64_t, 4>{4, 2, 1, 0});
    CHECK(s.totals == std::array<int64_t, 4>{6, 5, 4, 3});
    CHECK(s.sys_len == 6);
    CHECK(s.ref_len == 8);
}

TEST_CASE("bleu: score from statistics (sacreBLEU test_scoring and degenerate statistics)", "[metrics][bleu]") {
    // test/test_bleu.py test_case_scoring: counts [9, 7, 5, 3], totals [10, 8, 6, 4], lengths 11, 11
    // -> 0.8375922397 (on a 0..1 scale, EPSILON 1e-8). Smoothing plays no part: no count is zero.
    CHECK(tf::bleu_from_stats({9, 7, 5, 3}, {10, 8, 6, 4}, 11, 11).score / 100.0 == Approx(0.8375922397).margin(1e-8));
    // test/test_bleu.py test_case_degenerate_stats: no matches, or no n-grams at all -> 0.
    CHECK(tf::bleu_from_stats({0, 0, 0, 0}, {4, 4, 2, 1}, 0, 1).score == 0.0);
    CHECK(tf::bleu_from_stats({0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0).score == 0.0);
}

TEST_CASE("bleu: a perfect match is 100", "[metrics][bleu]") {
    // test/test_bleu.py test_raw_bleu_cases: identical strings -> 1.0 (on a 0..1 scale).
    CHECK(tf::corpus_bleu({"this is a test"}, {"this is a test"}).score == Approx(100.0).margin(1e-9));
    const tf::BleuScore s = tf::corpus_bleu(kReadmeSys, kReadmeSys);
    CHECK(s.format() == "BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 17 ref_len = 17)");
}

// ---------------------------------------------------------------------------------------------------
// BLEU: worked by hand

TEST_CASE("bleu: one wrong word, 'exp' smoothing of the zero 4-gram precision", "[metrics][bleu]") {
    // hyp "this is a fest" vs ref "this is a test" (4 tokens each, BP = 1):
    //   1-grams 3/4 (this, is, a)   2-grams 2/3 (this is, is a)   3-grams 1/2 (this is a)   4-grams 0/1
    //   p4 has no match: 'exp' gives 100 / (2^1 * 1) = 50 (sacreBLEU's 'floor' with 0.01 would give 1,
    //   hence the 0.2236 that test_bleu.py asserts for raw_corpus_bleu)
    //   BLEU = (75 * 66.667 * 50 * 50)^(1/4) = 100 * 0.125^(1/4) = 59.4604
    const tf::BleuScore s = tf::corpus_bleu({"this is a fest"}, {"this is a test"});
    CHECK(s.counts == std::array<int64_t, 4>{3, 2, 1, 0});
    CHECK(s.totals == std::array<int64_t, 4>{4, 3, 2, 1});
    CHECK(s.precisions[0] == Approx(75.0));
    CHECK(s.precisions[1] == Approx(200.0 / 3.0));
    CHECK(s.precisions[2] == Approx(50.0));
    CHECK(s.precisions[3] == Approx(50.0));
    CHECK(s.bp == 1.0);
    CHECK(s.score == Approx(59.460355750136046).epsilon(1e-12));
}

TEST_CASE("bleu: two zero-match orders halve the smoothing step twice", "[metrics][bleu]") {
    // hyp "a b c d e" vs ref "a b x c d" (5 tokens each, BP = 1):
    //   1-grams 4/5 -> 80   2-grams 2/4 (a b, c d) -> 50
    //   3-grams 0/3 -> 100 / (2 * 3) = 16.667    4-grams 0/2 -> 100 / (4 * 2) = 12.5
    //   BLEU = (80 * 50 * 16.667 * 12.5)^(1/4) = 30.2138
    const tf::BleuScore s = tf::corpus_bleu({"a b c d e"}, {"a b x c d"});
    CHECK(s.precisions[2] == Approx(100.0 / 6.0));
    CHECK(s.precisions[3] == Approx(12.5));
    CHECK(s.score == Approx(30.213753973567677).epsilon(1e-12));
}

TEST_CASE("bleu: brevity penalty", "[metrics][bleu]") {
    // hyp "the cat sat on the" (c = 5) vs ref "the cat sat on the mat" (r = 6): every n-gram matches,
    //   BP = exp(1 - 6/5) = exp(-0.2) = 0.818731, BLEU = 100 * BP = 81.8731
    const tf::BleuScore s = tf::corpus_bleu({"the cat sat on the"}, {"the cat sat on the mat"});
    CHECK(s.counts == std::array<int64_t, 4>{5, 4, 3, 2});
    CHECK(s.bp == Approx(0.8187307530779819).epsilon(1e-12));
    CHECK(s.score == Approx(81.87307530779823).epsilon(1e-12));
    CHECK(s.format() == "BLEU = 81.87 100.0/100.0/100.0/100.0 (BP = 0.819 ratio = 0.833 hyp_len = 5 ref_len = 6)");
}

TEST_CASE("bleu: a corpus with no 4-grams scores 0 even when every n-gram matches", "[metrics][bleu]") {
    // hyp "the cat sat" has no 4-gram: total_4 = 0 stops the loop, p4 stays 0, log(0) counts as
    // -9999999999 and BLEU = 0. This is why corpus BLEU of very short outputs is 0.
    const tf::BleuScore s = tf::corpus_bleu({"the cat sat"}, {"the cat sat on the mat"});
    CHECK(s.precisions == std::array<double, 4>{100.0, 100.0, 100.0, 0.0});
    CHECK(s.score == 0.0);
}

TEST_CASE("bleu: statistics are summed over the corpus before the score", "[metrics][bleu]") {
    // Line 1 alone would be 0 (no 4-gram); summed with line 2 the corpus has 4-grams and a score.
    //   line 1 "the cat" vs "the cat": counts 2,1,0,0  totals 2,1,0,0
    //   line 2 "a b c d" vs "a b c d": counts 4,3,2,1  totals 4,3,2,1
    //   corpus: 6/6, 4/4, 2/2, 1/1 -> BLEU = 100
    const tf::BleuScore s = tf::corpus_bleu({"the cat", "a b c d"}, {"the cat", "a b c d"});
    CHECK(s.counts == std::array<int64_t, 4>{6, 4, 2, 1});
    CHECK(s.score == Approx(100.0).margin(1e-9));
}

TEST_CASE("bleu: empty hypothesis against a non-empty reference", "[metrics][bleu]") {
    const tf::BleuScore s = tf::corpus_bleu({""}, {"the cat"});
    CHECK(s.format() == "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 2)");
}

TEST_CASE("bleu: case-sensitive and tokenized with 13a", "[metrics][bleu]") {
    // "The" and "the" differ. "dog." is tokenized to "dog ." on both sides, so it matches "dog ."
    CHECK(tf::corpus_bleu({"The dog ."}, {"the dog."}).counts == std::array<int64_t, 4>{2, 1, 0, 0});
    // Trailing whitespace is rstrip()ed before tokenizing, so a trailing "-\n" is not joined away.
    CHECK(tf::corpus_bleu({"a b-\n"}, {"a b-"}).counts[0] == 2);
}

TEST_CASE("bleu: signature and bad input", "[metrics][bleu]") {
    CHECK(tf::corpus_bleu({"a"}, {"a"}).signature() ==
          "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:tapeformer-reimpl-of-sacrebleu-2");
    require_invalid_argument([] { tf::corpus_bleu({"a", "b", "c"}, {"a", "b"}); }, {"3 hypotheses", "2 references"});
    require_invalid_argument([] { tf::corpus_bleu({"a", "b"}, {"a", ""}); }, {"line 2", "empty"});
    require_invalid_argument([] { tf::corpus_bleu_multi_ref({"a"}, {}); }, {"reference stream"});
    require_invalid_argument([] { tf::corpus_bleu_multi_ref({"a"}, {{"a"}, {"a", "b"}}); },
                             {"1 hypotheses", "stream 2", "2 lines"});
}

// ---------------------------------------------------------------------------------------------------
// chrF: figures published by sacreBLEU

TEST_CASE("chrf: sacreBLEU README example with two references", "[metrics][bleu]") {
    // README.md: CHRF().corpus_score(sys, refs) -> "chrF2 = 59.73".
    const tf::ChrfScore s = tf::corpus_chrf_multi_ref(kReadmeSys, {kReadmeRefs1, kReadmeRefs2});
    CHECK(s.format() == "chrF2 = 59.73");
    CHECK(s.signature() == "nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:tapeformer-reimpl-of-sacrebleu-2");
}

TEST_CASE("chrf: sacreBLEU effective-order cases", "[metrics][bleu]") {
    // test/test_chrf.py test_cases_effective_order (eps_smoothing=False, the 2.x default). That test
    // uses beta = 3; in every case below precision equals recall, and then F-beta is the same for any
    // beta, so the figures hold for chrF2 too.
    CHECK(tf::corpus_chrf({"a"}, {"a"}).score == Approx(100.0).margin(1e-4));
    CHECK(tf::corpus_chrf({""}, {"reference"}).score == Approx(0.0).margin(1e-4));
    CHECK(tf::corpus_chrf({"a b c"}, {"a b c"}).score == Approx(100.0).margin(1e-4));
    CHECK(tf::corpus_chrf({"a b c"}, {"abc"}).score == Approx(100.0).margin(1e-4));  // whitespace removed
    CHECK(tf::corpus_chrf({""}, {"c"}).score == Approx(0.0).margin(1e-4));
    CHECK(tf::corpus_chrf({"a", "b"}, {"a", "c"}).score == Approx(50.0).margin(1e-4));
    CHECK(tf::corpus_chrf({"aa"}, {"ab"}).score == Approx(25.0).margin(1e-4));
}

TEST_CASE("chrf: identical sentence is 100", "[metrics][bleu]") {
    // test/test_chrf.py test_cases: identical German sentence -> 100.0.
    const std::string line = "Niemand hat die Absicht, eine Mauer zu errichten";
    CHECK(tf::corpus_chrf({line}, {line}).score == Approx(100.0).margin(1e-9));
}

// ---------------------------------------------------------------------------------------------------
// chrF: worked by hand

TEST_CASE("chrf: per-order statistics, and orders the reference lacks", "[metrics][bleu]") {
    // hyp "aa" vs ref "ab":
    //   order 1: hyp {a:2}, ref {a:1, b:1} -> hyp 2, ref 2, match 1
    //   order 2: hyp {aa}, ref {ab}        -> hyp 1, ref 1, match 0
    //   orders 3..6: the reference has none, so sacreBLEU counts no hypothesis n-grams either
    //   P = R = (1/2 + 0/1) / 2 = 0.25 over the 2 effective orders -> chrF = 25
    const tf::ChrfScore s = tf::corpus_chrf({"aa"}, {"ab"});
    CHECK(s.stats[0].hyp == 2);
    CHECK(s.stats[0].ref == 2);
    CHECK(s.stats[0].match == 1);
    CHECK(s.stats[1].match == 0);
    CHECK(s.stats[2].hyp == 0);
    CHECK(s.stats[2].ref == 0);
}

TEST_CASE("chrf: precision and recall are averaged before one F-beta", "[metrics][bleu]") {
    // hyp "ab" vs ref "abc":
    //   order 1: hyp 2, ref 3, match 2 -> p = 1, r = 2/3
    //   order 2: hyp 1, ref 2, match 1 -> p = 1, r = 1/2
    //   order 3: ref {abc} but the hypothesis has no 3-gram (hyp = 0): not an effective order
    //   P = 1, R = (2/3 + 1/2) / 2 = 7/12
    //   chrF2 = 100 * (1 + 4) * P * R / (4 * P + R) = 100 * (35/12) / (55/12) = 100 * 7/11 = 63.6364
    //   (averaging the per-order F2 values instead would give 63.49: not what sacreBLEU does)
    const tf::ChrfScore s = tf::corpus_chrf({"ab"}, {"abc"});
    CHECK(s.stats[2].hyp == 0);
    CHECK(s.stats[2].ref == 1);
    CHECK(s.score == Approx(700.0 / 11.0).epsilon(1e-12));
    CHECK(tf::chrf_from_stats(s.stats) == s.score);
}

TEST_CASE("chrf: characters are Unicode code points, not bytes", "[metrics][bleu]") {
    // hyp "schön" vs ref "schon": 5 code points each (the hypothesis has 6 bytes: ö is 2 bytes).
    //   order 1: 5, 5, match 4 (s c h n)       order 2: 4, 4, match 2 (sc, ch)
    //   order 3: 3, 3, match 1 (sch)           order 4: 2, 2, 0      order 5: 1, 1, 0     order 6: none
    //   P = R = (4/5 + 2/4 + 1/3 + 0 + 0) / 5 = 0.326667 -> chrF2 = 32.6667
    // Counting bytes would give hyp order-1 count 6 and a different score.
    const tf::ChrfScore s = tf::corpus_chrf({"schön"}, {"schon"});
    CHECK(s.stats[0].hyp == 5);
    CHECK(s.stats[0].match == 4);
    CHECK(s.stats[4].hyp == 1);
    CHECK(s.stats[5].hyp == 0);
    CHECK(s.score == Approx(100.0 * (0.8 + 0.5 + 1.0 / 3.0) / 5.0).epsilon(1e-12));
    // Unicode whitespace (no-break space) is removed like ASCII spaces.
    CHECK(tf::corpus_chrf({"schön\u00A0ist"}, {"schönist"}).score == Approx(100.0).margin(1e-9));
}

TEST_CASE("chrf: empty hypothesis, signature, bad input", "[metrics][bleu]") {
    const tf::ChrfScore s = tf::corpus_chrf({""}, {"Mauer"});
    CHECK(s.score == 0.0);
    CHECK(s.format() == "chrF2 = 0.00");
    CHECK(s.signature() == "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:tapeformer-reimpl-of-sacrebleu-2");
    require_invalid_argument([] { tf::corpus_chrf({"a"}, {"a", "b"}); }, {"1 hypotheses", "2 references"});
    require_invalid_argument([] { tf::corpus_chrf({"a"}, {""}); }, {"line 1", "empty"});
}
