// Reading plain text: a parallel corpus (two UTF-8 files aligned line by line) for training, and a
// single file for translation. Every line is validated (UTF-8) and trimmed; anything wrong with the
// input is reported as a std::runtime_error whose message names the file and, where it applies, the line.
#pragma once
#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/config.h"
#include "tapeformer/data/utf8.h"  // find_invalid_utf8

TF_NAMESPACE_BEGIN

// What happened to the pairs of a corpus on their way to training examples. read_parallel fills the first
// two counts; encode_parallel (batch.h), which knows token counts, fills `too_long`.
struct CorpusStats {
    std::int64_t pairs_read = 0;     // line pairs in the two files
    std::int64_t empty_skipped = 0;  // pairs dropped because one side (or both) was empty after trimming
    std::int64_t too_long = 0;       // pairs dropped because a side had more than max_len tokens

    std::int64_t kept() const { return pairs_read - empty_skipped - too_long; }
    // "kept 985 of 1000 pairs (skipped 3 empty pairs, filtered 12 over-long pairs)"
    std::string summary() const;
};

// Aligned sentence pairs: source[i] translates to target[i]. Both sides are trimmed and non-empty.
struct ParallelText {
    std::vector<std::string> source;
    std::vector<std::string> target;
    CorpusStats stats;

    std::size_t size() const { return source.size(); }
};

// Reads two files with one sentence per line. Throws if a file cannot be read (path and reason), if the
// line counts differ (both paths and both counts) or if a line is not valid UTF-8 (path and 1-based line).
// Pairs where either side is empty are skipped and counted in stats.empty_skipped.
ParallelText read_parallel(const std::string& source_path, const std::string& target_path);

// Reads one file, one sentence per line, for translation: every line is kept (an empty line stays an
// empty string) so the output can be written line for line. Same checks as read_parallel.
std::vector<std::string> read_lines(const std::string& path);
// The same from an open stream (e.g. std::cin); `name` is what error messages call it.
std::vector<std::string> read_lines(std::istream& in, const std::string& name);

// `s` without leading and trailing ASCII whitespace (space, \t, \n, \v, \f, \r).
std::string_view trim(std::string_view s);

TF_NAMESPACE_END
