// JSON and file helpers.
#include "tokamax/core/json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/json_scan.h"
#include "tokamax/core/error.h"
#include "tokamax/core/limits.h"
#include "tokamax/core/version.h"

namespace tokamax {

std::string library_version() { return TOKAMAX_VERSION; }

bool json_integer_in(const Json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) return hi >= 0 && v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
}

std::string canonical_dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// Nesting deeper than kMaxJsonDepth is refused before parsing: nlohmann's parser is iterative,
// but dumping, comparing and destroying a value recurse once per level, and a file of 100,000
// nested brackets would overflow the stack in any of them. One pass over the text, strings
// skipped.
void check_depth(std::string_view text, std::string_view source) {
  int depth = 0;
  JsonStringTracker strings;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!strings.structural(c)) continue;
    if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw InvalidArgument("JSON in " + std::string(source) + " nests deeper than " +
                              std::to_string(kMaxJsonDepth) + " levels at byte " +
                              std::to_string(i + 1) + "; expected at most " +
                              std::to_string(kMaxJsonDepth));
      }
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to report
    }
  }
}

}  // namespace

Json parse_json(std::string_view text, std::string_view source) {
  check_depth(text, source);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw InvalidArgument("malformed JSON in " + std::string(source) + " at byte " +
                          std::to_string(e.byte) + ": " + e.what());
  } catch (const Json::exception& e) {
    // A number beyond double's range (1e400) is out_of_range, not parse_error (found by
    // fuzz_json): still the input's fault.
    throw InvalidArgument("unreadable JSON in " + std::string(source) + ": " + e.what());
  }
}

std::string read_file(const std::string& path) {
  // open + fstat rather than ifstream: a directory opens as a stream and reads as empty (it
  // was reported as "malformed JSON"), and the size is known before anything is allocated.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InvalidArgument("cannot open '" + path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw InvalidArgument("cannot stat '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw InvalidArgument("'" + path + "' is a directory; expected a file");
  auto too_big = [&] {
    return InvalidArgument("'" + path + "' is larger than " + std::to_string(kMaxInputFileBytes) +
                           " bytes (kMaxInputFileBytes); expected a smaller file");
  };
  if (S_ISREG(st.st_mode) && st.st_size > kMaxInputFileBytes) throw too_big();
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument("cannot read '" + path + "': " + std::strerror(errno));
    }
    if (n == 0) break;
    // Pipes and devices have no size up front: the limit is checked as they are read.
    if (static_cast<int64_t>(out.size()) + n > kMaxInputFileBytes) throw too_big();
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Json read_json_file(const std::string& path) {
  return parse_json(read_file(path), "'" + path + "'");
}

int create_temp_file(const std::string& path, std::string* tmp_path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) {
      throw InvalidArgument("cannot create the directory of '" + path + "': " + ec.message());
    }
  }
  // A random name, created exclusively and never through a link: a file or symlink planted
  // at a predictable name cannot redirect the write (O_EXCL fails on any existing name).
  std::random_device rd;
  int err = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                            std::to_string((static_cast<uint64_t>(rd()) << 32) | rd());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) {
      *tmp_path = tmp;
      return fd;
    }
    err = errno;
    if (err != EEXIST) break;
  }
  throw InvalidArgument("cannot create a file next to '" + path + "': " + std::strerror(err));
}

void check_writable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw InvalidArgument("'" + path + "' is a directory; expected a file to write");
  std::string tmp;
  ::close(create_temp_file(path, &tmp));
  ::unlink(tmp.c_str());
}

void write_file_atomic(const std::string& path, std::string_view content) {
  std::string tmp;
  const int fd = create_temp_file(path, &tmp);
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write '" + tmp + "': " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot flush '" + tmp + "': " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
}

std::string move_aside(const std::string& path) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  // A second one within the same second gets a suffix rather than replacing the first.
  for (int n = 0; n < 1000; ++n) {
    std::string aside = path;
    aside += ".corrupt-";
    aside += stamp;
    if (n > 0) {
      aside += '.';
      aside += std::to_string(n);
    }
    struct stat st {};
    if (::lstat(aside.c_str(), &st) == 0) continue;
    // link + unlink, not rename: link refuses to replace a name that appeared in between.
    if (::link(path.c_str(), aside.c_str()) == 0) {
      ::unlink(path.c_str());
      return aside;
    }
    if (errno != EEXIST) break;
  }
  throw Error("cannot move '" + path + "' aside: " + std::strerror(errno));
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.reserve(out.size() + s.size() + 16);
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

namespace {
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull, kFnvPrime = 0x100000001b3ull;
}  // namespace

uint64_t hash64(std::string_view s) {
  uint64_t h = kFnvOffset;
  for (unsigned char c : s) h = (h ^ c) * kFnvPrime;
  return h;
}

uint64_t hash64(std::span<const int64_t> words) {
  uint64_t h = kFnvOffset;
  for (int64_t w : words) h = (h ^ static_cast<uint64_t>(w)) * kFnvPrime;
  return h;
}

}  // namespace tokamax
