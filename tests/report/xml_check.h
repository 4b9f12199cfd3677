// A well-formedness check of `tokamax report`'s pages, shared by the report test and the
// report's fuzz target (fuzz/fuzz_report.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace tokamax::testing {

// Whether `text` is UTF-8 (RFC 3629) made only of characters XML 1.0 allows (its Char
// production: tab, newline, CR, U+0020..U+D7FF, U+E000..U+FFFD, U+10000..U+10FFFF); "" when it
// is, else the first offending byte. Decoded independently of the code under test.
inline std::string xml_char_problem(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    const size_t n = b < 0x80           ? 1
                     : (b >> 5) == 0x6  ? 2
                     : (b >> 4) == 0xE  ? 3
                     : (b >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > text.size()) return "ill-formed UTF-8 at byte " + std::to_string(i);
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xC0) != 0x80) return "ill-formed UTF-8 at byte " + std::to_string(i);
      cp = (cp << 6) | (c & 0x3Fu);
    }
    static constexpr uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[n]) return "overlong UTF-8 at byte " + std::to_string(i);
    const bool allowed = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
                         (cp >= 0xE000 && cp <= 0xFFFD) || (cp >= 0x10000 && cp <= 0x10FFFF);
    if (!allowed) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(cp));
      return std::string("character ") + hex + " (not allowed in XML) at byte " + std::to_string(i);
    }
    i += n;
  }
  return "";
}

// Whether `html` is well-formed XML as far as characters and elements go: valid UTF-8 of XML
// characters only (xml_char_problem), every tag closed in order, every attribute quoted, no '<'
// or '&' outside markup and entities; "" when it is, else the first problem. (The browser test
// runs xmllint on a whole report as well.)
inline std::string xml_problem(const std::string& html) {
  if (std::string why = xml_char_problem(html); !why.empty()) return why;
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
