// Vocabulary: count words, sort by (count desc, word asc), keep the head; save and load as one piece per line.
#include "tapeformer/data/vocab.h"

#include "tapeformer/data/text.h"
#include "tapeformer/io.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

TF_NAMESPACE_BEGIN

const char* const kSpecialPieces[kFirstRealId] = {"<pad>", "<s>", "</s>", "<unk>"};

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

bool is_special(std::string_view piece) {
    for (const char* special : kSpecialPieces)
        if (piece == special) return true;
    return false;
}

}  // namespace

std::vector<std::string_view> split_words(std::string_view text) {
    std::vector<std::string_view> words;
    std::size_t i = 0, n = text.size();
    while (i < n) {
        while (i < n && is_space(text[i])) ++i;
        std::size_t start = i;
        while (i < n && !is_space(text[i])) ++i;
        if (i > start) words.push_back(text.substr(start, i - start));
    }
    return words;
}

void count_words(const std::vector<std::string_view>& sentences, WordCounts& counts) {
    for (std::string_view sentence : sentences)
        for (std::string_view word : split_words(sentence)) ++counts[std::string(word)];
}

Vocab::Vocab() {
    for (const char* special : kSpecialPieces) add(special);
}

void Vocab::add(std::string piece) {
    ids_.emplace(piece, size());
    pieces_.push_back(std::move(piece));
}

Vocab Vocab::build(const WordCounts& counts, std::int64_t min_count, std::int32_t max_size) {
    if (max_size != 0 && max_size <= kFirstRealId)
        throw std::invalid_argument("vocabulary size must be 0 (no limit) or more than " +
                                    std::to_string(kFirstRealId) + " (the special pieces), got " +
                                    std::to_string(max_size));
    std::vector<std::pair<std::string_view, std::int64_t>> words;
    for (const auto& [word, count] : counts)
        if (count >= min_count && !is_special(word)) words.emplace_back(word, count);
    std::sort(words.begin(), words.end(), [](const auto& a, const auto& b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    Vocab vocab;
    std::size_t room = max_size ? static_cast<std::size_t>(max_size - kFirstRealId) : words.size();
    for (std::size_t i = 0; i < std::min(room, words.size()); ++i) vocab.add(std::string(words[i].first));
    return vocab;
}

std::int32_t Vocab::id(std::string_view piece) const {
    auto it = ids_.find(std::string(piece));
    return it == ids_.end() ? kUnkId : it->second;
}

const std::string& Vocab::piece(std::int32_t id) const {
    if (id < 0 || id >= size())
        throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                std::to_string(size()) + ")");
    return pieces_[static_cast<std::size_t>(id)];
}

bool Vocab::contains(std::string_view piece) const { return ids_.count(std::string(piece)) > 0; }

void Vocab::save(const std::string& path) const {
    std::string text;
    for (const std::string& piece : pieces_) text += piece + '\n';
    write_file_atomic(path, text);  // a kill mid-write leaves the old file or the new one, never half of one
}

Vocab Vocab::load(const std::string& path) {
    std::ifstream in = open_text_file(path);  // a directory is named as one, not read as an I/O error
    Vocab vocab;
    std::string line;
    std::int32_t line_no = 0;
    while (std::getline(in, line)) {
        ++line_no;
        auto fail = [&](const std::string& what) {
            return std::runtime_error(path + ":" + std::to_string(line_no) + ": " + what);
        };
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line_no <= kFirstRealId) {
            if (line != kSpecialPieces[line_no - 1])
                throw fail("expected the special piece '" + std::string(kSpecialPieces[line_no - 1]) +
                           "' (a vocabulary starts with <pad>, <s>, </s>, <unk>), found '" + line + "'");
            continue;
        }
        if (line.empty()) throw fail("empty vocabulary entry");
        if (split_words(line).size() != 1 || split_words(line)[0].size() != line.size())
            throw fail("vocabulary entry '" + line + "' contains whitespace");
        if (vocab.contains(line)) throw fail("duplicate vocabulary entry '" + line + "'");
        vocab.add(line);
    }
    if (in.bad()) throw std::runtime_error("cannot read '" + path + "': I/O error");
    if (line_no < kFirstRealId)
        throw std::runtime_error(path + ": vocabulary has " + std::to_string(line_no) +
                                 " lines, fewer than the four special pieces");
    return vocab;
}

TF_NAMESPACE_END
