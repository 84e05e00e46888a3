#include "core/region_cache.h"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace moeserve {

namespace {

size_t rounded(size_t bytes) {
  return (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}

struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free;  // by rounded size
  size_t bytes = 0;
};

Cache& cache() {
  static Cache* c = new Cache();  // (never destroyed: frees may come from static destructors)
  return *c;
}

}  // namespace

void* region_alloc(size_t bytes) {
  const size_t n = rounded(bytes);
  {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(n);
    if (it != c.free.end()) {
      void* p = it->second;
      c.free.erase(it);
      c.bytes -= n;
      return p;
    }
  }
  void* p = std::aligned_alloc(kRegionAlign, n);
  if (!p) throw std::bad_alloc();
  madvise(p, n, MADV_HUGEPAGE);  // (advice: ignored where transparent huge pages are off)
  return p;
}

void region_free(void* p, size_t bytes) {
  if (!p) return;
  const size_t n = rounded(bytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.bytes + n <= kRegionCacheBytes) {
      c.free.emplace(n, p);
      c.bytes += n;
      return;
    }
  }
  std::free(p);
}

}  // namespace moeserve
