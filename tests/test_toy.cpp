// Tests of the toy corpus generator: the committed data/toy files are reproduced byte for byte, the
// splits are aligned, bounded and disjoint, every pair is the parser's translation of its source, and a
// few constructions (agreement, reordering, numbers) are checked against translations worked out by hand.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "tapeformer/data/toy.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

std::vector<std::string> words_of(const std::string& line) {
    std::vector<std::string> words;
    std::istringstream in(line);
    for (std::string w; in >> w;) words.push_back(w);
    return words;
}

const char* const kFiles[] = {"train.src", "train.tgt", "valid.src", "valid.tgt", "test.src", "test.tgt"};

}  // namespace

TEST_CASE("toy corpus: the committed data/toy files are what write_toy_corpus writes with the defaults", "[toy]") {
    TempDir tmp;
    tf::write_toy_corpus((tmp.path / "toy").string());
    const fs::path committed = fs::path(TF_SOURCE_DIR) / "data" / "toy";
    for (const char* name : kFiles) {
        INFO(name);
        const std::string generated = read_all((tmp.path / "toy" / name).string());
        CHECK(generated == read_all((committed / name).string()));
        CHECK(!fs::exists(tmp.path / "toy" / (std::string(name) + ".tmp")));  // renamed into place
    }
}

TEST_CASE("toy corpus: files are aligned, the right size and end every line with a newline", "[toy]") {
    const fs::path dir = fs::path(TF_SOURCE_DIR) / "data" / "toy";
    const std::map<std::string, std::size_t> expected = {{"train", 20000}, {"valid", 1000}, {"test", 1000}};
    for (const auto& [split, count] : expected) {
        INFO(split);
        const std::string src = read_all((dir / (split + ".src")).string()), tgt = read_all((dir / (split + ".tgt")).string());
        REQUIRE(!src.empty());
        CHECK(src.back() == '\n');
        CHECK(tgt.back() == '\n');
        CHECK(split_lines(src).size() == count);
        CHECK(split_lines(tgt).size() == count);
    }
}

TEST_CASE("toy corpus: lengths within bounds, splits disjoint, no duplicates, plain lowercase ASCII", "[toy]") {
    const tf::ToyCorpus corpus = tf::generate_toy_corpus();
    REQUIRE(corpus.train.size() == 20000);
    REQUIRE(corpus.valid.size() == 1000);
    REQUIRE(corpus.test.size() == 1000);
    std::set<std::string> train_src, train_pairs;
    for (const tf::ToyPair& p : corpus.train) {
        train_src.insert(p.src);
        train_pairs.insert(p.src + '\t' + p.tgt);
    }
    CHECK(train_src.size() == corpus.train.size());  // (duplicates in train are not required but absent)
    std::set<std::string> held_out;
    for (const auto* split : {&corpus.valid, &corpus.test})
        for (const tf::ToyPair& p : *split) {
            CHECK(train_pairs.count(p.src + '\t' + p.tgt) == 0);
            CHECK(train_src.count(p.src) == 0);
            CHECK(held_out.insert(p.src).second);  // no duplicate inside or across valid and test
        }
    double total_words = 0;
    for (const auto* split : {&corpus.train, &corpus.valid, &corpus.test})
        for (const tf::ToyPair& p : *split)
            for (const std::string* line : {&p.src, &p.tgt}) {
                const auto words = words_of(*line);
                INFO(*line);
                CHECK(words.size() >= 3);
                CHECK(words.size() <= 20);
                CHECK(words.back() == ".");
                CHECK(line->find("  ") == std::string::npos);
                bool plain = true;
                for (char ch : *line)
                    plain = plain && ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == ' ' || ch == '.');
                CHECK(plain);
                total_words += double(words.size());
            }
    const double mean = total_words / (2.0 * 22000);
    CHECK(mean > 9.0);
    CHECK(mean < 11.0);
}

TEST_CASE("toy corpus: every pair is the reference translation of its source", "[toy]") {
    const tf::ToyCorpus corpus = tf::generate_toy_corpus();
    int mismatches = 0;
    for (const auto* split : {&corpus.train, &corpus.valid, &corpus.test})
        for (const tf::ToyPair& p : *split)
            if (tf::translate_toy_sentence(p.src) != p.tgt && ++mismatches <= 5) {
                INFO(p.src << " -> " << p.tgt);
                CHECK(tf::translate_toy_sentence(p.src) == p.tgt);
            }
    CHECK(mismatches == 0);
}

TEST_CASE("toy corpus: every held-out word is seen often in train (learnability)", "[toy]") {
    const tf::ToyCorpus corpus = tf::generate_toy_corpus();
    std::map<std::string, int> src_counts, tgt_counts;
    for (const tf::ToyPair& p : corpus.train) {
        for (const auto& w : words_of(p.src)) ++src_counts[w];
        for (const auto& w : words_of(p.tgt)) ++tgt_counts[w];
    }
    // A few hundred words each side; the rarest target forms (1st and 2nd person verb forms)
    // still occur dozens of times.
    CHECK(src_counts.size() >= 150);
    CHECK(src_counts.size() <= 250);
    CHECK(tgt_counts.size() >= 250);
    CHECK(tgt_counts.size() <= 450);
    for (const auto* counts : {&src_counts, &tgt_counts})
        for (const auto& [word, n] : *counts) {
            INFO(word);
            CHECK(n >= 20);
        }
    for (const auto* split : {&corpus.valid, &corpus.test})
        for (const tf::ToyPair& p : *split) {
            for (const auto& w : words_of(p.src)) CHECK(src_counts.count(w) == 1);
            for (const auto& w : words_of(p.tgt)) CHECK(tgt_counts.count(w) == 1);
        }
}

