// head_similarity(): the weight measures straight from each attention's parameters, the data measures from
// gated_pass (heads.h) batch by batch. Per batch and attention, the attention weights (B, H, Tq, Tk) give the
// Jensen–Shannon sums, and the gates' gradients (B, H, Tq, 1) the sums a Pearson correlation needs
// (Σx, Σx², Σxy), so nothing is kept from one batch to the next.
#include "tapeformer/study/heads_similarity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

TF_NAMESPACE_BEGIN

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

double jensen_shannon(const real* p, const real* q, std::int64_t n) {
    // JS = ½ Σ_k p_k ln(p_k/m_k) + ½ Σ_k q_k ln(q_k/m_k), m = (p + q)/2; a zero term is 0 (0 ln 0 = 0)
    double js = 0;
    for (std::int64_t k = 0; k < n; ++k) {
        const double a = p[k], b = q[k], m = 0.5 * (a + b);
        if (a > 0) js += 0.5 * a * std::log(a / m);
        if (b > 0) js += 0.5 * b * std::log(b / m);
    }
    return std::max(js, 0.0);  // rounding can leave −1e-17 for equal rows
}

std::vector<double> orthonormal_rows(const std::vector<double>& rows, std::int64_t C) {
    std::vector<double> basis;  // (rank, C)
    const std::int64_t r = std::int64_t(rows.size()) / C;
    for (std::int64_t i = 0; i < r; ++i) {
        std::vector<double> v(rows.begin() + i * C, rows.begin() + (i + 1) * C);
        double before = 0;
        for (double x : v) before += x * x;
        // modified Gram–Schmidt: v ← v − ⟨v, u⟩ u for every basis row u found so far
        for (std::size_t b = 0; b < basis.size(); b += std::size_t(C)) {
            double dot = 0;
            for (std::int64_t c = 0; c < C; ++c) dot += v[c] * basis[b + c];
            for (std::int64_t c = 0; c < C; ++c) v[c] -= dot * basis[b + c];
        }
        double after = 0;
        for (double x : v) after += x * x;
        if (before == 0 || std::sqrt(after) < 1e-9 * std::sqrt(before)) continue;  // in the span already
        const double inv = 1 / std::sqrt(after);
        for (double x : v) basis.push_back(x * inv);
    }
    return basis;
}

double subspace_overlap(const std::vector<double>& U, const std::vector<double>& V, std::int64_t C) {
    const std::int64_t ru = std::int64_t(U.size()) / C, rv = std::int64_t(V.size()) / C;
    if (ru == 0 || rv == 0) return kNaN;
    double sq = 0;  // ‖U Vᵀ‖²_F: the squared cosines between every pair of basis vectors
    for (std::int64_t i = 0; i < ru; ++i)
        for (std::int64_t j = 0; j < rv; ++j) {
            double dot = 0;
            for (std::int64_t c = 0; c < C; ++c) dot += U[i * C + c] * V[j * C + c];
            sq += dot * dot;
        }
    return sq / double(std::min(ru, rv));
}

double mean_off_diagonal(const std::vector<double>& m, std::int64_t H) {
    double s = 0;
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < H; ++i)
        for (std::int64_t j = 0; j < H; ++j)
            if (i != j && !std::isnan(m[std::size_t(i * H + j)])) {
                s += m[std::size_t(i * H + j)];
                ++n;
            }
    return n ? s / double(n) : kNaN;
}

double mean_diagonal(const std::vector<double>& m, std::int64_t H) {
    double s = 0;
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < H; ++i)
        if (!std::isnan(m[std::size_t(i * H + i)])) {
            s += m[std::size_t(i * H + i)];
            ++n;
        }
    return n ? s / double(n) : kNaN;
}

