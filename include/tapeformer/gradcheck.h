// Gradient checking: compare the tape's gradients with central finite differences.
//
// For f(inputs) -> y and a fixed random upstream vector r, the scalar L = Σ y·r has the analytic
// gradient that backward(y, r) computes, and the numeric one (L(x + h) − L(x − h)) / 2h for every input
// element. In the float64 build (`tf::f64`), h = 1e-6 leaves an error near 1e-9 relative, so a backward
// that is off by 1e-3 stands out by six orders of magnitude. The float32 build works too, with looser
// tolerances, but is only good for spotting gross errors.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

struct GradcheckOptions {
    double step = 1e-6;          // h; the float32 build uses 1e-2 when left at this default
    double tolerance = 1e-6;     // pass when max |analytic − numeric| / max |numeric| ≤ tolerance (float32: 1e-2)
    std::uint64_t seed = 1;      // for the upstream vector r
    std::int64_t max_per_input = 0;  // > 0: perturb only this many elements of each input, evenly spread
    bool keep_elements = false;  // keep every perturbed element's two gradients (`gradcheck --op` prints them)
};

// One perturbed input element: the gradient backward computed and the central difference.
struct GradcheckElement {
    std::size_t input = 0;       // which input
    std::int64_t index = 0;      // flat index into it
    double analytic = 0, numeric = 0;
};

struct GradcheckResult {
    std::string name;            // what was checked ("matmul (A Bᵀ)")
    std::string shapes;          // input shapes, "(2, 3) (4, 3)"
    double max_abs_error = 0;    // over all inputs that require grad
    double max_rel_error = 0;    // max over inputs of  max|a − n| / max|n|
    std::int64_t checked = 0;    // number of input elements perturbed
    bool passed = false;
    std::vector<Shape> input_shapes;          // with keep_elements
    std::vector<GradcheckElement> elements;   // with keep_elements, in the order perturbed
    double step = 0, tolerance = 0;           // the h and tolerance used
};

// f is called several times with the same inputs (perturbed one element at a time); it must be a pure
// function of its inputs (draw any randomness from a fresh Rng inside f). Only inputs with requires_grad
// are checked.
using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;
GradcheckResult gradcheck(const std::string& name, const GradcheckFn& f, std::vector<Tensor> inputs,
                          const GradcheckOptions& options = {});

// A random tensor with values uniform in [lo, hi), drawn from (seed, counter 0..n).
Tensor random_tensor(const Shape& shape, std::uint64_t seed, double lo = -1, double hi = 1, bool requires_grad = true);

// The suites of checks that use this (every op, every model block) are in gradcheck_suite.h.

TF_NAMESPACE_END
