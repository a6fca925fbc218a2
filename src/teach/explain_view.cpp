// The printout of an explanation (explain.h): the stages a view selects, with their numbers, checks and
// gradient norms, and the mask drawn as a picture. explain.cpp builds the stages from the model's probes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "tapeformer/teach/explain.h"
#include "tapeformer/io.h"

TF_NAMESPACE_BEGIN

namespace {

std::string value_str(real v) {
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    return fmt("%.4f", double(v));
}

std::string pad(const std::string& s, std::size_t w) {
    std::string t = s.size() > w - 1 ? s.substr(0, w - 1) : s;
    return t + std::string(w - t.size(), ' ');
}

// How many of `n` rows or columns a view limit of `shown` prints (0: all).
std::int64_t first(std::int64_t n, std::int64_t shown) { return shown > 0 ? std::min(n, shown) : n; }

// The mask as a picture: one row per query (or one row for all queries), "0" keeps, "-inf" drops; the
// first 12 rows and keys, or more when the view asks for more.
std::string mask_picture(const Tensor& mask, const std::vector<std::string>& queries, const std::vector<std::string>& keys,
                         const ExplainView& v) {
    const std::int64_t mq = first(mask.size(2), v.rows > 0 ? std::max<std::int64_t>(v.rows, 12) : 0);
    const std::int64_t Tk = mask.size(3), shown_keys = first(Tk, v.cols > 0 ? std::max<std::int64_t>(v.cols, 12) : 0);
    std::ostringstream o;
    o << "mask " << mask.shape().str() << (mask.size(2) == 1 ? ", the same for every query:" : ", row = query, column = key:") << "\n";
    o << "        ";
    for (std::int64_t k = 0; k < shown_keys; ++k) o << pad(keys.size() > std::size_t(k) ? keys[k] : "", 6);
    o << "\n";
    for (std::int64_t q = 0; q < mq; ++q) {
        o << pad(mask.size(2) == 1 ? "all" : (queries.size() > std::size_t(q) ? queries[q] : ""), 8);
        for (std::int64_t k = 0; k < shown_keys; ++k) o << pad(std::isinf(mask.data()[q * Tk + k]) ? "-inf" : "0", 6);
        o << "\n";
    }
    return o.str();
}

}  // namespace

// ---- the printout ---------------------------------------------------------------------------------------------

namespace {

bool shown(const ExplainStage& s, const ExplainView& v) {
    if (v.layer >= 0 && s.layer != v.layer) return false;
    if (!v.stages.empty() && std::find(v.stages.begin(), v.stages.end(), s.id) == v.stages.end()) return false;
    return true;
}

std::string label(const std::vector<std::string>& labels, std::int64_t i, std::size_t width) {
    std::string s = std::size_t(i) < labels.size() ? labels[i] : std::to_string(i);
    if (s.size() > width) s = s.substr(0, width);
    return s + std::string(width - s.size(), ' ');
}

// The first v.rows × v.cols of an (R, K) matrix at `base` (all of it where a limit is 0).
void matrix_excerpt(std::ostringstream& o, const real* base, std::int64_t R, std::int64_t K, const ExplainStage& s,
                    const ExplainView& v, const std::string& indent) {
    const std::int64_t rows = first(R, v.rows), cols = first(K, v.cols);
    if (!s.cols.empty()) {
        o << indent << std::string(10, ' ');
        for (std::int64_t k = 0; k < cols; ++k) {
            std::string c = std::size_t(k) < s.cols.size() ? s.cols[k] : std::to_string(k);
            if (c.size() > 9) c = c.substr(0, 9);
            o << " " << std::string(9 - c.size(), ' ') << c;  // right-aligned over the numbers
        }
        o << "\n";
    }
    for (std::int64_t r = 0; r < rows; ++r) {
        o << indent << label(s.rows, r, 10);
        for (std::int64_t k = 0; k < cols; ++k) {
            const std::string x = value_str(base[r * K + k]);
            o << " " << std::string(9 - std::min<std::size_t>(9, x.size()), ' ') << x;
        }
        if (K > cols) o << "  … (" << K << " columns; --cols or --full for more)";
        o << "\n";
    }
    if (R > rows) o << indent << "… (" << R << " rows; --rows or --full for more)\n";
}

void values(std::ostringstream& o, const ExplainStage& s, const ExplainView& v) {
    const Tensor& t = s.value;
    if (t.rank() == 3) {
        matrix_excerpt(o, t.data(), t.size(1), t.size(2), s, v, "      ");
    } else if (t.rank() == 4) {
        const std::int64_t H = t.size(1), R = t.size(2), K = t.size(3);
        for (std::int64_t h = 0; h < H; ++h) {
            if (v.head >= 0 && h != v.head) continue;
            o << "      head " << h << ":\n";
            matrix_excerpt(o, t.data() + h * R * K, R, K, s, v, "        ");
        }
    }
}

}  // namespace

