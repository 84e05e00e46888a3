// CHECK(cond, msg): the broken-invariant tier of error handling (CONTRIBUTING.md rule 6).
//
// Use only for conditions that no input can make false (a programming error). Bad input from a
// user, a file or a peer returns a Status instead. On failure prints the condition text, the
// message and the source location to stderr and aborts.
#pragma once

namespace moeserve::detail {
[[noreturn]] void check_failed(const char* cond, const char* msg, const char* file, int line);
}

#define CHECK(cond, msg)                                                \
  do {                                                                  \
    if (!(cond)) [[unlikely]]                                           \
      ::moeserve::detail::check_failed(#cond, msg, __FILE__, __LINE__); \
  } while (0)
