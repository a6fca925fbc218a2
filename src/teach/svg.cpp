// The SVG pictures of svg.h: plain string building, one element per cell or series, coordinates in pixels.
#include "tapeformer/teach/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

TF_NAMESPACE_BEGIN

std::string xml_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

namespace {

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

std::string px(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
}

// A value as a colour bar or a cell prints it: 3 significant digits ("0.25", "1e-03", "-0.5").
std::string num_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
}

// A value as a cell prints it, short enough for the cell: "0.25", "0.9", "2e-04" (the hover text has it whole).
std::string cell_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, v != 0 && std::abs(v) < 0.01 ? "%.0e" : "%.2g", v);
    return buf;
}

// a in [0, 1] -> white .. dark blue (the attention maps' colours)
std::string sequential_colour(double a) {
    char rgb[32];
    std::snprintf(rgb, sizeof rgb, "rgb(%d,%d,%d)", int(255 - 247 * a), int(255 - 207 * a), int(255 - 148 * a));
    return rgb;
}

// a in [0, 1] -> blue (0) .. white (0.5) .. red (1)
std::string diverging_colour(double a) {
    char rgb[32];
    const double t = std::abs(2 * a - 1);
    if (a < 0.5) std::snprintf(rgb, sizeof rgb, "rgb(%d,%d,%d)", int(255 - 222 * t), int(255 - 153 * t), int(255 - 83 * t));
    else std::snprintf(rgb, sizeof rgb, "rgb(%d,%d,%d)", int(255 - 77 * t), int(255 - 231 * t), int(255 - 212 * t));
    return rgb;
}

const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                                "#7f7f7f", "#bcbd22", "#17becf"};

// About `n` round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
std::vector<double> nice_ticks(double lo, double hi, int n) {
    if (!(hi > lo)) return {lo};
    const double raw = (hi - lo) / n, mag = std::pow(10, std::floor(std::log10(raw)));
    const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
    std::vector<double> ticks;
    for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
    return ticks;
}

}  // namespace

