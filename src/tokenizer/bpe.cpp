#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/check.h"

namespace moeserve {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Open-addressing hash table (linear probing, power-of-two size, load <= 1/2) from an id pair to
// its merge; the lookup is the inner loop of BPE, so it avoids std::unordered_map's node hops.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = kNoRank;
    int32_t result = -1;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void init(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // A later merge of the same pair replaces the earlier one (as a Hugging Face map built from
  // the merges list in order would).
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t result) {
    const uint64_t key = pair_key(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = {key, rank, result};
        return;
      }
    }
  }
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t key = pair_key(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  size_t slot(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// Cache of recently encoded short words. Sharded by hash so that threads encoding at once
// rarely wait on the same mutex; a full shard is cleared (simple, bounded memory).
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 24;
  static constexpr size_t kShards = 16;
  static constexpr size_t kShardCapacity = 4096;

  bool get(std::string_view word, size_t hash, std::vector<int32_t>& out) {
    Shard& s = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view word, size_t hash, const int32_t* ids, size_t n) {
    Shard& s = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kShardCapacity) s.map.clear();
    s.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;  // guards map
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards_;
};

}  // namespace

struct BpeModel::Impl {
  std::array<int32_t, 256> byte_id{};  // -1: the byte has no token and is dropped (as HF does)
  MergeTable merges;
  bool ignore_merges = false;
  size_t num_ranks = 0;
  bool ranks_monotone = false;
  std::unordered_map<std::string, int32_t> words;  // only filled when ignore_merges
  mutable WordCache cache;  // the only mutable state; internally synchronised

  // Initial symbols of a word: one per byte that has a token.
  void initial(std::string_view word, std::vector<int32_t>& ids) const {
    ids.clear();
    for (char c : word) {
      const int32_t id = byte_id[static_cast<uint8_t>(c)];
      if (id >= 0) ids.push_back(id);
    }
  }
};

BpeModel::BpeModel() = default;
BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;

Result<BpeModel> BpeModel::build(const std::vector<std::optional<int32_t>>& byte_ids,
                                 const std::vector<Merge>& merges,
                                 std::vector<std::pair<std::string, int32_t>> words,
                                 bool ignore_merges) {
  if (byte_ids.size() != 256) return InvalidArgument("byte_ids must have 256 entries");
  BpeModel m;
  m.impl_ = std::make_unique<Impl>();
  Impl& im = *m.impl_;
  for (int b = 0; b < 256; ++b) im.byte_id[b] = byte_ids[b].value_or(-1);
  im.merges.init(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    im.merges.insert(merges[r].left, merges[r].right, static_cast<uint32_t>(r), merges[r].result);
  }
  im.num_ranks = merges.size();
  // created[id]: rank of the merge that produces token id (-1 for tokens no merge produces).
  std::unordered_map<int32_t, int64_t> created;
  for (size_t r = 0; r < merges.size(); ++r)
    created.emplace(merges[r].result, static_cast<int64_t>(r));
  im.ranks_monotone = true;
  for (size_t r = 0; r < merges.size() && im.ranks_monotone; ++r) {
    for (int32_t side : {merges[r].left, merges[r].right}) {
      auto it = created.find(side);
      if (it != created.end() && it->second >= static_cast<int64_t>(r)) im.ranks_monotone = false;
    }
  }
  // A pair listed twice keeps its last rank, which may break the order the bucket path needs.
  for (size_t r = 0; r < merges.size() && im.ranks_monotone; ++r) {
    const MergeTable::Entry* e = im.merges.find(merges[r].left, merges[r].right);
    if (e->rank != r) im.ranks_monotone = false;
  }
  im.ignore_merges = ignore_merges;
  if (ignore_merges) {
    im.words.reserve(words.size());
    for (auto& [w, id] : words) im.words.emplace(std::move(w), id);
  }
  return m;
}

void BpeModel::encode_word_simple(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<uint32_t> rank;
  thread_local std::vector<int32_t> result;
  const Impl& im = *impl_;
  im.initial(word, ids);
  size_t n = ids.size();
  if (n == 0) return;
  rank.assign(n, kNoRank);  // rank[k]: merge rank of (ids[k], ids[k+1])
  result.assign(n, -1);
  auto update = [&](size_t k) {
    const MergeTable::Entry* e = im.merges.find(ids[k], ids[k + 1]);
    rank[k] = e ? e->rank : kNoRank;
    result[k] = e ? e->result : -1;
  };
  for (size_t k = 0; k + 1 < n; ++k) update(k);
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k) {
      if (rank[k] < rank[best]) best = k;  // strict: the leftmost of equal ranks wins
    }
    if (rank[best] == kNoRank) break;
    ids[best] = result[best];
    // Remove symbol best+1 and the pair that started at it.
    for (size_t k = best + 1; k + 1 < n; ++k) {
      ids[k] = ids[k + 1];
      rank[k] = rank[k + 1];
      result[k] = result[k + 1];
    }
    --n;
    rank[n - 1] = kNoRank;
    if (best > 0) update(best - 1);
    if (best + 1 < n)
      update(best);
    else
      rank[best] = kNoRank;
  }
  out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
}

