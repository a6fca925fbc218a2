// Exact-match accuracy: the fraction of hypotheses equal to their reference. The score of the toy tasks
// (copy, reverse): BLEU gives a half-reversed line partial credit, exact match gives it none.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

struct ExactMatch {
    std::int64_t matched = 0;  // hypotheses equal to their reference
    std::int64_t total = 0;    // hypotheses scored

    // matched / total, 0 when nothing was scored.
    double fraction() const;
    // e.g. "exact match = 97.50% (39/40)".
    std::string format() const;
};

// Counts the lines whose hypothesis equals its reference byte for byte once leading and trailing
// whitespace are trimmed from both (the decoder's detokenized output has none; a reference file may).
// Throws std::invalid_argument when the two sizes differ, naming both.
ExactMatch exact_match(const std::vector<std::string>& hyps, const std::vector<std::string>& refs);

TF_NAMESPACE_END
