// What several test files need: a scratch directory, whole files read and written, lines, shell words,
// random values that are the same on every machine, a precision and a thread count for one case, a case
// that cannot run here reported as skipped, and (tapeformer_tests) one run of the executable.
#pragma once
#include <stdlib.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/random.h"

namespace tf_test {

// A fresh directory under the system temp dir (tf_<tag>_XXXXXX), removed with everything in it at scope exit.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& tag = "test") {
        std::string tmpl = (std::filesystem::temp_directory_path() / ("tf_" + tag + "_XXXXXX")).string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    std::string str() const { return path.string(); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// The whole file as bytes; "" when it cannot be read (tests compare against expected contents).
inline std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline void write_all(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
    if (!out.good()) throw std::runtime_error("cannot write " + path);
}

// Writes `bytes` to dir/name and returns the path.
inline std::string write_file(const TempDir& dir, const std::string& name, const std::string& bytes) {
    write_all(dir / name, bytes);
    return dir / name;
}

inline std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

inline std::string join_lines(const std::vector<std::string>& lines) {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
}

// A shell word: 'text' with every ' written as '\''.
inline std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// n values uniform in [-1, 1) from the counter-based Rng(seed): the same on every machine (as floats; for
// a Tensor, tf::random_tensor in gradcheck.h).
inline std::vector<float> uniform(std::size_t n, std::uint64_t seed) {
    tf::Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = float(rng.uniform() * 2 - 1);
    return v;
}

// The precision for one test case; fp32 again at its end, whatever happens.
struct PrecisionScope {
    explicit PrecisionScope(tf::Precision p) { tf::set_precision(p); }
    ~PrecisionScope() { tf::set_precision(tf::Precision::FP32); }
    PrecisionScope(const PrecisionScope&) = delete;
    PrecisionScope& operator=(const PrecisionScope&) = delete;
};

// A model small enough for a test case, by its sizes: V (source and target), C, H, F, encoder and decoder
// layers, positions; ModelConfig's defaults for the rest, which a case sets on what this returns.
inline tf::ModelConfig tiny_model_config(std::int64_t V, std::int64_t C, std::int64_t H, std::int64_t F,
                                         std::int64_t enc_layers, std::int64_t dec_layers, std::int64_t max_len) {
    tf::ModelConfig c;
    c.src_vocab = c.tgt_vocab = V;
    c.d_model = C;
    c.heads = H;
    c.ffn = F;
    c.enc_layers = enc_layers;
    c.dec_layers = dec_layers;
    c.max_len = max_len;
    return c;
}

// A random model and batch for decoding tests that need several groups of decoder rows (decode.cpp's
// kGroupRows) and products of every kind: 80 source sentences of 4-10 words (S 12, EOS, padding), d_model 64,
// FFN 256, 2 + 2 layers, 1500 words a side, the generator sharpened (×8) so that the argmax is clear.
struct DecodingCase {
    std::unique_ptr<tf::Transformer> model;
    std::vector<std::int32_t> src;  // (B, S)
    std::int64_t B = 80, S = 12;
};
inline DecodingCase sharpened_decoding_case() {
    DecodingCase d;
    tf::ModelConfig c = tiny_model_config(1500, 64, 2, 256, 2, 2, 64);
    d.model = std::make_unique<tf::Transformer>(c, 11);
    for (std::int64_t i = 0; i < d.model->generator.numel(); ++i) d.model->generator.data()[i] *= 8;
    tf::Rng rng(12);
    for (std::int64_t b = 0; b < d.B; ++b)
        for (std::int64_t s = 0; s < d.S; ++s)
            d.src.push_back(s < 4 + b % 7 ? std::int32_t(3 + rng.below(1497)) : s == 4 + b % 7 ? 2 : 0);
    return d;
}

// The thread count for one case (train() and some cases set it); the previous one again at its end.
struct ThreadsGuard {
    int before = tf::num_threads();
    ThreadsGuard() = default;
    ~ThreadsGuard() { tf::set_threads(before); }
    ThreadsGuard(const ThreadsGuard&) = delete;
    ThreadsGuard& operator=(const ThreadsGuard&) = delete;
};

// ---- skipped, not passed ------------------------------------------------------------------------------------
// A case that cannot check what it is for on this machine says so with this line, and ctest reports it as
// skipped instead of passed: SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt matches kSkipMarker. The
// marker goes out through Catch2's WARN, which the console reporter prints for passing cases too.
inline const char* const kSkipMarker = "TAPEFORMER-TEST-SKIPPED";

// Skipped for something this machine lacks and no install can give it (bf16 instructions).
inline void skipped(const std::string& why) { WARN(kSkipMarker << ": " << why); }

// Whether the tool a case needs (chromium, Graphviz's dot; `command -v` finds it) is missing. Missing, the
// case is skipped — unless TAPEFORMER_REQUIRE_TOOLS is set (scripts/test.sh, which installs the tools,
// sets it): then a missing tool fails the case, so a run meant to run everything cannot pass on a skip.
inline bool tool_missing(const std::string& tool, const std::string& why) {
    if (std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) == 0) return false;
    const char* required = std::getenv("TAPEFORMER_REQUIRE_TOOLS");
    if (required && *required && std::string(required) != "0")
        FAIL(tool << " is not installed, and TAPEFORMER_REQUIRE_TOOLS is set (scripts/test.sh): " << why);
    skipped(tool + " is not installed: " + why);
    return true;
}

// x rounded to bf16 (to nearest, ties to even) and back: what a bf16 product multiplies (the tests of
// --precision bf16 compare against reference::gemm on operands rounded this way).
inline float round_bf16(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    float y;
    std::memcpy(&y, &u, sizeof y);
    return y;
}

// The largest |x| of v: the scale a difference is measured against.
inline double largest_magnitude(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

#ifdef TF_CLI  // the tests that run the executable (tapeformer_tests)
// What one run of the executable did.
struct Run {
    int status = -1;  // exit status; -1 if it did not exit normally (e.g. crashed)
    std::string out, err;
};

// Runs `tapeformer --threads 1 <args>` (args already quoted as needed) with `input` on stdin; stdin, stdout
// and stderr pass through files in `scratch`.
inline Run run_cli(const TempDir& scratch, const std::string& args, const std::string& input = "") {
    const std::string in = scratch / "run.stdin", out = scratch / "run.stdout", err = scratch / "run.stderr";
    write_all(in, input);
    const std::string command = shell_quote(TF_CLI) + " --threads 1 " + args + " <" + shell_quote(in) + " >" + shell_quote(out) +
                                " 2>" + shell_quote(err);
    const int raw = std::system(command.c_str());
    Run r;
    r.status = (raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1;
    r.out = read_all(out);
    r.err = read_all(err);
    return r;
}
#endif

}  // namespace tf_test
