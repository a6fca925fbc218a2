// train --preset copy|reverse: the task presets read what `tapeformer data copy|reverse` writes; without
// it they say how to make it, and the copy preset learns its task exactly as README says.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "helpers.h"

using namespace tf_test;

namespace {

// `cd DIR && tapeformer --threads 2 <args> < input`; the exit status, stderr into *err, stdout in DIR/cli.stdout.
int run_in(const TempDir& dir, const std::string& args, std::string* err = nullptr, const std::string& input = "/dev/null") {
    const std::string command = "cd " + shell_quote(dir.str()) + " && " + shell_quote(TF_CLI) + " --threads 2 " + args +
                                " <" + shell_quote(input) + " >" + shell_quote(dir / "cli.stdout") + " 2>" + shell_quote(dir / "cli.stderr");
    const int raw = std::system(command.c_str());
    if (err) *err = read_all(dir / "cli.stderr");
    return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

}  // namespace

TEST_CASE("presets: copy and reverse without their data name the command that writes it", "[presets]") {
    TempDir tmp("presets");
    for (const std::string task : {"copy", "reverse"}) {
        std::string err;
        CHECK(run_in(tmp, "train --preset " + task + " --out run", &err) == 1);
        CHECK(split_lines(err).size() == 1);
        CHECK(err.find("which does not exist: tapeformer data " + task + " --out data/" + task) != std::string::npos);
    }
}

TEST_CASE("presets: --preset copy copies every test sequence exactly (600 steps, seconds)", "[presets][learns]") {
    TempDir tmp("presets");
    std::string err;
    REQUIRE(run_in(tmp, "data copy --out data/copy", &err) == 0);
    REQUIRE(run_in(tmp, "train --preset copy --out run", &err) == 0);
    INFO(err);
    CHECK(err.find("valid @ step 600") != std::string::npos);
    REQUIRE(run_in(tmp, "translate --model run", &err, tmp / "data/copy/test.src") == 0);
    const auto hyps = split_lines(read_all(tmp / "cli.stdout")), refs = split_lines(read_all(tmp / "data/copy/test.tgt"));
    REQUIRE(hyps.size() == 1000);
    int exact = 0;
    for (std::size_t i = 0; i < hyps.size(); ++i) exact += hyps[i] == refs[i];
    CHECK(exact == 1000);
}

TEST_CASE("presets: --preset toy-lm, a decoder-only model of data/toy/train.src, writes sentences (600 steps)",
          "[presets][learns][decoder_only]") {
    TempDir tmp("presets");
    std::filesystem::create_directory_symlink(std::string(TF_SOURCE_DIR) + "/data", tmp / "data");
    std::string err;
    REQUIRE(run_in(tmp, "train --preset toy-lm --out run", &err) == 0);
    INFO(err);
    // Measured: validation perplexity 464 before training, 14.18 at step 600 (lesson-decoder-only.md).
    const std::size_t at = err.find("valid @ step 600 | loss ");
    REQUIRE(at != std::string::npos);
    const std::size_t ppl = err.find("ppl ", at);
    REQUIRE(ppl != std::string::npos);
    CHECK(std::stod(err.substr(ppl + 4)) < 15.0);
    REQUIRE(run_in(tmp, "generate --model run --prompt 'the woman' --temperature 0", &err) == 0);
    const std::string greedy = read_all(tmp / "cli.stdout");
    CHECK(greedy.rfind("the woman ", 0) == 0);
    CHECK(greedy.size() > 12);
    CHECK(greedy.substr(greedy.size() - 3) == " .\n");  // a whole sentence of the toy language, ended by the model
}
