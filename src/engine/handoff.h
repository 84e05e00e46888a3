// KvHandoff: a request's state as a prefill unit hands it to a decode unit (prefill/decode
// disaggregation, docs/pd.md): its tokens, the KV of the computed ones, and the sampler's state.
// The prefill engine makes one when a request with EngineRequest::hand_off has sampled its first
// token; the decode engine continues a request from one (EngineRequest::resume) and gives it the
// tokens and logprobs co-located serving would have given.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <new>

#include "core/region_cache.h"
#include "core/status.h"

namespace moeserve {

// The allocator of a hand-off's block bytes: no zeroing (every byte is written: copied out of
// the KV pool or received), and blocks of 2 MiB and more in recycled huge-page regions
// (core/region_cache.h), so that filling a block costs one pass over memory, not page faults.
template <typename T>
struct KvBytesAllocator {
  using value_type = T;
  KvBytesAllocator() = default;
  template <typename U>
  KvBytesAllocator(const KvBytesAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    return static_cast<T*>(bytes < kRegionAlign ? ::operator new(bytes) : region_alloc(bytes));
  }
  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kRegionAlign) {
      ::operator delete(p);
    } else {
      region_free(p, bytes);
    }
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;  // default-initialized: no zeroing
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
  friend bool operator==(const KvBytesAllocator&, const KvBytesAllocator&) { return true; }
};
using KvBytes = std::vector<uint8_t, KvBytesAllocator<uint8_t>>;

struct KvHandoff {
  // Everything that decides the KV's bits (model, KV dtype, compute path, layout version: the
  // KvCache's fingerprint) and the size of one block: the decode engine refuses other values.
  uint64_t fingerprint = 0;
  uint64_t block_bytes = 0;
  std::vector<int32_t> tokens;  // the prompt, then the tokens generated so far (>= 1)
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // leading tokens whose KV `blocks` hold (< tokens.size())
  int64_t n_cached_prompt = 0;  // prompt tokens the prefill unit found in its prefix cache
  // blocks_for(n_computed) blocks of block_bytes each: the KvCache's block objects, in order
  // (the last one partly filled unless n_computed is a multiple of 64). With sliding windows
  // (V4), the blocks before KvCache::window_trim_point(n_computed) hold their main region only
  // (KvLayout::main_bytes(): the window region is read by no later step).
  std::vector<KvBytes> blocks;
  // The request's sampler (std::mt19937_64 written with operator<<) after its last sample.
  std::string rng_state;

  int64_t n_generated() const { return int64_t(tokens.size()) - n_prompt; }
  friend bool operator==(const KvHandoff&, const KvHandoff&) = default;
};

struct SamplingParams;

// A hand-off extended to where a re-bound request stands (EngineRequest::resume_generated):
// `generated` must begin with the hand-off's own generated tokens; the rest are appended, and
// the sampler is advanced one draw per appended token when the request samples (each token the
// engine emits costs exactly one std::mt19937_64 draw at temperature > 0, none when greedy:
// kernels/sampling.h). InvalidArgument when the tokens disagree.
Status extend_handoff(KvHandoff& h, const std::vector<int32_t>& generated,
                      const SamplingParams& sampling);

// How a unit's engine moves hand-offs, on the rank that runs the request (a unit of several
// DP-attention ranks included: the KV goes to and from that rank, never through rank 0). Set by
// the unit (src/router/pd_transport.h); empty functions: none.
struct PdHooks {
  // Prefill: holds a finished request's hand-off where decode units can pull it under `handle`;
  // returns the address they pull from ("host:port"). Called on the engine's step thread: quick.
  std::function<Result<std::string>(const std::string& handle, std::shared_ptr<const KvHandoff>)>
      offer;
  // Decode: pulls the hand-off `handle` from `address`. Called on a thread of its own (it
  // blocks); gives up soon once *stop is true.
  std::function<Result<std::shared_ptr<KvHandoff>>(
      const std::string& address, const std::string& handle, const std::atomic<bool>* stop)>
      pull;
};

}  // namespace moeserve
