// The `tapeformer` executable, run as a user would: translate, eval, encode and data toy on a tiny untrained
// model, and bad input (missing, truncated, corrupted or foreign model files, missing inputs, misaligned
// files, unknown or out-of-range flags), each of which must exit non-zero with exactly one line on stderr
// that names the problem, and leave an existing output file as it was.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/model_settings.h"
#include "tapeformer/autograd.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/io.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/metrics/exact_match.h"
#include "tapeformer/optim.h"
#include "tapeformer/safetensors.h"
#include "helpers.h"

namespace fs = std::filesystem;

using namespace tf_test;

namespace {

// A failed run: non-zero exit and one line on stderr that contains `what`.
void check_one_line_error(const Run& r, const std::string& what) {
    INFO("stderr: " << r.err);
    CHECK(r.status > 0);
    CHECK(r.err.size() > 1);
    CHECK(r.err.back() == '\n');
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains(what));
    CHECK(r.out.empty());
}

const std::vector<std::string> kSources = {"the dog sees a cat", "a big house", "the cat runs to the house",
                                           "a dog"};
const std::vector<std::string> kTargets = {"lo karo videt la kata", "la grando domo", "la kata al domo kurat",
                                           "lo karo"};

// A tiny untrained model: what `tapeformer train` would leave in its --out directory, without training;
// `change` may switch settings before it is built.
tf::ModelConfig write_model_dir(const std::string& dir, const std::function<void(tf::ModelConfig&)>& change = {}) {
    tf::TokenizerOptions options;
    options.kind = tf::TokenizerKind::word;
    options.joint = true;
    const tf::TokenizerPair tokenizers = tf::TokenizerPair::train(kSources, kTargets, options);
    tf::ModelConfig c;
    c.src_vocab = c.tgt_vocab = tokenizers.source->vocab_size();
    c.d_model = 8;
    c.heads = 2;
    c.ffn = 16;
    c.enc_layers = c.dec_layers = 1;
    c.dropout = c.attention_dropout = c.activation_dropout = 0.1;
    c.max_len = 16;  // sources longer than 15 tokens are cut
    if (change) change(c);
    tf::Transformer model(c, /*seed=*/3);
    fs::create_directories(dir);
    tf::save_model_weights((fs::path(dir) / "model.safetensors").string(), model, tf::tokenizer_hash(tokenizers));
    tokenizers.save(dir);
    return c;
}

// A scratch directory with a model in `model/` and a file `existing.txt` that failures must not touch.
struct CliFixture {
    TempDir tmp;
    std::string model = tmp / "model";
    std::string weights = tmp / "model/model.safetensors";
    std::string existing = tmp / "existing.txt";
    tf::ModelConfig config = write_model_dir(model);
    CliFixture() { write_all(existing, "keep me\n"); }
};

const std::string kInput = "the dog sees a cat\n\na big house\n";

}  // namespace

TEST_CASE("translate reads stdin and writes one translation per input line to stdout", "[cli]") {
    CliFixture f;
    const Run r = run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput);
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    CHECK(r.err.empty());  // stderr is no terminal: no progress line; nothing was cut: no note
    const auto out = split_lines(r.out);
    REQUIRE(out.size() == 3);
    CHECK(out[1].empty());  // an empty line stays empty

    SECTION("--input and --output give the same translations in a file, nothing on stdout") {
        write_all(f.tmp / "in.txt", kInput);
        const Run w = run_cli(f.tmp, "translate --model " + shell_quote(f.model) + " --input " + shell_quote(f.tmp / "in.txt") +
                                         " --output " + shell_quote(f.existing) + " --beam 3 --length-penalty 0.6");
        REQUIRE(w.status == 0);
        CHECK(w.out.empty());
        CHECK(split_lines(read_all(f.existing)).size() == 3);
        CHECK(split_lines(read_all(f.existing))[1].empty());
    }
    SECTION("a source longer than the model's positional table is cut, with a note on stderr") {
        std::string long_line;
        for (int i = 0; i < 40; ++i) long_line += "the dog ";
        const Run w = run_cli(f.tmp, "translate --model " + shell_quote(f.model), long_line + "\na dog\n");
        REQUIRE(w.status == 0);
        CHECK(split_lines(w.out).size() == 2);
        CHECK(std::count(w.err.begin(), w.err.end(), '\n') == 1);
        CHECK_THAT(w.err, Catch::Contains("1 of 2") && Catch::Contains("15"));
    }
}

TEST_CASE("encode prints the pieces or ids the model sees, one line per input line", "[cli]") {
    CliFixture f;
    const std::string input = "the dog zebra\n\na cat\n";
    const Run pieces = run_cli(f.tmp, "encode --model " + shell_quote(f.model), input);
    REQUIRE(pieces.status == 0);
    CHECK(pieces.out == "the dog <unk>\n\na cat\n");

    const tf::TokenizerPair tok = tf::TokenizerPair::load(f.model);
    const Run ids = run_cli(f.tmp, "encode --ids --side tgt --model " + shell_quote(f.model), input);
    REQUIRE(ids.status == 0);
    std::string expected;
    for (const char* line : {"the dog zebra", "", "a cat"}) {
        std::string row;
        for (std::int32_t id : tok.target->encode(line)) row += (row.empty() ? "" : " ") + std::to_string(id);
        expected += row + "\n";
    }
    CHECK(ids.out == expected);
    CHECK_THAT(ids.out, Catch::Contains(" 3\n"));  // zebra is <unk>

    const Run bad_side = run_cli(f.tmp, "encode --side both --model " + shell_quote(f.model), input);
    check_one_line_error(bad_side, "--side");
}

