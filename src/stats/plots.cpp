#include "stats/plots.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

namespace atlas::stats {

namespace {

std::string f2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}
std::string g4(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}
std::string text(double x, double y, const std::string& s, const char* anchor = "middle", int size = 12,
                 const std::string& extra = "") {
  return "<text x=\"" + f2(x) + "\" y=\"" + f2(y) + "\" font-size=\"" + std::to_string(size) +
         "\" text-anchor=\"" + anchor + "\"" + extra + ">" + esc(s) + "</text>\n";
}
std::string header(int w, int h) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(w) + "\" height=\"" + std::to_string(h) +
         "\" viewBox=\"0 0 " + std::to_string(w) + " " + std::to_string(h) +
         "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}
// A colour-blind-safe qualitative palette (Okabe and Ito).
const char* const kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"};

// Nice axis range and ticks for [lo, hi].
std::vector<double> ticks(double& lo, double& hi) {
  if (!(hi > lo)) {
    const double d = std::fabs(lo) > 0 ? std::fabs(lo) * 0.01 : 1e-6;
    lo -= d, hi += d;
  }
  const double raw = (hi - lo) / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
  std::vector<double> t;
  for (double v = lo; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

}  // namespace

std::string svg_line_plot(const LinePlot& p) {
  const int W = 760, H = 420, L = 80, R = 170, T = 40, B = 70;
  const double pw = W - L - R, ph = H - T - B;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : p.series)
    for (double v : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  const auto yt = ticks(lo, hi);
  const size_t n = p.x_ticks.size();
  auto X = [&](size_t i) { return L + (n > 1 ? pw * double(i) / double(n - 1) : pw / 2); };
  auto Y = [&](double v) { return T + ph * (1 - (v - lo) / (hi - lo)); };
  std::string s = header(W, H) + text(W / 2.0, 24, p.title, "middle", 15);
  for (double v : yt) {
    s += "<line x1=\"" + f2(L) + "\" x2=\"" + f2(L + pw) + "\" y1=\"" + f2(Y(v)) + "\" y2=\"" + f2(Y(v)) +
         "\" stroke=\"#dddddd\"/>\n" + text(L - 6, Y(v) + 4, g4(v), "end", 11);
  }
  const size_t every = std::max<size_t>(1, (n + 14) / 15);
  for (size_t i = 0; i < n; i += every) s += text(X(i), T + ph + 16, p.x_ticks[i], "middle", 10);
  s += "<rect x=\"" + f2(L) + "\" y=\"" + f2(T) + "\" width=\"" + f2(pw) + "\" height=\"" + f2(ph) +
       "\" fill=\"none\" stroke=\"#333333\"/>\n";
  s += text(L + pw / 2, H - 20, p.x_label, "middle", 13);
  s += text(18, T + ph / 2, p.y_label, "middle", 13, " transform=\"rotate(-90 18 " + f2(T + ph / 2) + ")\"");
  for (size_t k = 0; k < p.series.size(); ++k) {
    const char* col = kPalette[k % 8];
    std::string path;
    bool pen = false;
    for (size_t i = 0; i < p.series[k].y.size() && i < n; ++i) {
      const double v = p.series[k].y[i];
      if (!std::isfinite(v)) {
        pen = false;
        continue;
      }
      path += (pen ? " L " : " M ") + f2(X(i)) + " " + f2(Y(v));
      pen = true;
      s += "<circle cx=\"" + f2(X(i)) + "\" cy=\"" + f2(Y(v)) + "\" r=\"2.5\" fill=\"" + col + "\"/>\n";
    }
    if (!path.empty()) s += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + col + "\" stroke-width=\"1.8\"/>\n";
    const double ly = T + 14 + 18.0 * double(k);
    s += "<line x1=\"" + f2(L + pw + 12) + "\" x2=\"" + f2(L + pw + 32) + "\" y1=\"" + f2(ly - 4) + "\" y2=\"" +
         f2(ly - 4) + "\" stroke=\"" + col + "\" stroke-width=\"2\"/>\n" + text(L + pw + 38, ly, p.series[k].name, "start", 11);
  }
  return s + "</svg>\n";
}

std::string svg_heat_map(const HeatMap& h) {
  const int cw = 90, ch = 22, L = 90, T = 72, R = 120, B = 40;
  const int W = L + cw * int(h.cols.size()) + R, H = T + ch * int(h.rows.size()) + B;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : h.values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (!(hi > lo)) hi = lo + 1e-12;
  // Sequential white -> dark blue ramp; text switches to white on dark cells.
  auto colour = [&](double v, bool& dark) {
    const double t = (v - lo) / (hi - lo);
    dark = t > 0.55;
    const int r = int(std::lround(247 - t * (247 - 8))), g = int(std::lround(251 - t * (251 - 48))),
              b = int(std::lround(255 - t * (255 - 107)));
    char buf[16];
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
    return std::string(buf);
  };
  std::string s = header(W, H) + text(W / 2.0, 22, h.title, "middle", 14);
  s += text(L + cw * h.cols.size() / 2.0, 44, h.col_label, "middle", 12);
  for (size_t c = 0; c < h.cols.size(); ++c) s += text(L + cw * (c + 0.5), T - 4, h.cols[c], "middle", 11);
  for (size_t r = 0; r < h.rows.size(); ++r) {
    s += text(L - 6, T + ch * (r + 0.5) + 4, h.row_label + " " + h.rows[r], "end", 11);
    for (size_t c = 0; c < h.cols.size(); ++c) {
      const double v = h.values[r * h.cols.size() + c];
      bool dark = false;
      const std::string fill = std::isfinite(v) ? colour(v, dark) : "#eeeeee";
      s += "<rect x=\"" + std::to_string(L + cw * int(c)) + "\" y=\"" + std::to_string(T + ch * int(r)) + "\" width=\"" +
           std::to_string(cw) + "\" height=\"" + std::to_string(ch) + "\" fill=\"" + fill + "\" stroke=\"white\"/>\n";
      s += text(L + cw * (c + 0.5), T + ch * (r + 0.5) + 4, std::isfinite(v) ? g4(v) : "n/a", "middle", 10,
                dark ? " fill=\"white\"" : "");
    }
  }
  s += text(W - R + 10, T + 10, h.value_label, "start", 11) + text(W - R + 10, T + 28, "min " + g4(lo), "start", 10) +
       text(W - R + 10, T + 44, "max " + g4(hi), "start", 10);
  return s + "</svg>\n";
}

std::string svg_bar_chart(const BarChart& b) {
  const int W = 820, H = 360, L = 70, R = 20, T = 40, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  double lo = 0, hi = 0;
  for (double v : b.values)
    if (std::isfinite(v)) hi = std::max(hi, v);
  const auto yt = ticks(lo, hi);
  auto Y = [&](double v) { return T + ph * (1 - (v - lo) / (hi - lo)); };
  std::string s = header(W, H) + text(W / 2.0, 24, b.title, "middle", 14);
  for (double v : yt)
    s += "<line x1=\"" + f2(L) + "\" x2=\"" + f2(L + pw) + "\" y1=\"" + f2(Y(v)) + "\" y2=\"" + f2(Y(v)) +
         "\" stroke=\"#dddddd\"/>\n" + text(L - 6, Y(v) + 4, g4(v), "end", 11);
  const double bw = pw / double(std::max<size_t>(1, b.values.size()));
  for (size_t i = 0; i < b.values.size(); ++i) {
    const double v = std::isfinite(b.values[i]) ? b.values[i] : 0;
    s += "<rect x=\"" + f2(L + bw * i + 1) + "\" y=\"" + f2(Y(v)) + "\" width=\"" + f2(std::max(1.0, bw - 2)) +
         "\" height=\"" + f2(Y(0) - Y(v)) + "\" fill=\"#0072B2\"/>\n";
    if (i % 8 == 0) s += text(L + bw * (i + 0.5), T + ph + 14, std::to_string(i), "middle", 10);
  }
  s += "<rect x=\"" + f2(L) + "\" y=\"" + f2(T) + "\" width=\"" + f2(pw) + "\" height=\"" + f2(ph) +
       "\" fill=\"none\" stroke=\"#333333\"/>\n";
  s += text(L + pw / 2, H - 18, b.x_label, "middle", 13);
  s += text(18, T + ph / 2, b.y_label, "middle", 13, " transform=\"rotate(-90 18 " + f2(T + ph / 2) + ")\"");
  return s + "</svg>\n";
}

namespace {

std::vector<std::string> distinct(const ojson& rows, const char* key) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& r : rows)
    if (r.contains(key) && r[key].is_string() && seen.insert(r[key].get<std::string>()).second)
      out.push_back(r[key].get<std::string>());
  return out;
}
double value(const ojson& r) { return r["value"].is_number() ? r["value"].get<double>() : std::nan(""); }
std::string slug(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return o;
}

}  // namespace

