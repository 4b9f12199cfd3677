// JSON helpers shared by everything that serializes: canonical (sorted, compact) dumps for keys,
// parsing with errors that name the source, stable 64-bit hashing, and atomic file writes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

using Json = nlohmann::json;

// Sorted keys (nlohmann's object is an ordered std::map), no whitespace: equal values give
// equal strings, so the result can be a cache key.
std::string canonical_dump(const Json& j);
// Whether v is a JSON integer (signed or unsigned) in [lo, hi]. A float is not one: nlohmann's
// get<int64_t>() casts it, which is undefined past int64's range (1e42).
bool json_integer_in(const Json& v, int64_t lo, int64_t hi);
// Parses `text`; InvalidArgument naming `source` and the byte position on malformed input or
// nesting deeper than kMaxJsonDepth (tokamax/core/limits.h).
Json parse_json(std::string_view text, std::string_view source);
Json read_json_file(const std::string& path);
// Reads a whole file. InvalidArgument naming the path when it cannot be opened, is a
// directory or is larger than kMaxInputFileBytes (tokamax/core/limits.h).
std::string read_file(const std::string& path);
// Writes via a temp file in the same directory + fsync + rename: readers see the old or the new
// content, never a torn file. Creates parent directories. Every file tokamax writes goes
// through this or create_temp_file.
void write_file_atomic(const std::string& path, std::string_view content);
// Creates a new file with a random name next to `path` (O_CREAT | O_EXCL | O_NOFOLLOW, mode
// 0644; parent directories created) for a writer that renames it onto `path` when done; returns
// its descriptor and sets *tmp_path. InvalidArgument naming `path` when that is impossible.
int create_temp_file(const std::string& path, std::string* tmp_path);
// InvalidArgument naming `path` unless a file can be written there (not a directory, its
// directory exists or can be created, and is writable). For commands to call before long work.
void check_writable(const std::string& path);
// Renames an existing file to `<path>.corrupt-<UTC timestamp>` (never replacing another file)
// and returns the new name; Error when that fails. For a corrupt file about to be replaced: what
// was in it is kept for its owner to look at.
std::string move_aside(const std::string& path);
// Appends `s` as a JSON string literal (quotes, backslashes and control characters escaped;
// UTF-8 passed through). For hot paths that write JSON text without building a Json value.
void append_json_string(std::string& out, std::string_view s);
// FNV-1a 64: stable across runs and machines (std::hash is not). The library's one hash: of
// bytes, or of 64-bit words (one step per word; for hot-path keys made of integers).
uint64_t hash64(std::string_view s);
uint64_t hash64(std::span<const int64_t> words);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