TEST_CASE("eval prints BLEU, chrF and the reference loss, as text or one JSON line", "[cli]") {
    CliFixture f;
    std::string src, ref;
    for (std::size_t i = 0; i < kSources.size(); ++i) {
        src += kSources[i] + "\n";
        ref += kTargets[i] + "\n";
    }
    write_all(f.tmp / "test.src", src);
    write_all(f.tmp / "test.ref", ref);
    const std::string files = " --model " + shell_quote(f.model) + " --src " + shell_quote(f.tmp / "test.src") + " --ref " +
                              shell_quote(f.tmp / "test.ref");

    const Run json = run_cli(f.tmp, "eval --json" + files + " --output-hyp " + shell_quote(f.tmp / "hyp.txt"));
    INFO("stderr: " << json.err);
    REQUIRE(json.status == 0);
    REQUIRE(split_lines(json.out).size() == 1);
    const nlohmann::json j = nlohmann::json::parse(json.out);
    for (const char* key : {"bleu", "chrf", "exact_match", "loss", "nll", "ppl"}) {
        INFO(key);
        REQUIRE(j.contains(key));
        CHECK(j[key].is_number());
    }
    // The scores are those of the hypotheses it wrote, as the metrics library computes them.
    const std::vector<std::string> hyps = split_lines(read_all(f.tmp / "hyp.txt")), refs = split_lines(ref);
    CHECK(j["bleu"].get<double>() == Approx(tf::corpus_bleu(hyps, refs).score).epsilon(1e-12));
    CHECK(j["chrf"].get<double>() == Approx(tf::corpus_chrf(hyps, refs).score).epsilon(1e-12));
    CHECK(j["exact_match"].get<double>() == tf::exact_match(hyps, refs).fraction());
    CHECK(j["loss"].get<double>() >= j["nll"].get<double>() * 0.9);  // label smoothing 0.1 by default
    CHECK(j["ppl"].get<double>() == Approx(std::exp(j["nll"].get<double>())));
    CHECK_THAT(j["signature"].get<std::string>(), Catch::StartsWith("nrefs:1|") && Catch::Contains("tok:13a"));
    CHECK(split_lines(read_all(f.tmp / "hyp.txt")).size() == kSources.size());

    // The hypotheses file holds what translate prints.
    const Run tr = run_cli(f.tmp, "translate --model " + shell_quote(f.model) + " --input " + shell_quote(f.tmp / "test.src"));
    CHECK(tr.out == read_all(f.tmp / "hyp.txt"));

    const Run text = run_cli(f.tmp, "eval --label-smoothing 0" + files);
    REQUIRE(text.status == 0);
    const auto out = split_lines(text.out);
    REQUIRE(out.size() == 6);
    CHECK_THAT(out[0], Catch::StartsWith("BLEU = ") && Catch::Contains("(BP = "));
    CHECK_THAT(out[1], Catch::Contains("nrefs:1|"));
    CHECK_THAT(out[2], Catch::StartsWith("chrF2 = "));
    CHECK_THAT(out[4], Catch::StartsWith(tf::exact_match(hyps, refs).format()));
    CHECK_THAT(out[5], Catch::StartsWith("loss = ") && Catch::Contains("| nll = ") && Catch::Contains("| ppl = "));
}

TEST_CASE("eval --batch-tokens below the longest pair scores each such pair in a batch of its own", "[cli]") {
    CliFixture f;
    std::string src, ref;
    for (std::size_t i = 0; i < kSources.size(); ++i) {
        src += kSources[i] + "\n";
        ref += kTargets[i] + "\n";
    }
    write_all(f.tmp / "test.src", src);
    write_all(f.tmp / "test.ref", ref);
    const std::string files = " --json --model " + shell_quote(f.model) + " --src " + shell_quote(f.tmp / "test.src") +
                              " --ref " + shell_quote(f.tmp / "test.ref");
    const Run whole = run_cli(f.tmp, "eval" + files);
    REQUIRE(whole.status == 0);
    const Run alone = run_cli(f.tmp, "eval" + files + " --batch-tokens 3");  // every pair has more than 3 positions
    INFO("stderr: " << alone.err);
    REQUIRE(alone.status == 0);
    CHECK(alone.err.empty());
    const nlohmann::json a = nlohmann::json::parse(alone.out), w = nlohmann::json::parse(whole.out);
    CHECK(a["nll"].get<double>() == Approx(w["nll"].get<double>()).epsilon(1e-4));
    CHECK(a["loss"].get<double>() == Approx(w["loss"].get<double>()).epsilon(1e-4));
}

TEST_CASE("train --resume with a --max-steps past a cosine run's end is refused instead of training at lr 0", "[cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string out = tmp / "run";
    const std::string args = "train --train-src " + shell_quote(toy + "valid.src") + " --train-tgt " + shell_quote(toy + "valid.tgt") +
                             " --tokenizer word --vocab-size 0 --d-model 8 --heads 2 --ffn 16 --layers 1 --batch-tokens 400"
                             " --max-len 40 --schedule cosine --lr 0.001 --warmup 1 --checkpoint-every 2 --out " + shell_quote(out);
    const Run first = run_cli(tmp, args + " --max-steps 2");
    INFO("stderr: " << first.err);
    REQUIRE(first.status == 0);
    const Run longer = run_cli(tmp, "train --resume --max-steps 6 --out " + shell_quote(out));
    check_one_line_error(longer, "--resume --max-steps 6: the run's --schedule cosine reaches --min-lr 0 at --total-steps 2");
    CHECK_THAT(longer.err, Catch::Contains("steps 3 to 6 would train at learning rate 0"));
}

TEST_CASE("a --threads above what OpenBLAS runs is refused with the limit, not silently lowered", "[cli]") {
    CliFixture f;
    const std::string command = shell_quote(TF_CLI) + " --threads 1000 translate --model " + shell_quote(f.model) +
                                " </dev/null >/dev/null 2>" + shell_quote(f.tmp / "threads.err");
    const int raw = std::system(command.c_str());
    const std::string err = read_all(f.tmp / "threads.err");
    INFO("stderr: " << err);
    // A build whose OpenBLAS runs 1000 threads would accept it: then there is nothing to refuse.
    if (raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) == 0) SUCCEED("this OpenBLAS runs 1000 threads");
    else CHECK_THAT(err, Catch::StartsWith("tapeformer: error: --threads 1000: this build's OpenBLAS runs at most "));
    CHECK(std::count(err.begin(), err.end(), '\n') <= 1);
}

TEST_CASE("a flag a subcommand does not have is named, not its value as an unknown subcommand", "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);
    check_one_line_error(run_cli(f.tmp, "heads" + model + " --precision bf16 --src a --tgt b --out c"),
                         "unknown option '--precision' of `tapeformer heads`; see tapeformer heads --help");
    // A flag of the level above still takes its value there (the global --threads after `heads`).
    const std::string command = shell_quote(TF_CLI) + " heads --threads 1 --help >/dev/null 2>&1";
    const int raw = std::system(command.c_str());
    CHECK((raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) == 0));
}

TEST_CASE("explain --layer -1 and --head -1 are refused, not read as every layer and head", "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);
    check_one_line_error(run_cli(f.tmp, "explain" + model + " --layer -1 \"a dog\""), "--layer: must be >= 0, got -1");
    check_one_line_error(run_cli(f.tmp, "explain" + model + " --head -1 \"a dog\""), "--head: must be >= 0, got -1");
}

TEST_CASE("data toy refuses more pairs than it can hold, before allocating them", "[cli]") {
    TempDir tmp;
    const std::string out = " --out " + shell_quote(tmp / "toy");
    check_one_line_error(run_cli(tmp, "data toy --train 2000000000" + out), "--train");
    check_one_line_error(run_cli(tmp, "data toy --train 4000000 --valid 4000000" + out), "more than the 5000000");
    CHECK(!fs::exists(tmp / "toy"));
}

