// Dependency-free SVG plots of an analysis: depth curves, layer x domain heat maps, expert
// load bars. Deterministic text (fixed number formatting), so plots are byte-identical too.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"

namespace atlas::stats {

struct Series {
  std::string name;
  std::vector<double> y;  // NaN = gap
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<std::string> x_ticks;  // one per point
  std::vector<Series> series;
};
std::string svg_line_plot(const LinePlot& p);

struct HeatMap {
  std::string title, row_label, col_label, value_label;
  std::vector<std::string> rows, cols;
  std::vector<double> values;  // [rows][cols], NaN = no value
};
std::string svg_heat_map(const HeatMap& h);

struct BarChart {
  std::string title, x_label, y_label;
  std::vector<double> values;  // one bar per index 0..n-1
};
std::string svg_bar_chart(const BarChart& b);

struct Plot {
  std::string file, svg;
};
// Depth curves (cosine and relative L2 per stage, one line per edge), heat maps of TV and
// ordered exact rate (layer x domain, per edge), and expert load bars (last layer).
std::vector<Plot> make_plots(const ojson& analysis);

}  // namespace atlas::stats
