// Tokenizers turn a sentence into token ids and back. Two kinds share one interface: a word tokenizer
// (split at whitespace, look words up in a Vocab) and a SentencePiece model (BPE or unigram subwords).
// Both use the special ids of vocab.h, so the rest of tapeformer never asks which kind it has.
// A TokenizerPair holds the source and target tokenizers of a model (one shared object when joint).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/config.h"
#include "tapeformer/data/vocab.h"

namespace sentencepiece { class SentencePieceProcessor; }

TF_NAMESPACE_BEGIN

enum class TokenizerKind { word, bpe, unigram };
std::string to_string(TokenizerKind kind);                // "word", "bpe", "unigram"
TokenizerKind parse_tokenizer_kind(const std::string& name);  // throws, listing the valid names

// How to build tokenizers from training text.
struct TokenizerOptions {
    TokenizerKind kind = TokenizerKind::bpe;  // word: whitespace words; bpe / unigram: SentencePiece
    bool joint = true;              // one vocabulary for both languages (required to tie all embeddings)
    std::int32_t vocab_size = 8000; // SentencePiece: exact size; word: upper bound, 0 = no limit (both
                                    // count the four special pieces)
    std::int64_t min_count = 1;     // word: words seen fewer times are left out (become <unk>)
    int num_threads = 1;            // SentencePiece trainer threads
    std::int64_t max_train_sentences = 2000000;  // SentencePiece: sentences sampled (with `seed`) for training
    std::uint32_t seed = 1;         // SentencePiece: sampling seed, so training is repeatable
};

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    virtual std::string kind() const = 0;  // "word" or "sentencepiece"
    // Token ids of `text`, without BOS or EOS; unknown tokens become kUnkId.
    virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
    // The same tokenization as strings (for inspection; SentencePiece marks word starts with "▁").
    virtual std::vector<std::string> pieces(std::string_view text) const = 0;
    // Detokenized text of `ids`: reading stops at the first EOS, pad and BOS are skipped; <unk> comes out
    // as "<unk>" (word) or " ⁇ " (SentencePiece). Throws std::out_of_range for an id outside the vocabulary.
    virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;

    virtual std::int32_t vocab_size() const = 0;
    virtual std::int32_t piece_to_id(std::string_view piece) const = 0;  // kUnkId if unknown
    virtual std::string id_to_piece(std::int32_t id) const = 0;          // throws std::out_of_range

    // Writes the tokenizer into directory `dir` (created if needed) as `<prefix>vocab.txt` (word) or
    // `<prefix>spm.model` (SentencePiece).
    virtual void save(const std::string& dir, const std::string& prefix = "") const = 0;
    // Reads what save wrote, choosing the kind by which of the two files exists.
    static std::shared_ptr<const Tokenizer> load(const std::string& dir, const std::string& prefix = "");
    // True if `dir` holds a tokenizer saved with `prefix`.
    static bool exists(const std::string& dir, const std::string& prefix = "");
};

class WordTokenizer : public Tokenizer {
public:
    explicit WordTokenizer(Vocab vocab);
    // A vocabulary of the words in `sentences` (options.min_count, options.vocab_size; see Vocab::build).
    static std::shared_ptr<const WordTokenizer> train(const std::vector<std::string_view>& sentences,
                                                      const TokenizerOptions& options);

    std::string kind() const override { return "word"; }
    std::vector<std::int32_t> encode(std::string_view text) const override;
    std::vector<std::string> pieces(std::string_view text) const override;
    std::string decode(const std::vector<std::int32_t>& ids) const override;  // words joined by one space
    std::int32_t vocab_size() const override { return vocab_.size(); }
    std::int32_t piece_to_id(std::string_view piece) const override { return vocab_.id(piece); }
    std::string id_to_piece(std::int32_t id) const override { return vocab_.piece(id); }
    void save(const std::string& dir, const std::string& prefix = "") const override;

    const Vocab& vocab() const { return vocab_; }

private:
    Vocab vocab_;
};

class SentencePieceTokenizer : public Tokenizer {
public:
    // Loads a serialized SentencePiece model; throws unless its special ids are those of vocab.h.
    // `name` is what error messages call the model (usually its file).
    SentencePieceTokenizer(const std::string& serialized_model, const std::string& name);
    ~SentencePieceTokenizer() override;
    // Trains a BPE or unigram model (options.kind) of exactly options.vocab_size pieces on `sentences`,
    // in memory, with character coverage 1.0 and the special pieces <pad> <s> </s> <unk> at ids 0..3.
    static std::shared_ptr<const SentencePieceTokenizer> train(const std::vector<std::string_view>& sentences,
                                                               const TokenizerOptions& options);
    static std::shared_ptr<const SentencePieceTokenizer> load_file(const std::string& path);

    std::string kind() const override { return "sentencepiece"; }
    std::vector<std::int32_t> encode(std::string_view text) const override;
    std::vector<std::string> pieces(std::string_view text) const override;
    std::string decode(const std::vector<std::int32_t>& ids) const override;
    std::int32_t vocab_size() const override;
    std::int32_t piece_to_id(std::string_view piece) const override;
    std::string id_to_piece(std::int32_t id) const override;
    void save(const std::string& dir, const std::string& prefix = "") const override;

    const std::string& serialized_model() const { return serialized_; }

private:
    std::string serialized_;  // the model file's bytes, written as is by save
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// The two tokenizers of a translation model. When joint, `source` and `target` are the same object and
// one file is saved (`vocab.txt` or `spm.model`); otherwise two (`src.` and `tgt.` prefixes).
struct TokenizerPair {
    std::shared_ptr<const Tokenizer> source;
    std::shared_ptr<const Tokenizer> target;

    bool joint() const { return source == target; }
    // Trains on the training text: one tokenizer on both sides if options.joint, else one per side.
    static TokenizerPair train(const std::vector<std::string>& source_sentences,
                               const std::vector<std::string>& target_sentences,
                               const TokenizerOptions& options);
    void save(const std::string& dir) const;
    // Throws, naming the directory and the files it looked for, if neither layout is there.
    static TokenizerPair load(const std::string& dir);
};

TF_NAMESPACE_END
