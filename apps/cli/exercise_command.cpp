// `tapeformer exercise`: graded exercises (exercises.h). `start` writes a stub into the student's folder,
// `check` compiles the student's file with the system's C++ compiler into a shared object and grades it in a
// child process, so that code which crashes is reported as a failed case instead of taking the tool down.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "cli/commands.h"
#include "tapeformer/exercises.h"
#include "tapeformer/io.h"

extern char** environ;

TF_NAMESPACE_BEGIN

namespace {

namespace fs = std::filesystem;
using f64::check_exercise;  // the grader runs in the float64 build (exercises.h)
using f64::exercise_stub;
using f64::exercises;
using f64::ExerciseInfo;
using f64::find_exercise;

struct ExerciseCommandOptions {
    std::string name, dir = ".", file;
};

// A scratch folder for the compiled object, removed with everything in it when the check ends.
struct ScratchDir {
    std::string path;
    ScratchDir() {
        std::string pattern = (fs::temp_directory_path() / "tapeformer-exercise-XXXXXX").string();
        if (!mkdtemp(pattern.data())) throw std::runtime_error(std::string("exercise check: cannot make a scratch folder: ") + std::strerror(errno));
        path = pattern;
    }
    ~ScratchDir() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
};

// Runs `args` (args[0] looked up on PATH) and returns its exit status; −1 when it could not be started.
int run_program(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// $CXX, or c++.
std::string compiler() {
    const char* cxx = std::getenv("CXX");
    return cxx && *cxx ? cxx : "c++";
}

void start(const ExerciseCommandOptions& o) {
    const std::string text = exercise_stub(o.name);  // an unknown name is refused before anything is written
    const fs::path target = fs::path(o.dir) / (o.name + ".cpp");
    std::error_code ec;
    if (fs::exists(fs::symlink_status(target, ec)))
        throw std::invalid_argument("exercise start: " + target.string() + " already exists; tapeformer never replaces your work "
                                    "(check it with: tapeformer exercise check " + o.name + " --file " + target.string() + ")");
    if (fs::exists(o.dir) && !fs::is_directory(o.dir)) throw std::invalid_argument("exercise start: --dir " + o.dir + " is not a directory");
    fs::create_directories(o.dir);
    write_file_atomic(target.string(), text);
    const ExerciseInfo& info = find_exercise(o.name);
    std::cout << "wrote " << target.string() << ": " << info.title << ".\n"
              << "Fill in the function, then check it with:\n  tapeformer exercise check " << o.name
              << (o.dir == "." ? "" : " --file " + target.string()) << "\n";
}

void check(const ExerciseCommandOptions& o) {
    const ExerciseInfo& info = find_exercise(o.name);
    const std::string file = o.file.empty() ? o.name + ".cpp" : o.file;
    if (!fs::is_regular_file(file))
        throw std::invalid_argument("exercise check: no file " + file + (o.file.empty() ? " here (start one with: tapeformer exercise start " + o.name +
                                                                             ", or name yours with --file)" : ""));
    ScratchDir scratch;
    const std::string object = scratch.path + "/" + o.name + ".so";
    std::cout << "exercise " << o.name << ": compiling " << file << " with " << compiler() << "\n" << std::flush;
    const int built = run_program({compiler(), "-std=c++17", "-O1", "-g", "-Wall", "-fPIC", "-shared", "-o", object, file});
    if (built == -1) throw std::runtime_error("exercise check: cannot run the C++ compiler '" + compiler() + "' (install g++, or set CXX)");
    if (built != 0) throw std::runtime_error("exercise check: " + file + " does not compile; the compiler's messages are above");

    std::cout << "checking " << info.signature << "\n" << std::flush;
    const pid_t child = fork();
    if (child < 0) throw std::runtime_error(std::string("exercise check: cannot start the grader: ") + std::strerror(errno));
    if (child == 0) {  // the grader, apart from the tool: the student's code may crash it
        int code = 1;
        try {
            code = check_exercise(o.name, object, std::cout) > 0 ? 1 : 0;
        } catch (const std::exception& e) {
            std::cout << std::flush;
            std::cerr << "tapeformer: error: exercise check: " << e.what() << "\n";
            code = 2;
        }
        std::cout << std::flush;
        _exit(code);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) throw std::runtime_error(std::string("exercise check: lost the grader: ") + std::strerror(errno));
    if (WIFSIGNALED(status)) {
        std::cout << "CRASHED\n" << std::flush;
        throw std::runtime_error("exercise check: your code crashed in the case above (" + std::string(strsignal(WTERMSIG(status))) +
                                 "): an index past the end of an array?");
    }
    command_exit_code() = WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace

void add_exercise_command(CLI::App& app) {
    auto opt = std::make_shared<ExerciseCommandOptions>();
    CLI::App* cmd = app.add_subcommand(
        "exercise",
        "Graded exercises: write one function of the library yourself and have it checked against the library's\n"
        "own code and against finite differences, on random and edge-case inputs.\n"
        "  tapeformer exercise list                      the exercises\n"
        "  tapeformer exercise start softmax_backward    writes softmax_backward.cpp, a stub to fill in\n"
        "  tapeformer exercise check softmax_backward    compiles it (with $CXX or c++) and grades it");
    cmd->require_subcommand(1);
    CLI::App* list = cmd->add_subcommand("list", "List the exercises with what each function computes");
    list->callback([]() {
        for (const ExerciseInfo& e : exercises()) std::cout << e.name << "  " << e.title << "\n";
    });
    CLI::App* start_cmd = cmd->add_subcommand("start", "Write the stub of exercise NAME to DIR/NAME.cpp (never over an existing file)");
    start_cmd->add_option("name", opt->name, "The exercise (see: tapeformer exercise list)")->required();
    start_cmd->add_option("--dir", opt->dir, "Where to write the stub")->capture_default_str();
    start_cmd->callback([opt]() { start(*opt); });
    CLI::App* check_cmd = cmd->add_subcommand(
        "check", "Compile your file for exercise NAME and grade it; exits 0 when every case passes, 1 otherwise");
    check_cmd->add_option("name", opt->name, "The exercise (see: tapeformer exercise list)")->required();
    check_cmd->add_option("--file", opt->file, "Your file (default: NAME.cpp in this folder)");
    check_cmd->callback([opt]() { check(*opt); });
}

TF_NAMESPACE_END
