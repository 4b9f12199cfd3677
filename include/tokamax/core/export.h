// Symbol visibility. The library is compiled with -fvisibility=hidden, so the shared library
// exports only what the public headers (include/tokamax/) declare: each wraps its declarations
// in TOKAMAX_PUBLIC_BEGIN / TOKAMAX_PUBLIC_END. Everything under src/ stays internal, and
// programs cannot come to depend on it by accident.
#pragma once

#define TOKAMAX_PUBLIC_BEGIN _Pragma("GCC visibility push(default)")
#define TOKAMAX_PUBLIC_END _Pragma("GCC visibility pop")
