// The lessons in docs/ (lesson-*.md) are checked as a student would follow them:
//   - every `tapeformer` command in their ```sh blocks runs, with the CLI just built, in one scratch
//     directory per lesson (so a lesson's later commands see the files its earlier ones wrote), and
//     succeeds;
//   - every ```sh block that runs a tapeformer command is followed by at least one line
//       <!-- expect: TEXT -->
//     (between the closing fence and the next fence or heading), and each TEXT must occur in what the
//     block's tapeformer commands printed (stdout and stderr, all commands of the block together) — so a
//     lesson that says "look for X" cannot drift away from what the command prints;
//   - every `ctest ... -L NAME` in docs/*.md names a Catch2 tag [NAME] that some test in tests/ carries
//     (tests/tag_labels.cmake turns tags into CTest labels), and every `src/...`, `include/...`, `tests/...`
//     path the docs cite in backquotes exists.
// A command may go on over lines ending in `\`, as in the shell. docs/heads.md, the worked example of the
// head study, is checked the same way, on a smaller model (see its test). Commands of other tools in the
// blocks (cmake, dot, ctest) are left to the student.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "helpers.h"

using namespace tf_test;
namespace fs = std::filesystem;

namespace {

const std::string kDocs = std::string(TF_SOURCE_DIR) + "/docs";

std::vector<fs::path> doc_files(bool lessons_only) {
    std::vector<fs::path> out;
    for (const auto& entry : fs::directory_iterator(kDocs)) {
        const std::string name = entry.path().filename().string();
        if (entry.path().extension() != ".md") continue;
        if (lessons_only && name.rfind("lesson-", 0) != 0) continue;
        out.push_back(entry.path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

// One ```sh block: its tapeformer commands and the expectations that follow it.
struct Block {
    int line = 0;                       // 1-based line of the opening fence
    std::vector<std::string> commands;  // without the leading "tapeformer " and any trailing "  # comment"
    std::vector<std::string> expect;
};

std::vector<Block> sh_blocks(const std::string& text) {
    std::vector<Block> blocks;
    bool in_fence = false, in_sh = false, after_sh = false, continued = false;
    int number = 0;
    const std::string expect_open = "<!-- expect: ", expect_close = " -->";
    for (const std::string& line : split_lines(text)) {
        ++number;
        if (line.rfind("```", 0) == 0) {
            after_sh = false;
            if (!in_fence) {
                in_fence = true;
                in_sh = line == "```sh";
                if (in_sh) blocks.push_back(Block{number, {}, {}});
            } else {
                in_fence = false;
                after_sh = in_sh;
                in_sh = false;
            }
            continue;
        }
        if (in_sh && (line.rfind("tapeformer ", 0) == 0 || continued)) {
            std::string command = continued ? line : line.substr(std::string("tapeformer ").size());
            const std::size_t comment = command.find("  #");  // a trailing comment, as the lessons write them
            if (comment != std::string::npos) command = command.substr(0, comment);
            const bool continues = !command.empty() && command.back() == '\\';  // the shell's line continuation
            if (continues) command.pop_back();
            if (continued)
                blocks.back().commands.back() += " " + command;
            else
                blocks.back().commands.push_back(command);
            continued = continues;
            continue;
        }
        continued = false;
        if (!in_fence && line.rfind("#", 0) == 0) after_sh = false;  // a heading ends the block's section
        if (after_sh && line.rfind(expect_open, 0) == 0 && line.size() > expect_open.size() + expect_close.size() &&
            line.compare(line.size() - expect_close.size(), expect_close.size(), expect_close) == 0)
            blocks.back().expect.push_back(
                line.substr(expect_open.size(), line.size() - expect_open.size() - expect_close.size()));
    }
    return blocks;
}

std::string all_test_sources() {
    std::string all;
    for (const char* dir : {"/tests", "/tests/f64"})
        for (const auto& entry : fs::directory_iterator(std::string(TF_SOURCE_DIR) + dir))
            if (entry.path().extension() == ".cpp") all += read_all(entry.path().string());
    return all;
}

struct Counts {
    int commands = 0, expectations = 0;
};

// Runs a document's ```sh blocks in order in `dir`, each command through the CLI just built (after
// `adapt`), and checks each block's expectations against what its commands printed.
Counts run_doc(const fs::path& path, const TempDir& dir,
               const std::function<std::string(const std::string&)>& adapt) {
    Counts counts;
    const std::string name = path.filename().string();
    for (const Block& block : sh_blocks(read_all(path.string()))) {
        if (block.commands.empty()) continue;
        std::string printed;
        for (const std::string& command : block.commands) {
            INFO(name << ":" << block.line << ": tapeformer " << command);
            const std::string run = "cd " + shell_quote(dir.str()) + " && " + shell_quote(TF_CLI) + " --threads 1 " +
                                    adapt(command) + " >out.txt 2>err.txt";
            const int rc = std::system(run.c_str());
            const std::string out = read_all(dir / "out.txt"), err = read_all(dir / "err.txt");
            INFO("stderr: " << err);
            CHECK(rc == 0);
            CHECK_FALSE((out + err).empty());  // train logs to stderr, the others print to stdout
            printed += out + err;
            ++counts.commands;
        }
        INFO(name << ":" << block.line << ": the block of `tapeformer " << block.commands.front() << "`");
        CHECK_FALSE(block.expect.empty());  // every command says what to look for, and the test checks it
        for (const std::string& text : block.expect) {
            INFO("expected to see: " << text);
            CHECK(printed.find(text) != std::string::npos);
            ++counts.expectations;
        }
    }
    return counts;
}

}  // namespace

TEST_CASE("lessons: every tapeformer command in docs/lesson-*.md runs and prints what the lesson says", "[lessons][cli]") {
    int commands = 0, lessons = 0, expectations = 0;
    for (const fs::path& path : doc_files(true)) {
        ++lessons;
        TempDir tmp("lesson");
        const Counts counts = run_doc(path, tmp, [](const std::string& command) { return command; });
        commands += counts.commands;
        expectations += counts.expectations;
    }
    CHECK(lessons >= 8);
    CHECK(commands >= 20);
    CHECK(expectations >= commands / 2);
}

// docs/heads.md is a worked example on the toy preset's model (minutes of training, and its pasted numbers are
// that model's). Here its commands run in order on a smaller model trained the same way: every `train` gets
// `kSmallerModel` appended (flags override the preset), so the test checks that each command, path and
// checkpoint name of the document works and prints the tables it shows, not the numbers.
TEST_CASE("docs/heads.md: every command of the worked example runs, in order, on a smaller model", "[lessons][heads][cli]") {
    const std::string kSmallerModel = " --d-model 16 --ffn 32 --batch-tokens 1000 --time-budget 0 --valid-bleu-sentences 50";
    TempDir tmp("headsdoc");
    fs::create_directory_symlink(std::string(TF_SOURCE_DIR) + "/data", tmp / "data");
    const Counts counts = run_doc(fs::path(kDocs) / "heads.md", tmp, [&](const std::string& command) {
        return command.rfind("train ", 0) == 0 ? command + kSmallerModel : command;
    });
    CHECK(counts.commands >= 10);
    CHECK(counts.expectations >= counts.commands / 2);
}

TEST_CASE("lessons: the expectation convention is read as documented", "[lessons]") {
    const std::vector<Block> blocks = sh_blocks(
        "# t\n```sh\ntapeformer a --x  # note\nctest -L x\n```\n\nprose\n<!-- expect: one -->\n<!-- expect: two -->\n"
        "```text\nnot <!-- expect: inside -->\n```\n<!-- expect: after a text block -->\n```sh\ntapeformer b\n```\n"
        "## heading\n<!-- expect: too late -->\n```sh\ntapeformer c --y \\\n    --z  # note\ntapeformer d\n```\n");
    REQUIRE(blocks.size() == 3);
    CHECK(blocks[0].commands == std::vector<std::string>{"a --x"});
    CHECK(blocks[0].expect == std::vector<std::string>{"one", "two"});
    CHECK(blocks[1].commands == std::vector<std::string>{"b"});
    CHECK(blocks[1].expect.empty());
    CHECK(blocks[2].commands == std::vector<std::string>{"c --y      --z", "d"});  // a continued line joins the next
}

TEST_CASE("lessons: every ctest label and source path the docs name exists", "[lessons]") {
    const std::string tests = all_test_sources();
    const std::regex label(R"(ctest [^\n`]*-L ([A-Za-z0-9_]+))");
    const std::regex cited(R"(`((?:src|include|tests|docs|apps)/[A-Za-z0-9_./*-]+)`)");
    int labels = 0, paths = 0;
    for (const fs::path& path : doc_files(false)) {
        const std::string text = read_all(path.string());
        for (auto it = std::sregex_iterator(text.begin(), text.end(), label); it != std::sregex_iterator(); ++it) {
            const std::string tag = "[" + (*it)[1].str() + "]";
            INFO(path.filename().string() << " names ctest label " << (*it)[1].str());
            CHECK(tests.find(tag) != std::string::npos);
            ++labels;
        }
        for (auto it = std::sregex_iterator(text.begin(), text.end(), cited); it != std::sregex_iterator(); ++it) {
            const std::string p = (*it)[1].str();
            if (p.find('*') != std::string::npos) continue;  // a pattern such as tests/golden/*/x
            INFO(path.filename().string() << " cites " << p);
            CHECK(fs::exists(std::string(TF_SOURCE_DIR) + "/" + p));
            ++paths;
        }
    }
    CHECK(labels >= 5);
    CHECK(paths >= 20);
}

// catch_discover_tests splits a test name at ';' (a CMake list separator) into CTest entries that run
// nothing, so such a test would silently never run under ctest. The lessons tell students to run tests by
// label, so every name must survive that trip.
TEST_CASE("test case names contain no semicolon, which catch_discover_tests would split at", "[lessons][tests]") {
    const std::regex name(R"(TEST_CASE\s*\(\s*"((?:[^"\\]|\\.)*)\")");
    const std::string tests = all_test_sources();
    int names = 0;
    for (auto it = std::sregex_iterator(tests.begin(), tests.end(), name); it != std::sregex_iterator(); ++it) {
        INFO((*it)[1].str());
        CHECK((*it)[1].str().find(';') == std::string::npos);
        ++names;
    }
    CHECK(names >= 100);
}
