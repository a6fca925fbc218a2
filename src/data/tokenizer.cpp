// Tokenizers: the word tokenizer is a Vocab lookup per whitespace word; the SentencePiece tokenizer wraps
// sentencepiece::SentencePieceProcessor and trains in memory through a SentenceIterator, so no temporary
// files are written and the model bytes go straight into spm.model.
#include "tapeformer/data/tokenizer.h"

#include "tapeformer/io.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <unordered_map>

namespace fs = std::filesystem;

TF_NAMESPACE_BEGIN

std::string to_string(TokenizerKind kind) {
    switch (kind) {
        case TokenizerKind::word: return "word";
        case TokenizerKind::bpe: return "bpe";
        case TokenizerKind::unigram: return "unigram";
    }
    return "?";
}

TokenizerKind parse_tokenizer_kind(const std::string& name) {
    for (TokenizerKind kind : {TokenizerKind::word, TokenizerKind::bpe, TokenizerKind::unigram})
        if (name == to_string(kind)) return kind;
    throw std::invalid_argument("unknown tokenizer '" + name + "' (expected word, bpe or unigram)");
}

namespace {

const char* kWordFile = "vocab.txt";
const char* kSentencePieceFile = "spm.model";

// The ids between the start and the first EOS, without pad and BOS: what a decoder row means as text.
std::vector<std::int32_t> content_ids(const std::vector<std::int32_t>& ids, std::int32_t vocab_size) {
    std::vector<std::int32_t> kept;
    for (std::int32_t id : ids) {
        if (id < 0 || id >= vocab_size)
            throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                    std::to_string(vocab_size) + ")");
        if (id == kEosId) break;
        if (id != kPadId && id != kBosId) kept.push_back(id);
    }
    return kept;
}

std::string read_binary_file(const std::string& path) {
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw std::runtime_error("cannot read '" + path + "': " + (errno ? std::strerror(errno) : "cannot open file"));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw std::runtime_error("cannot read '" + path + "': I/O error");
    return bytes;
}


void make_dir(const std::string& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw std::runtime_error("cannot create directory '" + dir + "': " + ec.message());
}

// Feeds training sentences to the SentencePiece trainer straight from memory.
class ViewIterator : public sentencepiece::SentenceIterator {
public:
    explicit ViewIterator(const std::vector<std::string_view>& sentences) : sentences_(sentences) { load(); }
    bool done() const override { return i_ >= sentences_.size(); }
    void Next() override { ++i_; load(); }
    const std::string& value() const override { return current_; }
    sentencepiece::util::Status status() const override { return {}; }

private:
    void load() {
        if (!done()) current_.assign(sentences_[i_]);
    }
    const std::vector<std::string_view>& sentences_;
    std::size_t i_ = 0;
    std::string current_;
};

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& dir, const std::string& prefix) {
    fs::path word = fs::path(dir) / (prefix + kWordFile);
    fs::path spm = fs::path(dir) / (prefix + kSentencePieceFile);
    bool has_word = fs::exists(word), has_spm = fs::exists(spm);
    if (has_word && has_spm)
        throw std::runtime_error("'" + dir + "' holds both " + prefix + kWordFile + " and " + prefix +
                                 kSentencePieceFile + "; cannot tell which tokenizer to use");
    if (has_spm) return SentencePieceTokenizer::load_file(spm.string());
    if (has_word) return std::make_shared<WordTokenizer>(Vocab::load(word.string()));
    throw std::runtime_error("no tokenizer in '" + dir + "': expected " + prefix + kSentencePieceFile + " or " +
                             prefix + kWordFile);
}

bool Tokenizer::exists(const std::string& dir, const std::string& prefix) {
    return fs::exists(fs::path(dir) / (prefix + kWordFile)) ||
           fs::exists(fs::path(dir) / (prefix + kSentencePieceFile));
}

// ---- WordTokenizer ----

WordTokenizer::WordTokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}

std::shared_ptr<const WordTokenizer> WordTokenizer::train(const std::vector<std::string_view>& sentences,
                                                          const TokenizerOptions& options) {
    WordCounts counts;
    count_words(sentences, counts);
    return std::make_shared<WordTokenizer>(Vocab::build(counts, options.min_count, options.vocab_size));
}

