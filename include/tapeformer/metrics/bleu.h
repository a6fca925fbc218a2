// Corpus BLEU and chrF, computed the way sacreBLEU 2.x does with its default settings.
//
// These are the two numbers a translation paper reports, so they must match the reference tool to the
// last printed digit: BLEU with the mteval-v13a tokenizer and 'exp' smoothing, chrF2 on Unicode
// characters with whitespace removed. This is tapeformer's own reimplementation (no Python at run time);
// the signatures say so, and tests/test_bleu.cpp checks it against figures from sacreBLEU's test suite.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// The `version:` field of both signatures: tells a reader the figure came from this reimplementation
// of sacreBLEU 2.x defaults, not from sacreBLEU itself.
inline constexpr const char* kSacrebleuReimplVersion = "tapeformer-reimpl-of-sacrebleu-2";

// ---------------------------------------------------------------------------------------------------
// Tokenizer 13a

// sacreBLEU's default tokenizer `13a` (the rules of mteval-v13a.pl): drops `<skipped>`, joins `-\n`,
// turns other newlines into spaces, unescapes &quot; &amp; &lt; &gt;, puts spaces around most ASCII
// punctuation, splits `.` and `,` off unless they sit between digits ("3.5", "1,000" stay whole),
// splits `-` after a digit ("1990-1995" -> "1990 - 1995"), and collapses all whitespace to single
// spaces. Input is UTF-8; an invalid byte is read as U+FFFD. Returns the tokens joined by one space.
std::string tokenize_13a(const std::string& line);

// ---------------------------------------------------------------------------------------------------
// BLEU

// Corpus BLEU and its sufficient statistics, as sacreBLEU's BLEUScore holds them.
struct BleuScore {
    double score = 0.0;                   // BLEU in [0, 100]
    std::array<double, 4> precisions{};   // n-gram precisions in percent, n = 1..4, after 'exp' smoothing
    std::array<int64_t, 4> counts{};      // clipped n-gram matches summed over the corpus, n = 1..4
    std::array<int64_t, 4> totals{};      // hypothesis n-grams summed over the corpus, n = 1..4
    double bp = 0.0;                      // brevity penalty
    int64_t sys_len = 0;                  // hypothesis tokens (after 13a) summed over the corpus
    int64_t ref_len = 0;                  // closest-reference tokens summed over the corpus
    int nrefs = 1;                        // references per line; -1 when it varies ("var")

    // sys_len / ref_len, or 0 when ref_len is 0.
    double ratio() const;
    // sacreBLEU's line, e.g. "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)".
    std::string format() const;
    // e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:tapeformer-reimpl-of-sacrebleu-2".
    std::string signature() const;
};

// Corpus BLEU of `hyps` against one reference per line, with sacreBLEU 2.x defaults: 13a tokenizer,
// case-sensitive, n-grams 1..4, clipped counts summed over the corpus, brevity penalty, 'exp' smoothing,
// no effective order. Throws std::invalid_argument when the two sizes differ (naming both) or a
// reference is the empty string (sacreBLEU rejects those too). An empty hypothesis is scored, not skipped.
BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs);

// The same with several reference streams, laid out as sacreBLEU's `refs`: ref_streams[k][i] is the
// k-th reference of line i. Per line, empty references are ignored (at least one must remain), matches
// are clipped by the largest count in any reference, and ref_len takes the reference length closest to
// the hypothesis length (the shorter one on a tie).
BleuScore corpus_bleu_multi_ref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams);

// BLEU from already summed statistics (sacreBLEU's BLEU.compute_bleu with smooth_method='exp').
BleuScore bleu_from_stats(const std::array<int64_t, 4>& counts, const std::array<int64_t, 4>& totals,
                          int64_t sys_len, int64_t ref_len);

// ---------------------------------------------------------------------------------------------------
// chrF

// Character n-gram counts of one order: n-grams in the hypothesis, in the reference, and matched.
struct ChrfOrderStats {
    int64_t hyp = 0;
    int64_t ref = 0;
    int64_t match = 0;
};

// Corpus chrF and its statistics, as sacreBLEU's default CHRF() computes them.
struct ChrfScore {
    double score = 0.0;                   // chrF2 in [0, 100]
    std::array<ChrfOrderStats, 6> stats{}; // summed over the corpus; stats[n - 1] is character order n
    int nrefs = 1;                        // references per line; -1 when it varies ("var")

    // sacreBLEU's line, e.g. "chrF2 = 59.73".
    std::string format() const;
    // e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:tapeformer-reimpl-of-sacrebleu-2".
    std::string signature() const;
};

// Corpus chrF2 with sacreBLEU 2.x defaults: character n-grams of order 1..6 over Unicode code points
// (not bytes) with all whitespace removed, no word n-grams, beta = 2, statistics summed over the corpus,
// then precision and recall averaged over the orders that occur before one F-beta. Errors as corpus_bleu.
ChrfScore corpus_chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs);

// The same with several reference streams (layout as corpus_bleu_multi_ref): per line, the reference
// whose sentence-level chrF is highest (the first on a tie) contributes its statistics.
ChrfScore corpus_chrf_multi_ref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams);

// chrF2 in [0, 100] from summed statistics (sacreBLEU's CHRF._compute_f_score, eps_smoothing off).
double chrf_from_stats(const std::array<ChrfOrderStats, 6>& stats);

TF_NAMESPACE_END
