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
    CHECK(count(svg, "<rect") == 3);
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
