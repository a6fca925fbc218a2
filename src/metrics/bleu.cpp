// Corpus BLEU and chrF, reimplementing sacreBLEU 2.x defaults step by step.
//
// Reading order: Python-whitespace helpers, the 13a tokenizer, BLEU (statistics, then the
// score), chrF (statistics, then the score). Each step names the sacreBLEU function it mirrors, because
// "the same as sacreBLEU" is only true if every small rule (rstrip, tie-breaks, zero guards) is the same.
#include "tapeformer/metrics/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_map>

#include "tapeformer/data/utf8.h"

TF_NAMESPACE_BEGIN

namespace {

// ---------------------------------------------------------------------------------------------------
// Whitespace. sacreBLEU works on Python str, i.e. on Unicode code points (decode_utf8, data/utf8.h, turns
// each invalid byte into U+FFFD, so a metric never aborts on a stray byte in model output), and its
// str.split() / str.rstrip() treat every Unicode whitespace character as a separator, not only ASCII.

// Python's str.isspace(): the characters str.split() and str.strip() cut on (Unicode category Zs or
// bidirectional class WS/B/S). Note U+200B (zero width space) is not one of them.
bool is_py_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.split() with no argument: runs of whitespace separate, no empty pieces.
std::vector<std::u32string> split_py(const std::u32string& s) {
    std::vector<std::u32string> pieces;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_py_space(s[i])) ++i;
        const size_t start = i;
        while (i < s.size() && !is_py_space(s[i])) ++i;
        if (i > start) pieces.push_back(s.substr(start, i - start));
    }
    return pieces;
}

// Python's str.rstrip() with no argument.
std::string rstrip_py(const std::string& s) {
    std::u32string cps = decode_utf8(s);
    while (!cps.empty() && is_py_space(cps.back())) cps.pop_back();
    std::string out;
    for (char32_t c : cps) append_utf8(out, c);
    return out;
}

// Python's str.replace(from, to): every non-overlapping occurrence, scanning left to right. Safe on
// UTF-8 bytes because `from` is ASCII and ASCII bytes never occur inside a multi-byte sequence.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
    std::string out;
    size_t pos = 0;
    for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, pos)) {
        out.append(s, pos, hit - pos);
        out += to;
        pos = hit + from.size();
    }
    out.append(s, pos, std::string::npos);
    return out;
}

// ---------------------------------------------------------------------------------------------------
// Tokenizer 13a (sacreBLEU tokenizers/tokenizer_13a.py + tokenizer_re.py).

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }  // regex [0-9]: ASCII digits only
bool is_period_or_comma(char32_t c) { return c == U'.' || c == U','; }

// Regex class [\{-\~\[-\` -\&\(-\+\:-\@\/]: the ASCII ranges { | } ~, [ \ ] ^ _ `, space ! " # $ % &,
// ( ) * +, : ; < = > ? @, and /. Left out on purpose: ' , - . (and digits, letters).
bool is_13a_punct(char32_t c) {
    return (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) ||
           (c >= 0x28 && c <= 0x2B) || (c >= 0x3A && c <= 0x40) || c == 0x2F;
}

// One pass of re.sub with a two-character pattern (first char satisfies `a`, second satisfies `b`):
// scan left to right; where both match, write the pair through `emit` and resume after it, else copy
// one character. This is exactly how Python's re.sub walks a fixed-width pattern (matches never overlap).
template <class A, class B, class Emit>
std::u32string sub_pairs(const std::u32string& s, A a, B b, Emit emit) {
    std::u32string out;
    out.reserve(s.size() + s.size() / 2);
    size_t i = 0;
    while (i < s.size()) {
        if (i + 1 < s.size() && a(s[i]) && b(s[i + 1])) {
            emit(out, s[i], s[i + 1]);
            i += 2;
        } else {
            out.push_back(s[i]);
            i += 1;
        }
    }
    return out;
}

