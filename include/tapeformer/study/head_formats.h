// The head study's results as files and text: heads.json, heads.csv, and layers × heads tables.
#pragma once
#include <string>
#include <vector>

#include "tapeformer/study/heads.h"
#include "tapeformer/study/provenance.h"

TF_NAMESPACE_BEGIN

// One object: settings, totals, "made_from" (what the study was computed from), "heads": [...].
std::string heads_json(const HeadReport& report, const StudyProvenance& made_from);
std::string heads_csv(const HeadReport& report);    // one row per head, a header line first
std::string heads_tables(const HeadReport& report); // per kind: layers × heads of importance, then entropy

// One cell of a layers × heads table: a head and its value as text ("0.1234", "closed").
struct HeadCell {
    HeadId id;
    std::string text;
};
// The layers × heads table of `kind` among `cells`, as text: "K = <describe(kind)>: <what>", a header
// "  layer   head 0   head 1 ...", then per layer its cells right-aligned in 9 columns, in the order given.
// Empty when no cell is of `kind`. (heads_tables and heads_l0.h's l0_table print theirs with it.)
std::string layer_head_table(HeadKind kind, const std::string& what, const std::vector<HeadCell>& cells);

TF_NAMESPACE_END
