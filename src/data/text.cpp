// Reading text files: getline, strip "\r" and surrounding whitespace, check UTF-8 (data/utf8.h).
#include "tapeformer/data/text.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

TF_NAMESPACE_BEGIN

std::string CorpusStats::summary() const {
    return "kept " + std::to_string(kept()) + " of " + std::to_string(pairs_read) + " pairs (skipped " +
           std::to_string(empty_skipped) + " empty pairs, filtered " + std::to_string(too_long) +
           " over-long pairs)";
}

std::string_view trim(std::string_view s) {
    const char* space = " \t\n\v\f\r";
    std::size_t first = s.find_first_not_of(space);
    if (first == std::string_view::npos) return {};
    std::size_t last = s.find_last_not_of(space);
    return s.substr(first, last - first + 1);
}

namespace {

std::runtime_error read_error(const std::string& path, const std::string& reason) {
    return std::runtime_error("cannot read '" + path + "': " + reason);
}

}  // namespace

bool LineReader::next(std::string& line) {
    if (!std::getline(in_, raw_)) {
        if (in_.bad()) throw read_error(name_, "I/O error after line " + std::to_string(lines_));
        return false;
    }
    std::string_view view = raw_;
    if (lines_ == 0 && view.substr(0, 3) == "\xEF\xBB\xBF") view.remove_prefix(3);
    const std::size_t bad = find_invalid_utf8(view);
    if (bad != std::string_view::npos) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(view[bad]));
        throw std::runtime_error(name_ + ":" + std::to_string(lines_ + 1) + ": invalid UTF-8 (byte " + hex +
                                 " at column " + std::to_string(bad + 1) + ")");
    }
    view = trim(view);
    // A carriage return left inside the line: the file ends its lines with a lone \r (classic Mac OS), and
    // the whole file would read as one line. Refused rather than read as one sentence.
    const std::size_t cr = view.find('\r');
    if (cr != std::string_view::npos)
        throw std::runtime_error(name_ + ":" + std::to_string(lines_ + 1) + ": a carriage return (\\r) inside the line at " +
                                 "column " + std::to_string(view.data() - raw_.data() + cr + 1) + ": lines must end with \\n or \\r\\n, not \\r alone "
                                 "(convert with: tr '\\r' '\\n')");
    line = view;
    ++lines_;
    return true;
}

std::ifstream open_text_file(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw read_error(path, std::strerror(EISDIR));
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in) throw read_error(path, errno ? std::strerror(errno) : "cannot open file");
    return in;
}

namespace {

std::vector<std::string> read_all_lines(std::istream& in, const std::string& name) {
    std::vector<std::string> lines;
    LineReader reader(in, name);
    std::string line;
    while (reader.next(line)) lines.push_back(std::move(line));
    return lines;
}

std::vector<std::string> read_file_lines(const std::string& path) {
    std::ifstream in = open_text_file(path);
    return read_all_lines(in, path);
}

}  // namespace

std::vector<std::string> read_lines(std::istream& in, const std::string& name) {
    return read_all_lines(in, name);
}

std::vector<std::string> read_lines(const std::string& path) { return read_file_lines(path); }

ParallelText read_parallel(const std::string& source_path, const std::string& target_path) {
    std::vector<std::string> src = read_file_lines(source_path);
    std::vector<std::string> tgt = read_file_lines(target_path);
    if (src.size() != tgt.size())
        throw std::runtime_error("parallel corpus is not aligned: '" + source_path + "' has " +
                                 std::to_string(src.size()) + " lines but '" + target_path + "' has " +
                                 std::to_string(tgt.size()));
    return parallel_text(std::move(src), std::move(tgt));
}

ParallelText parallel_text(std::vector<std::string> src, std::vector<std::string> tgt) {
    if (src.size() != tgt.size())
        throw std::invalid_argument("the source has " + std::to_string(src.size()) + " sentences and the target " +
                                    std::to_string(tgt.size()) + ": they must pair line by line");
    ParallelText text;
    text.stats.pairs_read = static_cast<std::int64_t>(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
        if (src[i].empty() || tgt[i].empty()) {
            ++text.stats.empty_skipped;
            continue;
        }
        text.source.push_back(std::move(src[i]));
        text.target.push_back(std::move(tgt[i]));
        text.line.push_back(std::int64_t(i) + 1);
    }
    return text;
}

TF_NAMESPACE_END
