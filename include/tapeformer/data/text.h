// Reading plain text: a parallel corpus (two UTF-8 files aligned line by line) for training, and a
// single file for translation. Every line is validated (UTF-8) and trimmed; anything wrong with the
// input is reported as a std::runtime_error whose message names the file and, where it applies, the line.
#pragma once
#include <cstdint>
#include <fstream>
#include <istream>
#include <string>
#include <string_view>
#include <utility>
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
    std::vector<std::int64_t> line;  // 1-based line of each pair in the files (empty pairs skipped between)

    std::size_t size() const { return source.size(); }
};

// Pairs two lists of sentences line by line (their sizes must agree: std::invalid_argument otherwise),
// skipping the pairs where either side is empty (counted in stats.empty_skipped) and keeping each pair's
// 1-based line.
ParallelText parallel_text(std::vector<std::string> source, std::vector<std::string> target);

// Reads two files with one sentence per line. Throws if a file cannot be read (path and reason), if the
// line counts differ (both paths and both counts) or if a line is not valid UTF-8 (path and 1-based line).
// Pairs where either side is empty are skipped and counted in stats.empty_skipped.
ParallelText read_parallel(const std::string& source_path, const std::string& target_path);

// Reads a stream one line at a time with the checks of read_lines (a UTF-8 BOM at the start dropped, every
// line valid UTF-8, else std::runtime_error "NAME:LINE: invalid UTF-8 ..."; trimmed, with no \r left inside,
// else "NAME:LINE: a carriage return ...": a file whose lines end with a lone \r would read as one line),
// so that a long input can be processed in pieces without being held whole.
class LineReader {
public:
    LineReader(std::istream& in, std::string name) : in_(in), name_(std::move(name)) {}
    // The next line into `line`; false at the end of the input.
    bool next(std::string& line);
    std::int64_t lines_read() const { return lines_; }

private:
    std::istream& in_;
    std::string name_;
    std::string raw_;
    std::int64_t lines_ = 0;
};

// `path` opened for LineReader; std::runtime_error "cannot read 'PATH': REASON" when it cannot be (missing,
// unreadable, a directory).
std::ifstream open_text_file(const std::string& path);

// Reads one file, one sentence per line, for translation: every line is kept (an empty line stays an
// empty string) so the output can be written line for line. Same checks as read_parallel.
std::vector<std::string> read_lines(const std::string& path);
// The same from an open stream (e.g. std::cin); `name` is what error messages call it.
std::vector<std::string> read_lines(std::istream& in, const std::string& name);

// `s` without leading and trailing ASCII whitespace (space, \t, \n, \v, \f, \r).
std::string_view trim(std::string_view s);

TF_NAMESPACE_END