std::vector<std::int32_t> WordTokenizer::encode(std::string_view text) const {
    std::vector<std::int32_t> ids;
    for (std::string_view word : split_words(text)) {
        std::int32_t id = vocab_.id(word);
        ids.push_back(id < kFirstRealId ? kUnkId : id);  // "<pad>" typed in the text is not padding
    }
    return ids;
}

std::vector<std::string> WordTokenizer::pieces(std::string_view text) const {
    std::vector<std::string> out;
    for (std::string_view word : split_words(text)) out.emplace_back(word);
    return out;
}

std::string WordTokenizer::decode(const std::vector<std::int32_t>& ids) const {
    std::string text;
    for (std::int32_t id : content_ids(ids, vocab_size())) {
        if (!text.empty()) text += ' ';
        text += vocab_.piece(id);
    }
    return text;
}

void WordTokenizer::save(const std::string& dir, const std::string& prefix) const {
    make_dir(dir);
    vocab_.save((fs::path(dir) / (prefix + kWordFile)).string());
}

// ---- SentencePieceTokenizer ----

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& serialized_model, const std::string& name)
    : serialized_(serialized_model), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
    sentencepiece::util::Status status;
    try {
        status = sp_->LoadFromSerializedProto(serialized_);
    } catch (const std::exception& e) {
        // SentencePiece reports most problems in its status, but its double-array trie (darts-clone) throws
        // on some malformed models, e.g. a piece "\0" read as an empty key (found by fuzzing, regression
        // tests/fuzz/regressions/sentencepiece/darts_exception_empty_piece.model).
        throw std::runtime_error("cannot load SentencePiece model '" + name + "': " + e.what());
    }
    if (!status.ok())
        throw std::runtime_error("cannot load SentencePiece model '" + name + "': " + status.ToString());
    if (sp_->pad_id() != kPadId || sp_->bos_id() != kBosId || sp_->eos_id() != kEosId || sp_->unk_id() != kUnkId)
        throw std::runtime_error("SentencePiece model '" + name + "' has special ids pad=" +
                                 std::to_string(sp_->pad_id()) + " bos=" + std::to_string(sp_->bos_id()) +
                                 " eos=" + std::to_string(sp_->eos_id()) + " unk=" + std::to_string(sp_->unk_id()) +
                                 "; tapeformer needs pad=0 bos=1 eos=2 unk=3");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::shared_ptr<const SentencePieceTokenizer> SentencePieceTokenizer::train(
    const std::vector<std::string_view>& sentences, const TokenizerOptions& options) {
    if (options.kind == TokenizerKind::word)
        throw std::invalid_argument("SentencePieceTokenizer::train needs kind bpe or unigram, not word");
    std::unordered_map<std::string, std::string> args = {
        {"model_type", to_string(options.kind)},
        {"vocab_size", std::to_string(options.vocab_size)},
        {"pad_id", std::to_string(kPadId)}, {"pad_piece", kSpecialPieces[kPadId]},
        {"bos_id", std::to_string(kBosId)}, {"bos_piece", kSpecialPieces[kBosId]},
        {"eos_id", std::to_string(kEosId)}, {"eos_piece", kSpecialPieces[kEosId]},
        {"unk_id", std::to_string(kUnkId)}, {"unk_piece", kSpecialPieces[kUnkId]},
        {"character_coverage", "1.0"},  // every character of the training text gets a piece
        {"input_sentence_size", std::to_string(options.max_train_sentences)},
        {"shuffle_input_sentence", "true"},  // a seeded random sample when the corpus is larger
        {"num_threads", std::to_string(std::max(1, options.num_threads))},
        {"minloglevel", "2"},  // errors come back in the returned status; no progress log on stderr
    };
    sentencepiece::SetRandomGeneratorSeed(options.seed);
    ViewIterator iterator(sentences);
    std::string model;
    auto status = sentencepiece::SentencePieceTrainer::Train(args, &iterator, &model);
    if (!status.ok())
        throw std::runtime_error("SentencePiece " + to_string(options.kind) + " training (vocab_size " +
                                 std::to_string(options.vocab_size) + ", " + std::to_string(sentences.size()) +
                                 " sentences) failed: " + status.ToString());
    return std::make_shared<SentencePieceTokenizer>(model, "trained in memory");
}

