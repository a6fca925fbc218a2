// Exact-match accuracy (exact_match.h): a count of equal lines.
#include "tapeformer/metrics/exact_match.h"

#include <cstdio>
#include <stdexcept>

#include "tapeformer/data/text.h"

TF_NAMESPACE_BEGIN

double ExactMatch::fraction() const { return total ? double(matched) / double(total) : 0.0; }

std::string ExactMatch::format() const {
    char percent[32];
    std::snprintf(percent, sizeof percent, "%.2f%%", 100.0 * fraction());
    return "exact match = " + std::string(percent) + " (" + std::to_string(matched) + "/" + std::to_string(total) + ")";
}

ExactMatch exact_match(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
    if (hyps.size() != refs.size())
        throw std::invalid_argument("exact_match: " + std::to_string(hyps.size()) + " hypotheses but " +
                                    std::to_string(refs.size()) + " references");
    ExactMatch m;
    m.total = static_cast<std::int64_t>(hyps.size());
    for (std::size_t i = 0; i < hyps.size(); ++i) m.matched += trim(hyps[i]) == trim(refs[i]) ? 1 : 0;
    return m;
}

TF_NAMESPACE_END