// The 13a tokens of one line, as UTF-8 strings.
std::vector<std::string> tokens_13a(const std::string& raw) {
    // Language-independent part, on bytes, in sacreBLEU's order (the order matters: "&amp;quot;"
    // becomes "&quot;", not '"').
    std::string line = replace_all(raw, "<skipped>", "");
    line = replace_all(line, "-\n", "");
    line = replace_all(line, "\n", " ");
    line = replace_all(line, "&quot;", "\"");
    line = replace_all(line, "&amp;", "&");
    line = replace_all(line, "&lt;", "<");
    line = replace_all(line, "&gt;", ">");

    // The regex part runs on code points, on " line " (the padding lets rule 2 and 3 see a neighbour).
    std::u32string t = U" " + decode_utf8(line) + U" ";

    // Rule 1: ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "   (space around punctuation and symbols)
    std::u32string r1;
    r1.reserve(t.size() * 2);
    for (char32_t c : t) {
        if (is_13a_punct(c)) { r1 += U' '; r1 += c; r1 += U' '; }
        else r1 += c;
    }
    // Rule 2: ([^0-9])([\.,]) -> "\1 \2 "   (split . and , unless preceded by a digit)
    t = sub_pairs(r1, [](char32_t c) { return !is_digit(c); }, is_period_or_comma,
                  [](std::u32string& o, char32_t x, char32_t y) { o += x; o += U' '; o += y; o += U' '; });
    // Rule 3: ([\.,])([^0-9]) -> " \1 \2"   (split . and , unless followed by a digit)
    t = sub_pairs(t, is_period_or_comma, [](char32_t c) { return !is_digit(c); },
                  [](std::u32string& o, char32_t x, char32_t y) { o += U' '; o += x; o += U' '; o += y; });
    // Rule 4: ([0-9])(-) -> "\1 \2 "   (split a dash that follows a digit)
    t = sub_pairs(t, is_digit, [](char32_t c) { return c == U'-'; },
                  [](std::u32string& o, char32_t x, char32_t y) { o += x; o += U' '; o += y; o += U' '; });

    // Finally ' '.join(line.split()): whitespace runs (any Unicode whitespace) become single spaces.
    std::vector<std::string> tokens;
    for (const std::u32string& piece : split_py(t)) {
        std::string tok;
        for (char32_t c : piece) append_utf8(tok, c);
        tokens.push_back(std::move(tok));
    }
    return tokens;
}

// ---------------------------------------------------------------------------------------------------
// Shared input checks. sacreBLEU drops "" references per line and refuses a line that has none left.

constexpr int kMaxOrder = 4;      // BLEU n-gram orders 1..4
constexpr int kCharOrder = 6;     // chrF character n-gram orders 1..6
constexpr int kChrfBeta = 2;      // chrF2: F-beta with beta = 2, recall counts twice as much as precision

// Reference streams by pointer, so the single-reference entry points need not copy their lines.
using RefStreams = std::vector<const std::vector<std::string>*>;

RefStreams point_to(const std::vector<std::vector<std::string>>& ref_streams) {
    RefStreams ptrs;
    for (const auto& stream : ref_streams) ptrs.push_back(&stream);
    return ptrs;
}

// Checks sizes and collects, per line, the non-empty references. Sets nrefs (-1 when it varies).
std::vector<std::vector<const std::string*>> gather_refs(const char* fn, const std::vector<std::string>& hyps,
                                                         const RefStreams& ref_streams, int& nrefs) {
    if (ref_streams.empty())
        throw std::invalid_argument(std::string(fn) + ": needs at least one reference stream, got none");
    for (size_t k = 0; k < ref_streams.size(); ++k) {
        if (ref_streams[k]->size() != hyps.size()) {
            throw std::invalid_argument(
                std::string(fn) + ": " + std::to_string(hyps.size()) + " hypotheses but reference stream " +
                std::to_string(k + 1) + " has " + std::to_string(ref_streams[k]->size()) +
                " lines (one reference per hypothesis expected)");
        }
    }
    std::vector<std::vector<const std::string*>> per_line(hyps.size());
    nrefs = 0;
    for (size_t i = 0; i < hyps.size(); ++i) {
        for (const auto* stream : ref_streams)
            if (!(*stream)[i].empty()) per_line[i].push_back(&(*stream)[i]);
        if (per_line[i].empty()) {
            throw std::invalid_argument(std::string(fn) + ": the reference of line " + std::to_string(i + 1) +
                                        " is empty (sacreBLEU rejects empty references too)");
        }
        const int count = static_cast<int>(per_line[i].size());
        if (i == 0) nrefs = count;
        else if (nrefs != count) nrefs = -1;
    }
    if (hyps.empty()) nrefs = static_cast<int>(ref_streams.size());
    return per_line;
}

