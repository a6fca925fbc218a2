// summarize(): walks the model's modules in data-flow order and counts, for each, its parameters (from the
// module's own parameter list) and the multiply-adds of its products (from the shapes):
//   a linear layer (in → out) over N positions:     N · in · out
//   attention, Tq queries over Tk keys, H heads:    projections, then H · Tq · Tk · D for Q Kᵀ and as many for
//                                                   the weights times V
// Element-wise work (softmax, layer norm, activations) is left out, as torchinfo leaves it out.
#include "tapeformer/teach/summary.h"

#include <cstdio>
#include <sstream>
#include <stdexcept>

TF_NAMESPACE_BEGIN

namespace {

std::int64_t count(const ParamList& params) {
    std::int64_t n = 0;
    for (const auto& p : params) n += p.tensor.numel();
    return n;
}

template <class Module>
std::int64_t params_of(const Module& m) {
    ParamList list;
    m.parameters(list, "");
    return count(list);
}

// Multiply-adds of attention with Tq queries, Tk keys (and values) over a batch of B.
std::int64_t attention_mult_adds(const MultiHeadAttention& a, std::int64_t B, std::int64_t Tq, std::int64_t Tk) {
    const std::int64_t C = a.C;
    const std::int64_t q = B * Tq * C * C, kv = 2 * B * Tk * C * C;  // x W_qᵀ; x_kv W_kᵀ and x_kv W_vᵀ
    const std::int64_t scores = B * a.H * Tq * Tk * a.D;             // Q Kᵀ
    const std::int64_t mix = B * a.H * Tq * Tk * a.D;                // weights · V
    const std::int64_t out = B * Tq * C * C;                         // heads merged · W_oᵀ
    return q + kv + scores + mix + out;
}

std::int64_t ffn_mult_adds(const FeedForward& f, std::int64_t N) {
    return N * f.linear1.weight.size(0) * f.linear1.weight.size(1) + N * f.linear2.weight.size(0) * f.linear2.weight.size(1);
}

}  // namespace

ModelSummary summarize(const Transformer& model, std::int64_t B, std::int64_t S, std::int64_t T) {
    const ModelConfig& c = model.config;
    if (B < 1 || S < 1 || T < 1)
        throw std::invalid_argument("summary: batch, source and target lengths must be >= 1, got " + std::to_string(B) +
                                    ", " + std::to_string(S) + ", " + std::to_string(T));
    if (S > c.max_len || T > c.max_len)
        throw std::invalid_argument("summary: the model covers at most " + std::to_string(c.max_len) +
                                    " positions, asked for S " + std::to_string(S) + ", T " + std::to_string(T));
    const std::int64_t C = c.d_model, V = c.tgt_vocab;
    ModelSummary s;
    s.B = B, s.S = S, s.T = T;
    auto row = [&](int depth, std::string name, std::string kind, Shape out, std::int64_t params, std::int64_t mult_adds,
                   bool shared = false) {
        s.rows.push_back({depth, std::move(name), std::move(kind), out, params, shared, mult_adds});
        return s.rows.size() - 1;
    };
    auto add_parts = [&](std::size_t layer) {  // a layer's totals are those of the rows after it
        for (std::size_t r = layer + 1; r < s.rows.size(); ++r) {
            s.rows[layer].params += s.rows[r].params;
            s.rows[layer].mult_adds += s.rows[r].mult_adds;
        }
    };
    row(0, "", "Transformer", Shape{B, T, V}, 0, 0);

    row(1, "encoder.embedding", "Embedding", Shape{B, S, C}, model.src_embed.weight.numel(), 0);
    ParamList pos;
    model.positional.parameters(pos, "");
    row(1, "positional", c.positional == PositionalKind::Learned ? "PositionalEncoding, learned"
                                                                 : "PositionalEncoding, sinusoidal",
        Shape{B, S, C}, count(pos), 0);
    for (std::size_t i = 0; i < model.encoder.size(); ++i) {
        const EncoderLayer& l = model.encoder[i];
        const std::string p = "encoder.layers." + std::to_string(i);
        const std::size_t layer = row(1, p, "EncoderLayer", Shape{B, S, C}, 0, 0);
        row(2, p + ".self_attn", "MultiHeadAttention", Shape{B, S, C}, params_of(l.self_attn),
            attention_mult_adds(l.self_attn, B, S, S));
        row(2, p + ".norm1", "LayerNorm", Shape{B, S, C}, 2 * C, 0);
        row(2, p + ".linear1+linear2", "FeedForward", Shape{B, S, C}, params_of(l.ff), ffn_mult_adds(l.ff, B * S));
        row(2, p + ".norm2", "LayerNorm", Shape{B, S, C}, 2 * C, 0);
        add_parts(layer);
    }
    if (c.norm == NormPosition::Pre) row(1, "encoder.norm", "LayerNorm", Shape{B, S, C}, 2 * C, 0);

    const bool tgt_shared = c.tie == Tying::All;
    row(1, "decoder.embedding", "Embedding", Shape{B, T, C}, model.tgt_embed.weight.numel(), 0, tgt_shared);
    for (std::size_t i = 0; i < model.decoder.size(); ++i) {
        const DecoderLayer& l = model.decoder[i];
        const std::string p = "decoder.layers." + std::to_string(i);
        const std::size_t layer = row(1, p, "DecoderLayer", Shape{B, T, C}, 0, 0);
        row(2, p + ".self_attn", "MultiHeadAttention, causal", Shape{B, T, C}, params_of(l.self_attn),
            attention_mult_adds(l.self_attn, B, T, T));
        row(2, p + ".norm1", "LayerNorm", Shape{B, T, C}, 2 * C, 0);
        row(2, p + ".multihead_attn", "MultiHeadAttention, cross", Shape{B, T, C}, params_of(l.multihead_attn),
            attention_mult_adds(l.multihead_attn, B, T, S));
        row(2, p + ".norm2", "LayerNorm", Shape{B, T, C}, 2 * C, 0);
        row(2, p + ".linear1+linear2", "FeedForward", Shape{B, T, C}, params_of(l.ff), ffn_mult_adds(l.ff, B * T));
        row(2, p + ".norm3", "LayerNorm", Shape{B, T, C}, 2 * C, 0);
        add_parts(layer);
    }
    if (c.norm == NormPosition::Pre) row(1, "decoder.norm", "LayerNorm", Shape{B, T, C}, 2 * C, 0);
    row(1, "generator", "Linear, no bias", Shape{B, T, V}, model.generator.numel(), B * T * C * V, c.tie != Tying::None);

    for (std::size_t r = 1; r < s.rows.size(); ++r)
        if (s.rows[r].depth == 1) {
            if (!s.rows[r].shared) s.rows[0].params += s.rows[r].params;
            s.rows[0].mult_adds += s.rows[r].mult_adds;
        }
    s.total_params = s.rows[0].params;
    s.trainable_bytes = s.total_params * std::int64_t(sizeof(float));
    return s;
}