void check_view(const Explanation& ex, const ModelConfig& c, const ExplainView& v) {
    const std::int64_t layers = c.decoder_only() ? c.dec_layers : std::max(c.enc_layers, c.dec_layers);  // decoder-only: no encoder
    if (v.layer < -1 || v.layer >= layers)
        throw std::invalid_argument("--layer: the model has layers 0.." + std::to_string(layers - 1) + ", got " + std::to_string(v.layer));
    if (v.head < -1 || v.head >= c.heads)
        throw std::invalid_argument("--head: the model has heads 0.." + std::to_string(c.heads - 1) + ", got " + std::to_string(v.head));
    const std::vector<std::string> ids = explain_stage_ids();
    for (const std::string& id : v.stages)
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
            std::string present;
            for (const ExplainStage& s : ex.stages)
                if (present.find(" " + s.id + ",") == std::string::npos) present += " " + s.id + ",";
            throw std::invalid_argument("--stage: no stage '" + id + "'; this model's stages are" + present.substr(0, present.size() - 1));
        }
}

std::string format_explanation(const Explanation& ex, const ExplainView& v) {
    std::ostringstream o;
    std::string heading;
    int n = 0;
    for (const ExplainStage& s : ex.stages) {
        ++n;
        if (!shown(s, v)) continue;
        std::string h = s.part + (s.layer >= 0 ? " layer " + std::to_string(s.layer) : "") + (s.block.empty() ? "" : ", " + s.block);
        if (h != heading) {
            o << "\n== " << h << " ==\n";
            heading = h;
        }
        o << "[" << n << "] " << s.id << ": " << s.title;
        if (s.value.defined()) o << "   " << s.letters << " = " << s.value.shape().str();
        else if (!s.letters.empty()) o << "   " << s.letters;
        o << "\n      computed in " << s.where << "\n";
        const std::string text = s.id == "mask" ? mask_picture(s.value, s.rows, s.cols, v) : s.text;
        if (!text.empty() && (v.values || !s.value.defined())) {
            std::istringstream lines(text);
            for (std::string line; std::getline(lines, line);) o << "      " << line << "\n";
        }
        if (v.values && s.value.defined()) values(o, s, v);
        if (v.checks)
            for (const StageCheck& k : s.checks) o << "      check " << (k.passed ? "ok  " : "FAIL") << "  " << k.what << "\n";
    }
    if (v.backward) {
        o << "\n== backward: loss = cross-entropy of the target = " << fmt("%.4f", ex.loss)
          << "; gradient norms in the order backward reaches the stages ==\n";
        for (std::size_t i = ex.stages.size(); i-- > 0;) {
            const ExplainStage& s = ex.stages[i];
            if (!s.value.defined() || !shown(s, v)) continue;
            std::string where = s.part + (s.layer >= 0 ? " layer " + std::to_string(s.layer) : "") + (s.block.empty() ? "" : " " + s.block);
            char buf[256];
            const std::string index = "[" + std::to_string(i + 1) + "]";
            std::snprintf(buf, sizeof buf, "%-5s %-10s %-38s ", index.c_str(), s.id.c_str(), where.c_str());
            o << buf << (s.grad_norm >= 0 ? "|dL/dx| = " + fmt("%.4e", s.grad_norm) : "no gradient (not on the loss's path)") << "\n";
        }
    }
    return o.str();
}

TF_NAMESPACE_END
