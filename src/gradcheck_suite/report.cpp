// The whole suite and its report: what `tapeformer gradcheck` runs and prints (gradcheck_suite.h,
// gradcheck_cli.h). Compiled for float64 only.
#include "tapeformer/gradcheck_suite.h"  // first: it opens tf::f64 as the inline namespace that it is
#include "tapeformer/gradcheck_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "tapeformer/ops.h"
#include "tapeformer/reference_ops.h"

TF_NAMESPACE_BEGIN

std::vector<GradcheckResult> check_everything(std::uint64_t seed) {
    std::vector<GradcheckResult> all = check_primitive_ops(seed);
    std::vector<GradcheckResult> blocks = check_model_blocks(seed);
    all.insert(all.end(), blocks.begin(), blocks.end());
    return all;
}

std::string format_gradcheck_table(const std::vector<GradcheckResult>& results, bool color) {
    std::size_t wn = 2, ws = 6;
    for (const auto& r : results) {
        wn = std::max(wn, r.name.size());
        ws = std::max(ws, r.shapes.size());
    }
    std::string out;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%-*s  %-*s  %12s  %12s  %s\n", int(wn), "op", int(ws), "shapes", "max abs err",
                  "max rel err", "result");
    out += buf;
    out += std::string(wn + ws + 12 + 12 + 6 + 8, '-') + "\n";
    int failed = 0;
    for (const auto& r : results) {
        const char* verdict = r.passed ? (color ? "\033[32mPASS\033[0m" : "PASS") : (color ? "\033[31mFAIL\033[0m" : "FAIL");
        std::snprintf(buf, sizeof buf, "%-*s  %-*s  %12.2e  %12.2e  %s\n", int(wn), r.name.c_str(), int(ws), r.shapes.c_str(),
                      r.max_abs_error, r.max_rel_error, verdict);
        out += buf;
        failed += !r.passed;
    }
    std::snprintf(buf, sizeof buf, "%zu checks: %zu passed, %d failed (%s, central differences; a check fails when "
                                   "max|analytic - numeric| / max|numeric| > %.0e)\n",
                  results.size(), results.size() - failed, failed, sizeof(real) == 8 ? "float64" : "float32",
                  sizeof(real) == 8 ? 1e-6 : 1e-2);
    out += buf;
    return out;
}

std::string format_gradcheck_elements(const GradcheckResult& r) {
    std::string out;
    char buf[512];
    out += "gradcheck of " + r.name + ", inputs " + r.shapes + (sizeof(real) == 8 ? ", float64" : ", float32") + "\n";
    std::snprintf(buf, sizeof buf,
                  "For a fixed random r, L = sum(y * r). analytic: dL/dx from backward(y, r) (the op's backward);\n"
                  "numeric: (L(x + h) - L(x - h)) / 2h with h = %.0e, perturbing one element x at a time.\n"
                  "rel error = |analytic - numeric| / max(|analytic|, |numeric|)  (0 when both are 0)\n\n", r.step);
    out += buf;
    std::snprintf(buf, sizeof buf, "%-6s %-16s %16s %16s %12s %12s\n", "input", "element", "analytic", "numeric", "|a - n|", "rel error");
    out += buf;
    for (const GradcheckElement& e : r.elements) {
        // the element's position from its flat index, last axis fastest
        const Shape& s = r.input_shapes[e.input];
        std::vector<std::int64_t> pos(std::size_t(s.rank));
        std::int64_t rest = e.index;
        for (int a = s.rank - 1; a >= 0; --a) {
            pos[std::size_t(a)] = rest % s.dims[a];
            rest /= s.dims[a];
        }
        std::string p = "(";
        for (std::size_t a = 0; a < pos.size(); ++a) p += (a ? ", " : "") + std::to_string(pos[a]);
        p += ")";
        const double diff = std::fabs(e.analytic - e.numeric), scale = std::max(std::fabs(e.analytic), std::fabs(e.numeric));
        std::snprintf(buf, sizeof buf, "%-6zu %-16s %16.9f %16.9f %12.2e %12.2e\n", e.input, p.c_str(), e.analytic, e.numeric, diff,
                      scale > 0 ? diff / scale : 0.0);
        out += buf;
    }
    std::snprintf(buf, sizeof buf,
                  "\n%lld elements: max |a - n| = %.2e, max |a - n| / max |n| per input = %.2e (tolerance %.0e): %s\n",
                  static_cast<long long>(r.checked), r.max_abs_error, r.max_rel_error, r.tolerance, r.passed ? "PASS" : "FAIL");
    out += buf;
    return out;
}

int run_gradcheck_cli(const GradcheckCliOptions& options) {
    const BrokenGradient broken = parse_broken_gradient(options.break_grad.empty() ? "none" : options.break_grad);
    BrokenGradientScope scope(broken);
    const ReferenceModeScope reference(options.reference);
    if (options.reference && !options.list_only) std::cout << "--reference: the reference ops (src/reference_ops.cpp)\n\n";
    if (broken != BrokenGradient::None && !options.list_only)
        std::cout << "--break-grad " << to_string(broken) << ": a deliberately wrong backward, " << broken_gradient_description(broken)
                  << ". The checks through it should FAIL.\n\n";
    // With a wrong backward planted, the question is whether gradcheck catches it: then failed checks are
    // the expected outcome, and none failing is the one to report.
    auto verdict = [&](int failed) {
        if (broken == BrokenGradient::None) return failed;
        std::cout << "\n--break-grad " << to_string(broken) << ": "
                  << (failed ? "caught by " + std::to_string(failed) + (failed == 1 ? " check" : " checks")
                             : std::string("NOT caught: no check here runs through it"))
                  << "\n";
        return failed ? 0 : 1;
    };
    if (!options.op.empty()) {
        const GradcheckResult r = check_one_op(options.op, options.seed);
        std::cout << format_gradcheck_elements(r);
        return verdict(r.passed ? 0 : 1);
    }
    std::vector<GradcheckResult> all = check_everything(options.seed), picked;
    for (auto& r : all)
        if (options.filter.empty() || r.name.find(options.filter) != std::string::npos) picked.push_back(r);
    if (options.list_only) {
        for (auto& r : picked) std::cout << r.name << "\n";
        return 0;
    }
    std::cout << format_gradcheck_table(picked, options.color);
    int failed = 0;
    for (auto& r : picked) failed += !r.passed;
    return verdict(failed);
}

TF_NAMESPACE_END
