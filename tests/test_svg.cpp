// svg.h: the heatmap and line chart that attention maps and the training report draw with.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "tapeformer/teach/svg.h"

namespace {

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
    return n;
}

}  // namespace

TEST_CASE("svg: text is escaped, colours are clamped, a chart without data says so", "[svg][report]") {
    CHECK(tf::xml_escape("a<b & \"c\">") == "a&lt;b &amp; &quot;c&quot;&gt;");
    tf::Heatmap m;
    m.values = {{-5, 0.5, 7}};
    m.rows = {"<r>"};
    m.columns = {"a", "b", "c"};
    const std::string svg = tf::heatmap_svg(m);
    CHECK(count(svg, "<rect") == 3 + 21);  // 3 cells, the colour bar's 20 bands and its frame
    CHECK(svg.find("fill=\"rgb(255,255,255)\"") != std::string::npos);  // −5 clamped to lo = 0: white
    CHECK(svg.find("fill=\"rgb(8,48,107)\"") != std::string::npos);     // 7 clamped to hi = 1: dark blue
    CHECK(svg.find("&lt;r&gt;") != std::string::npos);
    tf::LineChart c;
    tf::LineSeries nan_only;
    nan_only.x = {1, 2};
    nan_only.y = {std::nan(""), std::nan("")};
    c.series.push_back(nan_only);
    CHECK(tf::line_chart_svg(c).find("no data") != std::string::npos);
    c.log_y = true;
    tf::LineSeries one;
    one.x = {1, 2, 3};
    one.y = {0, 1, 10};  // 0 cannot be drawn on a log axis: skipped
    c.series.push_back(one);
    const std::string chart = tf::line_chart_svg(c);
    CHECK(chart.find("no data") == std::string::npos);
    CHECK(count(chart, "<polyline") == 1);
    // A log axis from 1 to 10 is labelled 1, 2, 5, 10 (not at log-spaced fractions).
    for (const char* label : {">1</text>", ">2</text>", ">5</text>", ">10</text>"}) CHECK(count(chart, label) >= 1);

    tf::Heatmap d;  // diverging: lo blue, the middle white, hi red
    d.values = {{-1, 0, 1}};
    d.columns = {"a", "b", "c"};
    d.lo = -1;
    d.scale = tf::ColorScale::diverging;
    const std::string dsvg = tf::heatmap_svg(d);
    CHECK(dsvg.find("fill=\"rgb(33,102,172)\"") != std::string::npos);
    CHECK(dsvg.find("fill=\"rgb(255,255,255)\"") != std::string::npos);
    CHECK(dsvg.find("fill=\"rgb(178,24,43)\"") != std::string::npos);
}

TEST_CASE("svg: a heatmap has a colour bar with its values, axis titles, and prints its numbers on request", "[svg][report]") {
    tf::Heatmap m;
    m.values = {{0.0, 0.25}, {0.5, 1.0}};
    m.rows = {"q0", "q1"};
    m.columns = {"k0", "k1"};
    m.title = "E:0:1";
    m.row_title = "query";
    m.column_title = "key";
    const std::string svg = tf::heatmap_svg(m);
    REQUIRE(count(svg, "<g class=\"colour-bar\">") == 1);
    const std::string bar = svg.substr(svg.find("<g class=\"colour-bar\">"));
    CHECK(count(bar, "<rect") == 21);
    CHECK(bar.find("fill=\"rgb(8,48,107)\"") == std::string::npos);  // bands are band centres: darkest just below hi
    for (const char* value : {">1</text>", ">0.5</text>", ">0</text>"}) CHECK(count(bar, value) == 1);  // hi, middle, lo
    CHECK(count(svg, "class=\"axis-title\"") == 2);
    CHECK(svg.find(">query</text>") != std::string::npos);
    CHECK(svg.find(">key →</text>") != std::string::npos);
    CHECK(count(svg, "class=\"cell-value\"") == 0);
    // The bar lies inside the picture: its right edge plus the values' text fit the width.
    const int width = std::stoi(svg.substr(svg.find("width=\"") + 7));
    const int bar_x = std::stoi(bar.substr(bar.find("x=\"") + 3));
    CHECK(bar_x + 12 + 4 + 3 * 7 <= width);

    m.cell_numbers = true;
    m.values[0][0] = 0.000206;  // ε/V of label smoothing: short enough for a cell
    const std::string numbered = tf::heatmap_svg(m);
    CHECK(count(numbered, "class=\"cell-value\"") == 4);
    CHECK(numbered.find(">0.25</text>") != std::string::npos);
    CHECK(numbered.find(">2e-04</text>") != std::string::npos);
    CHECK(numbered.find("fill=\"white\" pointer-events=\"none\">1</text>") != std::string::npos);  // white on the darkest cell
    m.colour_bar = false;
    CHECK(count(tf::heatmap_svg(m), "colour-bar") == 0);
}
