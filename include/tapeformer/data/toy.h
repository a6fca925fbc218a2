// The toy translation corpus: English-like sentences paired with an invented target language whose
// word order and morphology differ (verb-final clauses, postpositions, adjectives after the noun,
// gendered articles, agreeing verb endings, numbers spelled out). It is small and regular enough for a
// 2-layer Transformer to learn in minutes on a CPU, yet a model that only copies words cannot score on
// it: attention has to reorder and agree. data/README.md describes the grammar; data/toy/ holds the files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// The most pairs one corpus may hold, all splits together: the generator keeps every sentence in memory
// (about 500 bytes a pair: 2.4 GB at this limit) to keep the splits distinct; far more would end in an
// allocation failure.
constexpr std::int64_t kMaxToyPairs = 5'000'000;

// What to generate. The committed data/toy/ files are exactly write_toy_corpus("data/toy") with these
// defaults, and a test checks that they still are.
struct ToyCorpusOptions {
    std::uint64_t seed = 1;  // the only source of variation: same seed, same bytes, on any machine
    int train = 20000;       // pairs in train.{src,tgt}
    int valid = 1000;        // pairs in valid.{src,tgt}
    int test = 1000;         // pairs in test.{src,tgt}
    int min_words = 3;       // shortest sentence, in whitespace tokens (the final " ." counts), both sides
    int max_words = 20;      // longest sentence, likewise
};

// One sentence and its translation, each a line of whitespace-separated lowercase tokens ending in " .".
struct ToyPair {
    std::string src;
    std::string tgt;
};

struct ToyCorpus {
    std::vector<ToyPair> train, valid, test;
};

// Draws the three splits from one random stream. Every source sentence in the whole corpus is distinct,
// so no valid/test pair also occurs in train and no split repeats a pair. Throws std::invalid_argument
// for impossible options (negative counts, min_words < 3, min_words > max_words) and std::runtime_error
// if that many distinct sentences within the length bounds cannot be found.
ToyCorpus generate_toy_corpus(const ToyCorpusOptions& opt = {});

// Generates the corpus and writes train.src, train.tgt, valid.src, valid.tgt, test.src and test.tgt
// (one sentence per line, '\n' after each) into `out_dir`, creating it if needed. Each file is written
// to `<name>.tmp` and then renamed, so a reader never sees a half-written file. Throws
// std::runtime_error naming the path and the reason if the directory or a file cannot be written.
void write_toy_corpus(const std::string& out_dir, const ToyCorpusOptions& opt = {});

// The reference translation of one source sentence of the toy grammar (tokens separated by single
// spaces, as in the files), e.g. "the big dog sees 3 cats ." -> "lo karo grando mesin tri videt ." Generated
// pairs satisfy translate_toy_sentence(src) == tgt. Throws std::invalid_argument naming the token
// position and what was expected if `src` is not a sentence of the toy grammar.
std::string translate_toy_sentence(const std::string& src);

TF_NAMESPACE_END
