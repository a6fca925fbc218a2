// Attention maps of one sentence pair: every head's weights in every attention, with the tokens they are
// between, as JSON (bertviz's layout), one SVG heatmap per layer × head, and a self-contained HTML page.
//
// bertviz (head_view / model_view) takes a list with one (1, H, Tq, Tk) tensor per layer; from the JSON:
//   import json, torch; d = json.load(open("attention.json"))
//   to_bertviz = lambda maps: [torch.tensor(layer)[None] for layer in maps]
//   model_view(encoder_attention=to_bertviz(d["encoder_self"]), decoder_attention=to_bertviz(d["decoder_self"]),
//              cross_attention=to_bertviz(d["cross"]), encoder_tokens=d["tokens"]["src"],
//              decoder_tokens=d["tokens"]["tgt_in"])
#pragma once
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/decode.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/study/provenance.h"

TF_NAMESPACE_BEGIN

using AttentionMatrix = std::vector<std::vector<double>>;  // [query][key], each row sums to 1

struct AttentionMaps {
    std::vector<std::string> src;      // source pieces + "</s>": the keys of E and A, the queries of E
    std::vector<std::string> tgt_in;   // "<s>" + target pieces: the queries of D and A, the keys of D
    std::vector<std::string> tgt_out;  // target pieces + "</s>": what each decoder position predicts
    bool decoded = false;              // the target came from greedy decoding (no --tgt)
    std::vector<std::vector<AttentionMatrix>> encoder_self, decoder_self, cross;  // [layer][head]
    std::vector<std::string> masked;   // heads whose gate was 0 (--mask-heads), "E:0:1": their weights are
                                       // still computed, but nothing they read reaches the output
};

// One teacher-forced pass (dropout off) of `src` and `tgt`; with tgt == nullptr the target is first
// decoded greedily with `decode`. Throws std::invalid_argument for an empty sentence or one longer than
// the model's positions.
AttentionMaps attention_maps(Transformer& model, const TokenizerPair& tokenizers, const std::string& src,
                             const std::string* tgt, const DecodeOptions& decode = {});

// {"tokens": {src, tgt_in, tgt_out}, "made_from": {...}, "encoder_self": ...}
std::string attention_json(const AttentionMaps& maps, const StudyProvenance& made_from);

// How each heatmap is drawn.
struct MapStyle {
    int cell_px = 28;      // pixels per cell side: a 10-token map is about 400 px wide, readable when projected
    bool numbers = false;  // each weight printed in its cell (for small maps)
};

// One heatmap: rows are queries, columns keys, darker = more weight, a colour bar from 0 to 1 beside it;
// the title, the axis titles (query, key) and the labels inside the picture, escaped for XML.
std::string attention_svg(const AttentionMatrix& weights, const std::vector<std::string>& queries,
                          const std::vector<std::string>& keys, const std::string& title, const MapStyle& style = {});

// Which layers and heads the page and the SVG files show (empty: all).
struct MapFilter {
    std::vector<int> layers, heads;
    bool shows(int layer, int head) const;
};

// A page with every selected heatmap, grouped by attention and layer: inline SVG and CSS, nothing fetched.
std::string attention_html(const AttentionMaps& maps, const MapFilter& filter, const std::string& title,
                           const MapStyle& style = {});

// bertviz's head view as one self-contained page: query tokens in a left column, key tokens in a right
// one, a line per (query, key) with opacity and width following the weight; selectors for the kind (only
// those the model has), the layer and the head (one, or all overlaid in per-head colours); hovering or
// clicking a query token leaves only its lines and prints each weight beside its key. Masked heads are
// drawn grey and labelled. The maps are embedded as JSON (script type="application/json", "<", ">" and
// "&" written as \u escapes); a Content-Security-Policy meta tag forbids every fetch.
std::string attention_view(const AttentionMaps& maps, const std::string& title);

// (file name, SVG) for every selected heatmap: "E-layer0-head1.svg", "D-...", "A-...".
std::vector<std::pair<std::string, std::string>> attention_svg_files(const AttentionMaps& maps, const MapFilter& filter,
                                                                    const MapStyle& style = {});

TF_NAMESPACE_END