TEST_CASE("data toy writes the six files of data/toy byte for byte", "[cli]") {
    TempDir tmp;
    const Run r = run_cli(tmp, "data toy --out " + shell_quote(tmp / "toy"));
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    for (const char* name : {"train.src", "train.tgt", "valid.src", "valid.tgt", "test.src", "test.tgt"}) {
        INFO(name);
        const std::string committed = read_all((fs::path(TF_SOURCE_DIR) / "data/toy" / name).string());
        REQUIRE(!committed.empty());
        CHECK(read_all(tmp / ("toy/" + std::string(name))) == committed);
    }

    const Run group = run_cli(tmp, "data");
    check_one_line_error(group, "needs a subcommand: toy");
    const Run help = run_cli(tmp, "data --help");
    CHECK(help.status == 0);
    CHECK_THAT(help.out, Catch::Contains("toy"));
}

TEST_CASE("every flag of the inference commands has a help line with its default", "[cli]") {
    TempDir tmp;
    const Run translate = run_cli(tmp, "translate --help");
    CHECK(translate.status == 0);
    for (const char* flag : {"--model", "--input", "--output", "--beam", "--length-penalty", "--max-len",
                             "--max-len-ratio", "--batch-tokens"})
        CHECK_THAT(translate.out, Catch::Contains(flag));
    CHECK_THAT(translate.out, Catch::Contains("default: standard input"));
    const Run eval = run_cli(tmp, "eval --help");
    CHECK_THAT(eval.out, Catch::Contains("--label-smoothing") && Catch::Contains("0.1") && Catch::Contains("--json"));
}

TEST_CASE("bad model directories fail with one line naming the problem and leave --output alone", "[cli]") {
    CliFixture f;
    auto translate_to_existing = [&](const std::string& model_dir) {
        return run_cli(f.tmp, "translate --model " + shell_quote(model_dir) + " --output " + shell_quote(f.existing), kInput);
    };

    SECTION("a missing directory") {
        check_one_line_error(translate_to_existing(f.tmp / "no_such_model"), "no_such_model");
    }
    SECTION("a directory without model.safetensors") {
        fs::remove(f.weights);
        check_one_line_error(translate_to_existing(f.model), "model.safetensors");
    }
    SECTION("a truncated model.safetensors") {
        const std::string bytes = tf::read_file(f.weights);
        write_all(f.weights, bytes.substr(0, bytes.size() / 2));
        check_one_line_error(translate_to_existing(f.model), f.weights);
    }
    SECTION("a corrupted model.safetensors: one flipped data byte fails the checksum") {
        std::string bytes = tf::read_file(f.weights);
        bytes[bytes.size() - 3] ^= 0x10;  // inside the last tensor's values
        write_all(f.weights, bytes);
        check_one_line_error(translate_to_existing(f.model), "checksum mismatch");
    }
    SECTION("a model.safetensors of another format version") {
        tf::Transformer model(f.config);
        auto meta = tf::to_metadata(f.config);
        meta["tapeformer.format"] = "999";
        meta["tapeformer.kind"] = "model";
        tf::save_safetensors(f.weights, model.parameters(), meta, /*with_checksum=*/true);
        const Run r = translate_to_existing(f.model);
        check_one_line_error(r, "format 999");
        CHECK_THAT(r.err, Catch::Contains(f.weights));
    }
    SECTION("a missing tokenizer") {
        fs::remove(fs::path(f.model) / "vocab.txt");
        check_one_line_error(translate_to_existing(f.model), "vocab.txt");
    }
    CHECK(read_all(f.existing) == "keep me\n");

    SECTION("eval and encode report the same problems") {
        const std::string missing = f.tmp / "no_such_model";
        write_all(f.tmp / "a.txt", "a dog\n");
        check_one_line_error(run_cli(f.tmp, "eval --model " + shell_quote(missing) + " --src " + shell_quote(f.tmp / "a.txt") +
                                                " --ref " + shell_quote(f.tmp / "a.txt")),
                             "no_such_model");
        check_one_line_error(run_cli(f.tmp, "encode --model " + shell_quote(missing), "a dog\n"), "no_such_model");
    }
}

TEST_CASE("bad inputs and flags fail with one line naming the problem", "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);

    SECTION("a missing --input file") {
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --input " + shell_quote(f.tmp / "nope.txt") +
                                                " --output " + shell_quote(f.existing)),
                             "nope.txt");
        check_one_line_error(run_cli(f.tmp, "encode" + model + " --input " + shell_quote(f.tmp / "nope.txt")), "nope.txt");
    }
    SECTION("eval with source and reference files of different lengths names both counts") {
        write_all(f.tmp / "three.src", "a dog\nthe cat\na big house\n");
        write_all(f.tmp / "two.ref", "lo karo\nla kata\n");
        const Run r = run_cli(f.tmp, "eval" + model + " --src " + shell_quote(f.tmp / "three.src") + " --ref " +
                                         shell_quote(f.tmp / "two.ref") + " --output-hyp " + shell_quote(f.existing));
        check_one_line_error(r, "three.src' has 3 lines");
        CHECK_THAT(r.err, Catch::Contains("two.ref' has 2"));
    }
    SECTION("invalid UTF-8 in the input names the line") {
        check_one_line_error(run_cli(f.tmp, "translate" + model, "a dog\nthe \xff cat\n"), "standard input:2");
    }
    SECTION("an unknown flag") {
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --bogus 3", kInput), "--bogus");
    }
    SECTION("out-of-range numbers") {
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --beam 0", kInput), "--beam");
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --max-len -5", kInput), "--max-len");
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --max-len-ratio 0", kInput), "--max-len-ratio");
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --length-penalty -1", kInput), "--length-penalty");
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --batch-tokens 0", kInput), "--batch-tokens");
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --beam two", kInput), "--beam");
        write_all(f.tmp / "a.txt", "a dog\n");
        check_one_line_error(run_cli(f.tmp, "eval" + model + " --src " + shell_quote(f.tmp / "a.txt") + " --ref " +
                                                shell_quote(f.tmp / "a.txt") + " --label-smoothing 1"),
                             "--label-smoothing");
        check_one_line_error(run_cli(f.tmp, "data toy --out " + shell_quote(f.tmp / "toy") + " --train -1"), "--train");
        check_one_line_error(run_cli(f.tmp, "--threads 0 translate" + model, kInput), "--threads");
        check_one_line_error(run_cli(f.tmp, "--threads 99999999999 translate" + model, kInput), "--threads");
        // train: a value that overflows its type, and one past its bound, named as typed; nothing is written.
        const std::string out = " --out " + shell_quote(f.tmp / "run");
        const Run overflow = run_cli(f.tmp, "train --preset toy --d-model 99999999999999999999" + out);
        check_one_line_error(overflow, "--d-model");
        CHECK_THAT(overflow.err, Catch::Contains("99999999999999999999"));
        check_one_line_error(run_cli(f.tmp, "train --preset toy --max-positions 100000000" + out), "--max-positions");
        check_one_line_error(run_cli(f.tmp, "train --preset toy --layers 2 --enc-layers 3" + out), "--layers");
        CHECK(!std::filesystem::exists(f.tmp / "run"));
    }
    SECTION("a missing required flag") {
        check_one_line_error(run_cli(f.tmp, "translate", kInput), "--model");
    }
    SECTION("an --output in a directory that does not exist fails before translating") {
        check_one_line_error(run_cli(f.tmp, "translate" + model + " --output " + shell_quote(f.tmp / "no/dir/out.txt"), kInput),
                             "no/dir");
    }
    CHECK(read_all(f.existing) == "keep me\n");
}

