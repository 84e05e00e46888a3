// RowPool and RowVector: recycled storage for the big row arrays of an ExpertBatch (x,
// tokens_bf16).
//
// Why: every MoE layer's dispatch hands the caller megabytes of expert rows in a fresh vector,
// and the caller drops it after combine. Memory that large is mapped fresh by malloc (always
// above glibc's largest mmap threshold, 32 MB) and unmapped on free, so every call page-faults
// all of it in again and zero-fills it first: on the development VM a fresh 8 MB vector costs
// ~4 ms, ten times writing the rows themselves; 59 MB of V3 rows, ~100 ms per dispatch. A
// RowVector draws its block from a RowPool shared by the dispatcher and every batch it made, and
// gives it back when the batch dies, so the next dispatch reuses pages already mapped.
//
// RowVector<T> is a std::vector<T> for trivial T with two differences:
//   - resize(n) and RowVector(n) leave the new elements uninitialized (default-initialized);
//     assign(n, v) and resize(n, v) still set them. Writers must fill every element they expose.
//   - its allocator carries the pool (or none: plain aligned new/delete). Copies and moves of
//     the vector carry the allocator with them, so storage always returns to the pool it came
//     from.
// RowPool keeps at most max_free idle blocks (the largest ones); a block taken is the smallest
// idle one that fits, else a new one with 1/4 headroom (the rows per rank vary call to call).
// Thread-safe: a batch may die on another thread than the one dispatching.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace moeserve {

class RowPool {
 public:
  explicit RowPool(size_t max_free = 4) : max_free_(max_free) {}
  ~RowPool();
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  // A 64-byte aligned block of at least `bytes`; from the pool when `pool` is non-null.
  static void* take(RowPool* pool, size_t bytes);
  // Gives back a block from take(): kept in `pool` (when non-null and not over max_free), else
  // freed. Any pool may take back any block.
  static void give(RowPool* pool, void* block) noexcept;

  size_t idle_blocks() const;       // for tests
  size_t blocks_allocated() const;  // blocks this pool ever allocated fresh (for tests)

 private:
  struct Block {
    void* p;
    size_t bytes;
  };
  size_t max_free_;
  mutable std::mutex mu_;
  std::vector<Block> free_;  // guarded by mu_; idle blocks
  size_t allocated_ = 0;     // guarded by mu_
};

template <typename T>
class RowAllocator {
  static_assert(std::is_trivially_copyable_v<T>, "RowVector holds plain numbers");

 public:
  using value_type = T;
  // Storage goes wherever the vector goes (move, copy, swap): back to its own pool.
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  RowAllocator() = default;
  explicit RowAllocator(std::shared_ptr<RowPool> pool) : pool_(std::move(pool)) {}
  template <typename U>
  RowAllocator(const RowAllocator<U>& other) : pool_(other.pool()) {}

  T* allocate(size_t n) { return static_cast<T*>(RowPool::take(pool_.get(), n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { RowPool::give(pool_.get(), p); }

  // Value-initialization skipped: resize(n) does not zero (the caller writes every row).
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  const std::shared_ptr<RowPool>& pool() const { return pool_; }
  template <typename U>
  bool operator==(const RowAllocator<U>& o) const {
    return pool_ == o.pool();
  }

 private:
  std::shared_ptr<RowPool> pool_;
};

template <typename T>
using RowVector = std::vector<T, RowAllocator<T>>;

}  // namespace moeserve
