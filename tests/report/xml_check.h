// A well-formedness check of `tokamax report`'s pages, shared by the report test and the
// report's fuzz target (fuzz/fuzz_report.cc).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace tokamax::testing {

// Whether `html` is well-formed XML as far as elements go: every tag closed in order, every
// attribute quoted, no '<' or '&' outside markup and entities; "" when it is, else the first
// problem. (The browser test runs xmllint on a whole report as well.)
inline std::string xml_problem(const std::string& html) {
  std::vector<std::string> open;
  size_t i = 0;
  while (i < html.size()) {
    const char c = html[i];
    if (c == '&') {
      const size_t semi = html.find(';', i);
      if (semi == std::string::npos || semi - i > 8) return "bare '&' at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (c != '<') {
      ++i;
      continue;
    }
    const size_t end = html.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    const std::string tag = html.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag at " + std::to_string(end - 1);
    if (tag.rfind("!DOCTYPE", 0) == 0) continue;
    if (tag.find('<') != std::string::npos) return "'<' inside tag " + tag;
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "unbalanced quotes in " + tag;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
      continue;
    }
    if (tag.back() == '/') continue;
    const std::string name = tag.substr(0, tag.find_first_of(" \n"));
    if (name == "style") {  // CSS: text up to its end tag
      const size_t close = html.find("</style>", i);
      if (close == std::string::npos) return "unclosed style";
      if (html.substr(i, close - i).find_first_of("<&") != std::string::npos)
        return "markup in the style sheet";
      i = close;
    }
    open.push_back(name);
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

}  // namespace tokamax::testing