TEST_CASE("translate and eval use the newest checkpoint, with a note, when model.safetensors is missing", "[cli]") {
    CliFixture f;
    const Run with_model = run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput);
    REQUIRE(with_model.status == 0);

    // What a run killed before it wrote model.safetensors leaves: training checkpoints (weights and Adam's
    // state), the newest of which holds the same weights as the model file had; an older one others.
    tf::Transformer model(f.config), older(f.config, /*seed=*/99);
    tf::load_into(model.parameters(), tf::load_safetensors(f.weights));
    fs::create_directories(f.model + "/checkpoints");
    tf::TrainState state;
    state.step = 1;
    tf::save_training_checkpoint(f.model + "/checkpoints/step-00000001.safetensors", older,
                                 tf::Adam(older.parameters()), state);
    state.step = 2;
    tf::save_training_checkpoint(f.model + "/checkpoints/step-00000002.safetensors", model,
                                 tf::Adam(model.parameters()), state);
    fs::remove(f.weights);

    const Run r = run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput);
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK(r.out == with_model.out);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains("tapeformer: note: ") && Catch::Contains("no model.safetensors") &&
                          Catch::Contains("checkpoints/step-00000002.safetensors"));

    write_all(f.tmp / "a.src", "a dog\n");
    write_all(f.tmp / "a.ref", "lo karo\n");
    const Run e = run_cli(f.tmp, "eval --model " + shell_quote(f.model) + " --src " + shell_quote(f.tmp / "a.src") +
                                     " --ref " + shell_quote(f.tmp / "a.ref"));
    INFO(e.err);
    CHECK(e.status == 0);
    CHECK_THAT(e.err, Catch::Contains("checkpoints/step-00000002.safetensors"));
}

// ---- integrity of what is loaded (issue 8, section 3) ------------------------------------------------------

TEST_CASE("a model is refused with a tokenizer other than its own, even one of the same size", "[cli]") {
    CliFixture f;
    // vocab.txt with two words swapped: same size, so only the stored hash can tell.
    auto lines = split_lines(read_all(f.model + "/vocab.txt"));
    REQUIRE(lines.size() > 6);
    std::swap(lines[4], lines[5]);
    write_all(f.model + "/vocab.txt", join_lines(lines));
    check_one_line_error(run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput),
                         "the tokenizer files (vocab.txt / spm.model) are not the ones");
}

TEST_CASE("a tapeformer model file without its checksum, or with a data-only one, is refused", "[cli]") {
    CliFixture f;
    tf::SafetensorsFile file = tf::load_safetensors(f.weights);
    std::vector<tf::NamedTensor> tensors;
    for (const auto& [name, entry] : file.tensors) tensors.push_back({name, file.tensor(name)});
    file.metadata.erase(tf::kSafetensorsChecksumKey);

    SECTION("no checksum") {
        tf::save_safetensors(f.weights, tensors, file.metadata, /*with_checksum=*/false);
        check_one_line_error(run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput),
                             f.weights + ": no checksum");
    }
    SECTION("a checksum of the data alone, as older versions wrote") {
        std::string bytes = tf::serialize_safetensors(tensors, file.metadata, /*with_checksum=*/true);
        std::uint64_t n = 0;
        for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
        char hex[9];
        std::snprintf(hex, sizeof hex, "%08x", tf::crc32c(std::string_view(bytes).substr(8 + n)));
        const std::size_t at = bytes.find("crc32c:") + 7;
        bytes.replace(at, 8, hex);
        write_all(f.weights, bytes);
        check_one_line_error(run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput),
                             "checksum covers only the tensor data");
    }
}

namespace {
// Rewrites a weights file with `edits` applied to its metadata and `extra` tensors added, the checksum
// recomputed, as a program that knows the format could: the checksum cannot tell, only the settings
// checked against the tensors.
void rewrite_weights(const std::string& path, const std::map<std::string, std::string>& edits,
                     const std::vector<tf::NamedTensor>& extra = {}) {
    tf::SafetensorsFile file = tf::load_safetensors(path);
    std::vector<tf::NamedTensor> tensors = extra;
    for (const auto& [name, entry] : file.tensors) tensors.push_back({name, file.tensor(name)});
    for (const auto& [key, value] : edits) file.metadata[key] = value;
    tf::save_safetensors(path, tensors, file.metadata, /*with_checksum=*/true);
}
}  // namespace

