// The report page: its head (inline style, no fetches), the parts in order, and build_report,
// which reads every input leniently (a file that cannot be used is skipped and listed, the rest
// still renders). The inputs, charts and sections are in the files next to this one.
#include "report/report.h"

#include <string>
#include <vector>

#include "report/html.h"
#include "report/inputs.h"
#include "report/keys.h"
#include "report/sections.h"
#include "tokamax/tokamax.h"

namespace tokamax::report {
namespace {

using internal::code;
using internal::esc;
using internal::Loaded;

const char* kCss = R"(
body{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;margin:0 auto;max-width:1140px;
padding:12px 20px 40px;color:#1a1a1a;background:#ffffff;font-size:14px;line-height:1.4}
h1{font-size:24px;margin:8px 0 4px}
h2{font-size:20px;border-bottom:2px solid #1b2a5c;padding-bottom:3px;margin:32px 0 8px}
h3{font-size:16px;margin:26px 0 6px;word-break:break-all}
h4{font-size:14px;margin:22px 0 6px;word-break:break-all}
table{border-collapse:collapse;margin:8px 0 18px;font-size:12px;width:100%}
caption{caption-side:top;text-align:left;font-weight:bold;padding:4px 0}
th,td{border:1px solid #cccccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eceff4}
th.group{background:#f7f8fa;font-weight:bold}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code{font-family:"DejaVu Sans Mono",monospace;font-size:11px;overflow-wrap:break-word}
code.j{word-break:break-all}
.scroll{overflow-x:auto}
.warn{border:2px solid #8e1b3d;background:#fbeff2;padding:6px 12px}
.warn ul{margin:4px 0;padding-left:20px}
.note{border-left:4px solid #e27b2b;background:#fdf3ea;padding:6px 12px}
.muted{color:#505050}
.chart{overflow-x:auto;margin:6px 0}
svg{max-width:100%;height:auto;display:block;font-family:"DejaVu Sans",Arial,sans-serif}
nav a{margin-right:14px}
)";

// The page's head and title block: what made it, when, and links to its parts.
std::string head(const About& about) {
  std::string h;
  h += "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\"><head>"
       "<meta charset=\"utf-8\"/>"
       // Nothing may be fetched: no scripts, fonts, images or styles from anywhere.
       "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
       "style-src 'unsafe-inline'\"/>"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>"
       "<title>tokamax report</title><style>";
  h += kCss;
  h += "</style></head><body>";
  h += "<h1>tokamax report</h1>";
  h += "<p class=\"muted\">Made " + esc(about.created) + " by tokamax " + esc(library_version()) +
       ": " + code(about.command) + "</p>";
  h += "<nav><a href=\"#headline\">Headline</a><a href=\"#charts\">Charts</a>"
       "<a href=\"#details\">Details</a><a href=\"#tuning\">Tuned keys</a>"
       "<a href=\"#inputs\">Inputs</a></nav>";
  return h;
}

std::string page(const Loaded& l, const About& about, std::string* summary) {
  // Tuned keys, gathered once: the headline, the details and the summary use the same views.
  const internal::KeyLabels key_labels = internal::key_labels_of(l);
  const std::vector<internal::KeyView> keys = internal::key_views(l, key_labels);
  *summary = internal::summary_text(l, keys);
  // What was measured and what won first; how, then where from, after.
  std::string h = head(about);
  h += internal::warnings_part(l);
  h += internal::headline_part(l, keys);
  h += internal::charts_part(l, key_labels);
  h += internal::details_part(l, keys);
  h += internal::inputs_part(l);
  h += "</body></html>\n";
  return h;
}

}  // namespace

Report build_report(const Inputs& inputs, const About& about) {
  if (inputs.results.empty() && inputs.benches.empty() && inputs.traces.empty()) {
    throw InvalidArgument(
        "report: no input; give autotuning result files, --bench files or --trace files");
  }
  const Loaded l = internal::load_all(inputs);
  Report r;
  for (const auto& [path, why] : l.skipped) r.skipped.push_back("'" + path + "': " + why);
  r.used = static_cast<int>(l.results.size() + l.benches.size() + l.traces.size());
  if (r.used == 0) {
    throw InvalidArgument("report: none of the inputs can be used:\n  " + join(r.skipped, "\n  "));
  }
  r.html = page(l, about, &r.summary);
  return r;
}

}  // namespace tokamax::report
