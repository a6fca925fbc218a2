// The graded exercises (exercises.h, `tapeformer exercise`): every untouched stub fails and every reference
// solution (tests/exercises/<name>.cpp) passes; a wrong answer is named element by element, a crash is a
// failed case, and the command's bad inputs are one line each.
#include <catch2/catch.hpp>

#include <string>

#include "helpers.h"

using namespace tf_test;

namespace {

const std::string kSolutions = std::string(TF_SOURCE_DIR) + "/tests/exercises/";
const std::vector<std::string> kExercises = {"softmax_backward", "layer_norm_backward", "sinusoidal_positions",
                                             "attention", "label_smoothed_cross_entropy", "adam_step",
                                             "greedy_decode"};

std::string last_line(const std::string& text) {
    const std::vector<std::string> lines = split_lines(text);
    return lines.empty() ? "" : lines.back();
}

}  // namespace

TEST_CASE("exercise: every untouched stub fails every case, every reference solution passes them all", "[exercise][cli]") {
    TempDir tmp("exercise");
    const Run list = run_cli(tmp, "exercise list");
    REQUIRE(list.status == 0);
    for (const std::string& name : kExercises) {
        INFO(name);
        CHECK(list.out.find(name + "  ") != std::string::npos);
        // start writes the stub of docs/exercises, byte for byte, and never over an existing file.
        const Run started = run_cli(tmp, "exercise start " + name + " --dir " + shell_quote(tmp / "work"));
        REQUIRE(started.status == 0);
        CHECK(read_all(tmp / ("work/" + name + ".cpp")) == read_all(std::string(TF_SOURCE_DIR) + "/docs/exercises/" + name + ".cpp"));
        const Run again = run_cli(tmp, "exercise start " + name + " --dir " + shell_quote(tmp / "work"));
        CHECK(again.status == 1);
        CHECK(again.err.find("already exists; tapeformer never replaces your work") != std::string::npos);

        const Run untouched = run_cli(tmp, "exercise check " + name + " --file " + shell_quote(tmp / ("work/" + name + ".cpp")));
        INFO(untouched.out << untouched.err);
        CHECK(untouched.status == 1);
        CHECK(last_line(untouched.out).find(name + ": 0 of ") == 0);
        // An output the stub never writes is named as such (adam_step updates p in place; greedy_decode returns
        // how many tokens it wrote).
        if (name != "adam_step" && name != "greedy_decode") CHECK(untouched.out.find("got nan (never written?)") != std::string::npos);

        const Run solved = run_cli(tmp, "exercise check " + name + " --file " + shell_quote(kSolutions + name + ".cpp"));
        INFO(solved.out << solved.err);
        CHECK(solved.status == 0);
        CHECK(solved.out.find("FAIL") == std::string::npos);
        const std::string summary = last_line(solved.out);
        CHECK(summary.find(name + ": ") == 0);
        const std::size_t of = summary.find(" of ");
        REQUIRE(of != std::string::npos);
        CHECK(summary.substr(name.size() + 2, of - name.size() - 2) + " cases passed" == summary.substr(of + 4));
    }
}

TEST_CASE("exercise: a wrong answer is named by element, expected and got, and a crash fails its case", "[exercise][cli]") {
    TempDir tmp("exercise");
    // LayerNorm backward without the mean term of dx: dbeta and dgamma right, dx wrong.
    std::string wrong = read_all(kSolutions + "layer_norm_backward.cpp");
    const std::string term = " - mean_g - x_hat[j]";
    REQUIRE(wrong.find(term) != std::string::npos);
    wrong.replace(wrong.find(term), term.size(), " - x_hat[j]");
    const std::string file = write_file(tmp, "layer_norm_backward.cpp", wrong);
    const Run r = run_cli(tmp, "exercise check layer_norm_backward --file " + shell_quote(file));
    INFO(r.out << r.err);
    CHECK(r.status == 1);
    CHECK(r.out.find("[1/6] random 4 x 6 rows, against the library and against central differences ... FAIL") != std::string::npos);
    CHECK(r.out.find("      dx[0, 0]: expected ") != std::string::npos);
    CHECK(r.out.find(", got ") != std::string::npos);
    CHECK(r.out.find("elements of dx are wrong (tolerance") != std::string::npos);

    // Greedy decoding that projects the whole prefix again at every step (no cache): the right tokens, but
    // each position must be projected once.
    std::string no_cache = read_all(kSolutions + "greedy_decode.cpp");
    const std::string once = "model->project(model->self, token, t, q.data(), k_cache + t * D, v_cache + t * D);";
    REQUIRE(no_cache.find(once) != std::string::npos);
    no_cache.replace(no_cache.find(once), once.size(),
                     "std::vector<int> prefix(out_tokens, out_tokens + n); prefix.insert(prefix.begin(), bos);"
                     "for (long s = 0; s <= t; ++s) model->project(model->self, prefix[s], s, q.data(), k_cache + s * D, v_cache + s * D);");
    const Run g = run_cli(tmp, "exercise check greedy_decode --file " + shell_quote(write_file(tmp, "greedy_decode.cpp", no_cache)));
    INFO(g.out << g.err);
    CHECK(g.status == 1);
    CHECK(g.out.find("[1/5] eos never wins: stops after max_len = 10 tokens ... FAIL") != std::string::npos);
    CHECK(g.out.find("with a cache, position i is projected once, in order (55 calls for 10 tokens)") != std::string::npos);

    // Writing far outside the array: the grader's process dies, the tool reports the case and exits 1.
    const std::string crash = write_file(tmp, "crash.cpp",
                                         "extern \"C\" void sinusoidal_positions(double* pe, long, long) { pe[-100000000] = 1; }\n");
    const Run c = run_cli(tmp, "exercise check sinusoidal_positions --file " + shell_quote(crash));
    INFO(c.out << c.err);
    CHECK(c.status == 1);
    CHECK(c.out.find("[1/4] 8 positions, C = 16 ... CRASHED") != std::string::npos);
    CHECK(c.err.find("your code crashed in the case above") != std::string::npos);
}

TEST_CASE("exercise: bad input is one line — an unknown exercise, a missing file, code that does not compile, no function",
          "[exercise][cli]") {
    TempDir tmp("exercise");
    auto one_line = [](const Run& r, const std::string& what) {
        INFO(r.out << r.err);
        CHECK(r.status > 0);
        CHECK(r.err.find(what) != std::string::npos);
        CHECK(r.err.find("tapeformer: error: ") == r.err.rfind("tapeformer: error: "));
    };
    one_line(run_cli(tmp, "exercise start softmax"), "no exercise 'softmax'; the exercises are softmax_backward, layer_norm_backward");
    one_line(run_cli(tmp, "exercise check softmax_backward --file " + shell_quote(tmp / "none.cpp")), "no file ");
    one_line(run_cli(tmp, "exercise check softmax_backward --file " + shell_quote(write_file(tmp, "bad.cpp", "this is not C++\n"))),
             "does not compile; the compiler's messages are above");
    one_line(run_cli(tmp, "exercise check softmax_backward --file " + shell_quote(write_file(tmp, "other.cpp", "extern \"C\" void f() {}\n"))),
             "the file defines no function softmax_backward");
    one_line(run_cli(tmp, "exercise start softmax_backward --dir " + shell_quote(write_file(tmp, "plain", "x"))), "is not a directory");
}
