// BpeModel: the byte-level BPE model of a tokenizer.json, working on raw bytes (the byte-level
// alphabet of the file is decoded once at load, so no per-call character mapping is needed).
//
// encode_word() turns one pre-tokenized word into token ids exactly as Hugging Face's BPE does:
// start from one symbol per byte, then repeatedly merge the adjacent pair with the lowest merge
// rank, leftmost first. Two implementations that must agree (tested): a simple one for short
// words (quadratic, but on a handful of symbols), a heap + linked-list one for long words
// (O(n log n), HF's algorithm), and for very long words a rank-bucket one (O(n + merges count)):
// when every merge's rank is above the ranks of the merges that made its two tokens (true of any
// merges list in training order; checked at build()), a merge only creates pairs of higher rank,
// so visiting ranks in increasing order, positions in increasing order within a rank, performs
// exactly the merges the heap would, without its cache-unfriendly log n per operation.
//
// Immutable after build(); encode_word() is const and thread-safe. It keeps a cache of recent
// short words, sharded and guarded by mutexes (see WordCache in bpe.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve {

class BpeModel {
 public:
  struct Merge {
    int32_t left, right;  // ids of the pair
    int32_t result;       // id of the merged token
  };

  // byte_ids[b]: id of the token for the single byte b. merges: in rank order (index = rank).
  // words: raw bytes -> id of every vocabulary token expressible in the byte-level alphabet,
  // used when ignore_merges is set (a word that is itself a token is emitted whole).
  static Result<BpeModel> build(const std::vector<std::optional<int32_t>>& byte_ids,
                                const std::vector<Merge>& merges,
                                std::vector<std::pair<std::string, int32_t>> words,
                                bool ignore_merges);

  // Appends the ids of `word` (raw bytes, non-empty) to out.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // The two implementations, exposed for tests and benches (no cache).
  void encode_word_simple(std::string_view word, std::vector<int32_t>& out) const;
  void encode_word_heap(std::string_view word, std::vector<int32_t>& out) const;
  // Precondition: ranks_monotone().
  void encode_word_buckets(std::string_view word, std::vector<int32_t>& out) const;
  bool ranks_monotone() const;

  // Words with at most this many bytes take the simple path.
  static constexpr size_t kSimpleMaxBytes = 48;
  // Words with at least this many bytes take the bucket path (when ranks_monotone()); its fixed
  // cost is a pass over all ranks.
  static constexpr size_t kBucketMinBytes = 2048;

  BpeModel();
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve
