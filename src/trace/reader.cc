// Reading a trace as a stream: the file's text in chunks, and a SAX parse that builds one event
// at a time.
#include "trace/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <istream>

#include "tokamax/core/error.h"
#include "tokamax/core/limits.h"
#include "tokamax/core/log.h"

namespace tokamax::trace_internal {

namespace {
constexpr size_t kChunk = size_t{1} << 16;
}  // namespace

struct TraceFileBuf::Zlib {
  z_stream z{};
  bool initialized = false;
  ~Zlib() {
    if (initialized) inflateEnd(&z);
  }
};

TraceFileBuf::TraceFileBuf(const std::string& path)
    : path_(path), z_(std::make_unique<Zlib>()), raw_(kChunk) {
  // The checks and messages of read_file (core/json.cc), which read the whole file at once.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InvalidArgument("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw InvalidArgument("cannot stat '" + path + "': " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    throw InvalidArgument("'" + path + "' is a directory; expected a file");
  }
  if (S_ISREG(st.st_mode) && st.st_size > kMaxInputFileBytes) {
    ::close(fd_);
    throw InvalidArgument("'" + path + "' is larger than " + std::to_string(kMaxInputFileBytes) +
                          " bytes (kMaxInputFileBytes); expected a smaller file");
  }
  try {
    // Two bytes decide whether it is gzip (a pipe may hand them out one at a time).
    while (first_ < 2) {
      const size_t n = read_raw(raw_.data() + first_, raw_.size() - first_);
      if (n == 0) break;
      first_ += n;
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
  gzip_ = first_ >= 2 && static_cast<unsigned char>(raw_[0]) == 0x1f &&
          static_cast<unsigned char>(raw_[1]) == 0x8b;
  if (!gzip_) {
    setg(raw_.data(), raw_.data(), raw_.data() + first_);
    return;
  }
  if (inflateInit2(&z_->z, 16 + MAX_WBITS) != Z_OK) {
    ::close(fd_);
    throw Error(path + ": zlib initialization failed");
  }
  z_->initialized = true;
  z_->z.next_in = reinterpret_cast<Bytef*>(raw_.data());
  z_->z.avail_in = static_cast<uInt>(first_);
  out_.resize(kChunk);
  setg(out_.data(), out_.data(), out_.data());
}

TraceFileBuf::~TraceFileBuf() {
  if (fd_ >= 0) ::close(fd_);
}

size_t TraceFileBuf::read_raw(char* buf, size_t n) {
  while (true) {
    const ssize_t got = ::read(fd_, buf, n);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument("cannot read '" + path_ + "': " + std::strerror(errno));
    }
    // Pipes and devices have no size up front: the limit is checked as they are read.
    raw_total_ += got;
    if (raw_total_ > kMaxInputFileBytes) {
      throw InvalidArgument("'" + path_ + "' is larger than " + std::to_string(kMaxInputFileBytes) +
                            " bytes (kMaxInputFileBytes); expected a smaller file");
    }
    if (got == 0) raw_eof_ = true;
    return static_cast<size_t>(got);
  }
}

size_t TraceFileBuf::inflate_more() {
  z_stream& z = z_->z;
  while (!ended_) {
    if (z.avail_in == 0 && !raw_eof_) {
      const size_t n = read_raw(raw_.data(), raw_.size());
      z.next_in = reinterpret_cast<Bytef*>(raw_.data());
      z.avail_in = static_cast<uInt>(n);
    }
    z.next_out = reinterpret_cast<Bytef*>(out_.data());
    z.avail_out = static_cast<uInt>(out_.size());
    const int rc = inflate(&z, Z_NO_FLUSH);
    const size_t produced = out_.size() - z.avail_out;
    // gzip compresses a repetitive text a thousandfold: the limit is on what comes out.
    if (done_ + static_cast<int64_t>(produced) > kMaxInputFileBytes) {
      throw InvalidArgument("'" + path_ + "': gzip text is larger than " +
                            std::to_string(kMaxInputFileBytes) +
                            " bytes (kMaxInputFileBytes); expected a smaller trace");
    }
    const bool truncated = rc == Z_BUF_ERROR && z.avail_in == 0 && raw_eof_;
    if (rc == Z_STREAM_END) {
      ended_ = true;  // what follows the stream is ignored, as gunzip -c's first member
    } else if (truncated || (rc != Z_OK && rc != Z_BUF_ERROR)) {
      ended_ = true;
      const std::string why = path_ + ": gzip stream " +
                              (truncated ? std::string("truncated") : "corrupt") + " after " +
                              std::to_string(done_ + static_cast<int64_t>(produced)) +
                              " bytes of text; reading what came out";
      warnings_.push_back(why);
      TOKAMAX_LOG("trace", kInfo, why);
    }
    if (produced > 0) return produced;
  }
  return 0;
}

TraceFileBuf::int_type TraceFileBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  done_ += egptr() - eback();
  size_t n = 0;
  if (gzip_) {
    n = inflate_more();
    setg(out_.data(), out_.data(), out_.data() + n);
  } else {
    if (!raw_eof_) n = read_raw(raw_.data(), raw_.size());
    setg(raw_.data(), raw_.data(), raw_.data() + n);
  }
  return n == 0 ? traits_type::eof() : traits_type::to_int_type(*gptr());
}