TEST_CASE("a weights file whose settings disagree with its tensors is refused before the model is built, naming "
          "the setting and the tensor", "[cli]") {
    CliFixture f;  // d_model 8, ffn 16, one layer a side, post-norm, sinusoidal, dot attention, no output bias
    const std::string V = std::to_string(f.config.src_vocab);
    struct Case {
        std::map<std::string, std::string> edits;
        std::vector<tf::NamedTensor> extra;
        std::string message;
    };
    const std::vector<Case> cases = {
        // Within every bound, 0.94 billion weights (3.7 GB) together: refused before any of it is allocated.
        {{{"d_model", "8192"}, {"ffn", "4096"}}, {},
         "model setting d_model 8192 does not fit tensor 'src_embed.weight' of shape (" + V + ", 8) (the metadata's "
         "settings give (" + V + ", 8192))"},
        {{{"ffn", "4096"}}, {}, "model setting ffn 4096 does not fit tensor 'encoder.layers.0.linear1.weight' of shape (16, 8)"},
        {{{"src_vocab", "999"}}, {}, "model setting src_vocab 999 does not fit tensor 'src_embed.weight' of shape (" + V + ", 8)"},
        {{{"tgt_vocab", "999"}}, {}, "model setting tgt_vocab 999 does not fit tensor 'tgt_embed.weight' of shape (" + V + ", 8)"},
        {{{"enc_layers", "2"}}, {},
         "model setting enc_layers 2 needs tensor 'encoder.layers.1.self_attn.in_proj_weight', which the file lacks"},
        {{{"dec_layers", "3"}}, {},
         "model setting dec_layers 3 needs tensor 'decoder.layers.1.self_attn.in_proj_weight', which the file lacks"},
        {{{"positional", "learned"}}, {}, "model setting positional learned needs tensor 'positional.weight'"},
        {{{"norm", "pre"}}, {}, "model setting norm pre needs tensor 'encoder.norm.weight'"},
        {{{"output_bias", "true"}}, {}, "model setting output_bias true needs tensor 'generator.bias'"},
        {{{"attention", "additive"}}, {}, "model setting attention additive needs tensor 'encoder.layers.0.self_attn.score_v'"},
        // Tensors the settings have no place for: the setting that would have one is named.
        {{}, {{"encoder.layers.1.linear1.weight", tf::Tensor::zeros({16, 8})}},
         "tensor 'encoder.layers.1.linear1.weight' is in the file, but model setting enc_layers 1 gives the model no such tensor"},
        {{}, {{"generator.bias", tf::Tensor::zeros({f.config.tgt_vocab})}},
         "tensor 'generator.bias' is in the file, but model setting output_bias false gives the model no such tensor"},
        {{}, {{"extra.weight", tf::Tensor::zeros({2})}}, "unexpected tensor 'extra.weight'"},
    };
    const std::string original = read_all(f.weights);
    for (const Case& c : cases) {
        INFO(c.message);
        write_all(f.weights, original);
        rewrite_weights(f.weights, c.edits, c.extra);
        check_one_line_error(run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput), f.weights + ": " + c.message);
    }
    // The same check for a checkpoint given as --model (its optimizer state aside).
    tf::Transformer model(f.config, 3);
    tf::Adam adam(model.parameters());
    const std::string checkpoint = f.model + "/checkpoints/step-00000001.safetensors";
    fs::create_directories(f.model + "/checkpoints");
    tf::save_training_checkpoint(checkpoint, model, adam, tf::TrainState{}, tf::tokenizer_hash(tf::TokenizerPair::load(f.model)));
    rewrite_weights(checkpoint, {{"ffn", "32"}});
    check_one_line_error(run_cli(f.tmp, "translate --model " + shell_quote(checkpoint), kInput),
                         checkpoint + ": model setting ffn 32 does not fit tensor 'encoder.layers.0.linear1.weight'");
}

TEST_CASE("a checkpoint whose tensors or training state disagree with its settings is refused, naming what", "[cli]") {
    CliFixture f;
    tf::ModelConfig wide = f.config;
    wide.ffn = 32;  // what run.json and the checkpoint's metadata say; the tensors are of ffn 16
    tf::Transformer small(f.config, 3), model(wide, 3);
    tf::Adam small_adam(small.parameters()), adam(model.parameters());
    const std::string path = f.tmp / "step.safetensors";
    tf::TrainState state;
    state.step = 8;
    state.epoch = 1;
    state.batch_in_epoch = 2;
    state.best_step = state.valid_step = 8;
    tf::save_training_checkpoint(path, small, small_adam, state);
    const std::string original = read_all(path);
    rewrite_weights(path, {{"ffn", "32"}});
    CHECK_THROWS_WITH(tf::load_training_checkpoint(path, model, adam),
                      path + ": model setting ffn 32 does not fit tensor 'encoder.layers.0.linear1.weight' of shape (16, 8) "
                             "(the metadata's settings give (32, 8))");

    // A training state no run can reach.
    const std::map<std::string, std::string> impossible = {
        {"\"best_step\":8", "\"best_step\":9"}, {"\"valid_step\":8", "\"valid_step\":12"},
        {"\"train_seconds\":0", "\"train_seconds\":-1"}, {"\"target_tokens\":0", "\"target_tokens\":-5"}};
    const std::string state_text = tf::to_json(state);
    for (const auto& [from, to] : impossible) {
        INFO(to);
        std::string text = state_text;
        REQUIRE(text.find(from) != std::string::npos);
        text.replace(text.find(from), from.size(), to);
        write_all(path, original);
        rewrite_weights(path, {{"tapeformer.train_state", text}});
        const std::string key = to.substr(1, to.find('"', 1) - 1);
        CHECK_THROWS_WITH(tf::load_training_checkpoint(path, small, small_adam), Catch::Contains(path + ": training state") && Catch::Contains(key));
    }
}

TEST_CASE("eval says how many pairs its loss covers, and refuses when none fits the model", "[cli]") {
    CliFixture f;  // max_len 16: a side of more than 15 tokens cannot be scored
    const std::string long_line = "the dog sees a cat the dog sees a cat the dog sees a cat the dog";  // 16 tokens
    write_all(f.tmp / "a.src", "a big house\nthe dog\n");
    write_all(f.tmp / "a.ref", "la grando domo\n" + long_line + "\n");
    const Run some = run_cli(f.tmp, "eval --model " + shell_quote(f.model) + " --src " + shell_quote(f.tmp / "a.src") +
                                        " --ref " + shell_quote(f.tmp / "a.ref"));
    INFO("stderr: " << some.err);
    CHECK(some.status == 0);
    CHECK_THAT(some.err, Catch::Contains("the loss is of 1 of 2 pairs; 1 have a side longer than the model's 15 tokens"));

    write_all(f.tmp / "b.ref", long_line + "\n" + long_line + "\n");
    check_one_line_error(run_cli(f.tmp, "eval --model " + shell_quote(f.model) + " --src " + shell_quote(f.tmp / "a.src") +
                                            " --ref " + shell_quote(f.tmp / "b.ref")),
                         "none of the 2 pairs can be scored for loss");
}

TEST_CASE("translate --beam K counts the K hypotheses against --batch-tokens", "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);
    check_one_line_error(run_cli(f.tmp, "translate" + model + " --beam 5 --batch-tokens 4", kInput),
                         "--beam 5 decodes 5 hypotheses per sentence, each counted against --batch-tokens 4");
    // A budget of one sentence per batch translates exactly as one large batch.
    const Run small = run_cli(f.tmp, "translate" + model + " --beam 4 --batch-tokens 4", kInput);
    const Run large = run_cli(f.tmp, "translate" + model + " --beam 4 --batch-tokens 4096", kInput);
    INFO("stderr: " << small.err);
    CHECK(small.status == 0);
    CHECK(large.status == 0);
    CHECK(small.out == large.out);
}

TEST_CASE("an error quoting a line break from the file is still one line on stderr", "[cli]") {
    CliFixture f;
    // A tensor whose name and dtype hold line breaks (JSON "\n"): the message quotes them, escaped.
    const std::string header = "{\"a\\nb\":{\"dtype\":\"X\\nY\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    write_all(f.weights, bytes + header + std::string(4, '\0'));
    check_one_line_error(run_cli(f.tmp, "translate --model " + shell_quote(f.model), kInput),
                         "tensor 'a\\nb' has unknown dtype 'X\\nY'");
}

