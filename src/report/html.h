// The HTML building blocks every part of the report page shares (internal to src/report):
// escaped text, numbers, code spans, tables and the chart wrapper. Every string from an input
// passes through esc() or one of its wrappers, so a file's contents cannot break the page.
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tokamax::report::internal {

std::string esc(std::string_view s);
std::string num(double v, int digits = 4);
// `s` cut to at most `n` bytes, before a character rather than inside one, ending in "..." when
// cut.
std::string clip(const std::string& s, size_t n);
std::string code(std::string_view s);
// JSON (keys, configs) has no spaces to wrap at: it may break anywhere.
std::string json_code(std::string_view s);

// A table whose cells are HTML already escaped by the caller.
struct Table {
  std::vector<std::string> head;
  std::vector<bool> numeric;  // right-aligned columns
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> heading;  // per row: a heading across all columns (one cell)
  void add(std::vector<std::string> r) {
    rows.push_back(std::move(r));
    heading.push_back(false);
  }
  // A row across all columns that heads the rows after it (e.g. a spec's name).
  void group(std::string cell) {
    rows.push_back({std::move(cell)});
    heading.push_back(true);
  }
  std::string html(std::string_view caption) const;
};

// A chart, or a note saying why it could not be drawn: one odd figure in an input must not cost
// the rest of the page (the table below the chart still shows it).
template <class Draw>
std::string chart(Draw draw) {
  try {
    return "<div class=\"chart\">" + draw() + "</div>";
  } catch (const std::exception& e) {
    return "<p class=\"warn\">This chart could not be drawn: " + esc(e.what()) + "</p>";
  }
}

}  // namespace tokamax::report::internal
