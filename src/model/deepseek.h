// DeepseekModel: the forward pass of the DeepSeek-V3/V2 family (V3, R1, V3.1, V2, V2-Lite;
// model/family.h), a CausalLm. Its files: deepseek.cpp (the decoder layer and the residual
// stream, top to bottom), deepseek_attention.cpp (MLA), deepseek_moe.cpp (routing, experts),
// microbatch.cpp (the two-micro-batch driver) and fast_path.cpp (weight preparation).
//
// One call runs one engine step over a batch of sequences, each contributing a run of new tokens
// (a prefill chunk or one decode token) at known positions; the latent KV of every new token is
// written into the paged cache through the sequence's block table, and attention reads all
// earlier positions from there. The MoE layer reaches its experts through a Dispatcher.
//
// Holds references to config, weights, dispatcher and pool: they must outlive it. forward() is
// called by one thread at a time; it uses the pool for parallel loops.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "ep/dispatcher.h"
#include "ep/expert_migration.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_int8.h"
#include "kernels/mla_decode.h"
#include "kernels/rope.h"
#include "model/causal_lm.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/expert_store.h"
#include "model/family.h"
#include "model/packed_linear.h"
#include "model/weight_cache.h"

namespace moeserve {

// The two micro-batches of a step (docs/ep-overlap.md): indices into the batch, ascending, each
// sequence in exactly one. Balances attention work (the sum over new tokens of their context
// length) by longest-first greedy assignment; a sequence is never split. Either may be empty.
// A batch of fewer than min_tokens new tokens is not split: everything goes to the first.
std::array<std::vector<size_t>, 2> split_micro_batches(std::span<const StepSequence> batch,
                                                       int64_t min_tokens = 0);

class DeepseekModel final : public CausalLm {
 public:
  // Whether a checkpoint can run on `path`: the fast path's FP8 GEMMs need 128x128 scale
  // blocks (InvalidArgument naming quantization_config.weight_block_size otherwise). Checked
  // at load, before construction (the constructor CHECKs it).
  static Status supports(const ModelConfig& config, ComputePath path);
  // The latent KV cache layout (docs/kv-cache.md): every layer keeps MLA's latent per token
  // (kv_lora_rank normalised values, then qk_rope_head_dim rotated rope-key values) as
  // kv_dtype (kBF16, kF8E4M3: FlashMLA's FP8, or kF32); with mtp, one more layer after the
  // main ones: the MTP module's (docs/mtp.md). kv_layout_status says whether it can be used
  // (FP8 needs kv_lora_rank % 128 == 0).
  static KvLayout kv_layout(const ModelConfig& config, DType kv_dtype, bool mtp);

  DeepseekModel(const ModelConfig& config, const ModelWeights& weights, Dispatcher& dispatcher,
                ThreadPool* pool, AttentionMode mode = AttentionMode::kAbsorbed,
                ComputePath path = ComputePath::kReference, bool overlap = true,
                bool progress = false, WeightFormats formats = {},
                const WeightCacheOptions& weight_cache = {});

  const ModelConfig& config() const override { return config_; }

  // One projection the fast path prepares (fast_path.cpp): from the checkpoint's tensor, into
  // its slot, in a format.
  struct PackJob {
    const WeightView* source;
    PackedLinear* packed;
    WeightFormat format;
  };

  // Records per-layer stages (attention, gate, dispatch, experts, combine, ...) when non-null.
  void set_tracer(Tracer* tracer) override { tracer_ = tracer; }

  // Called after the gate of every MoE layer with the experts chosen for the rows it routed
  // ([rows, k] in the step's row order): for tests that compare routing between compute paths.
  using RouteObserver = std::function<void(int64_t layer, std::span<const int32_t> ids)>;
  void set_route_observer(RouteObserver observer) { route_observer_ = std::move(observer); }

