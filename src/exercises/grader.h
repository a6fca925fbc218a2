// What every exercise's checks share (exercises.h): cases that report what is wrong in words a student can
// act on, element comparisons with the first wrong index, central differences of a scalar function, and
// random inputs from a fixed seed so that every machine grades the same numbers.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/random.h"

TF_NAMESPACE_BEGIN

// One case: its name ("random 3 x 5 rows") and a check returning "" when the student's code passed, or
// what was wrong (several lines allowed).
struct GradedCase {
    std::string name;
    std::function<std::string()> run;
};

// An exercise as the grader sees it: its catalogue entry's name and the cases to run once the student's
// function is found at `fn`.
struct GradedExercise {
    const char* name;
    const char* title;
    const char* signature;
    std::vector<GradedCase> (*cases)(void* fn);
};

// The exercises, one definition each in src/exercises/<name>.cpp.
GradedExercise softmax_backward_exercise();
GradedExercise layer_norm_backward_exercise();
GradedExercise sinusoidal_positions_exercise();
GradedExercise attention_exercise();
GradedExercise label_smoothed_cross_entropy_exercise();
GradedExercise adam_step_exercise();
GradedExercise greedy_decode_exercise();

// "" when every got[i] is within atol + rtol·|expected[i]| of expected[i] (a NaN never is); else the first
// wrong element under `what`, indexed [row, col] with `cols` per row, expected and got, and how many are wrong.
std::string compare(const std::string& what, const std::vector<double>& expected, const std::vector<double>& got,
                    std::int64_t cols, double rtol, double atol);

// n values uniform in [lo, hi).
std::vector<double> uniform_values(Rng& rng, std::size_t n, double lo, double hi);

// ∂f/∂x[i] by central differences, (f(x + h e_i) − f(x − h e_i)) / 2h, for every i.
std::vector<double> central_differences(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> x, double h = 1e-6);

// An output buffer the student's function must fill: every value NaN until written, so that an element the
// code never writes is reported as such.
std::vector<double> unwritten(std::size_t n);

TF_NAMESPACE_END