namespace {

// What one head's weights are, taken out of its attention's fused parameters (all row-major, double).
struct HeadWeights {
    std::vector<double> basis_q, basis_k, basis_v, basis_o;  // orthonormal rows (rank, C)
    std::vector<double> w_qk, w_ov;                           // (C, C)
};

HeadWeights head_weights(const MultiHeadAttention& m, std::int64_t h) {
    const std::int64_t C = m.C, D = m.D;
    const real* w = m.in_proj_weight.data();   // (3C, C): W_q, W_k, W_v, head h owning rows [hD, (h+1)D) of each
    const real* wo = m.out_proj.weight.data();  // (C, C): head h owns columns [hD, (h+1)D)
    auto rows = [&](std::int64_t first) {      // (D, C)
        return std::vector<double>(w + first * C, w + (first + D) * C);
    };
    const std::vector<double> q = rows(h * D), k = rows(C + h * D), v = rows(2 * C + h * D);
    std::vector<double> o(std::size_t(D * C));  // W_o^hᵀ (D, C): its rows span W_o^h's column space
    for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t d = 0; d < D; ++d) o[std::size_t(d * C + c)] = wo[c * C + h * D + d];
    HeadWeights out;
    out.basis_q = orthonormal_rows(q, C);
    out.basis_k = orthonormal_rows(k, C);
    out.basis_v = orthonormal_rows(v, C);
    out.basis_o = orthonormal_rows(o, C);
    // W_QK = W_qᵀ W_k (C, C): Σ_d q[d, a] k[d, b];  W_OV = W_o^h W_v^h (C, C): Σ_d o[d, a] v[d, b]
    out.w_qk.assign(std::size_t(C * C), 0);
    out.w_ov.assign(std::size_t(C * C), 0);
    for (std::int64_t d = 0; d < D; ++d)
        for (std::int64_t a = 0; a < C; ++a)
            for (std::int64_t b = 0; b < C; ++b) {
                out.w_qk[std::size_t(a * C + b)] += q[std::size_t(d * C + a)] * k[std::size_t(d * C + b)];
                out.w_ov[std::size_t(a * C + b)] += o[std::size_t(d * C + a)] * v[std::size_t(d * C + b)];
            }
    return out;
}

double frobenius_cosine(const std::vector<double>& a, const std::vector<double>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        ab += a[i] * b[i];
        aa += a[i] * a[i];
        bb += b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : kNaN;
}

// The weight measures between the heads of `x` (rows) and of `y` (columns): the same attention of one model,
// or of two.
void compare_weights(const MultiHeadAttention& x, const MultiHeadAttention& y, LayerSimilarity& out) {
    const std::int64_t H = x.H, C = x.C;
    std::vector<HeadWeights> wx, wy;
    for (std::int64_t h = 0; h < H; ++h) wx.push_back(head_weights(x, h));
    for (std::int64_t h = 0; h < H; ++h) wy.push_back(&x == &y ? wx[std::size_t(h)] : head_weights(y, h));
    for (auto* m : {&out.overlap_q, &out.overlap_k, &out.overlap_v, &out.overlap_o, &out.cos_qk, &out.cos_ov})
        m->assign(std::size_t(H * H), kNaN);
    for (std::int64_t i = 0; i < H; ++i)
        for (std::int64_t j = 0; j < H; ++j) {
            const HeadWeights &a = wx[std::size_t(i)], &b = wy[std::size_t(j)];
            const std::size_t ij = std::size_t(i * H + j);
            out.overlap_q[ij] = subspace_overlap(a.basis_q, b.basis_q, C);
            out.overlap_k[ij] = subspace_overlap(a.basis_k, b.basis_k, C);
            out.overlap_v[ij] = subspace_overlap(a.basis_v, b.basis_v, C);
            out.overlap_o[ij] = subspace_overlap(a.basis_o, b.basis_o, C);
            out.cos_qk[ij] = frobenius_cosine(a.w_qk, b.w_qk);
            out.cos_ov[ij] = frobenius_cosine(a.w_ov, b.w_ov);
        }
}

// Running sums of the data measures between the heads of two attentions (or one with itself).
struct DataSums {
    std::vector<double> js;                       // (H, H) Σ over queries of JS
    std::vector<double> sx, sxx, sy, syy, sxy;    // Pearson sums: x = row head's gate gradient, y = column head's
    std::int64_t queries = 0;
    explicit DataSums(std::int64_t H)
        : js(std::size_t(H * H)), sx(std::size_t(H * H)), sxx(std::size_t(H * H)), sy(std::size_t(H * H)),
          syy(std::size_t(H * H)), sxy(std::size_t(H * H)) {}
};

