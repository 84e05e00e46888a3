// DeepSeek-V4's forward pass (docs/deepseek-v4.md), the family `deepseek_v4`: DeepSeek's
// inference/model.py top-down.
//
//   h = hc copies of embed(ids)                                 the residual as hc_mult streams
//   per layer:  x, post, comb = hc_pre(h)      (mHC: Sinkhorn-normalised stream mixing)
//               h = hc_post(attention(norm(x)), h, post, comb)
//               x, post, comb = hc_pre(h)
//               h = hc_post(moe(norm(x), ids), h, post, comb)
//   logits = head(norm(hc_head(h)))
//
// Attention over one shared KV head (K = V, head_dim values, RoPE on the last qk_rope_head_dim):
// every layer attends to a sliding window of its last `sliding_window` tokens; a layer with
// compress ratio 128 also to every 128-token compressed entry before the query (heavily
// compressed attention), one with ratio 4 to the index_topk 4-token entries its lightning
// indexer picks (compressed sparse attention); one softmax over the union with a per-head sink;
// a grouped output projection. MoE: sqrt(softplus) scores, top-k by score plus bias, or a token-id
// table in the first num_hash_layers layers; clipped SwiGLU experts and one shared expert.
//
// What a layer keeps in the paged KV cache (v4_kv_layout): the window's KV per token, the
// compressed entries and the indexer's keys per group, and per block the compressors' state for
// an unfinished group (running per-channel softmax sums), so that any block boundary is a place
// to resume from and a prefix hit needs nothing else.
//
// Two paths. The reference: FP32 activations times weights dequantized on the fly. The fast path:
// the same code with its matrices packed for gemm_fp8 / gemm_fp4 / gemm_bf16 (activations rounded
// to BF16 on the way in, FP4 experts read as the checkpoint holds them), the F32 products model.py
// takes in F32 on gemm_f32, attention and the indexer's scores on attend_f32's kernels; the
// compressors' pools and mHC stay the reference's code. Both spread a prefill's queries over the
// threads.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "cache/kv_layout.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/weight_cache.h"

namespace moeserve {

class Dispatcher;

class ThreadPool;
struct ModelWeights;

KvLayout v4_kv_layout(const ModelConfig& config, DType kv_dtype, bool mtp);

// For tests that compare compute paths: called with each discrete choice a layer makes for a row
// of the step (kind 0: the routed experts of a top-k MoE layer, sorted; kind 1: the compressed
// entries a lightning indexer picked), so that a row where rounding flipped a near-tie can be
// told from a kernel error.
using V4ChoiceObserver =
    std::function<void(int64_t layer, int kind, int64_t row, std::span<const int64_t> picked)>;
// `model` from make_deepseek_v4.
void set_v4_choice_observer(CausalLm& model, V4ChoiceObserver observer);

// fast: the fast path (docs/deepseek-v4.md "Fast path"); else the reference path. `cache` (the
// fast path's, docs/memory.md): where its packed matrices are kept between starts. dispatcher:
// an EP group's, when the routed experts are spread over its ranks (they are then loaded by
// placement: LoadOptions::holds_layer_expert); null or one rank: all here. formats: the fast
// path's requantizing options (docs/deepseek-v4.md "Requantized weights"; v4_supports checks
// them).
std::unique_ptr<CausalLm> make_deepseek_v4(const ModelConfig& config, const ModelWeights& weights,
                                           ThreadPool* pool, bool fast,
                                           const WeightCacheOptions& cache = {},
                                           Dispatcher* dispatcher = nullptr,
                                           const WeightFormats& formats = {});

}  // namespace moeserve
