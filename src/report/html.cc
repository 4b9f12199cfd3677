// The report page's shared HTML pieces: escaping, number formatting and tables.
#include "report/html.h"

#include <string>

#include "report/svg.h"

namespace tokamax::report::internal {

std::string esc(std::string_view s) { return xml_escape(s); }
std::string num(double v, int digits) { return format_number(v, digits); }

std::string clip(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  // Cut before a character, not inside one: half a UTF-8 sequence would show as U+FFFD.
  size_t cut = n - 3;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

std::string code(std::string_view s) { return "<code>" + esc(s) + "</code>"; }
std::string json_code(std::string_view s) { return "<code class=\"j\">" + esc(s) + "</code>"; }

std::string Table::html(std::string_view caption) const {
  std::string s = "<div class=\"scroll\"><table>";
  if (!caption.empty()) s += "<caption>" + esc(caption) + "</caption>";
  s += "<thead><tr>";
  for (const auto& h : head) s += "<th>" + esc(h) + "</th>";
  s += "</tr></thead><tbody>";
  for (size_t k = 0; k < rows.size(); ++k) {
    const auto& r = rows[k];
    if (k < heading.size() && heading[k] && !r.empty()) {
      s += "<tr><th class=\"group\" colspan=\"" + std::to_string(head.size()) + "\">" + r[0] +
           "</th></tr>";
      continue;
    }
    s += "<tr>";
    for (size_t i = 0; i < r.size(); ++i) {
      const bool n = i < numeric.size() && numeric[i];
      s += (n ? "<td class=\"n\">" : "<td>") + r[i] + "</td>";
    }
    s += "</tr>";
  }
  return s + "</tbody></table></div>";
}

}  // namespace tokamax::report::internal