std::string format_summary(const ModelSummary& s) {
    auto with_commas = [](std::int64_t n) {
        std::string digits = std::to_string(n), out;
        for (std::size_t i = 0; i < digits.size(); ++i) {
            if (i && (digits.size() - i) % 3 == 0) out += ',';
            out += digits[i];
        }
        return out;
    };
    std::ostringstream o;
    const std::string rule(112, '=');
    char line[256];
    o << rule << "\n";
    std::snprintf(line, sizeof line, "%-62s %-18s %14s %15s\n", "Layer (type)", "Output shape", "Param #", "Mult-Adds");
    o << line << rule << "\n";
    for (std::size_t i = 0; i < s.rows.size(); ++i) {
        const SummaryRow& r = s.rows[i];
        // A layer's parts are named after the layer: "encoder.layers.0.self_attn" shows as "self_attn".
        std::string name = r.name;
        if (r.depth == 2) name = name.substr(name.find('.', name.find("layers.") + 7) + 1);
        const std::string label = std::string(std::size_t(2 * r.depth), ' ') + (r.depth ? "└─" : "") +
                                  (name.empty() ? r.kind : name + " (" + r.kind + ")");
        const std::string params = r.shared ? "(tied)" : r.params ? with_commas(r.params) : "--";
        const std::string macs = r.mult_adds ? with_commas(r.mult_adds) : "--";
        // printf pads by bytes; "└─" is 2 characters in 6 bytes
        const int pad = 62 + (r.depth ? 4 : 0);
        std::snprintf(line, sizeof line, "%-*s %-18s %14s %15s\n", pad, label.c_str(), r.output.str().c_str(),
                      params.c_str(), macs.c_str());
        o << line;
    }
    o << rule << "\n";
    o << "Total params: " << with_commas(s.total_params) << " (" << std::fixed;
    o.precision(2);
    o << double(s.trainable_bytes) / 1e6 << " MB as float32)\n";
    o << "Total mult-adds for a batch of " << s.B << " x (S " << s.S << ", T " << s.T << "): " << with_commas(s.rows[0].mult_adds)
      << " (" << double(s.rows[0].mult_adds) / 1e9 << " G); a training step does about 3x that (forward + backward)\n";
    o << rule << "\n";
    return o.str();
}

TF_NAMESPACE_END
