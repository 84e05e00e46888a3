// StringIdMap: string -> id hash map for the vocabulary (~130k tokens), built once at load.
// Keys live in one contiguous buffer and slots are open-addressed, so building it costs no
// allocation per token (std::unordered_map's per-node allocations dominated load time).
// Immutable after building; find() is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve {

class StringIdMap {
 public:
  void reserve(size_t n);
  // Inserts or overwrites.
  void insert(std::string_view key, int32_t id);
  std::optional<int32_t> find(std::string_view key) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = 0;
    int32_t id = -1;  // -1: empty
  };
  void grow();
  size_t probe(std::string_view key, uint64_t hash) const;

  std::string keys_;
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace moeserve
