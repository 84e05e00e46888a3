// DeepseekModel: the DeepSeek-V3/V2 forward pass (reference path: FP32 activations, weights
// read in their checkpoint format, FP8 blocks dequantized on the fly).
//
// One call runs one engine step over a batch of sequences, each contributing a run of new tokens
// (a prefill chunk or one decode token) at known positions; the latent KV of every new token is
// written into the paged cache through the sequence's block table, and attention reads all
// earlier positions from there. The MoE layer reaches its experts through a Dispatcher.
//
// Holds references to config, weights, dispatcher and pool: they must outlive it. forward() is
// called by one thread at a time; it uses the pool for parallel loops.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/latent_cache.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "ep/dispatcher.h"
#include "kernels/gemm_fp8.h"
#include "kernels/rope.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace moeserve {

// How attention reads the latent cache (DeepSeek's model.py keeps both):
//   naive: expand each cached latent into per-head K and V with kv_b_proj, then attend;
//   absorbed: fold kv_b_proj into the query and the output, attend in the latent space.
enum class AttentionMode { kNaive, kAbsorbed };

// How projections are computed:
//   reference: FP32 activations times weights dequantized on the fly (linear_ref), the path the
//              Hugging Face fixtures are held to 2e-2;
//   fast:      activations rounded to BF16 per GEMM (FP32 residual stream), FP8 weights repacked
//              once at construction for gemm_fp8, BF16 weights through gemm_bf16 (the served
//              path, held to 5e-2).
enum class ComputePath { kReference, kFast };

struct StepSequence {
  std::span<const int32_t> tokens;       // new tokens this step
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + tokens.size())
  bool want_logits = true;               // logits of the last new token
};

class DeepseekModel {
 public:
  DeepseekModel(const ModelConfig& config, const ModelWeights& weights, Dispatcher& dispatcher,
                ThreadPool* pool, AttentionMode mode = AttentionMode::kAbsorbed,
                ComputePath path = ComputePath::kReference);

  const ModelConfig& config() const { return config_; }
  AttentionMode attention_mode() const { return mode_; }
  void set_attention_mode(AttentionMode mode) { mode_ = mode; }

  // Records per-layer stages (attention, gate, dispatch, experts, combine, ...) when non-null.
  void set_tracer(Tracer* tracer) { tracer_ = tracer; }

  // logits: resized to [number of sequences with want_logits, vocab_size], in batch order.
  Status forward(std::span<const StepSequence> batch, LatentKvCache& cache,
                 std::vector<float>* logits);

 private:
  // x: [n, hidden] normalised input of the layer's attention; out: [n, hidden].
  void attention(int64_t layer, std::span<const StepSequence> batch, const float* x, int64_t n,
                 LatentKvCache& cache, float* out);
  // Attention of one sequence's new tokens over its whole cached context.
  void attend_sequence(int64_t layer, const StepSequence& seq, const float* q, int64_t ldq,
                       const LatentKvCache& cache, const std::vector<float>& kv_b,
                       float* attn_out, int64_t ld_out);
  void attend_absorbed_fast(int64_t layer, std::span<const StepSequence> batch, const float* q,
                            int64_t n, const LatentKvCache& cache, float* o);
  Status moe(const MoeWeights& w, const float* x, int64_t n, float* out);
  void mlp(const MlpWeights& w, const float* x, int64_t n, float* out);
  void experts_grouped(const MoeWeights& w, const ExpertBatch& b, float* out);
  // y[m, w.rows] = x[m, w.cols] W^T on the configured compute path.
  void linear(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy);
  // Repacks FP8 projections, splits kv_b_proj per head and converts the router to F32.
  void prepare_fast_path();

  const ModelConfig& config_;
  const ModelWeights& weights_;
  Dispatcher& dispatcher_;
  ThreadPool* pool_;
  AttentionMode mode_;
  ComputePath path_;
  Tracer* tracer_ = nullptr;
  int64_t layer_ = 0;  // the layer forward() is in (trace labels)
  RopeTable rope_;
  // Fast path: FP8 weights repacked for gemm_fp8, keyed by the checkpoint bytes they came from.
  std::unordered_map<const uint8_t*, PackedFp8Weight> packed_;
  std::vector<uint16_t> x_bf16_;  // scratch: the GEMM input in BF16
  // Fast absorbed attention: kv_b_proj split per head and dequantized to F32 (BF16 rounding
  // of these small matrices moved logprobs by up to 0.3 on the test models: the scores
  // q_lat . c amplify it).
  struct AbsorbedWeights {
    std::vector<float> uk;    // [nh][dn][R]: W_UK, maps q_nope into the latent space
    std::vector<float> uv_t;  // [nh][R][dv]: W_UV^T, maps the attended latent to values
  };
  std::vector<AbsorbedWeights> absorbed_;  // per layer
  // Fast path: router weights in F32 (routing stays FP32-exact), keyed by checkpoint bytes.
  std::unordered_map<const uint8_t*, std::vector<float>> gate_f32_;
};

}  // namespace moeserve