void check_single_ref_sizes(const char* fn, const std::vector<std::string>& hyps,
                            const std::vector<std::string>& refs) {
    if (hyps.size() != refs.size()) {
        throw std::invalid_argument(std::string(fn) + ": " + std::to_string(hyps.size()) + " hypotheses but " +
                                    std::to_string(refs.size()) +
                                    " references (one reference per hypothesis expected)");
    }
}

std::string nrefs_str(int nrefs) { return nrefs < 0 ? "var" : std::to_string(nrefs); }

// ---------------------------------------------------------------------------------------------------
// BLEU statistics of one line (sacreBLEU BLEU._extract_reference_info + _compute_segment_statistics).

using NgramCounts = std::unordered_map<std::string, int64_t>;

// All word n-grams of order 1..4, keyed by the tokens joined with ' ' (tokens never contain a space).
NgramCounts word_ngrams(const std::vector<std::string>& tokens) {
    NgramCounts counts;
    const int len = static_cast<int>(tokens.size());
    for (int i = 0; i < len; ++i) {
        std::string key;
        for (int n = 1; n <= kMaxOrder && i + n <= len; ++n) {
            if (n > 1) key += ' ';
            key += tokens[i + n - 1];
            counts[key] += 1;
        }
    }
    return counts;
}

int order_of(const std::string& key) {
    int n = 1;
    for (char c : key) n += (c == ' ');
    return n;
}

// Adds one line's statistics into `s`: sys_len, ref_len, counts, totals.
void add_line_bleu_stats(const std::string& hyp, const std::vector<const std::string*>& refs, BleuScore& s) {
    // Reference side: n-gram counts merged by maximum over references, and each reference's length.
    // Every segment is rstrip()ed before tokenizing, as BLEU._preprocess_segment does.
    NgramCounts ref_ngrams;
    std::vector<int64_t> ref_lens;
    for (const std::string* ref : refs) {
        const std::vector<std::string> tokens = tokens_13a(rstrip_py(*ref));
        ref_lens.push_back(static_cast<int64_t>(tokens.size()));
        for (const auto& [ngram, count] : word_ngrams(tokens)) {
            int64_t& best = ref_ngrams[ngram];
            if (count > best) best = count;
        }
    }

    const std::vector<std::string> hyp_tokens = tokens_13a(rstrip_py(hyp));
    const int64_t hyp_len = static_cast<int64_t>(hyp_tokens.size());

    // Closest reference length (BLEU._get_closest_ref_len): smallest |hyp_len - ref_len|, the shorter
    // reference on a tie.
    int64_t closest_diff = -1, closest_len = -1;
    for (int64_t len : ref_lens) {
        const int64_t diff = len > hyp_len ? len - hyp_len : hyp_len - len;
        if (closest_diff == -1 || diff < closest_diff) { closest_diff = diff; closest_len = len; }
        else if (diff == closest_diff && len < closest_len) { closest_len = len; }
    }
    s.sys_len += hyp_len;
    s.ref_len += closest_len;

    // Clipped matches: count(ngram in hyp) capped by its count in the (merged) reference.
    for (const auto& [ngram, count] : word_ngrams(hyp_tokens)) {
        const int n = order_of(ngram);
        s.totals[n - 1] += count;
        const auto it = ref_ngrams.find(ngram);
        if (it != ref_ngrams.end()) s.counts[n - 1] += std::min(count, it->second);
    }
}

BleuScore bleu_from_lines(const char* fn, const std::vector<std::string>& hyps, const RefStreams& ref_streams) {
    int nrefs = 1;
    const auto refs = gather_refs(fn, hyps, ref_streams, nrefs);
    BleuScore sums;
    for (size_t i = 0; i < hyps.size(); ++i) add_line_bleu_stats(hyps[i], refs[i], sums);
    BleuScore score = bleu_from_stats(sums.counts, sums.totals, sums.sys_len, sums.ref_len);
    score.nrefs = nrefs;
    return score;
}

// ---------------------------------------------------------------------------------------------------
// chrF statistics of one line (sacreBLEU helpers.extract_all_char_ngrams + CHRF._get_match_statistics).

using CharNgramCounts = std::unordered_map<std::u32string, int64_t>;

