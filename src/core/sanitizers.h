// Whether this code is compiled under a sanitizer that tracks memory's state (AddressSanitizer:
// use after free; MemorySanitizer: reads of uninitialized memory), in GCC's and clang's ways of
// saying so: what they check must not be hidden from them, e.g. by reusing freed buffers.
#pragma once

namespace tokamax {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kMemorySanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
inline constexpr bool kMemorySanitizer = true;
#else
inline constexpr bool kMemorySanitizer = false;
#endif
#else
inline constexpr bool kMemorySanitizer = false;
#endif

}  // namespace tokamax
