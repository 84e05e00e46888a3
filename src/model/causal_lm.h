// CausalLm: what the engine asks of a model family's forward pass (docs/engine.md, "Model
// families"). One engine step is one forward() over a batch of sequences, each contributing a
// run of new tokens at known positions; the family writes whatever its layers keep per token
// into the paged KV cache (its KvLayout) through the sequence's block table and reads earlier
// positions from there. The first family is DeepSeek-V3/V2 (model/deepseek.h); the family of a
// checkpoint is chosen from its config.json (model/family.h).
//
// Also here: the options every family's forward pass takes (compute path, attention form, the
// opt-in requantized weights) and the step's input and output rows.
//
// A model is called by one thread at a time (the engine's step thread); it may use a thread
// pool for its parallel loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cache/kv_cache.h"
#include "core/status.h"
#include "model/config.h"
#include "model/packed_linear.h"

namespace moeserve {

class ExpertStore;
class Tracer;

// How attention reads the latent cache (DeepSeek's model.py keeps both):
//   naive: expand each cached latent into per-head K and V with kv_b_proj, then attend;
//   absorbed: fold kv_b_proj into the query and the output, attend in the latent space;
//   mha_prefill (fast path): absorbed, except that a sequence's step long enough to gain by it
//     attends as naive does, in MHA form (DeepSeek's prefill form; docs/kernels-mla.md "MHA
//     prefill"): the step's rows then differ from the absorbed form's by rounding.
enum class AttentionMode { kNaive, kAbsorbed, kMhaPrefill };

// How projections are computed:
//   reference: FP32 activations times weights dequantized on the fly (linear_ref), the path the
//              Hugging Face fixtures are held to 2e-2;
//   fast:      activations rounded to BF16 per GEMM (FP32 residual stream), FP8 weights repacked
//              once at construction for gemm_fp8, BF16 weights through gemm_bf16 (the served
//              path, held to 5e-2).
enum class ComputePath { kReference, kFast };

// The fast path's opt-in requantized weights (docs/quantization.md, docs/kernels-int8.md): they
// change numerics, so the projections' and the experts' formats are part of the model
// fingerprint (they change the latent cache's bits; the lm_head changes only the logits).
struct WeightFormats {
  // --projection-dtype (--gemm-int8: int8): every FP8 projection (attention, dense and shared
  // MLPs, and the routed experts unless `experts` says otherwise).
  WeightFormat projections = WeightFormat::kFp8;
  HeadFormat lm_head = HeadFormat::kBf16;  // --lm-head-dtype (--lm-head-int8: int8)
  // --expert-dtype: the routed experts' format when given (docs/quantization.md); otherwise
  // theirs is the other projections'.
  std::optional<WeightFormat> experts;

  WeightFormat expert_format() const { return experts ? *experts : projections; }
  bool requantized() const {
    return projections != WeightFormat::kFp8 || lm_head != HeadFormat::kBf16 || experts;
  }
};

struct StepSequence {
  std::span<const int32_t> tokens;       // new tokens this step
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + tokens.size())
  int64_t n_logits = 1;                  // logits of the last n_logits new tokens (<= tokens)
  // Final hidden rows of the last max(n_logits, n_hidden) new tokens (<= tokens): the MTP
  // module reads every position's, logits are needed only for the last few.
  int64_t n_hidden = 0;

  int64_t hidden_rows() const { return std::max(n_logits, n_hidden); }
};

// forward()'s results, in batch order: logits of each sequence's last n_logits new tokens, and
// final hidden rows of its last hidden_rows() (so a sequence's logits rows are the last n_logits
// of its hidden rows).
struct StepOutput {
  std::vector<float> logits;  // [sum n_logits, vocab_size]
  std::vector<float> hidden;  // [sum hidden_rows(), hidden_width()]: after the final norm (the
                              // lm_head input; forward_mtp: after shared_head.norm), or V4's
                              // streams before their collapse
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual const ModelConfig& config() const = 0;

  // Runs the step; `out` gets the logits and final hidden rows of the requested positions.
  virtual Status forward(std::span<const StepSequence> batch, KvCache& cache, StepOutput* out) = 0;
  // Whether the weights include the MTP module (LoadOptions::mtp); its KV is the cache's last
  // layer, which then has num_layers() layers.
  virtual bool has_mtp() const = 0;
  // The MTP module (docs/mtp.md) over a batch laid out as for forward(): the row at position p
  // carries the token t_{p+1} and, in `hidden` [rows, H], the main model's final hidden row at
  // p (or the module's own output row at p - 1 when chaining drafts).
  virtual Status forward_mtp(std::span<const StepSequence> batch, const float* hidden,
                             KvCache& cache, StepOutput* out) = 0;
  // Values per row of StepOutput::hidden and of forward_mtp's `hidden`: the hidden size, or for
  // DeepSeek-V4 its hc_mult residual streams (hc_mult x hidden), which its MTP module takes.
  virtual int64_t hidden_width() const { return config().hidden_size; }
  // Layers of the KV cache this model writes (the MTP module's included).
  virtual int64_t num_layers() const = 0;
  // Every forward() and forward_mtp() is collective over the ranks of an EP group: callers
  // make the same calls on every rank.
  virtual bool collective() const = 0;
  // The routed experts this rank holds now (EPLB installs and drops them between steps).
  virtual ExpertStore& experts() = 0;
  // Records per-layer stages in a Chrome trace when non-null.
  virtual void set_tracer(Tracer* tracer) = 0;
  // EP: steps with fewer new tokens than this run as one micro-batch (-1: automatic).
  virtual void set_overlap_min_tokens(int64_t n) = 0;
};

}  // namespace moeserve
