// The whole suite and its report: what `tapeformer gradcheck` runs and prints (gradcheck_suite.h,
// gradcheck_cli.h). Compiled for float64 only.
#include "tapeformer/gradcheck_suite.h"  // first: it opens tf::f64 as the inline namespace that it is
#include "tapeformer/gradcheck_cli.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

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

int run_gradcheck_cli(const GradcheckCliOptions& options) {
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
    return failed;
}

TF_NAMESPACE_END
