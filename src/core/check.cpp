#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace moeserve::detail {

void check_failed(const char* cond, const char* msg, const char* file, int line) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s (%s)\n", file, line, cond, msg);
  std::fflush(stderr);
  std::abort();
}

}  // namespace moeserve::detail
