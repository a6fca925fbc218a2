// Every fuzz target (tests/fuzz/targets.h) over its seed corpus and over every input a fuzzer once found a
// bug with: each must load or be refused with a one-line error, here in the Release build and under the
// sanitizers of the second test pass. Regression inputs are named after what they broke.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/targets.h"

namespace fs = std::filesystem;

namespace {

// The files of tests/fuzz/<kind>/<target>/, sorted so that a failure names the same file every run.
std::vector<fs::path> inputs(const std::string& kind, const std::string& target) {
    std::vector<fs::path> files;
    const fs::path dir = fs::path(TF_SOURCE_DIR) / "tests" / "fuzz" / kind / target;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file()) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    return files;
}

std::string contents(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void check_all(const std::string& kind) {
    for (const tf_fuzz::NamedTarget& t : tf_fuzz::all_targets()) {
        for (const fs::path& file : inputs(kind, t.name)) {
            const std::string bytes = contents(file);
            INFO(t.name << " on " << file.string());
            CHECK(tf_fuzz::run_checked(t.run, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) == "");
        }
    }
}

}  // namespace

TEST_CASE("every fuzz target has seeds", "[fuzz]") {
    for (const tf_fuzz::NamedTarget& t : tf_fuzz::all_targets()) {
        INFO(t.name);
        CHECK(inputs("corpus", t.name).size() >= 2);
    }
}

TEST_CASE("fuzz seed corpus: every loader accepts or refuses each seed with a one-line error", "[fuzz]") {
    check_all("corpus");
}

TEST_CASE("fuzz regressions: inputs that once crashed, hung or leaked are now refused cleanly", "[fuzz]") {
    check_all("regressions");
}
