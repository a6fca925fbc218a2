// Tokenizers: the word tokenizer, SentencePiece BPE and unigram models trained on a small generated
// corpus, joint and separate vocabularies, and saving / loading them from a model directory.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "tapeformer/data/tokenizer.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

// `n` sentences of 3..10 words drawn from `words` by a fixed linear congruential generator.
std::vector<std::string> synthetic_corpus(const std::vector<std::string>& words, int n, std::uint32_t seed) {
    std::vector<std::string> lines;
    std::uint32_t x = seed;
    auto next = [&] { return (x = x * 1664525u + 1013904223u) >> 8; };
    for (int i = 0; i < n; ++i) {
        std::string line;
        int len = 3 + static_cast<int>(next() % 8);
        for (int k = 0; k < len; ++k) line += (k ? " " : "") + words[next() % words.size()];
        lines.push_back(line);
    }
    return lines;
}

const std::vector<std::string> kEnglish = {"the", "house", "is", "small", "a", "dog", "runs", "in", "garden",
                                           "children", "are", "playing", "with", "ball", "street", "man",
                                           "woman", "sitting", "on", "bench", "red", "blue", "water", "near"};
const std::vector<std::string> kGerman = {"das", "haus", "ist", "klein", "ein", "hund", "läuft", "im", "garten",
                                          "kinder", "spielen", "mit", "ball", "straße", "mann", "frau", "sitzt",
                                          "auf", "der", "bank", "rot", "blau", "wasser", "nahe"};

std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("tokenizer kinds parse from and print to their names", "[tokenizer]") {
    CHECK(tf::parse_tokenizer_kind("word") == tf::TokenizerKind::word);
    CHECK(tf::parse_tokenizer_kind("bpe") == tf::TokenizerKind::bpe);
    CHECK(tf::to_string(tf::TokenizerKind::unigram) == "unigram");
    CHECK_THROWS_WITH(tf::parse_tokenizer_kind("char"), Catch::Contains("'char'") && Catch::Contains("unigram"));
}

TEST_CASE("WordTokenizer encodes known words, maps the rest to <unk>, and decodes up to EOS", "[tokenizer]") {
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    auto tok = tf::WordTokenizer::train({"the dog runs", "the dog", "a cat"}, options);
    CHECK(tok->vocab_size() == 9);  // 4 specials + dog the a cat runs
    CHECK(tok->id_to_piece(4) == "dog");  // count 2, then "the" (count 2, after "dog" in byte order)
    CHECK(tok->id_to_piece(5) == "the");
    std::vector<std::int32_t> ids = tok->encode("  the zebra\truns ");
    CHECK(ids == std::vector<std::int32_t>{5, tf::kUnkId, tok->piece_to_id("runs")});
    CHECK(tok->pieces("the  zebra") == std::vector<std::string>{"the", "zebra"});
    // Text never yields pad or BOS, even where it spells them.
    CHECK(tok->encode("<pad> <s>") == std::vector<std::int32_t>{tf::kUnkId, tf::kUnkId});
    CHECK(tok->decode(ids) == "the <unk> runs");
    CHECK(tok->decode({tf::kBosId, 5, 4, tf::kEosId, 6, 7}) == "the dog");
    CHECK(tok->decode({5, tf::kPadId, 4, tf::kPadId}) == "the dog");
    CHECK(tok->decode({}).empty());
    CHECK_THROWS_AS(tok->decode({5, 99}), std::out_of_range);
    CHECK(tok->encode("").empty());
}

TEST_CASE("joint word vocabularies cover both languages, separate ones only their own", "[tokenizer]") {
    std::vector<std::string> de = {"das haus", "ein hund"}, en = {"the house", "a dog"};
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    tf::TokenizerPair joint = tf::TokenizerPair::train(de, en, options);
    CHECK(joint.joint());
    CHECK(joint.source->vocab_size() == 4 + 8);
    CHECK(joint.source->piece_to_id("house") != tf::kUnkId);
    CHECK(joint.target->piece_to_id("haus") != tf::kUnkId);

    options.joint = false;
    tf::TokenizerPair separate = tf::TokenizerPair::train(de, en, options);
    CHECK_FALSE(separate.joint());
    CHECK(separate.source->vocab_size() == 8);
    CHECK(separate.target->vocab_size() == 8);
    CHECK(separate.source->piece_to_id("house") == tf::kUnkId);
    CHECK(separate.target->piece_to_id("house") != tf::kUnkId);
}

TEST_CASE("TokenizerPair saves and loads joint and separate word vocabularies", "[tokenizer]") {
    TempDir dir;
    std::vector<std::string> de = {"das haus ist klein", "ein hund"}, en = {"the house is small", "a dog"};
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    tf::TokenizerPair joint = tf::TokenizerPair::train(de, en, options);
    joint.save(dir.str());
    CHECK(fs::exists(dir.path / "vocab.txt"));
    tf::TokenizerPair back = tf::TokenizerPair::load(dir.str());
    CHECK(back.joint());
    CHECK(back.source->kind() == "word");
    CHECK(back.source->encode("das house ist") == joint.source->encode("das house ist"));

    options.joint = false;
    tf::TokenizerPair separate = tf::TokenizerPair::train(de, en, options);
    separate.save(dir.str());  // replaces the joint vocabulary
    CHECK_FALSE(fs::exists(dir.path / "vocab.txt"));
    CHECK(fs::exists(dir.path / "src.vocab.txt"));
    CHECK(fs::exists(dir.path / "tgt.vocab.txt"));
    tf::TokenizerPair back2 = tf::TokenizerPair::load(dir.str());
    CHECK_FALSE(back2.joint());
    CHECK(back2.source->encode("das haus house") == separate.source->encode("das haus house"));
    CHECK(back2.target->encode("das haus house") == separate.target->encode("das haus house"));

    TempDir empty;
    CHECK_THROWS_WITH(tf::TokenizerPair::load(empty.str()),
                      Catch::Contains(empty.str()) && Catch::Contains("spm.model") && Catch::Contains("vocab.txt"));
}

