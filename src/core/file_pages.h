// Resident pages of read-only file mappings. The fast path copies most of the checkpoint into
// its own layouts at load (docs/kernels-gemm.md); the source pages it read would otherwise stay
// in the process's resident set beside the copy, doubling the memory a model needs. A mapping
// registered here (the checkpoint's safetensors files, read-only MAP_PRIVATE, never written) can
// give such pages back: MADV_DONTNEED drops them from this process, and a later read faults them
// in again from the file (the page cache, or the disk), so nothing is lost, only a later read of
// them costs a fault. Memory that is not a registered mapping is never touched (there the same
// call would zero anonymous memory). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace moeserve {

void register_file_mapping(const void* base, size_t bytes, std::string path);
void unregister_file_mapping(const void* base);

// Where p lies in a registered mapping: the file's path and the byte offset (stable across
// runs, unlike the address), for keying what was derived from those bytes.
struct MappedLocation {
  std::string path;
  uint64_t offset = 0;
};
std::optional<MappedLocation> mapped_location(const void* p);

// Drops the whole pages inside [p, p + bytes) from the resident set when the range lies inside
// one registered mapping; otherwise does nothing. Returns the bytes of the pages dropped.
size_t release_file_pages(const void* p, size_t bytes);

}  // namespace moeserve
