// attention_maps(): listens to every attention module's "weights" probe (AttentionProbes, heads.h) during
// one teacher-forced forward pass and copies them out per layer and head; the rest draws them.
#include "tapeformer/study/attention_maps.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/data/text.h"
#include "tapeformer/study/head_ids.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/teach/svg.h"
#include "provenance_json.h"

TF_NAMESPACE_BEGIN

namespace {

// weights (1, H, Tq, Tk) of one attention -> [head][query][key]
std::vector<AttentionMatrix> per_head(const Tensor& w) {
    const std::int64_t H = w.size(1), Tq = w.size(2), Tk = w.size(3);
    std::vector<AttentionMatrix> out(static_cast<std::size_t>(H),
                                     AttentionMatrix(static_cast<std::size_t>(Tq), std::vector<double>(static_cast<std::size_t>(Tk))));
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t q = 0; q < Tq; ++q)
            for (std::int64_t k = 0; k < Tk; ++k) out[h][q][k] = w.data()[(h * Tq + q) * Tk + k];
    return out;
}

const char* kind_name(char kind) {
    return kind == 'E' ? "encoder self-attention" : kind == 'D' ? "decoder self-attention (causal)" : "cross-attention";
}

}  // namespace

AttentionMaps attention_maps(Transformer& model, const TokenizerPair& tokenizers, const std::string& src_text,
                             const std::string* tgt_text, const DecodeOptions& decode) {
    const ModelConfig& c = model.config;
    const std::string src_line(trim(src_text));
    if (src_line.empty()) throw std::invalid_argument("attention: the source sentence is empty");
    std::vector<std::int32_t> src = tokenizers.source->encode(src_line);
    const auto too_long = [&](const char* side, std::size_t n) {
        if (std::int64_t(n) + 1 > c.max_len)
            throw std::invalid_argument(std::string("attention: the ") + side + " has " + std::to_string(n) +
                                        " tokens; the model covers " + std::to_string(c.max_len - 1) + " (plus EOS/BOS)");
    };
    too_long("source", src.size());
    src.push_back(c.eos_id);
    const std::int64_t S = std::int64_t(src.size());
    NoGradGuard no_grad;
    AttentionMaps maps;
    std::vector<std::int32_t> tgt;
    if (c.decoder_only()) {  // one sequence: the sentence itself is what the decoder reads (BOS + tokens)
        tgt = tokenizers.target->encode(tgt_text ? std::string(trim(*tgt_text)) : src_line);
    } else if (tgt_text) {
        const std::string line(trim(*tgt_text));
        if (line.empty()) throw std::invalid_argument("attention: the target sentence is empty (leave out --tgt to decode)");
        tgt = tokenizers.target->encode(line);
    } else {
        // The pass below reads BOS + target: the target may fill max_len - 1 positions, one fewer than
        // translation's cap (which needs no position for the token after the last).
        DecodeOptions capped = decode;
        capped.max_len_abs = int(std::min<std::int64_t>(capped.max_len_abs, c.max_len - 1));
        tgt = translate_batch(model, src, 1, S, capped).at(0);
        maps.decoded = true;
    }
    too_long("target", tgt.size());
    std::vector<std::int32_t> dec_in{c.bos_id};
    dec_in.insert(dec_in.end(), tgt.begin(), tgt.end());
    const std::int64_t T = std::int64_t(dec_in.size());

    AttentionProbes probes;
    Pass pass;
    pass.observer = &probes;
    model.forward(src, 1, S, dec_in, T, pass);
    if (!c.decoder_only())
        for (std::int32_t id : src) maps.src.push_back(tokenizers.source->id_to_piece(id));
    for (std::int32_t id : dec_in) maps.tgt_in.push_back(tokenizers.target->id_to_piece(id));
    for (std::size_t i = 1; i < dec_in.size(); ++i) maps.tgt_out.push_back(maps.tgt_in[i]);
    maps.tgt_out.push_back(tokenizers.target->id_to_piece(c.eos_id));
    for (int l = 0; l < layers_of(c, HeadKind::E); ++l) maps.encoder_self.push_back(per_head(probes.of(attention_of(model, HeadKind::E, l)).weights));
    for (int l = 0; l < int(c.dec_layers); ++l) {
        maps.decoder_self.push_back(per_head(probes.of(attention_of(model, HeadKind::D, l)).weights));
        if (layers_of(c, HeadKind::A) > 0) maps.cross.push_back(per_head(probes.of(attention_of(model, HeadKind::A, l)).weights));
    }
    for (const HeadId& h : masked_heads(model)) maps.masked.push_back(h.str());
    return maps;
}