// Character n-grams of order 1..6 of the line with all whitespace removed (''.join(line.split())).
std::array<CharNgramCounts, kCharOrder> char_ngrams(const std::string& line) {
    std::u32string chars;
    for (char32_t c : decode_utf8(line))
        if (!is_py_space(c)) chars.push_back(c);
    std::array<CharNgramCounts, kCharOrder> counts;
    for (int n = 1; n <= kCharOrder; ++n)
        for (size_t i = 0; i + n <= chars.size(); ++i) counts[n - 1][chars.substr(i, n)] += 1;
    return counts;
}

std::array<ChrfOrderStats, kCharOrder> chrf_line_stats(const std::array<CharNgramCounts, kCharOrder>& hyp,
                                                       const std::array<CharNgramCounts, kCharOrder>& ref) {
    std::array<ChrfOrderStats, kCharOrder> stats{};
    for (int o = 0; o < kCharOrder; ++o) {
        int64_t hyp_count = 0, ref_count = 0, match = 0;
        for (const auto& [ngram, count] : hyp[o]) {
            hyp_count += count;
            const auto it = ref[o].find(ngram);
            if (it != ref[o].end()) match += std::min(count, it->second);
        }
        for (const auto& entry : ref[o]) ref_count += entry.second;
        // sacreBLEU counts the hypothesis n-grams of an order only when the reference has n-grams of
        // that order (a reference shorter than n characters leaves that order out for this line).
        stats[o].hyp = ref[o].empty() ? 0 : hyp_count;
        stats[o].ref = ref_count;
        stats[o].match = match;
    }
    return stats;
}

ChrfScore chrf_from_lines(const char* fn, const std::vector<std::string>& hyps, const RefStreams& ref_streams) {
    int nrefs = 1;
    const auto refs = gather_refs(fn, hyps, ref_streams, nrefs);
    ChrfScore total;
    total.nrefs = nrefs;
    for (size_t i = 0; i < hyps.size(); ++i) {
        const auto hyp_ngrams = char_ngrams(hyps[i]);
        // Several references: keep the statistics of the one with the best sentence chrF (first on a tie).
        std::array<ChrfOrderStats, kCharOrder> best{};
        double best_f = -1.0;
        for (const std::string* ref : refs[i]) {
            const auto stats = chrf_line_stats(hyp_ngrams, char_ngrams(*ref));
            const double f = chrf_from_stats(stats);
            if (f > best_f) { best_f = f; best = stats; }
        }
        for (int o = 0; o < kCharOrder; ++o) {
            total.stats[o].hyp += best[o].hyp;
            total.stats[o].ref += best[o].ref;
            total.stats[o].match += best[o].match;
        }
    }
    total.score = chrf_from_stats(total.stats);
    return total;
}

std::string printf_str(const char* fmt, double a) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), fmt, a);
    return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Public API

std::string tokenize_13a(const std::string& line) {
    std::string out;
    for (const std::string& tok : tokens_13a(line)) {
        if (!out.empty()) out += ' ';
        out += tok;
    }
    return out;
}

// BLEU from summed statistics (sacreBLEU BLEU.compute_bleu, smooth_method='exp', effective_order off):
//
//   BP    = 1                          if c >= r        (c = sys_len, r = ref_len)
//         = exp(1 - r / c)             if 0 < c < r
//         = 0                          if c = 0 < r
//   p_n   = 100 * m_n / t_n            if m_n > 0       (m = clipped matches, t = hypothesis n-grams)
//         = 100 / (2^k * t_n)          if m_n = 0, where k counts the zero-match orders so far (1, 2, ...)
//   BLEU  = BP * exp( (1/4) * sum_{n=1..4} log p_n )
//
// Two guards from sacreBLEU: no match at any order gives BLEU = 0 with all p_n = 0 (issue #141); an order
// with t_n = 0 stops the loop, leaves p_n = 0 for it and the orders above, and log(0) is taken as
// -9999999999, so BLEU = 0. Expressions keep sacreBLEU's evaluation order so the doubles agree bit for bit.
BleuScore bleu_from_stats(const std::array<int64_t, 4>& counts, const std::array<int64_t, 4>& totals,
                          int64_t sys_len, int64_t ref_len) {
    BleuScore s;
    s.counts = counts;
    s.totals = totals;
    s.sys_len = sys_len;
    s.ref_len = ref_len;

    if (sys_len < ref_len)
        s.bp = sys_len > 0 ? std::exp(1.0 - static_cast<double>(ref_len) / static_cast<double>(sys_len)) : 0.0;
    else
        s.bp = 1.0;

    bool any_match = false;
    for (int64_t m : counts) any_match = any_match || m != 0;
    if (!any_match) return s;  // score 0, precisions 0

    double smooth_mteval = 1.0;
    for (int n = 1; n <= kMaxOrder; ++n) {
        const double total = static_cast<double>(totals[n - 1]);
        if (totals[n - 1] == 0) break;
        if (counts[n - 1] == 0) {
            smooth_mteval *= 2.0;
            s.precisions[n - 1] = 100.0 / (smooth_mteval * total);
        } else {
            s.precisions[n - 1] = 100.0 * static_cast<double>(counts[n - 1]) / total;
        }
    }

    double log_sum = 0.0;
    for (double p : s.precisions) log_sum += p > 0.0 ? std::log(p) : -9999999999.0;
    s.score = s.bp * std::exp(log_sum / kMaxOrder);
    return s;
}

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
    check_single_ref_sizes("corpus_bleu", hyps, refs);
    return bleu_from_lines("corpus_bleu", hyps, {&refs});
}

