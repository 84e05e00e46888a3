// Large buffers (2 MiB and more) on transparent huge pages, recycled: a freed region is kept
// (up to a bound) and handed out again, already faulted in, to the next request of its size.
// For buffers made and dropped at a steady rate, each filled once by a copy or a receive (KV
// hand-offs, docs/pd.md): the kernel's page faults and zeroing of fresh memory would otherwise
// cost about as much as the copy itself.
//
// Thread-safe.
#pragma once

#include <cstddef>

namespace moeserve {

inline constexpr size_t kRegionAlign = size_t(2) << 20;
inline constexpr size_t kRegionCacheBytes = size_t(1) << 30;  // kept for reuse at most

// `bytes` rounded up to kRegionAlign, aligned to it; its contents are not initialized.
// Throws std::bad_alloc when out of memory.
void* region_alloc(size_t bytes);
void region_free(void* p, size_t bytes);  // the `bytes` it was allocated with

}  // namespace moeserve