void BpeModel::encode_word_heap(std::string_view word, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  im.initial(word, ids);
  const size_t n = ids.size();
  if (n == 0) return;
  // Doubly linked list over symbol slots; a merged-away slot is marked dead.
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // Candidate merges, smallest (rank, position) first. Entries go stale when a neighbour merges;
  // a popped entry is used only if its pair still merges into the same token (as in HF).
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t result;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> storage;
  storage.reserve(n);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap(std::greater<Cand>{},
                                                                        std::move(storage));
  auto push = [&](int32_t pos) {
    const int32_t nx = next[pos];
    if (nx < 0) return;
    if (const MergeTable::Entry* e = im.merges.find(ids[pos], ids[nx])) {
      heap.push({e->rank, pos, e->result});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos]) continue;
    const int32_t nx = next[c.pos];
    if (nx < 0) continue;
    const MergeTable::Entry* e = im.merges.find(ids[c.pos], ids[nx]);
    if (e == nullptr || e->result != c.result) continue;
    ids[c.pos] = c.result;
    alive[nx] = 0;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

bool BpeModel::ranks_monotone() const {
  return impl_->ranks_monotone;
}

void BpeModel::encode_word_buckets(std::string_view word, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  CHECK(im.ranks_monotone, "encode_word_buckets needs monotone merge ranks");
  std::vector<int32_t> init;
  im.initial(word, init);
  const size_t n = init.size();
  if (n == 0) return;
  // One record per symbol slot (id and links side by side: one cache line per visit on words
  // far larger than the cache); id -1 marks a slot merged away.
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> sym(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {init[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  // Candidates as singly linked lists per rank: head[rank] -> entry -> entry ...
  std::vector<int32_t> head(im.num_ranks, -1);
  struct Entry {
    int32_t pos, result, next;
  };
  std::vector<Entry> entries;
  entries.reserve(2 * n);
  size_t lowest = im.num_ranks;  // no candidate below this rank (monotone: never goes back)
  auto push = [&](int32_t pos) {
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    if (const MergeTable::Entry* e = im.merges.find(sym[pos].id, sym[nx].id)) {
      entries.push_back({pos, e->result, head[e->rank]});
      head[e->rank] = static_cast<int32_t>(entries.size() - 1);
      lowest = std::min<size_t>(lowest, e->rank);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  std::vector<std::pair<int32_t, int32_t>> bucket;  // (pos, result) of one rank
  for (size_t r = lowest; r < im.num_ranks; ++r) {
    if (head[r] < 0) continue;
    bucket.clear();
    for (int32_t k = head[r]; k >= 0; k = entries[k].next) {
      bucket.emplace_back(entries[k].pos, entries[k].result);
    }
    std::sort(bucket.begin(), bucket.end());  // leftmost first, as the heap's (rank, pos) order
    for (const auto& [pos, result] : bucket) {
      // Same validity test as the heap: the pair at pos still merges into `result`.
      Sym& s = sym[pos];
      if (s.id < 0 || s.next < 0) continue;
      Sym& right = sym[s.next];
      const MergeTable::Entry* e = im.merges.find(s.id, right.id);
      if (e == nullptr || e->result != result) continue;
      s.id = result;
      right.id = -1;
      s.next = right.next;
      if (s.next >= 0) sym[s.next].prev = pos;
      // New pairs have ranks above r (monotone ranks), so they land in later buckets.
      if (s.prev >= 0) push(s.prev);
      push(pos);
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const Impl& im = *impl_;
  if (im.ignore_merges) {
    if (auto it = im.words.find(std::string(word)); it != im.words.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    const int32_t id = im.byte_id[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (word.size() >= kBucketMinBytes && im.ranks_monotone) {
    encode_word_buckets(word, out);
    return;
  }
  if (word.size() > kSimpleMaxBytes) {
    encode_word_heap(word, out);
    return;
  }
  if (word.size() > WordCache::kMaxWordBytes) {
    encode_word_simple(word, out);
    return;
  }
  const size_t hash = std::hash<std::string_view>{}(word);
  if (im.cache.get(word, hash, out)) return;
  const size_t before = out.size();
  encode_word_simple(word, out);
  im.cache.put(word, hash, out.data() + before, out.size() - before);
}

}  // namespace moeserve
