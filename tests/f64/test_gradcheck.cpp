// The gradient checker itself (gradcheck.h), in float64: every primitive op passes, the suite checks exactly
// the ops ops.h declares, and the checker has teeth — a backward that is off by 1e-3 relative, or that forgets
// an input, is reported as failed.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/gradcheck_suite.h"
#include "tapeformer/ops.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

static_assert(sizeof(real) == sizeof(double), "the gradient-check tests must be built with TAPEFORMER_F64");

namespace {

// y = x ⊙ x with a hand-written backward that multiplies the true gradient 2x·g by `factor`.
Tensor square(const Tensor& x, double factor) {
    Tensor out = Tensor::empty(x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) out.data()[i] = x.data()[i] * x.data()[i];
    if (!tf::needs_grad({&x})) return out;
    return tf::record("square", out, {x}, [factor](Tensor& y, std::vector<Tensor>& in) {
        const real *g = y.grad(), *v = in[0].data();
        real* dx = in[0].grad();
        for (std::int64_t i = 0; i < y.numel(); ++i) dx[i] += real(factor) * 2 * v[i] * g[i];
    });
}

// y = a ⊙ b whose backward fills only a's gradient when `forget_b` is set.
Tensor product(const Tensor& a, const Tensor& b, bool forget_b) {
    Tensor out = Tensor::empty(a.shape());
    for (std::int64_t i = 0; i < a.numel(); ++i) out.data()[i] = a.data()[i] * b.data()[i];
    if (!tf::needs_grad({&a, &b})) return out;
    return tf::record("product", out, {a, b}, [forget_b](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        for (std::int64_t i = 0; i < y.numel(); ++i) {
            in[0].grad()[i] += g[i] * in[1].data()[i];
            if (!forget_b) in[1].grad()[i] += g[i] * in[0].data()[i];
        }
    });
}

void check_all_pass(const std::vector<tf::GradcheckResult>& results) {
    for (const tf::GradcheckResult& r : results) {
        INFO(r.name << " " << r.shapes << ": max abs error " << r.max_abs_error << ", max rel error " << r.max_rel_error);
        CHECK(r.passed);
        CHECK(r.checked > 0);
        CHECK(r.max_rel_error <= 1e-6);
    }
}

}  // namespace

TEST_CASE("gradcheck: every primitive op passes (seed 1)", "[gradcheck]") { check_all_pass(tf::check_primitive_ops(1)); }

// The list of ops to cover is derived, not written out: ops.h's declarations on one side, the suite's
// registered checks (primitive_op_names: the first word of each check's name) on the other. An op added to
// ops.h without a check, or a check that silently disappears, fails here.
TEST_CASE("gradcheck: the suite checks exactly the ops that ops.h declares", "[gradcheck]") {
    std::ifstream header(std::string(TF_SOURCE_DIR) + "/include/tapeformer/ops.h");
    REQUIRE(header);
    const std::regex declaration("^Tensor ([a-z_0-9]+)\\(");  // an op: a line that starts "Tensor name("
    std::set<std::string> declared;
    std::smatch m;
    for (std::string line; std::getline(header, line);)
        if (std::regex_search(line, m, declaration)) declared.insert(m[1]);
    // The reading has teeth: the ops every model uses are among what it found.
    for (const char* op : {"matmul", "softmax", "layer_norm", "cross_entropy"}) {
        INFO("op " << op);
        CHECK(declared.count(op) == 1);
    }
    const std::vector<std::string> names = tf::primitive_op_names();
    const std::set<std::string> checked(names.begin(), names.end());
    for (const std::string& op : declared) {
        INFO("ops.h declares " << op << "; no check in src/gradcheck_suite/primitive_ops.cpp is named after it");
        CHECK(checked.count(op) == 1);
    }
    for (const std::string& op : checked) {
        INFO("src/gradcheck_suite/primitive_ops.cpp checks '" << op << "', which ops.h does not declare");
        CHECK(declared.count(op) == 1);
    }
    // And every op named has at least one check that ran and passed.
    std::set<std::string> ran;
    for (const tf::GradcheckResult& r : tf::check_primitive_ops(1)) ran.insert(r.name.substr(0, r.name.find(' ')));
    CHECK(ran == checked);
}

TEST_CASE("gradcheck: every primitive op passes (seed 7)", "[gradcheck]") { check_all_pass(tf::check_primitive_ops(7)); }

TEST_CASE("gradcheck: every model block passes, additive attention scoring included", "[gradcheck][attention]") {
    const std::vector<tf::GradcheckResult> results = tf::check_model_blocks(1);
    std::set<std::string> names;
    for (const auto& r : results) names.insert(r.name);
    for (const char* block : {"attention: self + key padding mask + dropout", "attention: causal self + padding mask",
                              "attention: cross (decoder -> encoder)", "attention: head gates xi",
                              "attention: additive scores, causal self + padding mask"}) {
        INFO("block " << block);
        CHECK(names.count(block) == 1);
    }
    check_all_pass(results);
}

TEST_CASE("gradcheck: the suite has the efficient attentions, linear and local, in every use", "[gradcheck][attention]") {
    // They pass with every other block (check_all_pass above); here: that the suite has them.
    std::set<std::string> names;
    for (const auto& r : tf::check_model_blocks(1)) names.insert(r.name);
    for (const char* block : {"attention: linear, causal self + padding mask", "attention: linear, self + key padding mask",
                              "attention: linear, cross (decoder -> encoder)", "encoder layer (linear attention)",
                              "decoder layer (linear attention)", "attention: local window 2, causal self + padding mask",
                              "attention: local window 2, self + key padding mask", "decoder layer (local attention, window 2)"}) {
        INFO("block " << block);
        CHECK(names.count(block) == 1);
    }
}

