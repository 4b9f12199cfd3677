// Lexical scanning of JSON text without parsing it: which characters are structural (outside
// string literals). For passes over text that may be huge, truncated or not JSON at all: the
// nesting-depth check before parsing, and the payload scanner of traces. Internal.
#pragma once

namespace tokamax {

class JsonStringTracker {
 public:
  // Feeds the next character; true when it is structural: outside every string literal and not
  // a quote that opens or closes one.
  bool structural(char c) {
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      return false;
    }
    if (c == '"') {
      in_string_ = true;
      return false;
    }
    return true;
  }

 private:
  bool in_string_ = false, escaped_ = false;
};

}  // namespace tokamax
