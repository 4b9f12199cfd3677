// `tokamax report`: one self-contained HTML page (inline CSS and SVG; no script, font or image
// fetched from anywhere, so it reads offline and can be attached to a bug) from the files the
// other commands write: autotuning results (`tokamax autotune -o`), benchmark documents
// (`tokamax bench --json` / `-o`) and traces (TOKAMAX_TRACE). It reads in the order a
// performance engineer asks: warnings about the inputs and the machine; the headline (per bench
// spec the fastest implementation, its ratio to the strongest baseline and its share of a named
// ceiling, and what tuning found); the charts (a roofline per benchmark document, a trace's time
// per op and key with the rung that configured each call); the detail tables behind every chart
// with every tuned key's candidates; and last where the inputs came from. The page is well-formed
// XML (XHTML-compatible HTML5), so XML tools can check it.
//
// Built on the library's public API only: it links with the shared library (the command) and
// with the static one (the tests) alike.
#pragma once

#include <string>
#include <vector>

namespace tokamax::report {

struct Inputs {
  std::vector<std::string> results;  // AutotuningResult files
  std::vector<std::string> benches;  // bench documents (or the bare row lists of older versions)
  std::vector<std::string> traces;   // Chrome traces with tokamax payloads (.json or .json.gz)
};

// The report's own provenance, printed at its top.
struct About {
  std::string command;  // the command line that made it
  std::string created;  // when (UTC, ISO 8601)
};

struct Report {
  std::string html;
  // One line per input left out, "'path': why" (missing, unreadable, malformed); the page
  // lists them too.
  std::vector<std::string> skipped;
  int used = 0;  // inputs that went into the page
  // The headline as plain text (`tokamax report` prints it; `make run` ends with it).
  std::string summary;
};

// InvalidArgument when no input is given, or when none of them can be used (naming each one
// and why).
Report build_report(const Inputs& inputs, const About& about);

}  // namespace tokamax::report