TEST_CASE("gradcheck: the switched-off forms of the model pass too", "[gradcheck][break_it]") {
    // Every block with a part switched off is a composition of the same ops, so it passes like the paper's
    // (check_all_pass in the case above); here: that the suite has them.
    std::set<std::string> names;
    for (const auto& r : tf::check_model_blocks(1)) names.insert(r.name);
    for (const char* block : {"attention: unscaled dot scores, causal self + padding mask", "encoder layer (post-norm, no residual)",
                              "decoder layer (pre-norm, no residual)", "encoder layer (no LayerNorm)",
                              "decoder layer (no LayerNorm, no residual)",
                              "whole model to the loss (no causal mask, positional none, unscaled scores)"}) {
        INFO("block " << block);
        CHECK(names.count(block) == 1);
    }
}

TEST_CASE("gradcheck: LayerNorm's backward without its mean or variance term fails, and only inside the scope",
          "[gradcheck][break_it]") {
    for (tf::BrokenGradient broken : {tf::BrokenGradient::LayerNormMean, tf::BrokenGradient::LayerNormVariance}) {
        INFO(tf::to_string(broken));
        tf::GradcheckResult wrong;
        {
            tf::BrokenGradientScope scope(broken);
            wrong = tf::check_one_op("layer_norm", 1);
        }
        CHECK_FALSE(wrong.passed);
        CHECK(wrong.max_rel_error > 1e-2);  // not rounding: a missing term
    }
    CHECK(tf::check_one_op("layer_norm", 1).passed);  // the derived backward again after the scope
}

TEST_CASE("gradcheck: a backward off by 1e-3 relative fails, the exact one passes", "[gradcheck]") {
    const Tensor x = tf::random_tensor({3, 4}, 5);
    const tf::GradcheckResult exact = tf::gradcheck("square", [](auto& in) { return square(in[0], 1.0); }, {x});
    INFO("exact: max rel error " << exact.max_rel_error);
    CHECK(exact.passed);
    CHECK(exact.checked == 12);
    CHECK(exact.max_rel_error < 1e-8);

    const tf::GradcheckResult off = tf::gradcheck("square x1.001", [](auto& in) { return square(in[0], 1.001); }, {x});
    INFO("off by 1e-3: max rel error " << off.max_rel_error);
    CHECK_FALSE(off.passed);
    CHECK(off.max_rel_error > 0.9e-3);   // the checker measures the error it was given ...
    CHECK(off.max_rel_error < 1.1e-3);   // ... not more
    CHECK(off.name == "square x1.001");
    CHECK(off.shapes == "(3, 4)");

    // Inside a composition the wrong op is still found.
    const tf::GradcheckResult composed = tf::gradcheck(
        "softmax(square(x) W)", [](auto& in) { return tf::softmax(tf::matmul(square(in[0], 1.001), in[1])); },
        {tf::random_tensor({3, 4}, 6), tf::random_tensor({4, 5}, 7)});
    CHECK_FALSE(composed.passed);
}

TEST_CASE("gradcheck: a backward that forgets one input fails", "[gradcheck]") {
    const Tensor a = tf::random_tensor({2, 5}, 8), b = tf::random_tensor({2, 5}, 9);
    CHECK(tf::gradcheck("product", [](auto& in) { return product(in[0], in[1], false); }, {a, b}).passed);
    const tf::GradcheckResult missing =
        tf::gradcheck("product without db", [](auto& in) { return product(in[0], in[1], true); }, {a, b});
    CHECK_FALSE(missing.passed);
    CHECK(missing.max_rel_error == Approx(1));  // analytic 0 against the whole numeric gradient
    // Only inputs that require grad are checked: with b constant the missing gradient is not needed.
    const Tensor b_const = tf::random_tensor({2, 5}, 9, -1, 1, /*requires_grad=*/false);
    const tf::GradcheckResult only_a =
        tf::gradcheck("product, b constant", [](auto& in) { return product(in[0], in[1], true); }, {a, b_const});
    CHECK(only_a.passed);
    CHECK(only_a.checked == 10);
}

TEST_CASE("gradcheck: the table names every op and marks failures", "[gradcheck]") {
    std::vector<tf::GradcheckResult> results = tf::check_primitive_ops(1);
    results.push_back(tf::gradcheck("square x1.001", [](auto& in) { return square(in[0], 1.001); },
                                    {tf::random_tensor({2, 2}, 3)}));
    const std::string table = tf::format_gradcheck_table(results, /*color=*/false);
    CHECK(table.find('\033') == std::string::npos);
    std::istringstream lines(table);
    std::string line;
    std::vector<std::string> all;
    while (std::getline(lines, line)) all.push_back(line);
    for (const tf::GradcheckResult& r : results) {
        INFO("op " << r.name);
        bool found = false;
        for (const std::string& l : all)
            if (l.rfind(r.name + " ", 0) == 0 && l.find(r.shapes) != std::string::npos) {
                found = true;
                CHECK_THAT(l, Catch::EndsWith(r.passed ? "PASS" : "FAIL"));
            }
        CHECK(found);
    }
    const std::string n = std::to_string(results.size());
    CHECK_THAT(table, Catch::Contains(n + " checks: " + std::to_string(results.size() - 1) + " passed, 1 failed"));
    CHECK_THAT(tf::format_gradcheck_table(results, /*color=*/true), Catch::Contains("\033[31mFAIL"));
}
