// The router's load balancers for prefill and decode (docs/pd.md "Balancers"), after DeepSeek's
// published design, where a "GPU" is a DP-attention rank:
//
//   prefill: balance core-attention computation across ranks and equalize the input tokens per
//            rank (the dispatch send load); with cache awareness, the rank whose prefix cache
//            holds the longest prefix of the prompt is preferred while its load stays within
//            (1 + slack) of the best choice's.
//   decode:  balance KV-cache usage and equalize the requests per rank.
//
// Pure functions of hand-made or reported loads (unit-tested on both); the router keeps the
// loads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace moeserve {

struct RankLoad {
  bool accepting = true;       // registered, heartbeating, not draining
  int64_t input_tokens = 0;    // prefill: prompt tokens to compute, queued or in progress
  double attention = 0;        // prefill: their core-attention work (attention_work units)
  int64_t assigned_total = 0;  // prefill: input tokens ever given to it (breaks ties: idle ranks
                               // share work evenly instead of the first one taking it all)
  int64_t requests = 0;        // decode: requests running or queued
  int64_t kv_used = 0;         // decode: KV blocks in use
  int64_t kv_total = 0;
};

// Core attention of prefilling n_new tokens after n_cached cached ones: each new token attends
// to every earlier token and itself.
double attention_work(int64_t n_new, int64_t n_cached);

struct PrefillPick {
  size_t rank = 0;
  bool by_cache = false;  // the longest cached prefix decided it
};

// cached[r]: prompt tokens rank r's prefix cache is believed to hold. nullopt: no rank accepts.
std::optional<PrefillPick> choose_prefill(std::span<const RankLoad> ranks,
                                          std::span<const int64_t> cached, int64_t prompt_tokens,
                                          double slack = 0.25);

// blocks_needed: KV blocks the request will take. Ranks with room come first; among them the
// fewest requests, then the lowest KV usage.
std::optional<size_t> choose_decode(std::span<const RankLoad> ranks, int64_t blocks_needed);

}  // namespace moeserve
