// Sequence: the engine's state for one request (tokens, KV block table, sampling state).
// Owned by the scheduler; touched only by the engine's step thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/engine.h"

namespace moeserve {

struct Sequence {
  EngineRequest req;
  OutputCallback callback;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t n_prompt = 0;
  std::vector<int32_t> block_table;
  int64_t n_computed = 0;          // leading tokens whose KV is in the cache
  int64_t n_cached_prompt = 0;     // prompt tokens found in the prefix cache at first admission
  bool admitted_before = false;
  bool cancelled = false;
  std::mt19937_64 rng;
  std::chrono::steady_clock::time_point arrival;

  int64_t n_generated() const { return int64_t(tokens.size()) - n_prompt; }
  int64_t n_uncomputed() const { return int64_t(tokens.size()) - n_computed; }
};

}  // namespace moeserve
