// Reference mode (reference_ops.h) in float64: the hand-written backwards of the reference ops agree with
// central finite differences, op by op and through every model block, as the fast ops' do
// (test_gradcheck.cpp), with no product going through BLAS. And a broken LayerNorm gradient shows there too.
#include <catch2/catch.hpp>

#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/gradcheck_suite.h"
#include "tapeformer/ops.h"
#include "tapeformer/reference_ops.h"

static_assert(sizeof(tf::real) == sizeof(double), "the gradient-check tests must be built with TAPEFORMER_F64");

TEST_CASE("reference gradcheck: every primitive op and model block passes in reference mode", "[gradcheck][reference]") {
    tf::ReferenceModeScope reference;
    tf::ProductTimer products;  // counts every call into gemm (blas.h)
    const std::vector<tf::GradcheckResult> results = tf::check_everything(1);
    REQUIRE(results.size() > 20);
    for (const tf::GradcheckResult& r : results) {
        INFO(r.name << " " << r.shapes << ": max abs error " << r.max_abs_error << ", max rel error " << r.max_rel_error);
        CHECK(r.passed);
        CHECK(r.checked > 0);
        CHECK(r.max_rel_error <= 1e-6);
    }
    CHECK(products.calls == 0);  // every product was the reference's three loops
}

TEST_CASE("reference gradcheck: a LayerNorm backward without its mean term fails in reference mode too",
          "[gradcheck][reference]") {
    tf::ReferenceModeScope reference;
    tf::BrokenGradientScope broken(tf::BrokenGradient::LayerNormMean);
    const tf::GradcheckResult r = tf::check_one_op("layer_norm", 1);
    INFO(r.name << ": max rel error " << r.max_rel_error);
    CHECK_FALSE(r.passed);
}
