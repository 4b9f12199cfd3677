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
// Parses `text`; InvalidArgument naming `source` and the byte position on malformed input.
Json parse_json(std::string_view text, std::string_view source);
Json read_json_file(const std::string& path);
std::string read_file(const std::string& path);
// Writes via a temp file in the same directory + fsync + rename: readers see the old or the new
// content, never a torn file. Creates parent directories.
void write_file_atomic(const std::string& path, std::string_view content);
// Appends `s` as a JSON string literal (quotes, backslashes and control characters escaped;
// UTF-8 passed through). For hot paths that write JSON text without building a Json value.
void append_json_string(std::string& out, std::string_view s);
// FNV-1a 64: stable across runs and machines (std::hash is not). The library's one hash: of
// bytes, or of 64-bit words (one step per word; for hot-path keys made of integers).
uint64_t hash64(std::string_view s);
uint64_t hash64(std::span<const int64_t> words);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
