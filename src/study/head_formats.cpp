// The head study's results as JSON, CSV and layers × heads tables (head_formats.h).
#include "tapeformer/study/head_formats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "tapeformer/autograd.h"
#include "tapeformer/data/text.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/ops.h"
#include "tapeformer/random.h"
#include "provenance_json.h"


TF_NAMESPACE_BEGIN

std::string heads_json(const HeadReport& r, const StudyProvenance& made_from) {
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadStats& s : r.heads) {
        nlohmann::json h = {
            {"head", s.id.str()}, {"kind", std::string(1, to_char(s.id.kind))}, {"layer", s.id.layer}, {"index", s.id.head},
            {"importance", s.importance}, {"importance_raw", s.importance_raw},
            {"importance_signed_raw", s.importance_signed_raw}, {"masked", s.masked},
            {"grad_norm", {{"wq", s.grad_wq}, {"wk", s.grad_wk}, {"wv", s.grad_wv}, {"wo", s.grad_wo},
                           {"bq", s.grad_bq}, {"bk", s.grad_bk}, {"bv", s.grad_bv}}},
            {"entropy", s.entropy}, {"entropy_normalised", s.entropy_normalised}, {"confidence", s.confidence},
            {"eos_share", s.eos_share}, {"bos_share", s.bos_share}, {"value_norm", s.value_norm},
            {"punctuation_share", s.punctuation_share}, {"rare_share", s.rare_share}, {"rare_argmax_share", s.rare_argmax_share},
            {"rare_chance", s.rare_chance}, {"rare_queries", s.rare_queries}};
        if (s.id.kind != HeadKind::A) {
            h["mean_distance"] = s.mean_distance;
            h["argmax_offset"] = s.argmax_offset;
            h["argmax_offset_share"] = s.argmax_offset_share;
            h["positional"] = s.argmax_offset_share >= 0.9;
            h["attention_by_offset"] = s.attention_by_offset;
        }
        heads.push_back(std::move(h));
    }
    nlohmann::json out = {
        {"pairs", r.pairs}, {"batches", r.batches}, {"src_tokens", r.src_tokens}, {"tgt_tokens", r.tgt_tokens},
        {"loss", r.options.smoothed ? "label-smoothed cross-entropy, summed over target tokens" : "NLL, summed over target tokens"},
        {"loss_value", r.loss},
        {"granularity", to_string(r.options.granularity)},
        {"label_smoothing", r.options.smoothed ? r.options.label_smoothing : 0.0},
        {"importance_normalised", r.options.normalise},
        {"dropout", false},
        {"batch_tokens", r.options.batch_tokens},
        {"attention_by_offset", "mean attention at key offset j - i = -" + std::to_string(kOffsetReach) + " ... " +
                                    std::to_string(kOffsetReach) + ", the ends pooling the offsets beyond"},
        {"rare_outside_top", r.options.rare_outside_top},
        {"made_from", provenance_json(made_from)},
        {"heads", heads}};
    return out.dump(1) + "\n";
}

// JSON whose numbers print at float precision (9 digits): the gradients are floats, and the file has one
// number per head and token.
using FloatJson = nlohmann::basic_json<nlohmann::ordered_map, std::vector, std::string, bool, std::int64_t, std::uint64_t, float>;

std::string sentence_heads_json_line(const SentenceHeads& s, const TokenizerPair& tokenizers, const ModelConfig& config) {
    FloatJson heads = FloatJson::array();
    for (std::size_t i = 0; i < s.heads.size(); ++i) {
        const std::vector<double>& g = s.gate_grad[i];
        double magnitude = 0, sum = 0;
        for (double v : g) {
            magnitude += std::fabs(v);
            sum += v;
        }
        heads.push_back({{"head", s.heads[i].str()},
                         {"importance_token", g.empty() ? 0.0 : magnitude / double(g.size())},
                         {"importance_sentence", std::fabs(sum)},
                         {"importance_signed", sum},
                         {"gate_grad", g}});
    }
    FloatJson line = {{"line", s.example->line}};
    if (!config.decoder_only()) {
        std::vector<std::string> src;
        for (std::int32_t id : s.example->src) src.push_back(tokenizers.source->id_to_piece(id));
        src.push_back(tokenizers.source->id_to_piece(config.eos_id));
        line["src"] = src;
    }
    std::vector<std::string> tgt_in{tokenizers.target->id_to_piece(config.bos_id)};
    for (std::int32_t id : s.example->tgt) tgt_in.push_back(tokenizers.target->id_to_piece(id));
    line["tgt_in"] = tgt_in;
    line["heads"] = heads;
    return line.dump() + "\n";
}

