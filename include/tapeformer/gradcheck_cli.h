// The entry point of `tapeformer gradcheck`, implemented by the float64 gradient-check suite
// (src/gradcheck_suite/report.cpp, target tapeformer_gradcheck_suite) so that the float32 CLI can run its
// checks in double precision. Deliberately free of `real`.
#pragma once
#include <cstdint>
#include <string>

namespace tf {
namespace f64 {
struct GradcheckCliOptions {
    std::uint64_t seed = 1;
    std::string filter;  // run only checks whose name contains this text
    std::string op;      // non-empty: check this one op and print it element by element
    bool color = false;
    bool list_only = false;
    std::string break_grad;  // non-empty: run under this deliberately wrong backward (ops.h BrokenGradient)
    bool reference = false;  // check the reference ops (reference_ops.h; the global --reference)
};
// Prints the table (or, with `op`, one op element by element) to stdout; returns the number of failed checks,
// or, with `break_grad`, 0 when the wrong backward was caught (some check failed) and 1 when it was not.
// An unknown op throws std::invalid_argument listing the valid names.
int run_gradcheck_cli(const GradcheckCliOptions& options);
}  // namespace f64
}  // namespace tf
