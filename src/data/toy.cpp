// Generator of the toy translation corpus (toy.h; the grammar is tabulated in data/README.md).
// A sentence is drawn as a small syntax tree, and the source and target lines are two renderings of that
// tree. A recursive-descent parser reads a source line back into a tree, which gives translate_toy_sentence
// and lets the tests prove that the source alone determines the target (no ambiguous pair can exist).
// Only fixed-width integer arithmetic touches the random stream, so the bytes are the same everywhere.
#include "tapeformer/data/toy.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>

#include "tapeformer/io.h"
#include "tapeformer/random.h"

TF_NAMESPACE_BEGIN

namespace {

// ---------------------------------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------------------------------

// SplitMix64 (random.h) and our own integer->range mapping, because std::uniform_int_distribution's
// algorithm is implementation-defined and would make the committed files depend on the standard library.
class ToyRng {
public:
    explicit ToyRng(std::uint64_t seed) : stream_(seed) {}

    // Uniform in [0, n) for n > 0. `next() % n` alone would favour small values; rejecting the lowest
    // (2^64 mod n) draws leaves a range whose size is a multiple of n, so every residue is equally likely.
    int below(int n) {
        const std::uint64_t un = std::uint64_t(n);
        const std::uint64_t reject = (0 - un) % un;  // (2^64 - n) mod n == 2^64 mod n
        for (;;) {
            const std::uint64_t r = stream_.next();
            if (r >= reject) return int(r % un);
        }
    }