std::string heatmap_svg(const Heatmap& m) {
    const std::size_t R = m.values.size(), K = m.columns.size();
    const int font = 11;
    // Left of the cells: the row title, rotated; above them the column title under the picture's title.
    const int left = m.left + (m.row_title.empty() ? 0 : 18), top = m.top + (m.column_title.empty() ? 0 : 10);
    const int cells_w = m.cell_width * int(K), cells_h = m.cell_height * int(R);
    // The colour bar: 20 bands from hi (top) to lo, at least 80 px tall, values at its top, middle and bottom.
    const int bar_x = left + cells_w + 14, bar_w = 12, bar_h = std::max(cells_h, 80);
    const std::string lo_text = num_text(m.lo), mid_text = num_text((m.lo + m.hi) / 2), hi_text = num_text(m.hi);
    const int bar_text = int(std::max({lo_text.size(), mid_text.size(), hi_text.size()})) * font * 6 / 10;
    const int right = m.colour_bar ? bar_x + bar_w + 6 + bar_text + 6 : left + cells_w + 10;
    // Wide enough for the title too (about 0.6 em per character of bold text).
    const int width = std::max(right, 8 + int(m.title.size()) * font * 6 / 10);
    const int height = top + (m.colour_bar ? std::max(cells_h, bar_h) : cells_h) + 10;
    const int every = std::max(1, m.label_every);
    const double span = m.hi > m.lo ? m.hi - m.lo : 1;
    auto colour = [&](double v) {
        const double a = std::min(1.0, std::max(0.0, (v - m.lo) / span));
        return m.scale == ColorScale::sequential ? sequential_colour(a) : diverging_colour(a);
    };
    std::ostringstream o;
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\"" << (m.id.empty() ? "" : " id=\"" + xml_escape(m.id) + "\"")
      << " width=\"" << width << "\" height=\"" << height << "\" font-family=\"sans-serif\" font-size=\"" << font
      << "\">\n<title>" << xml_escape(m.title) << "</title>\n";
    o << "<text class=\"map-title\" x=\"4\" y=\"14\" font-weight=\"bold\">" << xml_escape(m.title) << "</text>\n";
    if (!m.column_title.empty())
        o << "<text class=\"axis-title\" x=\"" << left + cells_w / 2 << "\" y=\"30\" text-anchor=\"middle\" font-style=\"italic\">"
          << xml_escape(m.column_title) << " →</text>\n";
    if (!m.row_title.empty()) {
        const int x = 12, y = top + cells_h / 2;
        o << "<text class=\"axis-title\" x=\"" << x << "\" y=\"" << y << "\" text-anchor=\"middle\" font-style=\"italic\" "
          << "transform=\"rotate(-90 " << x << " " << y << ")\">" << xml_escape(m.row_title) << "</text>\n";
    }
    for (std::size_t k = 0; k < K; k += every) {  // column labels, rotated, above the columns
        const int x = left + int(k) * m.cell_width + m.cell_width / 2 + 4, y = top - 6;
        o << "<text x=\"" << x << "\" y=\"" << y << "\" transform=\"rotate(-60 " << x << " " << y << ")\">"
          << xml_escape(m.columns[k]) << "</text>\n";
    }
    for (std::size_t r = 0; r < R; ++r) {
        if (r % every == 0 && r < m.rows.size())
            o << "<text x=\"" << left - 6 << "\" y=\"" << top + int(r) * m.cell_height + m.cell_height / 2 + 4
              << "\" text-anchor=\"end\">" << xml_escape(m.rows[r]) << "</text>\n";
        for (std::size_t k = 0; k < K && k < m.values[r].size(); ++k) {
            const double v = m.values[r][k];
            o << "<rect x=\"" << left + int(k) * m.cell_width << "\" y=\"" << top + int(r) * m.cell_height << "\" width=\""
              << m.cell_width << "\" height=\"" << m.cell_height << "\" fill=\"" << colour(v) << "\"";
            if (!m.hover) {
                o << "/>\n";
            } else {
                std::string text = m.hover_text ? m.hover_text(r, k) : std::string();
                if (text.empty()) {
                    std::ostringstream t;
                    t << (r < m.rows.size() ? m.rows[r] : std::to_string(r)) << " → " << m.columns[k] << ": " << v;
                    text = t.str();
                }
                o << "><title>" << xml_escape(text) << "</title></rect>\n";
            }
            if (m.cell_numbers && std::isfinite(v)) {  // dark cells get white digits
                const double a = std::min(1.0, std::max(0.0, (v - m.lo) / span));
                const bool dark = m.scale == ColorScale::sequential ? a > 0.55 : std::abs(2 * a - 1) > 0.6;
                o << "<text class=\"cell-value\" x=\"" << left + int(k) * m.cell_width + m.cell_width / 2 << "\" y=\""
                  << top + int(r) * m.cell_height + m.cell_height / 2 + 3 << "\" text-anchor=\"middle\" font-size=\""
                  << std::clamp(m.cell_height * 2 / 5, 6, font) << "\" fill=\"" << (dark ? "white" : "black")
                  << "\" pointer-events=\"none\">" << cell_text(v) << "</text>\n";
            }
        }
    }
    if (m.colour_bar) {
        constexpr int kBands = 20;
        o << "<g class=\"colour-bar\">\n";
        for (int i = 0; i < kBands; ++i) {
            const int y0 = top + bar_h * i / kBands, y1 = top + bar_h * (i + 1) / kBands;
            o << "<rect x=\"" << bar_x << "\" y=\"" << y0 << "\" width=\"" << bar_w << "\" height=\"" << y1 - y0
              << "\" fill=\"" << colour(m.hi - span * (i + 0.5) / kBands) << "\"/>\n";
        }
        o << "<rect x=\"" << bar_x << "\" y=\"" << top << "\" width=\"" << bar_w << "\" height=\"" << bar_h
          << "\" fill=\"none\" stroke=\"#888\"/>\n";
        const int tx = bar_x + bar_w + 4;
        o << "<text x=\"" << tx << "\" y=\"" << top + 9 << "\">" << hi_text << "</text>\n"
          << "<text x=\"" << tx << "\" y=\"" << top + bar_h / 2 + 4 << "\">" << mid_text << "</text>\n"
          << "<text x=\"" << tx << "\" y=\"" << top + bar_h << "\">" << lo_text << "</text>\n</g>\n";
    }
    o << "</svg>\n";
    return o.str();
}