// One batch's attention weights and gate gradients of attention `x` (rows) against `y` (columns) — the same
// attention of two passes over the same batch.
void accumulate(const GatedAttention& x, const GatedAttention& y, const Batch& b, DataSums& s) {
    const std::int64_t H = x.module->H;
    const std::int64_t Tq = x.kind == HeadKind::E ? b.S : b.T, Tk = x.kind == HeadKind::D ? b.T : b.S;
    const real* wx = x.weights.data();  // (B, H, Tq, Tk)
    const real* wy = y.weights.data();  // (B, H, Tq, Tk)
    const real* gx = std::as_const(x.gate).grad();    // (B, H, Tq, 1)
    const real* gy = std::as_const(y.gate).grad();    // (B, H, Tq, 1)
    for (std::int64_t r = 0; r < b.B; ++r) {
        const std::int64_t q_len = x.kind == HeadKind::E ? b.src_len[r] : b.tgt_len[r];
        const std::int64_t k_len = x.kind == HeadKind::D ? b.tgt_len[r] : b.src_len[r];
        for (std::int64_t t = 0; t < q_len; ++t) {
            const std::int64_t visible = x.kind == HeadKind::D ? t + 1 : k_len;  // the keys query t sees
            for (std::int64_t i = 0; i < H; ++i)
                for (std::int64_t j = 0; j < H; ++j) {
                    const std::size_t ij = std::size_t(i * H + j);
                    s.js[ij] += jensen_shannon(wx + ((r * H + i) * Tq + t) * Tk, wy + ((r * H + j) * Tq + t) * Tk, visible);
                    const double a = gx ? gx[(r * H + i) * Tq + t] : 0.0, c = gy ? gy[(r * H + j) * Tq + t] : 0.0;
                    s.sx[ij] += a;
                    s.sxx[ij] += a * a;
                    s.sy[ij] += c;
                    s.syy[ij] += c * c;
                    s.sxy[ij] += a * c;
                }
            ++s.queries;
        }
    }
}

void finish(const DataSums& s, std::int64_t H, LayerSimilarity& out) {
    out.queries = s.queries;
    out.js.assign(std::size_t(H * H), kNaN);
    out.grad_corr.assign(std::size_t(H * H), kNaN);
    if (!s.queries) return;
    const double n = double(s.queries);
    for (std::size_t ij = 0; ij < std::size_t(H * H); ++ij) {
        out.js[ij] = s.js[ij] / n;
        // r = (n Σxy − Σx Σy) / √((n Σx² − (Σx)²)(n Σy² − (Σy)²))
        const double vx = n * s.sxx[ij] - s.sx[ij] * s.sx[ij], vy = n * s.syy[ij] - s.sy[ij] * s.sy[ij];
        if (vx > 0 && vy > 0) out.grad_corr[ij] = std::clamp((n * s.sxy[ij] - s.sx[ij] * s.sy[ij]) / std::sqrt(vx * vy), -1.0, 1.0);
    }
}

}  // namespace

