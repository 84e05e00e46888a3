#include "tokenizer/string_id_map.h"

#include <xxhash.h>

namespace moeserve {

void StringIdMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    size_t i = s.hash & (slots_.size() - 1);
    while (slots_[i].id >= 0) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = s;
  }
}

void StringIdMap::grow() {
  reserve(slots_.empty() ? 8 : slots_.size());
}

// Index of the slot holding `key`, or of the empty slot where it would go.
size_t StringIdMap::probe(std::string_view key, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id < 0) return i;
    if (s.hash == hash && s.len == key.size() &&
        std::string_view(keys_).substr(s.off, s.len) == key) {
      return i;
    }
  }
}

void StringIdMap::insert(std::string_view key, int32_t id) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const uint64_t h = XXH3_64bits(key.data(), key.size());
  Slot& s = slots_[probe(key, h)];
  if (s.id < 0) {
    s = {h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size()), id};
    keys_.append(key);
    ++size_;
  } else {
    s.id = id;
  }
}

std::optional<int32_t> StringIdMap::find(std::string_view key) const {
  if (slots_.empty()) return std::nullopt;
  const Slot& s = slots_[probe(key, XXH3_64bits(key.data(), key.size()))];
  if (s.id < 0) return std::nullopt;
  return s.id;
}

}  // namespace moeserve