std::shared_ptr<const SentencePieceTokenizer> SentencePieceTokenizer::load_file(const std::string& path) {
    return std::make_shared<SentencePieceTokenizer>(read_binary_file(path), path);
}

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
    std::vector<int> ids;
    auto status = sp_->Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error("SentencePiece encoding failed: " + status.ToString());
    return std::vector<std::int32_t>(ids.begin(), ids.end());
}

std::vector<std::string> SentencePieceTokenizer::pieces(std::string_view text) const {
    std::vector<std::string> out;
    auto status = sp_->Encode(text, &out);
    if (!status.ok()) throw std::runtime_error("SentencePiece encoding failed: " + status.ToString());
    return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
    std::vector<std::int32_t> kept = content_ids(ids, vocab_size());
    std::string text;
    auto status = sp_->Decode(std::vector<int>(kept.begin(), kept.end()), &text);
    if (!status.ok()) throw std::runtime_error("SentencePiece decoding failed: " + status.ToString());
    return text;
}

std::int32_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::int32_t SentencePieceTokenizer::piece_to_id(std::string_view piece) const { return sp_->PieceToId(piece); }

std::string SentencePieceTokenizer::id_to_piece(std::int32_t id) const {
    if (id < 0 || id >= vocab_size())
        throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                std::to_string(vocab_size()) + ")");
    return sp_->IdToPiece(id);
}

void SentencePieceTokenizer::save(const std::string& dir, const std::string& prefix) const {
    make_dir(dir);
    write_file_atomic((fs::path(dir) / (prefix + kSentencePieceFile)).string(), serialized_);
}

// ---- TokenizerPair ----

namespace {

std::shared_ptr<const Tokenizer> train_one(const std::vector<std::string_view>& sentences,
                                           const TokenizerOptions& options) {
    if (options.kind == TokenizerKind::word) return WordTokenizer::train(sentences, options);
    return SentencePieceTokenizer::train(sentences, options);
}

std::vector<std::string_view> views(const std::vector<std::string>& sentences) {
    return std::vector<std::string_view>(sentences.begin(), sentences.end());
}

const char* kSourcePrefix = "src.";
const char* kTargetPrefix = "tgt.";

}  // namespace

TokenizerPair TokenizerPair::train(const std::vector<std::string>& source_sentences,
                                   const std::vector<std::string>& target_sentences,
                                   const TokenizerOptions& options) {
    TokenizerPair pair;
    if (options.joint) {
        std::vector<std::string_view> both = views(source_sentences);
        both.insert(both.end(), target_sentences.begin(), target_sentences.end());
        pair.source = pair.target = train_one(both, options);
    } else {
        pair.source = train_one(views(source_sentences), options);
        pair.target = train_one(views(target_sentences), options);
    }
    return pair;
}

void TokenizerPair::save(const std::string& dir) const {
    // Remove files of the other layout first, so that load() cannot pick up a stale tokenizer.
    for (const char* prefix : {"", kSourcePrefix, kTargetPrefix})
        for (const char* file : {kWordFile, kSentencePieceFile}) {
            std::error_code ec;
            fs::remove(fs::path(dir) / (std::string(prefix) + file), ec);
        }
    if (joint()) {
        source->save(dir);
    } else {
        source->save(dir, kSourcePrefix);
        target->save(dir, kTargetPrefix);
    }
}

TokenizerPair TokenizerPair::load(const std::string& dir) {
    TokenizerPair pair;
    if (Tokenizer::exists(dir)) {
        pair.source = pair.target = Tokenizer::load(dir);
    } else if (Tokenizer::exists(dir, kSourcePrefix) && Tokenizer::exists(dir, kTargetPrefix)) {
        pair.source = Tokenizer::load(dir, kSourcePrefix);
        pair.target = Tokenizer::load(dir, kTargetPrefix);
    } else {
        throw std::runtime_error("no tokenizer in '" + dir + "': expected " + kSentencePieceFile + " or " +
                                 kWordFile + " (joint vocabulary), or src./tgt. versions of them (separate)");
    }
    return pair;
}

TF_NAMESPACE_END