namespace {

// `tapeformer translate <args>` started with pipes to its stdin and from its stdout (stderr to `err`), for
// the tests that talk to it while it runs.
struct Child {
    pid_t pid = -1;
    int in = -1, out = -1;
};

Child start_cli(const std::string& args, const std::string& err) {
    int to_child[2], from_child[2];
    REQUIRE(::pipe(to_child) == 0);
    REQUIRE(::pipe(from_child) == 0);
    Child c;
    c.pid = ::fork();
    REQUIRE(c.pid >= 0);
    if (c.pid == 0) {
        ::dup2(to_child[0], STDIN_FILENO);
        ::dup2(from_child[1], STDOUT_FILENO);
        for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
        const std::string command = "exec " + shell_quote(TF_CLI) + " --threads 1 " + args + " 2>" + shell_quote(err);
        ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    c.in = to_child[1];
    c.out = from_child[0];
    return c;
}

// Reads from `fd` until `lines` newlines have come or `seconds` have passed; what came.
std::string read_lines_from(int fd, std::int64_t lines, double seconds) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::count(got.begin(), got.end(), '\n') < lines && std::chrono::steady_clock::now() < deadline) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        char buffer[4096];
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n <= 0) break;
        got.append(buffer, static_cast<std::size_t>(n));
    }
    return got;
}

std::string numbered_sentences(int first, int count) {
    const std::vector<std::string> words = {"the dog", "a cat", "sees", "the big house", "runs to", "a dog"};
    std::string text;
    for (int i = first; i < first + count; ++i) text += words[i % 6] + " " + words[(i / 6) % 6] + " " + words[(i / 36) % 6] + "\n";
    return text;
}

}  // namespace

TEST_CASE("translate streams its input in pieces: memory does not grow with the file, output comes before the input ends",
          "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);

    SECTION("a long file is translated piece by piece, each piece as if it were the whole input") {
        // 2000 lines a piece: pieces are translated independently, so the whole equals its pieces run apart.
        write_all(f.tmp / "all.txt", numbered_sentences(0, 4500));
        const Run all = run_cli(f.tmp, "translate" + model + " --input " + shell_quote(f.tmp / "all.txt"));
        REQUIRE(all.status == 0);
        std::string pieces;
        for (int first : {0, 2000, 4000}) {
            const Run piece = run_cli(f.tmp, "translate" + model, numbered_sentences(first, first == 4000 ? 500 : 2000));
            REQUIRE(piece.status == 0);
            pieces += piece.out;
        }
        CHECK(split_lines(all.out).size() == 4500);
        CHECK(all.out == pieces);
    }
    SECTION("from a pipe, the translations of what has arrived are written while the input is still open") {
        Child c = start_cli("translate" + model, f.tmp / "err.txt");
        const std::string first = numbered_sentences(0, 2001);  // one piece, and a line of the next
        REQUIRE(::write(c.in, first.data(), first.size()) == static_cast<ssize_t>(first.size()));
        const std::string got = read_lines_from(c.out, 2001, 120);
        CHECK(std::count(got.begin(), got.end(), '\n') == 2001);  // stdin is not closed yet
        ::close(c.in);
        const std::string rest = read_lines_from(c.out, 1, 120);
        ::close(c.out);
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
        CHECK(rest.empty());
    }
    SECTION("invalid UTF-8 after the first piece: one line naming the line, --output left as it was") {
        write_all(f.tmp / "bad.txt", numbered_sentences(0, 2499) + "a \xC3\x28 dog\n" + numbered_sentences(0, 10));
        const Run r = run_cli(f.tmp, "translate" + model + " --input " + shell_quote(f.tmp / "bad.txt") + " --output " +
                                         shell_quote(f.existing));
        check_one_line_error(r, "bad.txt:2500: invalid UTF-8");
        CHECK(read_all(f.existing) == "keep me\n");
        for (const auto& entry : fs::directory_iterator(f.tmp.path))
            CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
    }
    SECTION("Ctrl-C while translating into --output: the old file stays, no temporary file is left") {
        write_all(f.tmp / "long.txt", numbered_sentences(0, 200000));
        Child c = start_cli("translate" + model + " --input " + shell_quote(f.tmp / "long.txt") + " --output " +
                                shell_quote(f.existing),
                            f.tmp / "err.txt");
        ::close(c.in);
        // Wait for the temporary file: translation has begun.
        bool started = false;
        for (int i = 0; i < 1200 && !started; ++i) {
            for (const auto& entry : fs::directory_iterator(f.tmp.path))
                started |= entry.path().filename().string().rfind("existing.txt.tmp.", 0) == 0;
            if (!started) ::usleep(50000);
        }
        REQUIRE(started);
        ::kill(c.pid, SIGINT);
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        ::close(c.out);
        CHECK(WIFSIGNALED(status));
        CHECK(read_all(f.existing) == "keep me\n");
        for (const auto& entry : fs::directory_iterator(f.tmp.path))
            CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
        const std::string err = read_all(f.tmp / "err.txt");
        CHECK_THAT(err, Catch::Contains("interrupted by SIGINT after translating"));
        CHECK_THAT(err, Catch::Contains("left as it was"));
    }
}