// Expected translations derived by hand from the rules in data/README.md, not from the program.
TEST_CASE("toy translation: hand-checked constructions", "[toy]") {
    using tf::translate_toy_sentence;
    // SOV order, adjective after the noun with masculine agreement, a bare plural with its number last.
    CHECK(translate_toy_sentence("the big dog sees three cats .") == "lo karo grando mesin tri videt .");
    CHECK(translate_toy_sentence("the big dog sees 3 cats .") == "lo karo grando mesin tri videt .");
    // Predicate adjective agrees with the subject's gender; "i" is masculine by default.
    CHECK(translate_toy_sentence("she is happy .") == "lei fela eset .");
    CHECK(translate_toy_sentence("i am happy .") == "mi felo esem .");
    // Two feminine subjects give feminine plural; a mixed pair gives masculine plural; verb is 3pl.
    CHECK(translate_toy_sentence("the cats and the owls were not angry .") == "lai mesin e lai hubun iratai ne esint .");
    CHECK(translate_toy_sentence("the cat and the dog were hungry .") == "la mesi e lo karo famoi esint .");
    // do-support disappears, "ne" precedes the verb; the preposition follows its phrase; "an" and "a"
    // are both "un(a)"; 13 = dek tri; 1st person plural past ending.
    CHECK(translate_toy_sentence("we did not see the 13 old kings in an old house .") ==
          "nos loi regoren vekoi dek tri una domu veka ine ne vidimos .");
    // A relative clause on the subject is verb-final and agrees with its head; the adverb precedes the verb.
    CHECK(translate_toy_sentence("the boys that do not sleep like her quickly .") ==
          "loi pakon ke ne dorment lein rapide ament .");
    // Relative clause with an object (20 = du dek), then clause coordination.
    CHECK(translate_toy_sentence("the girl that saw the twenty cats sings and they ran .") ==
          "la lina ke lai mesin du dek vidit kantet e iro korint .");
    // Object, then the postpositional phrase, then the adverb, then the verb.
    CHECK(translate_toy_sentence("i see the dog with the cat quickly .") == "mi lo karo la mesi kun rapide videm .");
    // The generator draws at most one adjective, but the parser takes several; their order is kept.
    CHECK(translate_toy_sentence("the big red dog sleeps .") == "lo karo grando rudo dormet .");
    // "you" is tu as a subject and tun as an object.
    CHECK(translate_toy_sentence("you helped us but he called you .") == "tu nosen jutis ma lu tun klamit .");
    CHECK(translate_toy_sentence("these eleven flowers sleep .") == "estai rosin dek ein dorment .");
}

TEST_CASE("toy translation: sentences outside the grammar are rejected with the token position", "[toy]") {
    using tf::translate_toy_sentence;
    const auto rejects = [](const std::string& s, const std::string& fragment) {
        INFO(s);
        CHECK_THROWS_AS(translate_toy_sentence(s), std::invalid_argument);
        CHECK_THROWS_WITH(translate_toy_sentence(s), Catch::Contains(fragment));
    };
    rejects("the dog sees .", "token 4 ('.'): expected an object");
    rejects("a apple sleeps .", "'an' before 'apple'");
    rejects("the dogs sleeps .", "token 3 ('sleeps')");
    rejects("i is happy .", "'am' to agree");
    rejects("they does not sleep .", "'do' to agree");
    rejects("3 dog sleeps .", "agree with its noun");
    rejects("he sleeps", "final '.'");
    rejects("he and she sleep .", "token 2 ('and')");
    rejects("", "expected a subject");
}

TEST_CASE("toy corpus: options control the output and bad options are rejected", "[toy]") {
    tf::ToyCorpusOptions opt;
    opt.train = 300;
    opt.valid = 20;
    opt.test = 20;
    opt.min_words = 6;
    opt.max_words = 8;
    const tf::ToyCorpus a = tf::generate_toy_corpus(opt);
    CHECK(a.train.size() == 300);
    for (const tf::ToyPair& p : a.train) {
        CHECK(words_of(p.src).size() >= 6);
        CHECK(words_of(p.tgt).size() <= 8);
    }
    CHECK(tf::generate_toy_corpus(opt).train[7].src == a.train[7].src);  // same seed, same corpus
    opt.seed = 2;
    CHECK(tf::generate_toy_corpus(opt).train[7].src != a.train[7].src);

    tf::ToyCorpusOptions bad;
    bad.min_words = 2;
    CHECK_THROWS_AS(tf::generate_toy_corpus(bad), std::invalid_argument);
    bad = {};
    bad.valid = -1;
    CHECK_THROWS_AS(tf::generate_toy_corpus(bad), std::invalid_argument);
    bad = {};
    bad.train = 2000;  // only a few hundred 3-word sentences exist
    bad.valid = bad.test = 0;
    bad.min_words = bad.max_words = 3;
    CHECK_THROWS_AS(tf::generate_toy_corpus(bad), std::runtime_error);
}

TEST_CASE("toy corpus: an unwritable output directory is reported with its path", "[toy]") {
    TempDir tmp;
    fs::create_directories(tmp.path);
    const fs::path blocker = tmp.path / "not_a_dir";
    std::ofstream(blocker) << "x";
    tf::ToyCorpusOptions small;
    small.train = small.valid = small.test = 5;
    const std::string out = (blocker / "toy").string();
    CHECK_THROWS_AS(tf::write_toy_corpus(out, small), std::runtime_error);
    CHECK_THROWS_WITH(tf::write_toy_corpus(out, small), Catch::Contains(out) && Catch::Contains("Not a directory"));
}
