// Error types thrown by tokamax. Every failure a caller can act on has its own kind:
// InvalidArgument (bad input), Unsupported (an implementation cannot serve these arguments;
// dispatch moves on to the next one), CacheMiss (no tuned config and the policy is "error").
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what), message_(what) {}
  // The message without the kind (what() is "Kind: message"), for wrapping it in another.
  const std::string& message() const { return message_; }

 protected:
  Error(const char* kind, const std::string& message)
      : std::runtime_error(kind + message), message_(message) {}

 private:
  std::string message_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error("InvalidArgument: ", what) {}
};

// A config (from a cache file, say) that suits this CPU's own kernels but not the ones running,
// which TOKAMAX_ISA caps below them: not bad data, only data for another kernel set. Dispatch
// ignores such cache entries as it does every invalid one; `tokamax cache verify` counts them
// apart.
class ConfigForOtherIsa : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& what) : Error("Unsupported: ", what) {}
};

class CacheMiss : public Error {
 public:
  explicit CacheMiss(const std::string& what) : Error("CacheMiss: ", what) {}
};

// An allocation the library could not make, naming what was asked for ("f32[1000000000000]:
// 4000000000000 bytes"). A std::bad_alloc, so that whatever catches that still does (Python's
// bindings make it a MemoryError with this message).
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
