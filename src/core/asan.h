// Whether this code is compiled under AddressSanitizer (GCC's and clang's ways of saying so):
// what ASan checks (use after free) must not be hidden from it, e.g. by reusing freed buffers.
#pragma once

namespace tokamax {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace tokamax