    // True with probability p / 100.
    bool percent(int p) { return below(100) < p; }

private:
    SplitMix64 stream_;
};

// ---------------------------------------------------------------------------------------------------
// Lexicon: every source word with its one target rendering
// ---------------------------------------------------------------------------------------------------

enum class Gender { masc, fem };

// Person and number as the target's verb endings tell them apart. English "you" is always kSecond
// (the target, like English, does not distinguish singular and plural "you").
enum Person { kFirstSg, kSecond, kThirdSg, kFirstPl, kThirdPl };
constexpr int kPersons = 5;

// Target nouns have a fixed, arbitrary gender (as in French or German: it must be memorised) and one
// plural suffix: "-n" after a vowel, "-en" after a consonant.
struct NounEntry {
    const char* sg;
    const char* pl;
    const char* stem;
    Gender gender;
};
constexpr Gender M = Gender::masc, F = Gender::fem;
const NounEntry kNouns[] = {
    {"dog", "dogs", "karo", M},      {"cat", "cats", "mesi", F},         {"bird", "birds", "pilu", M},
    {"owl", "owls", "hubu", F},      {"elephant", "elephants", "olifo", M}, {"man", "men", "dono", M},
    {"woman", "women", "sela", F},   {"child", "children", "nuno", M},   {"boy", "boys", "pako", M},
    {"girl", "girls", "lina", F},    {"doctor", "doctors", "vrakir", F}, {"king", "kings", "regor", M},
    {"queen", "queens", "rania", F}, {"friend", "friends", "amik", M},   {"house", "houses", "domu", F},
    {"tree", "trees", "arbo", M},    {"car", "cars", "voto", F},         {"book", "books", "libu", M},
    {"apple", "apples", "pomi", F},  {"garden", "gardens", "vartu", F},  {"city", "cities", "urba", F},
    {"flower", "flowers", "rosi", F}, {"box", "boxes", "kesto", M},      {"river", "rivers", "flodo", M},
};
constexpr int kNounCount = int(sizeof(kNouns) / sizeof(kNouns[0]));

// Target adjectives agree with their noun: stem + {-o, -a, -oi, -ai} for masc/fem singular/plural.
struct AdjectiveEntry {
    const char* src;
    const char* stem;
};
const AdjectiveEntry kAdjectives[] = {
    {"big", "grand"}, {"small", "pik"}, {"old", "vek"},     {"young", "jun"},  {"red", "rud"},
    {"green", "verd"}, {"blue", "blav"}, {"white", "alb"},   {"black", "negr"}, {"happy", "fel"},
    {"sad", "trist"}, {"angry", "irat"}, {"tall", "alt"},    {"hungry", "fam"},
};
constexpr int kAdjectiveCount = int(sizeof(kAdjectives) / sizeof(kAdjectives[0]));
const char* const kAdjectiveEndings[2][2] = {{"o", "oi"}, {"a", "ai"}};  // [gender][plural]

// English verbs have three forms here (base, 3rd singular present, past); target verbs are a stem plus
// one of ten endings: the vowel marks the tense, the rest the person and number.
struct VerbEntry {
    const char* base;
    const char* third_sg;
    const char* past;
    const char* stem;
    bool transitive;  // transitive verbs always take an object, intransitive ones never do
};
const VerbEntry kVerbs[] = {
    {"see", "sees", "saw", "vid", true},          {"like", "likes", "liked", "am", true},
    {"find", "finds", "found", "trov", true},     {"help", "helps", "helped", "jut", true},
    {"follow", "follows", "followed", "seg", true}, {"call", "calls", "called", "klam", true},
    {"watch", "watches", "watched", "gard", true}, {"carry", "carries", "carried", "port", true},
    {"visit", "visits", "visited", "vizit", true}, {"sleep", "sleeps", "slept", "dorm", false},
    {"run", "runs", "ran", "kor", false},         {"walk", "walks", "walked", "pas", false},
    {"sing", "sings", "sang", "kant", false},     {"swim", "swims", "swam", "nat", false},
};
constexpr int kVerbCount = int(sizeof(kVerbs) / sizeof(kVerbs[0]));
const char* const kVerbEndings[2][kPersons] = {
    {"em", "es", "et", "emos", "ent"},  // present: 1sg, 2, 3sg, 1pl, 3pl
    {"im", "is", "it", "imos", "int"},  // past
};

// "to be" links a subject to an adjective; the target conjugates it like any verb (stem "es").
const char* const kCopulaForms[2][kPersons] = {
    {"am", "are", "is", "are", "are"},
    {"was", "were", "was", "were", "were"},
};
const char* const kCopulaStem = "es";

// Personal pronouns. The target has separate subject and object forms like English; "i", "you", "we"
// and "they" carry no gender, so an adjective agreeing with them takes the masculine (the default).
struct PronounEntry {
    const char* subj;
    const char* obj;
    const char* tgt_subj;
    const char* tgt_obj;
    Person person;
    Gender gender;
};
const PronounEntry kPronouns[] = {
    {"i", "me", "mi", "min", kFirstSg, M},    {"you", "you", "tu", "tun", kSecond, M},
    {"he", "him", "lu", "lun", kThirdSg, M},  {"she", "her", "lei", "lein", kThirdSg, F},
    {"we", "us", "nos", "nosen", kFirstPl, M}, {"they", "them", "iro", "iron", kThirdPl, M},
};
constexpr int kPronounCount = int(sizeof(kPronouns) / sizeof(kPronouns[0]));

// Words with a single rendering each. Prepositions become postpositions (they follow their noun phrase).
struct WordPair {
    const char* src;
    const char* tgt;
};
const WordPair kPrepositions[] = {
    {"in", "ine"}, {"on", "supe"}, {"under", "sube"}, {"near", "apud"}, {"with", "kun"}, {"behind", "dore"},
};
constexpr int kPrepositionCount = int(sizeof(kPrepositions) / sizeof(kPrepositions[0]));
const WordPair kAdverbs[] = {
    {"quickly", "rapide"}, {"slowly", "lente"}, {"often", "ofte"}, {"happily", "felice"},
};
constexpr int kAdverbCount = int(sizeof(kAdverbs) / sizeof(kAdverbs[0]));
const WordPair kConjunctions[] = {{"and", "e"}, {"but", "ma"}};  // [0] also joins two subjects
constexpr int kConjunctionCount = 2;

// Numbers 2..20 (numbers only ever count plural nouns). The source writes them in digits or in words;
// the target builds them from its digits: 13 = "dek tri" (ten three), 20 = "du dek" (two ten).
constexpr int kMinNumber = 2, kMaxNumber = 20;
const char* const kNumberWords[kMaxNumber + 1] = {
    "", "", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"};
const char* const kTargetDigits[10] = {"", "ein", "du", "tri", "kvar", "pen", "ses", "sep", "ok", "nev"};
const char* const kTargetTen = "dek";

// Determiners. `a` is written "an" before a vowel; `this_` is "this"/"these" by number.
enum class Determiner { none, the, a, some, this_ };
// Target articles agree in gender and number: [determiner][gender][plural]; "" where impossible.
const char* const kArticles[5][2][2] = {
    {{"", ""}, {"", ""}},                  // none
    {{"lo", "loi"}, {"la", "lai"}},        // the
    {{"un", ""}, {"una", ""}},             // a / an (singular only)
    {{"", "kei"}, {"", "kai"}},            // some (plural only)
    {{"esto", "estoi"}, {"esta", "estai"}},  // this / these
};

// ---------------------------------------------------------------------------------------------------
// Syntax trees
// ---------------------------------------------------------------------------------------------------

struct RelativeClause;

// A pronoun, or [determiner] [number] adjective* noun [relative clause] (drawn with at most one adjective).
struct NounPhrase {
    int pronoun = -1;  // index into kPronouns, or -1 for a phrase headed by a noun
    Determiner det = Determiner::none;
    int number = 0;  // kMinNumber..kMaxNumber, or 0 for none (a number implies plural)
    bool number_in_digits = false;
    std::vector<int> adjectives;  // indices into kAdjectives, in source order (the target keeps it)
    int noun = 0;
    bool plural = false;
    std::shared_ptr<const RelativeClause> relative;  // null when absent
};

// "that" + verb (+ object): the head noun is its subject. It holds no prepositional phrase and no
// adverb, so a phrase or adverb after it always belongs to the main clause: no attachment ambiguity.
struct RelativeClause {
    int verb = 0;
    bool past = false;
    bool negated = false;
    std::optional<NounPhrase> object;  // present exactly when the verb is transitive
};

struct Clause {
    std::vector<NounPhrase> subject;  // one phrase, or two joined by "and" (then plural)
    bool copula = false;              // "subject is adjective" instead of a verb
    int verb = 0;                     // index into kVerbs (unless copula)
    int adjective = 0;                // the predicate of a copula clause
    bool past = false;
    bool negated = false;
    std::optional<NounPhrase> object;  // present exactly when the verb is transitive
    int preposition = -1;              // index into kPrepositions, or -1 for no prepositional phrase
    NounPhrase place;                  // the object of the preposition
    int adverb = -1;                   // index into kAdverbs, or -1
};

struct Sentence {
    std::vector<Clause> clauses;
    std::vector<int> conjunctions;  // conjunctions[i] joins clauses[i] and clauses[i + 1]
};

// What a verb agrees with: the subject's person and number, and (for a predicate adjective) its gender.
struct Agreement {
    Person person = kThirdSg;
    Gender gender = Gender::masc;
    bool plural() const { return person == kFirstPl || person == kThirdPl; }
};

Agreement agreement_of(const NounPhrase& np) {
    if (np.pronoun >= 0) return {kPronouns[np.pronoun].person, kPronouns[np.pronoun].gender};
    return {np.plural ? kThirdPl : kThirdSg, kNouns[np.noun].gender};
}

// Two joined subjects are third person plural, feminine only if both are (as in French or Spanish).
Agreement agreement_of(const std::vector<NounPhrase>& subject) {
    if (subject.size() == 1) return agreement_of(subject[0]);
    bool all_fem = true;
    for (const NounPhrase& np : subject) all_fem = all_fem && agreement_of(np).gender == Gender::fem;
    return {kThirdPl, all_fem ? Gender::fem : Gender::masc};
}

// ---------------------------------------------------------------------------------------------------
// Rendering a tree as source (English-like) and as target
// ---------------------------------------------------------------------------------------------------

using Words = std::vector<std::string>;
enum class Role { subject, object };  // pronouns have a form for each

bool starts_with_vowel(const std::string& w) {
    return !w.empty() && std::strchr("aeiou", w[0]) != nullptr;
}

void source_verb_group(Words& out, int verb, bool copula, bool past, bool negated, Person person) {
    if (copula) {
        out.push_back(kCopulaForms[past][person]);
        if (negated) out.push_back("not");
        return;
    }
    const VerbEntry& v = kVerbs[verb];
    if (negated) {  // English negates with "do" + not + base form
        out.push_back(past ? "did" : person == kThirdSg ? "does" : "do");
        out.push_back("not");
        out.push_back(v.base);
    } else {
        out.push_back(past ? v.past : person == kThirdSg ? v.third_sg : v.base);
    }
}

void source_noun_phrase(Words& out, const NounPhrase& np, Role role) {
    if (np.pronoun >= 0) {
        out.push_back(role == Role::subject ? kPronouns[np.pronoun].subj : kPronouns[np.pronoun].obj);
        return;
    }
    Words rest;
    if (np.number > 0)
        rest.push_back(np.number_in_digits ? std::to_string(np.number) : kNumberWords[np.number]);
    for (int a : np.adjectives) rest.push_back(kAdjectives[a].src);
    rest.push_back(np.plural ? kNouns[np.noun].pl : kNouns[np.noun].sg);
    switch (np.det) {
    case Determiner::none: break;
    case Determiner::the: out.push_back("the"); break;
    case Determiner::a: out.push_back(starts_with_vowel(rest[0]) ? "an" : "a"); break;
    case Determiner::some: out.push_back("some"); break;
    case Determiner::this_: out.push_back(np.plural ? "these" : "this"); break;
    }
    out.insert(out.end(), rest.begin(), rest.end());
    if (const RelativeClause* rel = np.relative.get()) {
        out.push_back("that");
        source_verb_group(out, rel->verb, false, rel->past, rel->negated, np.plural ? kThirdPl : kThirdSg);
        if (rel->object) source_noun_phrase(out, *rel->object, Role::object);
    }
}

// English order: subject verb [object | adjective] [preposition phrase] [adverb].
void source_clause(Words& out, const Clause& c) {
    for (std::size_t i = 0; i < c.subject.size(); ++i) {
        if (i > 0) out.push_back(kConjunctions[0].src);
        source_noun_phrase(out, c.subject[i], Role::subject);
    }
    source_verb_group(out, c.verb, c.copula, c.past, c.negated, agreement_of(c.subject).person);
    if (c.copula) out.push_back(kAdjectives[c.adjective].src);
    if (c.object) source_noun_phrase(out, *c.object, Role::object);
    if (c.preposition >= 0) {
        out.push_back(kPrepositions[c.preposition].src);
        source_noun_phrase(out, c.place, Role::object);
    }
    if (c.adverb >= 0) out.push_back(kAdverbs[c.adverb].src);
}

std::string target_noun(int noun, bool plural) {
    std::string w = kNouns[noun].stem;
    if (plural) w += starts_with_vowel(w.substr(w.size() - 1)) ? "n" : "en";
    return w;
}

std::string target_adjective(int adjective, Gender g, bool plural) {
    return std::string(kAdjectives[adjective].stem) + kAdjectiveEndings[int(g)][plural];
}

std::string target_verb(const char* stem, bool past, Person person) {
    return std::string(stem) + kVerbEndings[past][person];
}

// Target numbers: units are single words, 10 is "dek", a teen is "dek" + unit, 20 is "du dek".
void target_number(Words& out, int n) {
    if (n >= 20) {
        out.push_back(kTargetDigits[n / 10]);
        out.push_back(kTargetTen);
    } else if (n >= 10) {
        out.push_back(kTargetTen);
        if (n > 10) out.push_back(kTargetDigits[n - 10]);
    } else {
        out.push_back(kTargetDigits[n]);
    }
}

// Verb-final: [ne] verb, where the negation particle sits right before the verb.
void target_verb_group(Words& out, int verb, bool copula, bool past, bool negated, Person person) {
    if (negated) out.push_back("ne");
    out.push_back(target_verb(copula ? kCopulaStem : kVerbs[verb].stem, past, person));
}

// Target noun phrase: [article] noun adjective* [number] [ke [object] verb], i.e. every modifier
// follows the noun, and the relative clause is verb-final like a main clause.
void target_noun_phrase(Words& out, const NounPhrase& np, Role role) {
    if (np.pronoun >= 0) {
        out.push_back(role == Role::subject ? kPronouns[np.pronoun].tgt_subj : kPronouns[np.pronoun].tgt_obj);
        return;
    }
    const Gender g = kNouns[np.noun].gender;
    if (np.det != Determiner::none) out.push_back(kArticles[int(np.det)][int(g)][np.plural]);
    out.push_back(target_noun(np.noun, np.plural));
    for (int a : np.adjectives) out.push_back(target_adjective(a, g, np.plural));
    if (np.number > 0) target_number(out, np.number);
    if (const RelativeClause* rel = np.relative.get()) {
        out.push_back("ke");
        if (rel->object) target_noun_phrase(out, *rel->object, Role::object);
        target_verb_group(out, rel->verb, false, rel->past, rel->negated, np.plural ? kThirdPl : kThirdSg);
    }
}

// Target order (SOV with postpositions): subject [object | adjective] [phrase postposition] [adverb]
// [ne] verb: the source order, except that the verb moves to the end. A predicate adjective agrees with
// the subject in gender and number.
void target_clause(Words& out, const Clause& c) {
    for (std::size_t i = 0; i < c.subject.size(); ++i) {
        if (i > 0) out.push_back(kConjunctions[0].tgt);
        target_noun_phrase(out, c.subject[i], Role::subject);
    }
    const Agreement agr = agreement_of(c.subject);
    if (c.copula) out.push_back(target_adjective(c.adjective, agr.gender, agr.plural()));
    if (c.object) target_noun_phrase(out, *c.object, Role::object);
    if (c.preposition >= 0) {
        target_noun_phrase(out, c.place, Role::object);
        out.push_back(kPrepositions[c.preposition].tgt);
    }
    if (c.adverb >= 0) out.push_back(kAdverbs[c.adverb].tgt);
    target_verb_group(out, c.verb, c.copula, c.past, c.negated, agr.person);
}

template <class RenderClause>
Words render_sentence(const Sentence& s, RenderClause render_clause, bool target) {
    Words out;
    for (std::size_t i = 0; i < s.clauses.size(); ++i) {
        if (i > 0) {
            const WordPair& conj = kConjunctions[s.conjunctions[i - 1]];
            out.push_back(target ? conj.tgt : conj.src);
        }
        render_clause(out, s.clauses[i]);
    }
    out.push_back(".");
    return out;
}

Words source_words(const Sentence& s) { return render_sentence(s, source_clause, false); }
Words target_words(const Sentence& s) { return render_sentence(s, target_clause, true); }

std::string join(const Words& words) {
    std::string line;
    for (const std::string& w : words) {
        if (!line.empty()) line += ' ';
        line += w;
    }
    return line;
}

// ---------------------------------------------------------------------------------------------------
// Drawing random trees. Percentages were tuned so that sentences average about 9.5 words and every
// target word form (the rarest: 1st and 2nd person verb forms) occurs dozens of times
// in train.
// ---------------------------------------------------------------------------------------------------

NounPhrase draw_noun_phrase(ToyRng& rng, int relative_percent);

// "he" and "she" are drawn half as often as the others: third person singular is already common through
// noun subjects, while verb endings for "i", "you" and "we" occur only with pronouns.
NounPhrase draw_pronoun(ToyRng& rng) {
    static const int kWeights[kPronounCount] = {2, 2, 1, 1, 2, 2};  // i you he she we they
    NounPhrase np;
    int r = rng.below(10);
    for (np.pronoun = 0; r >= kWeights[np.pronoun]; ++np.pronoun) r -= kWeights[np.pronoun];
    return np;
}

std::shared_ptr<const RelativeClause> draw_relative(ToyRng& rng) {
    auto rel = std::make_shared<RelativeClause>();
    rel->verb = rng.below(kVerbCount);
    rel->past = rng.percent(50);
    rel->negated = rng.percent(10);
    if (kVerbs[rel->verb].transitive)
        rel->object = rng.percent(20) ? draw_pronoun(rng) : draw_noun_phrase(rng, 0);
    return rel;
}

// A phrase headed by a noun; it gets a relative clause with probability relative_percent.
NounPhrase draw_noun_phrase(ToyRng& rng, int relative_percent) {
    NounPhrase np;
    np.noun = rng.below(kNounCount);
    np.plural = rng.percent(40);
    const int d = rng.below(100);
    if (!np.plural) {
        np.det = d < 50 ? Determiner::the : d < 80 ? Determiner::a : Determiner::this_;
    } else {
        np.det = d < 35 ? Determiner::the : d < 55 ? Determiner::some : d < 70 ? Determiner::this_
                                                                           : Determiner::none;
        if (np.det != Determiner::some && rng.percent(np.det == Determiner::none ? 60 : 35)) {
            np.number = kMinNumber + rng.below(kMaxNumber - kMinNumber + 1);
            np.number_in_digits = rng.percent(50);
        }
    }
    // At most one adjective: with two, small models kept dropping or swapping one of them long after
    // everything else was right, and agreement is already exercised by one.
    if (rng.percent(42)) np.adjectives.push_back(rng.below(kAdjectiveCount));
    if (relative_percent > 0 && rng.percent(relative_percent)) np.relative = draw_relative(rng);
    return np;
}

// "i see me" is not English (it would be "myself"); a first or second person object never repeats the
// subject's pronoun.
bool reflexive(const Clause& c, const NounPhrase& object) {
    if (c.subject.size() != 1 || c.subject[0].pronoun < 0 || object.pronoun != c.subject[0].pronoun) return false;
    return kPronouns[object.pronoun].person != kThirdSg && kPronouns[object.pronoun].person != kThirdPl;
}

Clause draw_clause(ToyRng& rng) {
    Clause c;
    const int s = rng.below(100);
    if (s < 45) {
        c.subject.push_back(draw_pronoun(rng));
    } else if (s < 93) {
        c.subject.push_back(draw_noun_phrase(rng, 8));
    } else {  // two joined subjects; no relative clauses inside, so "and" after a subject always joins
        c.subject.push_back(draw_noun_phrase(rng, 0));
        c.subject.push_back(draw_noun_phrase(rng, 0));
    }
    const int k = rng.below(100);
    if (k < 12) {
        c.copula = true;
        c.adjective = rng.below(kAdjectiveCount);
    } else {
        const bool transitive = k < 62;
        do c.verb = rng.below(kVerbCount);
        while (kVerbs[c.verb].transitive != transitive);
        if (transitive) {
            do c.object = rng.percent(20) ? draw_pronoun(rng) : draw_noun_phrase(rng, 8);
            while (reflexive(c, *c.object));
        }
    }
    c.past = rng.percent(50);
    c.negated = rng.percent(15);
    if (rng.percent(30)) {
        c.preposition = rng.below(kPrepositionCount);
        c.place = rng.percent(15) ? draw_pronoun(rng) : draw_noun_phrase(rng, 0);
    }
    if (!c.copula && rng.percent(15)) c.adverb = rng.below(kAdverbCount);
    return c;
}

Sentence draw_sentence(ToyRng& rng) {
    Sentence s;
    s.clauses.push_back(draw_clause(rng));
    if (rng.percent(30)) {
        s.conjunctions.push_back(rng.percent(60) ? 0 : 1);
        s.clauses.push_back(draw_clause(rng));
    }
    return s;
}

// ---------------------------------------------------------------------------------------------------
// Parsing a source line back into a tree (recursive descent; the grammar is LL(1) but for a/an and
// verb agreement, which are checked against the already parsed subject)
// ---------------------------------------------------------------------------------------------------

class Parser {
public:
    explicit Parser(const std::string& line) {
        std::size_t i = 0;
        while (i < line.size()) {
            while (i < line.size() && line[i] == ' ') ++i;
            std::size_t j = i;
            while (j < line.size() && line[j] != ' ') ++j;
            if (j > i) tokens_.push_back(line.substr(i, j - i));
            i = j;
        }
    }

    Sentence sentence() {
        Sentence s;
        s.clauses.push_back(clause());
        for (int c; (c = find(kConjunctions, kConjunctionCount)) >= 0;) {
            ++pos_;
            s.conjunctions.push_back(c);
            s.clauses.push_back(clause());
        }
        expect(".", "a conjunction or the final '.'");
        if (pos_ != tokens_.size()) fail("the end of the sentence after '.'");
        return s;
    }

private:
    const std::string& peek() const {
        static const std::string end = "<end>";
        return pos_ < tokens_.size() ? tokens_[pos_] : end;
    }
    [[noreturn]] void fail(const std::string& expected) const {
        throw std::invalid_argument("toy sentence, token " + std::to_string(pos_ + 1) + " ('" + peek() +
                                    "'): expected " + expected);
    }
    void expect(const char* word, const std::string& expected) {
        if (peek() != word) fail(expected);
        ++pos_;
    }
    // Index of the entry whose `src` is the next token, or -1.
    template <class Entry>
    int find(const Entry* table, int n) const {
        for (int i = 0; i < n; ++i)
            if (peek() == table[i].src) return i;
        return -1;
    }

    NounPhrase noun_phrase(Role role, bool allow_relative) {
        NounPhrase np;
        for (int p = 0; p < kPronounCount; ++p)
            if (peek() == (role == Role::subject ? kPronouns[p].subj : kPronouns[p].obj)) {
                np.pronoun = p;
                ++pos_;
                return np;
            }
        std::string det = peek();
        if (det == "the") np.det = Determiner::the;
        else if (det == "a" || det == "an") np.det = Determiner::a;
        else if (det == "some") np.det = Determiner::some;
        else if (det == "this" || det == "these") np.det = Determiner::this_;
        else det.clear();
        if (!det.empty()) ++pos_;
        const std::size_t after_det = pos_;
        for (int n = kMinNumber; n <= kMaxNumber && np.number == 0; ++n)
            if (peek() == std::to_string(n) || peek() == kNumberWords[n]) {
                np.number = n;
                np.number_in_digits = peek() == std::to_string(n);
                ++pos_;
            }
        for (int a; (a = find(kAdjectives, kAdjectiveCount)) >= 0; ++pos_) np.adjectives.push_back(a);
        np.noun = -1;
        for (int n = 0; n < kNounCount && np.noun < 0; ++n)
            if (peek() == kNouns[n].sg || peek() == kNouns[n].pl) {
                np.noun = n;
                np.plural = peek() == kNouns[n].pl;
            }
        if (np.noun < 0) fail(role == Role::subject ? "a subject (pronoun or noun phrase)" : "an object (pronoun or noun phrase)");
        ++pos_;
        // Agreement inside the phrase, checked so that no ungrammatical line gets a translation.
        const bool singular_det = det == "a" || det == "an" || det == "this";
        const bool plural_det = det == "some" || det == "these";
        if ((np.plural && singular_det) || (!np.plural && (plural_det || np.number > 0))) {
            pos_ = after_det;
            fail("a noun phrase whose determiner and number agree with its noun");
        }
        if (np.det == Determiner::a && (det == "an") != starts_with_vowel(tokens_[after_det])) {
            pos_ = after_det - 1;
            fail(std::string("'") + (det == "an" ? "a" : "an") + "' before '" + tokens_[after_det] + "'");
        }
        if (allow_relative && peek() == "that") {
            ++pos_;
            auto rel = std::make_shared<RelativeClause>();
            bool copula = false;
            int adjective_unused = 0;
            verb_group(np.plural ? kThirdPl : kThirdSg, false, rel->verb, copula, adjective_unused, rel->past,
                       rel->negated);
            if (kVerbs[rel->verb].transitive) rel->object = noun_phrase(Role::object, false);
            np.relative = rel;
        }
        return np;
    }

    // Reads the verb (or "to be" + adjective) and checks that it agrees with `person`.
    void verb_group(Person person, bool allow_copula, int& verb, bool& copula, int& adjective, bool& past,
                    bool& negated) {
        const std::string w = peek();
        copula = false;
        negated = false;
        for (int t = 0; t < 2; ++t)
            for (int p = 0; p < kPersons; ++p)
                if (allow_copula && w == kCopulaForms[t][p]) copula = true, past = t == 1;
        if (copula) {
            if (w != kCopulaForms[past][person]) fail(std::string("'") + kCopulaForms[past][person] + "' to agree with the subject");
            ++pos_;
            if (peek() == "not") negated = true, ++pos_;
            adjective = find(kAdjectives, kAdjectiveCount);
            if (adjective < 0) fail("an adjective after 'to be'");
            ++pos_;
            return;
        }
        if (w == "do" || w == "does" || w == "did") {
            past = w == "did";
            if (!past && w != (person == kThirdSg ? "does" : "do"))
                fail(std::string("'") + (person == kThirdSg ? "does" : "do") + "' to agree with the subject");
            ++pos_;
            expect("not", "'not' after '" + w + "'");
            negated = true;
            for (verb = 0; verb < kVerbCount; ++verb)
                if (peek() == kVerbs[verb].base) break;
            if (verb == kVerbCount) fail("the base form of a verb after '" + w + " not'");
            ++pos_;
            return;
        }
        for (verb = 0; verb < kVerbCount; ++verb) {
            const VerbEntry& v = kVerbs[verb];
            if (w == v.past) past = true;
            else if (w == (person == kThirdSg ? v.third_sg : v.base)) past = false;
            else continue;
            ++pos_;
            return;
        }
        fail("a verb agreeing with the subject");
    }

    Clause clause() {
        Clause c;
        c.subject.push_back(noun_phrase(Role::subject, true));
        if (peek() == kConjunctions[0].src) {  // "and" before the verb can only join two subjects
            const std::size_t and_pos = pos_++;
            c.subject.push_back(noun_phrase(Role::subject, false));
            for (const NounPhrase& np : c.subject)
                if (np.pronoun >= 0 || np.relative) {
                    pos_ = and_pos;
                    fail("two plain noun phrases around 'and' (no pronoun, no relative clause)");
                }
        }
        verb_group(agreement_of(c.subject).person, true, c.verb, c.copula, c.adjective, c.past, c.negated);
        if (!c.copula && kVerbs[c.verb].transitive) c.object = noun_phrase(Role::object, true);
        c.preposition = find(kPrepositions, kPrepositionCount);
        if (c.preposition >= 0) {
            ++pos_;
            c.place = noun_phrase(Role::object, false);
        }
        if (!c.copula) c.adverb = find(kAdverbs, kAdverbCount);
        if (c.adverb >= 0) ++pos_;
        return c;
    }

    std::vector<std::string> tokens_;
    std::size_t pos_ = 0;
};

}  // namespace

ToyCorpus generate_toy_corpus(const ToyCorpusOptions& opt) {
    if (opt.train < 0 || opt.valid < 0 || opt.test < 0)
        throw std::invalid_argument("toy corpus: split sizes must be >= 0");
    if (opt.min_words < 3 || opt.min_words > opt.max_words)
        throw std::invalid_argument("toy corpus: need 3 <= min_words <= max_words, got min_words=" +
                                    std::to_string(opt.min_words) + " max_words=" + std::to_string(opt.max_words));
    if (std::int64_t(opt.train) + opt.valid + opt.test > kMaxToyPairs)
        throw std::invalid_argument("toy corpus: " + std::to_string(opt.train) + " train + " + std::to_string(opt.valid) +
                                    " valid + " + std::to_string(opt.test) + " test pairs is more than the " +
                                    std::to_string(kMaxToyPairs) + " one corpus may hold (all are kept in memory)");
    ToyRng rng(opt.seed);
    std::set<std::string> seen;  // every source line of all splits: keeps the splits disjoint
    ToyCorpus corpus;
    const std::int64_t total = std::int64_t(opt.train) + opt.valid + opt.test;
    const std::int64_t max_draws = 100 * total + 100000;  // generous: about 1.3 draws per kept pair at defaults
    std::int64_t draws = 0;
    for (auto [split, count] : {std::pair{&corpus.train, opt.train}, {&corpus.valid, opt.valid},
                                {&corpus.test, opt.test}}) {
        while (int(split->size()) < count) {
            if (++draws > max_draws)
                throw std::runtime_error("toy corpus: could not draw " + std::to_string(total) +
                                         " distinct sentences of " + std::to_string(opt.min_words) + ".." +
                                         std::to_string(opt.max_words) + " words");
            const Sentence s = draw_sentence(rng);
            const Words src = source_words(s), tgt = target_words(s);
            const auto fits = [&](const Words& w) {
                return int(w.size()) >= opt.min_words && int(w.size()) <= opt.max_words;
            };
            if (!fits(src) || !fits(tgt)) continue;
            std::string line = join(src);
            if (!seen.insert(line).second) continue;
            split->push_back({std::move(line), join(tgt)});
        }
    }
    return corpus;
}

void write_toy_corpus(const std::string& out_dir, const ToyCorpusOptions& opt) {
    namespace fs = std::filesystem;
    if (out_dir.empty()) throw std::runtime_error("toy corpus: the output directory path is empty");
    const ToyCorpus corpus = generate_toy_corpus(opt);
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) throw std::runtime_error("cannot create directory " + out_dir + ": " + ec.message());
    if (!fs::is_directory(out_dir, ec))
        throw std::runtime_error("cannot create directory " + out_dir + ": " + std::strerror(ENOTDIR));
    for (auto [name, pairs] : {std::pair{"train", &corpus.train}, {"valid", &corpus.valid},
                               {"test", &corpus.test}}) {
        std::string src, tgt;
        for (const ToyPair& p : *pairs) {
            src += p.src + '\n';
            tgt += p.tgt + '\n';
        }
        const std::string base = (fs::path(out_dir) / name).string();
        write_file_atomic(base + ".src", src);  // io.h: temporary file, fsync, rename
        write_file_atomic(base + ".tgt", tgt);
    }
}

std::string translate_toy_sentence(const std::string& src) {
    return join(target_words(Parser(src).sentence()));
}

TF_NAMESPACE_END
