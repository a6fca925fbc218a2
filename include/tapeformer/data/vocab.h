// A word vocabulary: the mapping between token strings ("pieces") and integer ids. The first four ids
// are the same in every vocabulary of tapeformer (and in the SentencePiece models it trains), because the
// model, the loss and the batches rely on them: <pad>=0, <s>=1, </s>=2, <unk>=3; real tokens start at 4.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

constexpr std::int32_t kPadId = 0;        // right padding of every batch row; ignored by the loss
constexpr std::int32_t kBosId = 1;        // first decoder input
constexpr std::int32_t kEosId = 2;        // ends every source row and every target row
constexpr std::int32_t kUnkId = 3;        // any token the vocabulary does not know
constexpr std::int32_t kFirstRealId = 4;  // id of the first ordinary token
extern const char* const kSpecialPieces[kFirstRealId];  // {"<pad>", "<s>", "</s>", "<unk>"}

// Token counts collected from training text, before they become a vocabulary.
using WordCounts = std::unordered_map<std::string, std::int64_t>;

// The words of `text`: maximal runs of non-whitespace bytes (ASCII whitespace separates).
std::vector<std::string_view> split_words(std::string_view text);

// Adds the whitespace-separated words of each sentence to `counts`.
void count_words(const std::vector<std::string_view>& sentences, WordCounts& counts);

class Vocab {
public:
    Vocab();  // only the four special pieces

    // Keeps words seen at least `min_count` times, the most frequent first (ties in byte-wise
    // lexicographic order, so the result does not depend on hash order), at most `max_size` entries in
    // all including the four specials (0 = no limit). Words spelled like a special piece are left out.
    static Vocab build(const WordCounts& counts, std::int64_t min_count, std::int32_t max_size);

    std::int32_t size() const { return static_cast<std::int32_t>(pieces_.size()); }
    std::int32_t id(std::string_view piece) const;   // kUnkId if unknown
    const std::string& piece(std::int32_t id) const; // throws std::out_of_range for a bad id
    bool contains(std::string_view piece) const;

    // Plain text, one piece per line in id order (the four specials first).
    void save(const std::string& path) const;
    // Throws with file and line if the file is unreadable, does not start with the four specials in
    // order, or has an empty, duplicated or whitespace-containing entry.
    static Vocab load(const std::string& path);

private:
    void add(std::string piece);

    std::vector<std::string> pieces_;                      // id -> piece
    std::unordered_map<std::string, std::int32_t> ids_;    // piece -> id
};

TF_NAMESPACE_END
