// DeepSeek Sparse Attention against dense MLA at DeepSeek-V3.2's real per-layer widths (128
// heads, latent 512 + rope 64, BF16 cache; the lightning indexer's 64 heads x 128 and top-k
// 2048), on one layer's attention over the same cache and queries (docs/dsa.md, "Bench"):
//  - decode (one query) at 4k, 16k, 64k and 128k of context: dense = mla_decode over the whole
//    context; DSA = index_topk (the FP8 scores and the top-k) + mla_sparse over the 2048 picked
//    tokens + the indexer's projections (wq_b, wk: weight reads at the DRAM ceiling, a
//    roofline figure, stated as such); their times, the bytes each reads per token, the ratio,
//    and the indexer's share of its roofline (its dot-product rate or its key bytes, whichever
//    binds);
//  - prefill at 8k, 32k and 128k in 256-token chunks (the engine's default step): the chunks at
//    sampled positions are timed and the rest interpolated (a chunk's cost is linear in its
//    position for both, past the top-k for DSA), the 8k case also timed whole as a check.
// Cache contents and queries are random: the timing does not depend on them.
#pragma once

#include "core/thread_pool.h"
#include "machine.h"

namespace moeserve::bench {

struct DsaBenchOptions {
  bool json = false;
  bool quick = false;        // decode at 4k and 16k, prefill at 8k
  bool decode_only = false;  // no prefill (the 128k prefill takes hours)
};

void run_dsa_benches(const DsaBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool);

}  // namespace moeserve::bench
