// The lessons in docs/ (lesson-*.md): every `tapeformer` command in their ```sh blocks runs, with the CLI
// just built, in a scratch directory, and succeeds — a lesson cannot tell a student to run something that
// fails. Commands of other tools in the blocks (cmake, dot, ctest) are left to the student.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "helpers.h"

using namespace tf_test;

TEST_CASE("lessons: every tapeformer command in docs/lesson-*.md runs and succeeds", "[lessons][cli]") {
    int commands = 0, lessons = 0;
    for (const auto& entry : std::filesystem::directory_iterator(std::string(TF_SOURCE_DIR) + "/docs")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("lesson-", 0) != 0 || entry.path().extension() != ".md") continue;
        ++lessons;
        TempDir tmp("lesson");
        bool in_sh = false;
        for (const std::string& line : split_lines(read_all(entry.path().string()))) {
            if (line.rfind("```", 0) == 0) {
                in_sh = !in_sh && line == "```sh";
                continue;
            }
            if (!in_sh || line.rfind("tapeformer ", 0) != 0) continue;
            std::string command = line.substr(std::string("tapeformer ").size());
            const std::size_t comment = command.find("  #");  // a trailing comment, as the lessons write them
            if (comment != std::string::npos) command = command.substr(0, comment);
            INFO(name << ": tapeformer " << command);
            const std::string run = "cd " + shell_quote(tmp.str()) + " && " + shell_quote(TF_CLI) + " --threads 1 " + command +
                                    " >out.txt 2>err.txt";
            CHECK(std::system(run.c_str()) == 0);
            CHECK_FALSE(read_all(tmp / "out.txt").empty());
            ++commands;
        }
    }
    CHECK(lessons >= 1);
    CHECK(commands >= 5);
}
