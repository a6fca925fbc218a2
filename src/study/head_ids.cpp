// Head names (KIND:layer:head) read and written, and heads masked through their gates (head_ids.h).
#include "tapeformer/study/head_ids.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tapeformer/number_text.h"

TF_NAMESPACE_BEGIN

char to_char(HeadKind kind) { return kind == HeadKind::E ? 'E' : kind == HeadKind::D ? 'D' : 'A'; }

const char* describe(HeadKind kind) {
    return kind == HeadKind::E ? "encoder self-attention"
           : kind == HeadKind::D ? "decoder self-attention"
                                 : "encoder-decoder (cross) attention";
}

// A decoder-only model has D heads only: no encoder (E), no cross-attention (A).
int layers_of(const ModelConfig& c, HeadKind kind) {
    if (c.decoder_only() && kind != HeadKind::D) return 0;
    return int(kind == HeadKind::E ? c.enc_layers : c.dec_layers);
}

int heads_of(const ModelConfig& c, HeadKind kind, int layer) { return int(c.heads_in(to_char(kind), layer)); }

std::string HeadId::str() const { return std::string(1, to_char(kind)) + ":" + std::to_string(layer) + ":" + std::to_string(head); }

namespace {

int parse_index(const std::string& item, const std::string& text, const char* what) {
    long long value = -1;
    const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits || read_integer(text, value) != NumberRead::ok || value > std::numeric_limits<int>::max())
        throw std::invalid_argument("head '" + item + "': the " + what + " must be a number >= 0, got '" + text + "'");
    return int(value);
}

HeadKind parse_kind(const std::string& kind, const std::string& where) {
    if (kind == "E") return HeadKind::E;
    if (kind == "D") return HeadKind::D;
    if (kind == "A") return HeadKind::A;
    throw std::invalid_argument(where + ": the kind must be E (encoder self-attention), D (decoder self-attention) " +
                                "or A (cross-attention), got '" + kind + "'");
}

}  // namespace

std::vector<HeadKind> parse_head_kinds(const std::string& spec) {
    std::vector<HeadKind> kinds;
    std::stringstream items(spec);
    for (std::string item; std::getline(items, item, ',');) {
        const HeadKind k = parse_kind(item, "kinds '" + spec + "'");
        if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
    }
    if (kinds.empty()) throw std::invalid_argument("kinds '" + spec + "' names none of E, D, A");
    return kinds;
}

std::vector<HeadId> parse_head_list(const std::string& spec, const ModelConfig& config) {
    std::vector<HeadId> heads;
    std::stringstream items(spec);
    std::string item;
    while (std::getline(items, item, ',')) {
        if (item.empty()) throw std::invalid_argument("head list '" + spec + "': an empty item (expected KIND:layer:head, e.g. E:0:1)");
        const std::size_t a = item.find(':'), b = a == std::string::npos ? a : item.find(':', a + 1);
        if (b == std::string::npos || item.find(':', b + 1) != std::string::npos)
            throw std::invalid_argument("head '" + item + "': expected KIND:layer:head, e.g. E:0:1 (KIND is E, D or A)");
        HeadId id;
        id.kind = parse_kind(item.substr(0, a), "head '" + item + "'");
        id.layer = parse_index(item, item.substr(a + 1, b - a - 1), "layer");
        id.head = parse_index(item, item.substr(b + 1), "head");
        if (layers_of(config, id.kind) == 0)
            throw std::invalid_argument("head '" + item + "': a decoder-only model has no " + describe(id.kind) +
                                        " (its heads are D:layer:head)");
        if (id.layer >= layers_of(config, id.kind))
            throw std::invalid_argument("head '" + item + "': the model's " + describe(id.kind) + " has layers 0.." +
                                        std::to_string(layers_of(config, id.kind) - 1));
        if (const int H = heads_of(config, id.kind, id.layer); id.head >= H)
            throw std::invalid_argument("head '" + item + "': the model has heads 0.." + std::to_string(H - 1) +
                                        (config.heads_removed() ? " in that attention (heads were removed)" : " in each attention"));
        if (std::find(heads.begin(), heads.end(), id) == heads.end()) heads.push_back(id);
    }
    if (heads.empty()) throw std::invalid_argument("head list '" + spec + "' names no head (expected e.g. E:0:1,A:2:3)");
    return heads;
}

MultiHeadAttention& attention_of(Transformer& model, HeadKind kind, int layer) {
    return const_cast<MultiHeadAttention&>(attention_of(static_cast<const Transformer&>(model), kind, layer));
}

const MultiHeadAttention& attention_of(const Transformer& model, HeadKind kind, int layer) {
    if (kind == HeadKind::E) return model.encoder.at(std::size_t(layer)).self_attn;
    if (kind == HeadKind::D) return model.decoder.at(std::size_t(layer)).self_attn;
    return model.decoder.at(std::size_t(layer)).multihead_attn;
}

void mask_heads(Transformer& model, const std::vector<HeadId>& heads) {
    for (HeadKind kind : kHeadKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            m.gate = Tensor::full({1, m.H, 1, 1}, 1);
        }
    for (const HeadId& h : heads) attention_of(model, h.kind, h.layer).gate.data()[h.head] = 0;
}

std::vector<HeadId> masked_heads(Transformer& model) {
    std::vector<HeadId> out;
    for (HeadKind kind : kHeadKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            const MultiHeadAttention& m = attention_of(model, kind, l);
            if (!m.gate.defined()) continue;  // never gated: every head open
            for (int h = 0; h < int(m.H); ++h)
                if (m.gate.data()[h] == 0) out.push_back(HeadId{kind, l, h});
        }
    return out;
}

TF_NAMESPACE_END