std::vector<Plot> make_plots(const ojson& a) {
  std::vector<Plot> out;
  if (a.contains("hidden")) {
    const ojson& st = a["hidden"]["stats"];
    const auto domains = distinct(st, "domain");
    const std::string g = std::find(domains.begin(), domains.end(), "all") != domains.end() ? "all" : domains.at(0);
    const auto stages = distinct(st, "stage");
    for (const auto& [metric, label] : {std::pair{"cosine_row_mean", "cosine (row mean)"},
                                        std::pair{"relative_l2_row_mean", "relative L2 (row mean)"}}) {
      LinePlot p{.title = std::string("Depth curve: ") + label + ", domain " + g, .x_label = "hidden stage",
                 .y_label = label, .x_ticks = stages, .series = {}};
      for (const auto& edge : distinct(st, "edge")) {
        Series s{.name = edge, .y = std::vector<double>(stages.size(), std::nan(""))};
        for (const auto& r : st)
          if (r["metric"] == metric && r["edge"] == edge && r["domain"] == g)
            s.y[std::find(stages.begin(), stages.end(), r["stage"].get<std::string>()) - stages.begin()] = value(r);
        p.series.push_back(s);
      }
      out.push_back({.file = std::string("depth_") + metric + ".svg", .svg = svg_line_plot(p)});
    }
  }
  if (a.contains("routing")) {
    const ojson& st = a["routing"]["stats"];
    const auto layers = distinct(st, "layer");
    const auto domains = distinct(st, "domain");
    for (const auto& edge : distinct(st, "edge"))
      for (const auto& [metric, label] :
           {std::pair{"tv", "TV (target, prompt-balanced, count)"}, std::pair{"ordered_exact_rate", "ordered top-k exact rate"}}) {
        HeatMap h{.title = edge + ": " + label, .row_label = "layer", .col_label = "domain", .value_label = metric,
                  .rows = layers, .cols = domains,
                  .values = std::vector<double>(layers.size() * domains.size(), std::nan(""))};
        for (const auto& r : st) {
          if (r["metric"] != metric || r["edge"] != edge || r["scope"] != "target") continue;
          if (r.contains("aggregation") && (r["aggregation"] != "prompt" || r["kind"] != "count")) continue;
          const size_t li = std::find(layers.begin(), layers.end(), r["layer"].get<std::string>()) - layers.begin();
          const size_t di = std::find(domains.begin(), domains.end(), r["domain"].get<std::string>()) - domains.begin();
          h.values[li * domains.size() + di] = value(r);
        }
        out.push_back({.file = "heat_" + std::string(metric) + "_" + slug(edge) + ".svg", .svg = svg_heat_map(h)});
      }
    // Expert load of the last layer, summary domain, target scope, each condition.
    const ojson& loads = a["routing"]["loads"];
    const std::string g = std::find(domains.begin(), domains.end(), "all") != domains.end() ? "all" : domains.at(0);
    for (const auto& r : loads) {
      if (r["layer"] != layers.back() || r["domain"] != g || r["scope"] != "target") continue;
      BarChart b{.title = "Expert load, layer " + layers.back() + ", " + g + ", target scope, " +
                          r["condition"].get<std::string>(),
                 .x_label = "expert", .y_label = "share of top-k selections", .values = {}};
      double tot = 0;
      for (const auto& v : r["load"]) tot += v.get<double>();
      for (const auto& v : r["load"]) b.values.push_back(tot > 0 ? v.get<double>() / tot : 0.0);
      out.push_back({.file = "load_L" + slug(layers.back()) + "_" + slug(r["condition"].get<std::string>()) + ".svg",
                     .svg = svg_bar_chart(b)});
    }
  }
  return out;
}

}  // namespace atlas::stats
