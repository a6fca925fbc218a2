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

// One line of heads_per_sentence.jsonl: {"line": the pair's line in the files, "src": the E heads' query
// tokens (source + "</s>"), "tgt_in": the D and A heads' (BOS + target), "heads": [{"head", "importance_token"
// Σ_t |g_t| / N_q, "importance_sentence" |Σ_t g_t|, "importance_signed" Σ_t g_t, "gate_grad" [g_t per query
// token]}]}: raw values, never normalised. A decoder-only model's line has no "src".
std::string sentence_heads_json_line(const SentenceHeads& sentence, const TokenizerPair& tokenizers, const ModelConfig& config);

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
