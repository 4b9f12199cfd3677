// Whether the test binary runs under a sanitizer (the asan and tsan presets, scripts/
// test-sanitizers). A test that limits the address space cannot run there: the sanitizers'
// shadow memory is address space, and their runtime aborts when it cannot map more.
#pragma once

namespace tokamax::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

}  // namespace tokamax::testing
