// Graded exercises: a student writes one function of the library in a stub file of their own
// (docs/exercises/<name>.cpp is the untouched stub), and the grader checks it against the library's own
// implementation and against central finite differences, on random and edge-case inputs, naming the first
// wrong element with what was expected and what the student's code gave. `tapeformer exercise` compiles the
// student's file into a shared object and runs check_exercise on it (apps/cli/exercise_command.cpp).
//
// The functions are plain C over double arrays, so a student's file needs no header of the library. The
// grader runs in the float64 build (src/exercises/, target tapeformer_exercises); like gradcheck_cli.h,
// this header is free of `real` so that the float32 CLI can call it.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace tf {
namespace f64 {

struct ExerciseInfo {
    std::string name;       // "softmax_backward": the stub's file name and the function to write
    std::string title;      // one line: what the function computes
    std::string signature;  // the C declaration the grader looks for
};

// Every exercise, in the order a course takes them.
const std::vector<ExerciseInfo>& exercises();

// The exercise called `name`; throws std::invalid_argument listing the names when there is none.
const ExerciseInfo& find_exercise(const std::string& name);

// The untouched stub of exercise `name` (docs/exercises/<name>.cpp, built into the program).
std::string exercise_stub(const std::string& name);

// Loads `shared_object` (the student's compiled file), finds the exercise's function and runs every case,
// writing one line per case to `out` (flushed before each case runs, so that a case that crashes the
// student's code is the last one named). Returns the number of failed cases; throws std::runtime_error when
// the object cannot be loaded or does not define the function.
int check_exercise(const std::string& name, const std::string& shared_object, std::ostream& out);

}  // namespace f64
}  // namespace tf