std::string attention_json(const AttentionMaps& m, const StudyProvenance& made_from) {
    const nlohmann::json j = {
        {"tokens", {{"src", m.src}, {"tgt_in", m.tgt_in}, {"tgt_out", m.tgt_out}}},
        {"made_from", provenance_json(made_from)},
        {"target_decoded", m.decoded},
        {"layout", "[layer][head][query][key]; queries: src for encoder_self, tgt_in for decoder_self and cross"},
        {"encoder_self", m.encoder_self},
        {"decoder_self", m.decoder_self},
        {"cross", m.cross}};
    return j.dump() + "\n";
}

std::string attention_svg(const AttentionMatrix& w, const std::vector<std::string>& queries,
                          const std::vector<std::string>& keys, const std::string& title, const MapStyle& style) {
    Heatmap map;  // white (0) to dark blue (1), one square cell per (query, key)
    map.values = w;
    map.rows = queries;
    map.columns = keys;
    map.title = title;
    map.row_title = "query";
    map.column_title = "key";
    map.cell_width = map.cell_height = std::max(4, style.cell_px);
    map.cell_numbers = style.numbers;
    return heatmap_svg(map);
}

bool MapFilter::shows(int layer, int head) const {
    auto in = [](const std::vector<int>& list, int v) { return list.empty() || std::find(list.begin(), list.end(), v) != list.end(); };
    return in(layers, layer) && in(heads, head);
}

namespace {

// Calls f(kind, layer, head, matrix, queries, keys) for each selected heatmap.
template <class F>
void for_each_map(const AttentionMaps& m, const MapFilter& filter, F f) {
    const struct {
        char kind;
        const std::vector<std::vector<AttentionMatrix>>& maps;
        const std::vector<std::string>& queries;
        const std::vector<std::string>& keys;
    } groups[] = {{'E', m.encoder_self, m.src, m.src}, {'D', m.decoder_self, m.tgt_in, m.tgt_in}, {'A', m.cross, m.tgt_in, m.src}};
    for (const auto& g : groups)
        for (std::size_t l = 0; l < g.maps.size(); ++l)
            for (std::size_t h = 0; h < g.maps[l].size(); ++h)
                if (filter.shows(int(l), int(h))) f(g.kind, int(l), int(h), g.maps[l][h], g.queries, g.keys);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> attention_svg_files(const AttentionMaps& m, const MapFilter& filter,
                                                                    const MapStyle& style) {
    std::vector<std::pair<std::string, std::string>> files;
    for_each_map(m, filter, [&](char kind, int l, int h, const AttentionMatrix& w, const auto& q, const auto& k) {
        const std::string title = std::string(1, kind) + ":" + std::to_string(l) + ":" + std::to_string(h) + " " + kind_name(kind);
        files.push_back({std::string(1, kind) + "-layer" + std::to_string(l) + "-head" + std::to_string(h) + ".svg",
                         attention_svg(w, q, k, title, style)});
    });
    return files;
}

std::string attention_html(const AttentionMaps& m, const MapFilter& filter, const std::string& title, const MapStyle& style) {
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << xml_escape(title) << "</title>\n"
      << "<style>body{font-family:sans-serif;margin:1em 2em}h2{margin-top:1.5em}.row{display:flex;flex-wrap:wrap;gap:1em}"
         "figure{margin:0}figcaption{font-size:12px;color:#444}</style></head><body>\n"
      << "<h1>" << xml_escape(title) << "</h1>\n<p>Rows are queries, columns keys; darker is more attention (each row sums "
         "to 1); the bar beside each map gives the colours' values. Hover a cell for its weight. Heads are KIND:layer:head, "
         "0-based.</p>\n";
    auto join = [](const std::vector<std::string>& t) {
        std::string s;
        for (const auto& x : t) s += (s.empty() ? "" : " ") + x;
        return s;
    };
    o << "<p>source: <code>" << xml_escape(join(m.src)) << "</code><br>target" << (m.decoded ? " (greedy decoding)" : "")
      << ": <code>" << xml_escape(join(m.tgt_in)) << "</code></p>\n";
    char current_kind = 0;
    int current_layer = -1;
    for_each_map(m, filter, [&](char kind, int l, int h, const AttentionMatrix& w, const auto& q, const auto& k) {
        if (kind != current_kind || l != current_layer) {
            if (current_kind) o << "</div>\n";
            o << "<h2>" << kind << " = " << kind_name(kind) << ", layer " << l << "</h2>\n<div class=\"row\">\n";
            current_kind = kind;
            current_layer = l;
        }
        const std::string name = std::string(1, kind) + ":" + std::to_string(l) + ":" + std::to_string(h);
        // The head's name is the title inside its own picture: a caption under a map reads as the next one's.
        o << "<figure id=\"" << name << "\">" << attention_svg(w, q, k, name, style) << "</figure>\n";
    });
    if (current_kind) o << "</div>\n";
    o << "</body></html>\n";
    return o.str();
}

TF_NAMESPACE_END
