#include "core/file_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace moeserve {
namespace {

struct Mapping {
  size_t bytes;
  std::string path;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Mapping> mappings;  // by base address
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_file_mapping(const void* base, size_t bytes, std::string path) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.mappings[reinterpret_cast<uintptr_t>(base)] = {bytes, std::move(path)};
}

std::optional<MappedLocation> mapped_location(const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.mappings.upper_bound(at);
  if (it == r.mappings.begin()) return std::nullopt;
  --it;
  if (at >= it->first + it->second.bytes) return std::nullopt;
  return MappedLocation{it->second.path, uint64_t(at - it->first)};
}

void unregister_file_mapping(const void* base) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.mappings.erase(reinterpret_cast<uintptr_t>(base));
}

size_t release_file_pages(const void* p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.mappings.upper_bound(begin);
    if (it == r.mappings.begin()) return 0;
    --it;
    if (end > it->first + it->second.bytes || end < begin) return 0;
  }
  // Only pages wholly inside the range: a neighbouring tensor may share the edge pages.
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last <= first) return 0;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

}  // namespace moeserve