TEST_CASE("SentencePiece BPE trains in memory with tapeformer's special ids and round-trips text", "[tokenizer]") {
    std::vector<std::string> en = synthetic_corpus(kEnglish, 300, 7), de = synthetic_corpus(kGerman, 300, 11);
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::bpe;
    options.vocab_size = 120;
    options.num_threads = 2;
    tf::TokenizerPair pair = tf::TokenizerPair::train(de, en, options);
    REQUIRE(pair.joint());
    const tf::Tokenizer& tok = *pair.source;
    CHECK(tok.kind() == "sentencepiece");
    CHECK(tok.vocab_size() == 120);
    CHECK(tok.id_to_piece(tf::kPadId) == "<pad>");
    CHECK(tok.id_to_piece(tf::kBosId) == "<s>");
    CHECK(tok.id_to_piece(tf::kEosId) == "</s>");
    CHECK(tok.id_to_piece(tf::kUnkId) == "<unk>");
    CHECK(tok.piece_to_id("<unk>") == tf::kUnkId);

    for (int i = 0; i < 20; ++i) {
        for (const std::string& s : {en[i], de[i]}) {
            std::vector<std::int32_t> ids = tok.encode(s);
            REQUIRE_FALSE(ids.empty());
            for (std::int32_t id : ids) CHECK(id >= tf::kUnkId + 1);  // no specials from known text
            CHECK(tok.decode(ids) == s);
            std::vector<std::int32_t> framed = {tf::kBosId};
            framed.insert(framed.end(), ids.begin(), ids.end());
            framed.insert(framed.end(), {tf::kEosId, 17, tf::kPadId});
            CHECK(tok.decode(framed) == s);  // BOS skipped, everything after EOS ignored
        }
    }
    std::vector<std::string> pieces = tok.pieces("the house");
    REQUIRE_FALSE(pieces.empty());
    CHECK(pieces[0].rfind("\xE2\x96\x81", 0) == 0);  // starts with "▁", SentencePiece's word-start mark
    CHECK(tok.encode("the #") .back() == tf::kUnkId);  // '#' never occurs in training text

    // The same data and seed give the same model, byte for byte.
    tf::TokenizerPair again = tf::TokenizerPair::train(de, en, options);
    CHECK(dynamic_cast<const tf::SentencePieceTokenizer&>(*again.source).serialized_model() ==
          dynamic_cast<const tf::SentencePieceTokenizer&>(tok).serialized_model());

    TempDir dir;
    pair.save(dir.str());
    CHECK(fs::exists(dir.path / "spm.model"));
    tf::TokenizerPair back = tf::TokenizerPair::load(dir.str());
    CHECK(back.joint());
    CHECK(back.source->kind() == "sentencepiece");
    CHECK(back.source->encode(en[3]) == tok.encode(en[3]));
}

TEST_CASE("separate SentencePiece unigram models for source and target", "[tokenizer]") {
    std::vector<std::string> en = synthetic_corpus(kEnglish, 300, 3), de = synthetic_corpus(kGerman, 300, 5);
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::unigram;
    options.vocab_size = 48;
    options.joint = false;
    tf::TokenizerPair pair = tf::TokenizerPair::train(de, en, options);
    REQUIRE_FALSE(pair.joint());
    CHECK(pair.source->vocab_size() == 48);
    CHECK(pair.target->vocab_size() == 48);
    CHECK(pair.source->decode(pair.source->encode(de[0])) == de[0]);
    CHECK(pair.target->decode(pair.target->encode(en[0])) == en[0]);
    CHECK(pair.target->encode("ß").back() == tf::kUnkId);  // German-only letter, unknown to the English model

    TempDir dir;
    pair.save(dir.str());
    CHECK(fs::exists(dir.path / "src.spm.model"));
    CHECK(fs::exists(dir.path / "tgt.spm.model"));
    tf::TokenizerPair back = tf::TokenizerPair::load(dir.str());
    CHECK_FALSE(back.joint());
    CHECK(back.source->encode(de[1]) == pair.source->encode(de[1]));
    CHECK(back.target->encode(en[1]) == pair.target->encode(en[1]));
}

TEST_CASE("SentencePiece errors are readable", "[tokenizer]") {
    std::vector<std::string> en = synthetic_corpus(kEnglish, 50, 1);
    tf::TokenizerOptions options;
    options.vocab_size = 5000;
    CHECK_THROWS_WITH(tf::SentencePieceTokenizer::train(views(en), options),
                      Catch::Contains("vocab_size 5000") && Catch::Contains("too high"));

    TempDir dir;
    std::string bogus = (dir.path / "spm.model").string();
    std::ofstream(bogus) << "not a model";
    CHECK_THROWS_WITH(tf::Tokenizer::load(dir.str()), Catch::Contains(bogus));
}