std::string line_chart_svg(const LineChart& c) {
    constexpr int left = 70, right = 170, top = 30, bottom = 45;
    const int pw = c.width - left - right, ph = c.height - top - bottom;
    auto ty = [&](double y) { return c.log_y ? std::log10(y) : y; };
    auto usable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!c.log_y || y > 0); };
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const LineSeries& s : c.series)
        for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
            if (usable(s.x[i], s.y[i])) {
                x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
                y0 = std::min(y0, ty(s.y[i])), y1 = std::max(y1, ty(s.y[i]));
            }
    for (const auto& mark : c.x_marks)
        if (std::isfinite(mark.first) && std::isfinite(x0)) x0 = std::min(x0, mark.first), x1 = std::max(x1, mark.first);
    const bool empty = !std::isfinite(x0);
    if (empty) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    if (x1 == x0) x0 -= 0.5, x1 += 0.5;
    if (y1 == y0) y0 -= c.log_y ? 0.5 : std::max(0.5, std::abs(y0) * 0.1), y1 += c.log_y ? 0.5 : std::max(0.5, std::abs(y1) * 0.1);
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
    auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
    auto sy = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

    std::ostringstream o;
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\"" << (c.id.empty() ? "" : " id=\"" + xml_escape(c.id) + "\"")
      << " class=\"chart\" width=\"" << c.width << "\" height=\"" << c.height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n<title>" << xml_escape(c.title) << "</title>\n";
    o << "<text x=\"" << left << "\" y=\"16\" font-weight=\"bold\">" << xml_escape(c.title) << "</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#888\"/>\n";
    for (double t : nice_ticks(x0, x1, 6)) {
        o << "<line x1=\"" << px(sx(t)) << "\" x2=\"" << px(sx(t)) << "\" y1=\"" << top + ph << "\" y2=\"" << top + ph + 4
          << "\" stroke=\"#888\"/><text x=\"" << px(sx(t)) << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">" << num(t)
          << "</text>\n";
    }
    // A log axis gets round values (1, 2, 5 times a power of ten; only the powers when those are many).
    std::vector<double> y_ticks;
    if (c.log_y) {
        std::vector<double> all, powers;
        for (int k = int(std::floor(y0)); k <= int(std::ceil(y1)); ++k)
            for (double m : {1.0, 2.0, 5.0}) {
                const double t = k + std::log10(m);
                if (t < y0 || t > y1) continue;
                all.push_back(t);
                if (m == 1.0) powers.push_back(t);
            }
        y_ticks = all.size() <= 8 ? all : powers;
    }
    if (y_ticks.size() < 2) y_ticks = nice_ticks(y0, y1, 5);
    for (double t : y_ticks) {
        const std::string label = c.log_y ? num(std::pow(10, t)) : num(t);
        o << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << px(sy(t)) << "\" y2=\"" << px(sy(t))
          << "\" stroke=\"#eee\"/><text x=\"" << left - 6 << "\" y=\"" << px(sy(t) + 4) << "\" text-anchor=\"end\">" << label
          << "</text>\n";
    }
    o << "<text x=\"" << left + pw / 2 << "\" y=\"" << c.height - 8 << "\" text-anchor=\"middle\">" << xml_escape(c.x_label)
      << "</text>\n";
    o << "<text x=\"14\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 14 " << top + ph / 2
      << ")\">" << xml_escape(c.y_label + (c.log_y ? " (log scale)" : "")) << "</text>\n";
    for (const auto& [x, label] : c.x_marks) {
        if (!std::isfinite(x)) continue;
        o << "<line x1=\"" << px(sx(x)) << "\" x2=\"" << px(sx(x)) << "\" y1=\"" << top << "\" y2=\"" << top + ph
          << "\" stroke=\"#555\" stroke-dasharray=\"2 3\"/><text x=\"" << px(sx(x) + 3) << "\" y=\"" << top + 12 << "\">"
          << xml_escape(label) << "</text>\n";
    }
    if (empty)
        o << "<text x=\"" << left + pw / 2 << "\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" fill=\"#a00\">no data</text>\n";
    for (std::size_t si = 0; si < c.series.size(); ++si) {
        const LineSeries& s = c.series[si];
        const std::string colour = s.color.empty() ? kPalette[si % (sizeof kPalette / sizeof *kPalette)] : s.color;
        std::string points;
        std::ostringstream dots;
        for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
            if (!usable(s.x[i], s.y[i])) continue;
            const std::string X = px(sx(s.x[i])), Y = px(sy(ty(s.y[i])));
            points += (points.empty() ? "" : " ") + X + "," + Y;
            if (s.markers)
                dots << "<circle cx=\"" << X << "\" cy=\"" << Y << "\" r=\"3\" fill=\"" << colour << "\"><title>"
                     << xml_escape(s.name) << " at " << num(s.x[i]) << ": " << num(s.y[i]) << "</title></circle>\n";
        }
        if (!points.empty())
            o << "<polyline class=\"series\" fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\""
              << (s.dashed ? " stroke-dasharray=\"5 3\"" : "") << " points=\"" << points << "\"><title>" << xml_escape(s.name)
              << "</title></polyline>\n"
              << dots.str();
        const int ly = top + 10 + int(si) * 16;
        o << "<line x1=\"" << left + pw + 10 << "\" x2=\"" << left + pw + 30 << "\" y1=\"" << ly << "\" y2=\"" << ly
          << "\" stroke=\"" << colour << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"5 3\"" : "")
          << "/><text x=\"" << left + pw + 34 << "\" y=\"" << ly + 4 << "\">" << xml_escape(s.name) << "</text>\n";
    }
    o << "</svg>\n";
    return o.str();
}

TF_NAMESPACE_END