TEST_CASE("translate answers a line-at-a-time client: each line's translation comes back before the next is sent",
          "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);
    // The answers a whole-input run gives, line for line.
    const std::string input = numbered_sentences(0, 5);
    const Run all = run_cli(f.tmp, "translate" + model, input);
    REQUIRE(all.status == 0);
    const std::vector<std::string> expected = split_lines(all.out), sent = split_lines(input);
    REQUIRE(expected.size() == 5);

    Child c = start_cli("translate" + model, f.tmp / "err.txt");
    for (std::size_t i = 0; i < sent.size(); ++i) {
        const std::string line = sent[i] + "\n";
        REQUIRE(::write(c.in, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
        // Bounded wait: a translate that holds the line back fails here instead of hanging the test.
        CHECK(read_lines_from(c.out, 1, 120) == expected[i] + "\n");
    }
    ::close(c.in);
    CHECK(read_lines_from(c.out, 1, 120).empty());
    ::close(c.out);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("translate on SIGINT or SIGTERM writes the translations it has finished and says how many", "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model);
    SECTION("waiting for input: the answers already given stand, and the message counts them") {
        for (int sig : {SIGINT, SIGTERM}) {
            Child c = start_cli("translate" + model, f.tmp / "err.txt");
            const std::string lines = numbered_sentences(0, 3);
            REQUIRE(::write(c.in, lines.data(), lines.size()) == static_cast<ssize_t>(lines.size()));
            const std::string got = read_lines_from(c.out, 3, 120);
            CHECK(std::count(got.begin(), got.end(), '\n') == 3);
            ::kill(c.pid, sig);  // translate is now blocked reading stdin, which stays open
            int status = 0;
            ::waitpid(c.pid, &status, 0);
            ::close(c.in);
            ::close(c.out);
            CHECK(WIFSIGNALED(status));
            CHECK(WTERMSIG(status) == sig);
            const std::string err = read_all(f.tmp / "err.txt");
            CHECK(err == std::string("tapeformer: interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                             ": wrote the translations of the first 3 input lines; the rest were not translated\n");
        }
    }
    SECTION("while translating a long file: the lines written are the lines the message counts") {
        write_all(f.tmp / "long.txt", numbered_sentences(0, 200000));
        Child c = start_cli("translate" + model + " --input " + shell_quote(f.tmp / "long.txt"), f.tmp / "err.txt");
        ::close(c.in);
        std::string got = read_lines_from(c.out, 1, 120);  // the first piece is out: translation is under way
        REQUIRE(!got.empty());
        ::kill(c.pid, SIGINT);
        for (std::string more; !(more = read_lines_from(c.out, 1, 120)).empty();) got += more;
        ::close(c.out);
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        CHECK(WIFSIGNALED(status));
        const std::size_t written = split_lines(got).size();
        CHECK(written < 200000);
        CHECK(read_all(f.tmp / "err.txt") == "tapeformer: interrupted by SIGINT: wrote the translations of the first " +
                                                 std::to_string(written) + " input lines; the rest were not translated\n");
    }
}

TEST_CASE("every subcommand names the real problem in one line: an unknown subcommand, a number that overflows or "
          "wraps, a file for a directory and a directory for a file", "[cli]") {
    CliFixture f;
    const std::string model = " --model " + shell_quote(f.model), existing = shell_quote(f.existing);
    const std::string huge = "99999999999999999999";  // past int64 and uint64
    const std::string tiny_init = " --init --d-model 8 --heads 2 --ffn 16 --layers 1 --vocab 20";
    const std::string src = shell_quote(write_file(f.tmp, "a.src", "a dog\n")), out = shell_quote(f.tmp / "out");
    const std::vector<std::pair<std::string, std::string>> cases = {
        // An unknown subcommand, at each level, with the closest name when one is near.
        {"translte" + model, "unknown subcommand 'translte' of `tapeformer` (did you mean 'translate'?)"},
        {"data toyy --out " + out, "unknown subcommand 'toyy' of `tapeformer data` (did you mean 'toy'?)"},
        {"bench trian", "unknown subcommand 'trian' of `tapeformer bench` (did you mean 'train'?)"},
        {"zzzzzzzz", "unknown subcommand 'zzzzzzzz' of `tapeformer`; see tapeformer --help"},
        // Numbers printed as typed: never saturated, never wrapped.
        {"translate" + model + " --batch-tokens " + huge, "--batch-tokens: must be an integer in [-9223372036854775808, "
                                                         "9223372036854775807], got " + huge},
        {"summary" + tiny_init + " --batch " + huge, "--batch: must be an integer in"},
        {"heads" + model + " --src " + src + " --tgt " + src + " --out " + out + " --batch-tokens " + huge, "got " + huge},
        {"data toy --out " + out + " --seed -1", "--seed: must be a non-negative integer, got -1"},
        {"data toy --out " + out + " --seed 18446744073709551616", "--seed: must be an integer in [0, 18446744073709551615], got "
                                                         "18446744073709551616"},
        {"translate" + model + " --beam -3", "--beam: must be > 0, got -3"},
        {"translate" + model + " --beam " + huge, "--beam: must be an integer in [-9223372036854775808, 9223372036854775807], got " + huge},
        {"train --preset toy --max-steps " + huge + " --out " + out, "--max-steps: must be an integer in [0, 1e+12], got " + huge},
        {"bench train --batch 2000000000", "--batch 2000000000 of 20 tokens (--src-len / --tgt-len) exceeds 100000000"},
        // A file where a directory is expected, and the other way round.
        {"translate --model " + existing, "--model '" + f.existing + "' is a file; expected a model directory"},
        {"encode --model " + existing, "--model '" + f.existing + "' is a file; expected a model directory"},
        {"summary --model " + existing, "--model '" + f.existing + "' is a file; expected a model directory"},
        {"attention" + model + " --src " + src + " --svg-dir " + existing, "--svg-dir '" + f.existing + "' is a file; expected a directory"},
        {"report" + model + " --out " + shell_quote(f.model), "--out '" + f.model + "' is a directory, not a file"},
        {"heads" + model + " --src " + src + " --tgt " + src + " --out " + existing, "--out '" + f.existing + "' is a file; expected a directory"},
        {"train --preset toy --max-steps 1 --out " + existing, "--out '" + f.existing + "' exists and is not a directory"},
        {"eval" + model + " --src " + shell_quote(f.model) + " --ref " + src, "--src: File is actually a directory"},
        {"translate" + model + " --output " + shell_quote(f.model), "--output '" + f.model + "' is a directory, not a file"},
    };
    for (const auto& [args, message] : cases) {
        INFO(args);
        check_one_line_error(run_cli(f.tmp, args), message);
    }
}

TEST_CASE("break it: a model with parts switched off is saved with them and used so by translate, eval, explain and summary",
          "[cli][break_it]") {
    TempDir tmp;
    const std::string dir = tmp / "model";
    const tf::ModelConfig c = write_model_dir(dir, [](tf::ModelConfig& m) {
        m.causal_mask = m.score_scaling = m.layer_norm = false;
        m.positional = tf::PositionalKind::None;
    });
    const tf::ModelBundle loaded = tf::load_model_dir(dir);
    CHECK(tf::to_metadata(loaded.model->config) == tf::to_metadata(c));
    // The loaded model's teacher-forced decoder is the saved one's, bit for bit, and sees the later targets
    // (a causal model of the same weights would not).
    tf::Transformer saved(c, 3);
    tf::ModelConfig causal_config = c;
    causal_config.causal_mask = true;
    tf::Transformer causal(causal_config, 3);
    const std::vector<std::int32_t> src = {5, 6, 7, 2}, dec_in = {1, 8, 9, 10};
    auto hidden = [&](tf::Transformer& m) {
        tf::NoGradGuard no_grad;
        const tf::Tensor memory = m.encode(src, 1, 4, tf::Pass{});
        const tf::Tensor h = m.decode(dec_in, 1, 4, memory, src, 4, tf::Pass{});
        return std::vector<float>(h.data(), h.data() + h.numel());
    };
    CHECK(hidden(*loaded.model) == hidden(saved));
    CHECK(hidden(*loaded.model) != hidden(causal));

    const std::string model = " --model " + shell_quote(dir);
    const Run translate = run_cli(tmp, "translate" + model, kInput);
    CHECK(translate.status == 0);
    CHECK(split_lines(translate.out).size() == 3);
    write_all(tmp / "src.txt", "a dog\n");
    const Run eval = run_cli(tmp, "eval" + model + " --src " + shell_quote(tmp / "src.txt") + " --ref " + shell_quote(tmp / "src.txt"));
    CHECK(eval.status == 0);
    const Run explain = run_cli(tmp, "explain" + model + " --tgt \"a dog\" --no-values --backward --break-grad layernorm-mean \"a dog\"");
    INFO("explain stderr: " << explain.err);
    CHECK(explain.status == 0);
    CHECK_THAT(explain.out, Catch::Contains("--positional none, --no-causal-mask, --no-score-scaling, --no-layer-norm"));
    CHECK_THAT(explain.out, Catch::Contains("not divided by √D"));
    CHECK_THAT(explain.out, Catch::Contains("no LayerNorm (--no-layer-norm)"));
    CHECK_THAT(explain.out, Catch::Contains("--break-grad layernorm-mean: the gradients below are deliberately wrong"));
    CHECK_THAT(explain.out, !Catch::Contains("+ positional encoding"));
    const Run summary = run_cli(tmp, "summary" + model + " --src-len 4 --tgt-len 4");
    INFO("summary stderr: " << summary.err);
    CHECK(summary.status == 0);
    CHECK_THAT(summary.out, Catch::Contains("Transformer") && !Catch::Contains("LayerNorm") && !Catch::Contains("PositionalEncoding"));
}

TEST_CASE("break it: the switches are train flags, refused in one line where they mean nothing", "[cli][break_it]") {
    TempDir tmp;
    const Run help = run_cli(tmp, "train --help");
    for (const char* flag : {"--no-causal-mask", "--no-score-scaling", "--no-residual", "--no-layer-norm", "sinusoidal, learned, none"})
        CHECK_THAT(help.out, Catch::Contains(flag));
    const std::string out = " --out " + shell_quote(tmp / "run");
    check_one_line_error(run_cli(tmp, "train --preset toy --no-score-scaling --attention additive" + out),
                         "score_scaling false (--no-score-scaling)");
    check_one_line_error(run_cli(tmp, "train --preset toy --no-layer-norm --norm pre" + out), "layer_norm false (--no-layer-norm)");
    check_one_line_error(run_cli(tmp, "train --preset toy --positional rotary" + out), "one of sinusoidal, learned, none");
    CHECK_FALSE(fs::exists(tmp / "run"));  // refused before anything was written
    // gradcheck and explain take the broken backward; training has no such flag.
    check_one_line_error(run_cli(tmp, "train --preset toy --break-grad layernorm-mean" + out), "--break-grad");
    check_one_line_error(run_cli(tmp, "gradcheck --break-grad softmax"), "--break-grad");
    check_one_line_error(run_cli(tmp, "explain --init --break-grad layernorm-mean \"a b\""), "--break-grad");
    const Run broken = run_cli(tmp, "gradcheck --op layer_norm --break-grad layernorm-mean");
    CHECK(broken.status == 0);  // with --break-grad: the wrong backward was caught
    CHECK_THAT(broken.out, Catch::Contains("without its mean term") && Catch::Contains("FAIL\n") &&
                               Catch::EndsWith("--break-grad layernorm-mean: caught by 1 check\n"));
    const Run missed = run_cli(tmp, "gradcheck --op softmax --break-grad layernorm-mean");
    CHECK(missed.status == 1);  // no check of softmax runs through LayerNorm
    CHECK_THAT(missed.out, Catch::Contains("PASS\n") && Catch::Contains("NOT caught"));
    CHECK_THAT(run_cli(tmp, "gradcheck --help").out, Catch::Contains("--break-grad"));

    // explain and summary build an untrained model (--init) with the same switches.
    const std::string init = " --init --d-model 8 --heads 2 --ffn 16 --layers 1";
    const Run paper = run_cli(tmp, "summary" + init + " --vocab 20"), no_norm = run_cli(tmp, "summary" + init + " --vocab 20 --no-layer-norm");
    CHECK_THAT(paper.out, Catch::Contains("1,984") && Catch::Contains("LayerNorm"));
    CHECK_THAT(no_norm.out, Catch::Contains("1,904") && !Catch::Contains("LayerNorm"));  // 5 LayerNorms of 2 x 8 fewer
    const Run explain = run_cli(tmp, "explain" + init + " --no-causal-mask --positional none --stage mask --no-values \"a b c\"");
    CHECK(explain.status == 0);
    CHECK_THAT(explain.out, Catch::Contains("post-norm, --positional none, --no-causal-mask") &&
                                Catch::Contains("self-attention, no causal mask"));
    check_one_line_error(run_cli(tmp, "explain" + init + " --no-layer-norm --norm pre \"a b\""), "layer_norm false");
    CliFixture f;
    check_one_line_error(run_cli(f.tmp, "explain --model " + shell_quote(f.model) + " --no-residual \"a dog\""),
                         "--no-residual: only with --init");
}

TEST_CASE("break it: a switch set in config.toml is kept in config.toml, run.json and the model", "[cli][break_it]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string out = tmp / "run";
    write_all(tmp / "config.toml", "causal-mask = false\nresidual = false\npositional = \"none\"\n");
    const Run train = run_cli(tmp, "train --config " + shell_quote(tmp / "config.toml") + " --train-src " +
                                       shell_quote(toy + "valid.src") + " --train-tgt " + shell_quote(toy + "valid.tgt") +
                                       " --tokenizer word --vocab-size 0 --d-model 8 --heads 2 --ffn 16 --layers 1"
                                       " --batch-tokens 400 --max-len 40 --max-steps 1 --out " + shell_quote(out));
    INFO("stderr: " << train.err);
    REQUIRE(train.status == 0);
    const std::string config = read_all(tmp / "run/config.toml");
    CHECK_THAT(config, Catch::Contains("causal-mask = false") && Catch::Contains("residual = false") &&
                           Catch::Contains("layer-norm = true") && Catch::Contains("score-scaling = true"));
    const nlohmann::json run = nlohmann::json::parse(read_all(tmp / "run/run.json"));
    CHECK(run.dump().find("\"causal_mask\":false") != std::string::npos);
    const tf::ModelBundle model = tf::load_model_dir(out);
    CHECK_FALSE(model.model->config.causal_mask);
    CHECK_FALSE(model.model->config.residual);
    CHECK(model.model->config.positional == tf::PositionalKind::None);
    CHECK(model.model->config.layer_norm);
}
