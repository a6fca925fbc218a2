// Inline SVG pictures for the HTML pages tapeformer writes (attention maps, the training report): a heatmap
// and a line chart, each one self-contained <svg> element with hover titles, nothing fetched.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// & < > " as XML entities: for text and attribute values.
std::string xml_escape(const std::string& s);

enum class ColorScale {
    sequential,  // lo white .. hi dark blue
    diverging,   // lo blue .. (lo + hi)/2 white .. hi red
};

struct Heatmap {
    std::vector<std::vector<double>> values;  // [row][column]
    std::vector<std::string> rows, columns;   // labels: left of each row, rotated above each column
    std::string title;                        // bold, top left, and the <title> of the picture
    std::string id;                           // the <svg>'s id attribute (empty: none)
    double lo = 0, hi = 1;                    // the colour range; values outside it are clamped
    ColorScale scale = ColorScale::sequential;
    int cell_width = 18, cell_height = 18;    // pixels per cell
    int left = 110, top = 120;                // room for the row and column labels
    int label_every = 1;                      // label every n-th row and column (dense matrices)
    bool hover = true;                        // a <title> per cell: "row → column: value"
    std::string row_title, column_title;      // what the rows and columns are ("query", "key"; "" = none)
    bool colour_bar = true;                   // a bar right of the cells: the colours from lo to hi, with values
    bool cell_numbers = false;                // each value printed in its cell (2 digits, "2e-04"; small maps)
    // Replaces the hover text of a cell ("" = the default).
    std::function<std::string(std::size_t row, std::size_t column)> hover_text;
};
std::string heatmap_svg(const Heatmap& map);

struct LineSeries {
    std::string name;          // in the legend
    std::vector<double> x, y;  // same length; non-finite points are skipped
    std::string color;         // CSS colour ("" = from a fixed palette, by position)
    bool dashed = false;
    bool markers = false;      // a dot at each point (sparse series such as validations)
};

struct LineChart {
    std::string title, x_label, y_label;
    std::string id;            // the <svg>'s id attribute
    std::vector<LineSeries> series;
    bool log_y = false;        // log10 axis (values ≤ 0 are skipped)
    std::vector<std::pair<double, std::string>> x_marks;  // dotted vertical lines with a label (e.g. warmup)
    int width = 640, height = 300;
};
// Axes with about five round ticks each, one polyline per series, a legend. A chart with no finite point
// draws its axes and says "no data".
std::string line_chart_svg(const LineChart& chart);

TF_NAMESPACE_END