SimilarityReport head_similarity(const std::vector<Transformer*>& models, const std::vector<std::string>& names,
                                 const std::vector<std::vector<Example>>& examples, const SimilarityOptions& options) {
    if (models.empty()) throw std::invalid_argument("heads similarity: no model");
    if (names.size() != models.size() || examples.size() != models.size())
        throw std::invalid_argument("heads similarity: one name and one sample per model");
    if (options.batch_tokens < 1) throw std::invalid_argument("heads similarity: --batch-tokens must be >= 1");
    const ModelConfig& c0 = models[0]->config;
    for (std::size_t k = 0; k < models.size(); ++k)
        if (models[k]->config.heads_removed())
            throw std::invalid_argument("heads similarity: --model " + names[k] + " had heads removed (head_counts " +
                                        models[k]->config.head_counts_text() + "); the measures compare attentions of " +
                                        "equal head counts, so give models with every head");
    for (std::size_t k = 1; k < models.size(); ++k) {
        const ModelConfig& c = models[k]->config;
        if (c.d_model != c0.d_model || c.heads != c0.heads || c.enc_layers != c0.enc_layers || c.dec_layers != c0.dec_layers)
            throw std::invalid_argument("heads similarity: --model " + names[k] + " (d_model " + std::to_string(c.d_model) +
                                        ", " + std::to_string(c.heads) + " heads, " + std::to_string(c.enc_layers) + "+" +
                                        std::to_string(c.dec_layers) + " layers) has another shape than --model " + names[0] +
                                        " (d_model " + std::to_string(c0.d_model) + ", " + std::to_string(c0.heads) +
                                        " heads, " + std::to_string(c0.enc_layers) + "+" + std::to_string(c0.dec_layers) +
                                        " layers): heads can only be compared between models of one shape");
    }
    for (std::size_t k = 0; k < models.size(); ++k) {
        if (examples[k].empty()) throw std::invalid_argument("heads similarity: no sentence pair to measure " + names[k] + " on");
        for (const Example& e : examples[k])
            if (std::int64_t(std::max(e.src.size(), e.tgt.size())) + 1 > models[k]->config.max_len)
                throw std::invalid_argument("heads similarity: a pair of " + std::to_string(e.src.size()) + " / " +
                                            std::to_string(e.tgt.size()) + " tokens is longer than the " +
                                            std::to_string(models[k]->config.max_len) + " positions of " + names[k]);
    }

    SimilarityReport report;
    report.C = c0.d_model;
    report.H = c0.heads;
    report.D = c0.d_model / c0.heads;
    report.pairs = std::int64_t(examples[0].size());
    report.across_data = true;
    for (std::size_t k = 1; k < models.size(); ++k) {
        bool same = examples[k].size() == examples[0].size();
        for (std::size_t i = 0; same && i < examples[0].size(); ++i)
            same = examples[k][i].src == examples[0][i].src && examples[k][i].tgt == examples[0][i].tgt;
        report.across_data = report.across_data && same;
    }
    const std::int64_t H = report.H;

    // Data sums: within[k][a] for model k's attention a; across[k][a] for model 0's attention a against model k's.
    std::size_t attentions = 0;
    for (HeadKind kind : {HeadKind::E, HeadKind::D, HeadKind::A}) attentions += std::size_t(layers_of(c0, kind));
    std::vector<std::vector<DataSums>> within(models.size(), std::vector<DataSums>(attentions, DataSums(H)));
    std::vector<std::vector<DataSums>> across(models.size(), std::vector<DataSums>(attentions, DataSums(H)));
    // Models passed over the same batches together: all of them when their tokens agree, else one at a time.
    std::vector<std::vector<std::size_t>> groups;
    if (report.across_data) {
        groups.emplace_back();
        for (std::size_t k = 0; k < models.size(); ++k) groups.back().push_back(k);
    } else {
        for (std::size_t k = 0; k < models.size(); ++k) groups.push_back({k});
    }
    for (const auto& group : groups) {
        const std::vector<Example>& data = examples[group[0]];
        for (const auto& indices : file_order_batches(data, options.batch_tokens)) {
            const Batch b = make_batch(data, indices);
            std::vector<std::vector<GatedAttention>> passes;
            for (std::size_t k : group) passes.push_back(gated_pass(*models[k], b, 0));
            for (std::size_t g = 0; g < group.size(); ++g)
                for (std::size_t a = 0; a < attentions; ++a) {
                    accumulate(passes[g][a], passes[g][a], b, within[group[g]][a]);
                    if (g > 0 && group[0] == 0) accumulate(passes[0][a], passes[g][a], b, across[group[g]][a]);
                }
        }
    }

    auto table = [&](std::size_t k, bool against_first) {
        SimilarityTable t;
        t.name = against_first ? names[0] + " vs " + names[k] : names[k];
        std::size_t a = 0;
        for (HeadKind kind : {HeadKind::E, HeadKind::D, HeadKind::A})
            for (int l = 0; l < layers_of(c0, kind); ++l, ++a) {
                LayerSimilarity s;
                s.kind = kind;
                s.layer = l;
                const MultiHeadAttention& mine = attention_of(*models[k], kind, l);
                compare_weights(against_first ? attention_of(*models[0], kind, l) : mine, mine, s);
                finish(against_first ? across[k][a] : within[k][a], H, s);
                t.layers.push_back(std::move(s));
            }
        return t;
    };
    for (std::size_t k = 0; k < models.size(); ++k) report.models.push_back(table(k, false));
    for (std::size_t k = 1; k < models.size(); ++k) report.across.push_back(table(k, true));
    return report;
}

namespace {

nlohmann::json matrix_json(const std::vector<double>& m, std::int64_t H) {  // NaN -> null
    nlohmann::json rows = nlohmann::json::array();
    for (std::int64_t i = 0; i < H; ++i) {
        nlohmann::json row = nlohmann::json::array();
        for (std::int64_t j = 0; j < H; ++j) {
            const double v = m[std::size_t(i * H + j)];
            row.push_back(std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v));
        }
        rows.push_back(row);
    }
    return rows;
}

nlohmann::json number_json(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }

std::string attention_name(const LayerSimilarity& s) { return std::string(1, to_char(s.kind)) + ":" + std::to_string(s.layer); }

struct Measure {
    const char* key;    // in the JSON
    const char* label;  // in the tables
    std::vector<double> LayerSimilarity::*field;
};

const Measure kMeasures[] = {
    {"js", "JS", &LayerSimilarity::js},
    {"grad_corr", "grad r", &LayerSimilarity::grad_corr},
    {"overlap_q", "ovl Q", &LayerSimilarity::overlap_q},
    {"overlap_k", "ovl K", &LayerSimilarity::overlap_k},
    {"overlap_v", "ovl V", &LayerSimilarity::overlap_v},
    {"overlap_o", "ovl O", &LayerSimilarity::overlap_o},
    {"cos_qk", "cos QK", &LayerSimilarity::cos_qk},
    {"cos_ov", "cos OV", &LayerSimilarity::cos_ov},
};