BleuScore corpus_bleu_multi_ref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams) {
    return bleu_from_lines("corpus_bleu_multi_ref", hyps, point_to(ref_streams));
}

double BleuScore::ratio() const {
    return ref_len != 0 ? static_cast<double>(sys_len) / static_cast<double>(ref_len) : 0.0;
}

// sacreBLEU's BLEUScore: score with 2 decimals, precisions with 1, BP and ratio with 3 (printf rounds the
// exact binary value, as Python's format() does).
std::string BleuScore::format() const {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld)", score,
                  precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio(),
                  static_cast<long long>(sys_len), static_cast<long long>(ref_len));
    return buf;
}

std::string BleuScore::signature() const {
    return "nrefs:" + nrefs_str(nrefs) + "|case:mixed|eff:no|tok:13a|smooth:exp|version:" +
           kSacrebleuReimplVersion;
}

// chrF from summed statistics (sacreBLEU CHRF._compute_f_score with eps_smoothing=False, the default):
//
//   over the orders n with hyp_n > 0 and ref_n > 0 (N_eff of them):
//     P = (1/N_eff) * sum_n match_n / hyp_n          R = (1/N_eff) * sum_n match_n / ref_n
//   chrF_beta = 100 * (1 + beta^2) * P * R / (beta^2 * P + R),   beta = 2
//
// Precision and recall are averaged first and one F is taken (not an average of per-order F's);
// N_eff = 0 or P + R = 0 gives 0.
double chrf_from_stats(const std::array<ChrfOrderStats, 6>& stats) {
    const double factor = static_cast<double>(kChrfBeta * kChrfBeta);
    double avg_prec = 0.0, avg_rec = 0.0;
    int effective_order = 0;
    for (const ChrfOrderStats& st : stats) {
        if (st.hyp > 0 && st.ref > 0) {
            avg_prec += static_cast<double>(st.match) / static_cast<double>(st.hyp);
            avg_rec += static_cast<double>(st.match) / static_cast<double>(st.ref);
            effective_order += 1;
        }
    }
    if (effective_order == 0) return 0.0;
    avg_prec /= effective_order;
    avg_rec /= effective_order;
    if (avg_prec + avg_rec == 0.0) return 0.0;
    double score = (1.0 + factor) * avg_prec * avg_rec;
    score /= (factor * avg_prec) + avg_rec;
    return 100.0 * score;
}

ChrfScore corpus_chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
    check_single_ref_sizes("corpus_chrf", hyps, refs);
    return chrf_from_lines("corpus_chrf", hyps, {&refs});
}

ChrfScore corpus_chrf_multi_ref(const std::vector<std::string>& hyps,
                                const std::vector<std::vector<std::string>>& ref_streams) {
    return chrf_from_lines("corpus_chrf_multi_ref", hyps, point_to(ref_streams));
}

std::string ChrfScore::format() const { return "chrF2 = " + printf_str("%.2f", score); }

std::string ChrfScore::signature() const {
    return "nrefs:" + nrefs_str(nrefs) + "|case:mixed|eff:yes|nc:6|nw:0|space:no|version:" +
           kSacrebleuReimplVersion;
}

TF_NAMESPACE_END