  // Dual micro-batch overlap (docs/ep-overlap.md), on by default: when the dispatcher spans
  // more than one rank, forward() splits the batch in two and interleaves them so that one's
  // dispatch/combine runs on a communication thread while the other computes. Results equal
  // the non-overlapped pass. Every rank of an EP group must use the same setting (it decides
  // how many exchanges a layer makes). Set it at construction or between forward() calls.
  void set_overlap(bool on) { overlap_ = on; }
  // Per step and per rank, with overlap on: a step with fewer new tokens than this runs as one
  // micro-batch (the second is empty: its exchanges still happen, with no rows, so the ranks
  // need not agree). Below it each micro-batch would give this rank's experts fewer rows than
  // the GEMMs need to leave the memory-bound regime, and splitting would read every expert's
  // weights twice for little hidden communication. -1 (the default) = automatic:
  // 2 * kOverlapRidgeRows * n_routed_experts / (ranks * top_k); 0 = always split.
  static constexpr int64_t kOverlapRidgeRows = 9;  // docs/kernels-gemm.md: FP8 ridge M ~ 9
  void set_overlap_min_tokens(int64_t n) override { overlap_min_tokens_ = n; }
  int64_t overlap_min_tokens() const;
  // AttentionMode::kMhaPrefill: a sequence's step of at least this many new tokens attends in
  // MHA form; 0 (the default) = where the form's estimated work is lower (mha_step).
  void set_mha_min_tokens(int64_t n) { mha_min_tokens_ = n; }

  // Runs the step; `out` gets the logits and final hidden rows of the requested positions.
  Status forward(std::span<const StepSequence> batch, KvCache& cache, StepOutput* out) override;

  // Whether the weights include the MTP module (LoadOptions::mtp); its latent cache is layer
  // num_hidden_layers of the cache, which then needs num_layers() layers.
  bool has_mtp() const override { return weights_.mtp.has_value(); }
  // Every forward() and forward_mtp() is collective over the ranks of an EP group (each MoE
  // layer exchanges rows with all of them): callers make the same calls on every rank.
  bool collective() const override { return dispatcher_.world_size() > 1; }
  int64_t num_layers() const override { return int64_t(weights_.layers.size()); }
  // The MTP module (docs/mtp.md) over a batch laid out as for forward(): the row at position p
  // of a sequence carries the token t_{p+1} (in tokens) and, in `hidden` [rows, H] in the same
  // row order, the main model's final hidden row at p (or, chaining drafts, this module's own
  // output row at p - 1). Writes the module's latent KV at those positions; `out` gets its
  // logits (draft predictions of t_{p+2}) and its output rows after shared_head.norm.
  Status forward_mtp(std::span<const StepSequence> batch, const float* hidden, KvCache& cache,
                     StepOutput* out) override;

  // The routed experts this rank holds now (EPLB installs and drops them through it, between
  // two forward() calls on its thread: model/expert_store.h).
  ExpertStore& experts() override { return experts_; }
  const ExpertStore& experts() const { return experts_; }