std::string heads_csv(const HeadReport& r) {
    std::ostringstream o;
    o << "head,kind,layer,index,importance,importance_raw,importance_signed_raw,masked,grad_wq,grad_wk,grad_wv,grad_wo,grad_bq,grad_bk,grad_bv,"
         "entropy,entropy_normalised,confidence,eos_share,bos_share,value_norm,mean_distance,argmax_offset,argmax_offset_share,"
         "punctuation_share,rare_share,rare_argmax_share,rare_chance,rare_queries\n";
    o.precision(9);
    for (const HeadStats& s : r.heads) {
        const bool self = s.id.kind != HeadKind::A;
        o << s.id.str() << ',' << to_char(s.id.kind) << ',' << s.id.layer << ',' << s.id.head << ',' << s.importance << ','
          << s.importance_raw << ',' << s.importance_signed_raw << ',' << (s.masked ? 1 : 0) << ',' << s.grad_wq << ',' << s.grad_wk << ',' << s.grad_wv << ',' << s.grad_wo << ','
          << s.grad_bq << ',' << s.grad_bk << ',' << s.grad_bv << ',' << s.entropy << ',' << s.entropy_normalised << ','
          << s.confidence << ',' << s.eos_share << ',' << s.bos_share << ',' << s.value_norm << ',';
        if (self) o << s.mean_distance << ',' << s.argmax_offset << ',' << s.argmax_offset_share;
        else o << ",,";
        o << ',' << s.punctuation_share << ',' << s.rare_share << ',' << s.rare_argmax_share << ',' << s.rare_chance << ','
          << s.rare_queries << '\n';
    }
    return o.str();
}

std::string layer_head_table(HeadKind kind, const std::string& what, const std::vector<HeadCell>& cells) {
    int layers = 0, heads = 0;
    for (const HeadCell& c : cells)
        if (c.id.kind == kind) layers = std::max(layers, c.id.layer + 1), heads = std::max(heads, c.id.head + 1);
    if (!layers) return {};
    std::ostringstream o;
    char cell[32];
    o << to_char(kind) << " = " << describe(kind) << ": " << what << "\n  layer";
    for (int h = 0; h < heads; ++h) {
        std::snprintf(cell, sizeof cell, "%9s", ("head " + std::to_string(h)).c_str());
        o << cell;
    }
    o << "\n";
    for (int l = 0; l < layers; ++l) {
        std::snprintf(cell, sizeof cell, "  %5d", l);
        o << cell;
        for (const HeadCell& c : cells)
            if (c.id.kind == kind && c.id.layer == l) o << std::string(c.text.size() < 9 ? 9 - c.text.size() : 0, ' ') << c.text;
        o << "\n";
    }
    return o.str();
}

std::string heads_tables(const HeadReport& r) {
    const std::string importance = std::string("importance (") + to_string(r.options.granularity) +
                                   (r.options.normalise ? ", normalised per layer)" : ", raw)");
    const auto four_places = [](double x) {
        char text[400];  // room for any double in %f
        std::snprintf(text, sizeof text, "%.4f", x);
        return std::string(text);
    };
    std::vector<HeadCell> importances, entropies;
    for (const HeadStats& s : r.heads) {
        importances.push_back({s.id, four_places(s.importance)});
        entropies.push_back({s.id, four_places(s.entropy)});
    }
    std::string o;
    for (HeadKind kind : kHeadKinds) {
        const std::string tables = layer_head_table(kind, importance, importances) +
                                   layer_head_table(kind, "attention entropy (nats)", entropies);
        if (!tables.empty()) o += tables + "\n";
    }
    return o;
}

TF_NAMESPACE_END