TextBuf::TextBuf(std::string_view text) {
  // Read only: the get area never writes through these pointers.
  char* p = const_cast<char*>(text.data());
  setg(p, p, p + text.size());
}

namespace {

// nlohmann's SAX interface: builds each event (and each top-level member other than the list
// of events) as a Json of its own; the list and the document around it are never built.
class EventSax {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  EventSax(const TraceBuf& buf, std::string_view source, EventVisitor& visitor)
      : buf_(buf), source_(source), visitor_(visitor) {}

  bool null() { return value(Json()); }
  bool boolean(bool v) { return value(Json(v)); }
  bool number_integer(number_integer_t v) { return value(Json(v)); }
  bool number_unsigned(number_unsigned_t v) { return value(Json(v)); }
  bool number_float(number_float_t v, const string_t&) { return value(Json(v)); }
  bool string(string_t& v) { return value(Json(std::move(v))); }
  bool binary(binary_t&) { return true; }  // not in JSON text
  bool start_object(size_t) { return open(Json::object()); }
  bool start_array(size_t) { return open(Json::array()); }
  bool key(string_t& k) {
    if (!stack_.empty()) {
      key_ = std::move(k);
      return true;
    }
    // A member of the top-level object. A parsed document keeps the last of repeated names; the
    // events of a first "traceEvents" list are handed out before a second one could replace
    // them, so a repeated one is refused rather than read differently.
    if (k == "traceEvents" && seen_events_member_) {
      throw MalformedTrace("JSON in " + std::string(source_) +
                           " has a second \"traceEvents\" member at byte " +
                           std::to_string(buf_.position()) + "; expected one list of events");
    }
    seen_events_member_ = seen_events_member_ || k == "traceEvents";
    member_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    // parse_json's messages (core/json.cc).
    if (const auto* pe = dynamic_cast<const Json::parse_error*>(&e)) {
      throw MalformedTrace("malformed JSON in " + std::string(source_) + " at byte " +
                           std::to_string(pe->byte) + ": " + e.what());
    }
    throw MalformedTrace("unreadable JSON in " + std::string(source_) + ": " + e.what());
  }

  TraceShape shape() && {
    TraceShape s;
    s.events_list = events_list_;
    s.rest = std::move(rest_);
    return s;
  }

 private:
  enum class Root { kNone, kArray, kObject, kScalar };

  bool open(Json container) {
    // parse_json refuses deep nesting before parsing (destroying or dumping a deep value
    // recurses once per level); here the same limit, with the same message, as it is met.
    if (++depth_ > kMaxJsonDepth) {
      throw MalformedTrace("JSON in " + std::string(source_) + " nests deeper than " +
                           std::to_string(kMaxJsonDepth) + " levels at byte " +
                           std::to_string(buf_.position()) + "; expected at most " +
                           std::to_string(kMaxJsonDepth));
    }
    if (!stack_.empty()) {
      stack_.push_back(insert(std::move(container)));
      return true;
    }
    if (root_ == Root::kNone) {  // the document itself: never built
      root_ = container.is_array() ? Root::kArray : Root::kObject;
      if (root_ == Root::kArray) {
        in_events_ = events_list_ = true;
      } else {
        rest_ = Json::object();
      }
      return true;
    }
    if (root_ == Root::kObject && depth_ == 2 && member_ == "traceEvents" && container.is_array()) {
      in_events_ = events_list_ = true;  // the list of events: never built either
      return true;
    }
    building_ = std::move(container);  // an event, or a member of the top-level object
    stack_.push_back(&building_);
    return true;
  }

  bool close() {
    --depth_;
    if (!stack_.empty()) {
      stack_.pop_back();
      if (stack_.empty()) complete(std::move(building_));
    } else if (in_events_) {
      in_events_ = false;  // the end of the list (the document's, for a top-level array)
    }
    return true;
  }

  bool value(Json v) {
    if (!stack_.empty()) {
      insert(std::move(v));
    } else if (root_ == Root::kNone) {
      root_ = Root::kScalar;
      rest_ = std::move(v);
    } else {
      complete(std::move(v));
    }
    return true;
  }

  // A value inside the one being built; returns where it went.
  Json* insert(Json v) {
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    Json& slot = top[key_];  // a repeated key keeps its last value, as a parsed Json does
    slot = std::move(v);
    return &slot;
  }

  // A whole value at the level of the events or of the top-level object's members.
  void complete(Json v) {
    if (in_events_) {
      visitor_.event(v, index_++);
    } else {
      rest_[member_] = std::move(v);
    }
  }

  const TraceBuf& buf_;
  std::string_view source_;
  EventVisitor& visitor_;
  Root root_ = Root::kNone;
  int depth_ = 0;
  bool in_events_ = false, events_list_ = false, seen_events_member_ = false;
  size_t index_ = 0;
  std::string member_, key_;
  Json building_, rest_;
  std::vector<Json*> stack_;  // the containers open in building_, innermost last
};

}  // namespace

TraceShape parse_trace(TraceBuf& buf, std::string_view source, EventVisitor& visitor) {
  EventSax sax(buf, source, visitor);
  std::istream in(&buf);
  Json::sax_parse(in, &sax);
  return std::move(sax).shape();
}

}  // namespace tokamax::trace_internal