 private:
  // x: [n, hidden] normalised input of the layer's attention; out: [n, hidden].
  void attention(int64_t layer, std::span<const StepSequence> batch, const float* x, int64_t n,
                 KvCache& cache, float* out);
  // Attention of one sequence's new tokens over its cached context: all of it, or, for new
  // token i with selected[i] not empty (DSA), the positions selected[i] (ascending).
  void attend_sequence(int64_t layer, const StepSequence& seq, const float* q, int64_t ldq,
                       const KvCache& cache, const std::vector<float>& kv_b, float* attn_out,
                       int64_t ld_out, std::span<const std::vector<int32_t>> selected = {});
  // DSA (V3.2, docs/dsa.md), reference path: writes the lightning indexer's keys of the batch's
  // new tokens into the layer's index-key part of the cache and returns, per new token in batch
  // order, the cached positions it attends to (ascending; empty: all of them, when there are no
  // more than index_topk). x: [n, H] the attention input; q_latent: [n, q_lora_rank] normalised.
  std::vector<std::vector<int32_t>> index_select(int64_t layer, std::span<const StepSequence> batch,
                                                 const float* x, const float* q_latent, int64_t n,
                                                 KvCache& cache);
  void attend_absorbed_fast(int64_t layer, std::span<const StepSequence> batch, const float* q,
                            int64_t n, const KvCache& cache, float* o);
  // AttentionMode::kMhaPrefill: whether a sequence's step of n_new tokens ending at context
  // length T attends in MHA form, and that form for it: q [n_new, heads, dn + dr] F32 ->
  // o [n_new, heads, dv] (deepseek_attention.cpp).
  bool mha_step(int64_t n_new, int64_t T) const;
  void attend_mha_fast(int64_t layer, const StepSequence& s, const float* q, const KvCache& cache,
                       float* o);
  // The fast path's absorbed form: qa [n, heads, kv_lora_rank + rope] = W_UK^T q_nope | q_pe;
  // o [n, heads, v_head_dim] = W_UV o_lat.
  void absorb_queries(int64_t layer, const float* q, int64_t n, float* qa);
  void project_values(int64_t layer, const float* o_lat, int64_t n, float* o);
  void absorbed_fp8(const float* x, int64_t n, int64_t dx, std::span<const PackedFp8Weight> w,
                    float* y, int64_t dy);
  MlaShape mla_shape() const;
  // DSA on the fast path: each sequence's new tokens whose context fits the top-k (a leading
  // run) through the paged MLA kernel over the cache, the others through the same kernel over
  // their selected positions gathered into a scratch arena. Per token, so a token's bits do not
  // depend on the batch or the chunking.
  void attend_dsa_fast(int64_t layer, std::span<const StepSequence> batch, const float* q,
                       int64_t n, const KvCache& cache,
                       const std::vector<std::vector<int32_t>>& selected, float* o);
  // The routed experts' output rows [b.n_rows(), H]: BF16 on the fast path (the expert GEMMs
  // write them rounded, as a BF16 model hands them on and as DeepEP's combine carries them),
  // F32 on the reference path; the other vector stays empty.
  struct ExpertRows {
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
  };
  // ---- One decoder layer as stages: the sequential driver (forward) and the micro-batch
  // driver (microbatch.cpp) both run a layer through these, in this order. `mb` names the
  // micro-batch in trace events (-1: the sequential driver). x, h, tmp: [n, H].
  //   attention_stage  x += attention(attn_norm(x)); h = ffn_norm(x)
  //   dense layer:     mlp_stage            x += mlp(h)
  //   MoE layer:       gate_stage           ids, wts [n, top_k] = the router's top-k of h
  //                    dispatch             (the dispatcher) rows to the ranks of their experts
  //                    experts_stage        every local expert on its rows of the batch
  //                    combine              (the dispatcher) weighted sum back into tmp [n, H]
  //                    shared_stage         shared [n, H] = shared experts(h)
  //                    moe_residual         x += tmp + shared
  // One layer, stage after stage, over the whole batch (x: [n, H] residual stream, in and out).
  Status layer_sequential(int64_t layer, std::span<const StepSequence> batch, KvCache& cache,
                          float* x, int64_t n);
  // The final norm (weight `norm_w`) of each sequence's requested rows of x, then the lm_head.
  void head(std::span<const StepSequence> batch, const float* x, const std::vector<float>& norm_w,
            StepOutput* out);
  void attention_stage(int64_t layer, int mb, std::span<const StepSequence> batch, KvCache& cache,
                       float* x, float* h, float* tmp, int64_t n);
  void mlp_stage(int64_t layer, int mb, const float* h, float* x, float* tmp, int64_t n);
  void gate_stage(int64_t layer, int mb, const float* h, int64_t n, int32_t* ids, float* wts);
  Status experts_stage(int64_t layer, int mb, const ExpertBatch& b, ExpertRows& out);
  void shared_stage(int64_t layer, int mb, const float* h, int64_t n, float* shared);
  void moe_residual(int64_t layer, float* x, float* routed, const float* shared, int64_t n);
  Status combine(const ExpertBatch& b, const ExpertRows& rows, float* y);
  int64_t moe_layer_index(int64_t layer) const;
  // RMSNorm on the configured compute path: y[n, d] (row stride ldy) of x[n, d] (stride ldx).
  void norm(const float* x, int64_t n, int64_t d, int64_t ldx, const float* w, float eps, float* y,
            int64_t ldy) const;
  // The layers of forward() with two interleaved micro-batches (microbatch.cpp); x: [n, H]
  // residual stream in batch order, in and out.
  struct MicroBatch;
  Status layers_overlapped(std::span<const StepSequence> batch, KvCache& cache,
                           std::vector<float>& x);
  Status run_micro_batches(std::array<MicroBatch, 2>& mbs, KvCache& cache);
  void advance_to_dispatch(MicroBatch& mb, KvCache& cache);
  Status submit_combine(MicroBatch& mb);
  Status finish_moe(MicroBatch& mb);
  void mlp(const MlpWeights& w, const float* x, int64_t n, float* out);
  // Contiguous layout, FP8 experts: the down projection writes BF16 rows (out [rows, H]).
  void experts_grouped(const MoeWeights& w, const ExpertBatch& b, uint16_t* out);
  // y[m, w.rows] = x[m, w.cols] W^T on the configured compute path.
  void linear(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy);
  // Repacks FP8 projections, splits kv_b_proj per head and converts the router to F32.
  // progress: an in-place progress line on stderr while it runs (minutes for a 671B checkpoint).
  // With a cache directory the packed weights are mapped from its file when it has them, and
  // written there otherwise (model/weight_cache.h).
  void prepare_fast_path(bool progress, const WeightCacheOptions& cache);
  void pack_projections(std::span<const PackJob> jobs, bool progress);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  Dispatcher& dispatcher_;
  ThreadPool* pool_;
  AttentionMode mode_;
  ComputePath path_;
  Tracer* tracer_ = nullptr;
  RouteObserver route_observer_;
  bool overlap_ = true;
  int64_t overlap_min_tokens_ = -1;
  int64_t mha_min_tokens_ = 0;
  RopeTable rope_;
  WeightFormats formats_;
  // Fast path: FP8 weights repacked for gemm_fp8 (or requantized for gemm_int8), keyed by the
  // checkpoint bytes they came from.
  PackedLinears packed_;
  // Fast path: the BF16 lm_head in formats_.lm_head (one of the three held), whole or, when at
  // least a quarter of its rows are +0.0, only the other rows (compact_head_; fast_path.cpp).
  struct PackedHead {
    PackedBf16Weight bf16;
    PackedInt8Weight int8;
    PackedInt4Weight int4;

