// Reading a trace as a stream (internal to src/trace): its text comes from the file in chunks
// (gunzipped as it is read when the file is gzip-compressed) and is parsed event by event, each
// event a small Json handed to a visitor and then dropped. A trace is thus read in memory of the
// order of one event and what the reader keeps, not of the file: parsing the whole document
// into a Json held about 13 times the file's size (a 1 GiB trace needed 14 GB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <streambuf>
#include <string>
#include <string_view>
#include <vector>

#include "tokamax/core/error.h"
#include "tokamax/core/json.h"

namespace tokamax::trace_internal {

// A stream buffer that says how far it has been read: the parser's errors name the byte.
class TraceBuf : public std::streambuf {
 public:
  // Bytes of text handed out so far.
  virtual int64_t position() const = 0;
};

// A trace file's text as a stream buffer: read in 64 KiB chunks, gunzipped when the file starts
// with the gzip magic. Throws what read_file and read_trace_file did, with the same messages:
// InvalidArgument when the file cannot be opened or read, is a directory, or holds (or, gzip,
// decompresses to) more than kMaxInputFileBytes. A gzip stream that is cut short or corrupt ends
// the text where its output ends, with a warning (warnings()).
class TraceFileBuf : public TraceBuf {
 public:
  explicit TraceFileBuf(const std::string& path);
  ~TraceFileBuf() override;
  TraceFileBuf(const TraceFileBuf&) = delete;
  TraceFileBuf& operator=(const TraceFileBuf&) = delete;

  int64_t position() const override { return done_ + (gptr() - eback()); }
  const std::vector<std::string>& warnings() const { return warnings_; }

 protected:
  int_type underflow() override;

 private:
  // Up to `n` raw bytes of the file into `buf`; 0 at its end.
  size_t read_raw(char* buf, size_t n);
  // Gunzips the next piece of text into out_; returns its size, 0 once the gzip stream ended.
  size_t inflate_more();

  std::string path_;
  int fd_ = -1;
  bool gzip_ = false, raw_eof_ = false, ended_ = false;
  struct Zlib;
  std::unique_ptr<Zlib> z_;
  std::vector<char> raw_, out_;
  size_t first_ = 0;  // raw bytes read while looking for the gzip magic, not yet handed out
  int64_t raw_total_ = 0, done_ = 0;
  std::vector<std::string> warnings_;
};

// A text already in memory as a stream buffer (no copy).
class TextBuf : public TraceBuf {
 public:
  explicit TextBuf(std::string_view text);
  int64_t position() const override { return gptr() - eback(); }
};

// The text is not JSON, or JSON nested too deep: parse_json's InvalidArgument, as its own type
// so that a reader can tell it from a file that cannot be read (`trace extract` scans such a
// text leniently instead).
class MalformedTrace : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// What a trace's parse saw besides its events.
struct TraceShape {
  // A list of events: a top-level array, or a top-level object with a "traceEvents" array.
  bool events_list = false;
  // For a top-level object: its members but the "traceEvents" list (sorted by name, as a Json
  // object holds them). Otherwise (a top-level array or scalar) the whole document when it is
  // not a list of events, else null.
  Json rest;
};

class EventVisitor {
 public:
  virtual ~EventVisitor() = default;
  // Each element of the list of events, in order; `index` counts from 0.
  virtual void event(const Json& e, size_t index) = 0;
};

// Parses the JSON text of `buf`, calling `visitor` for each event as soon as it is complete.
// MalformedTrace with parse_json's messages, naming `source`: malformed JSON (at its byte),
// unreadable JSON (a number beyond double's range), nesting deeper than kMaxJsonDepth (at its
// byte); events before it have been visited by then. What `buf` throws (a file that cannot be
// read) passes through.
TraceShape parse_trace(TraceBuf& buf, std::string_view source, EventVisitor& visitor);

}  // namespace tokamax::trace_internal