nlohmann::json table_json(const SimilarityTable& t, std::int64_t H, bool across) {
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerSimilarity& s : t.layers) {
        nlohmann::json l = {{"attention", attention_name(s)}, {"kind", std::string(1, to_char(s.kind))},
                            {"layer", s.layer}, {"queries", s.queries}};
        nlohmann::json off = nlohmann::json::object(), diag = nlohmann::json::object();
        for (const Measure& m : kMeasures) {
            l[m.key] = matrix_json(s.*m.field, H);
            off[m.key] = number_json(mean_off_diagonal(s.*m.field, H));
            diag[m.key] = number_json(mean_diagonal(s.*m.field, H));
        }
        l["mean_other_heads"] = off;
        if (across) l["mean_same_head"] = diag;
        layers.push_back(l);
    }
    return {{across ? "models" : "model", t.name}, {"layers", layers}};
}

void row(std::ostringstream& o, const std::string& label, const LayerSimilarity& s, std::int64_t H, bool diagonal) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "  %-18s", label.c_str());
    o << cell;
    for (const Measure& m : kMeasures) {
        const double v = diagonal ? mean_diagonal(s.*m.field, H) : mean_off_diagonal(s.*m.field, H);
        if (std::isnan(v)) std::snprintf(cell, sizeof cell, "%8s", "-");
        else std::snprintf(cell, sizeof cell, "%8.3f", v);
        o << cell;
    }
    o << "\n";
}

void header(std::ostringstream& o) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "  %-18s", "attention");
    o << cell;
    for (const Measure& m : kMeasures) {
        std::snprintf(cell, sizeof cell, "%8s", m.label);
        o << cell;
    }
    o << "\n";
}

}  // namespace

std::string similarity_json(const SimilarityReport& r) {
    nlohmann::json models = nlohmann::json::array(), across = nlohmann::json::array();
    for (const SimilarityTable& t : r.models) models.push_back(table_json(t, r.H, false));
    for (const SimilarityTable& t : r.across) across.push_back(table_json(t, r.H, true));
    const nlohmann::json j = {
        {"pairs", r.pairs}, {"d_model", r.C}, {"heads", r.H}, {"head_dim", r.D},
        {"chance_overlap", r.chance_overlap()},
        {"measures", {{"js", "Jensen-Shannon divergence of the attention maps, nats, mean over non-pad queries (max ln 2)"},
                      {"grad_corr", "Pearson correlation of the per-token gate gradients dL/dxi (token-summed NLL)"},
                      {"overlap_q", "||U_i^T U_j||_F^2 / D of orthonormal bases of the rows of W_q^h (chance D/C)"},
                      {"overlap_k", "the same for W_k^h"}, {"overlap_v", "the same for W_v^h"},
                      {"overlap_o", "the same for the columns of W_o^h"},
                      {"cos_qk", "Frobenius cosine of W_QK^h = W_q^h^T W_k^h"},
                      {"cos_ov", "Frobenius cosine of W_OV^h = W_o^h W_v^h"}}},
        {"across_data", r.across_data},
        {"models", models}, {"across", across}};
    return j.dump(1) + "\n";
}

std::string similarity_tables(const SimilarityReport& r) {
    std::ostringstream o;
    char line[512];
    std::snprintf(line, sizeof line,
                  "%lld pairs; d_model %lld, %lld heads of width %lld: the chance level of a subspace overlap is D/C = %.3f\n"
                  "JS: attention maps (nats, at most ln 2 = 0.693); grad r: correlation of per-token gate gradients;\n"
                  "ovl: subspace overlap of W_q, W_k, W_v, W_o; cos: Frobenius cosine of W_QK and W_OV\n\n",
                  (long long)r.pairs, (long long)r.C, (long long)r.H, (long long)r.D, r.chance_overlap());
    o << line;
    for (const SimilarityTable& t : r.models) {
        o << "model " << t.name << ": mean over pairs of different heads\n";
        header(o);
        for (const LayerSimilarity& s : t.layers) row(o, attention_name(s), s, r.H, false);
        o << "\n";
    }
    for (const SimilarityTable& t : r.across) {
        o << t.name << ": head h of the first against head h of the second (same), and against other heads\n";
        if (!r.across_data) o << "  (JS and grad r not measured: the models' tokenizers split the sample differently)\n";
        header(o);
        for (const LayerSimilarity& s : t.layers) {
            row(o, attention_name(s) + " same", s, r.H, true);
            row(o, attention_name(s) + " other", s, r.H, false);
        }
        o << "\n";
    }
    return o.str();
}

TF_NAMESPACE_END