    bool empty() const { return !bf16.data && !int8.data && !int4.data; }
    // y [m, n] F32 (row stride ldy) = x [m, k] BF16 (row stride ldx) times the head's rows.
    void gemm(const uint16_t* x, int64_t m, int64_t ldx, float* y, int64_t ldy,
              ThreadPool* pool) const;
  };
  PackedHead pack_head(const uint16_t* w, int64_t n, int64_t k) const;  // BF16 rows [n, k]
  PackedHead head_;  // the whole head (empty when compact_head_ holds it)
  struct CompactHead {
    std::vector<int32_t> rows;  // vocabulary ids of the packed rows, ascending
    PackedHead packed;
  } compact_head_;
  std::vector<uint16_t> x_bf16_;  // scratch: the GEMM input in BF16
  // Scratch of the routed experts (moe, experts_grouped) and of mlp() (shared experts, dense
  // layers), reused by every layer and step: fresh multi-MB vectors page-fault every time.
  struct ExpertScratch {
    ExpertRows expert_out;
    std::vector<float> rows_f32, g, u, shared, mlp_g, mlp_u;
    std::vector<uint16_t> xb, act;
    std::vector<float> h, tmp, wts;  // layer_sequential()
    std::vector<int32_t> ids;
  } scratch_;
  // Scratch of attention() and attend_absorbed_fast(), reused by every layer and step.
  struct AttentionScratch {
    std::vector<float> q, q_lora, kv, o, q_lat, o_lat;
    std::vector<float> mha_lat, mha_kv, mha_o;  // attend_mha_fast's
    std::vector<uint16_t> mha_blocks, mha_q;
    std::vector<int32_t> mha_tables;
  } attn_scratch_;
  // Fast absorbed attention: kv_b_proj split per head and dequantized to F32 (BF16 rounding
  // of these small matrices moved logprobs by up to 0.3 on the test models: the scores
  // q_lat . c amplify it).
  struct AbsorbedWeights {
    std::vector<float> uk;    // [nh][dn][R]: W_UK, maps q_nope into the latent space
    std::vector<float> uv_t;  // [nh][R][dv]: W_UV^T, maps the attended latent to values
    // When kv_b_proj is FP8 and every head's slices are whole 128x128 scale blocks (V3: dn = dv
    // = 128), the same matrices stay FP8 (a quarter of the bytes; exact FP8 values, F32
    // activations as two BF16 terms through gemm_fp8: absorbed_fp8) and uk/uv_t are left
    // empty: per head, W_UK^T [R, dn] and W_UV [dv, R].
    std::vector<PackedFp8Weight> uk_t_fp8, uv_fp8;
  };
  std::vector<AbsorbedWeights> absorbed_;  // per layer
  bool absorbed_fp8_ok(const WeightView& kv_b) const;
  void pack_absorbed_fp8(const WeightView& kv_b, AbsorbedWeights& W) const;
  // Fast path: router weights in F32 (routing stays FP32-exact), keyed by checkpoint bytes.
  std::unordered_map<const uint8_t*, std::vector<float>> gate_f32_;
  const MlpWeights* held_expert(const MoeWeights& w, int32_t e) const {
    return experts_.held(w, e);
  }
  ExpertStore experts_;  // after packed_, which it borrows
};

}  // namespace moeserve
