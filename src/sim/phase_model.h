// Step time and throughput of one device in a prefill or a decode unit, from the per-layer
// operators (layer_ops.h), two micro-batches overlapping compute with the all-to-all, and the
// unit's deployment (EP size, redundant experts, batch, MTP).
//
// Decode: one step runs every sequence of the device's batch once (1 + draft query tokens each,
// verified together), plus the MTP module that drafts the next token. Prefill: one forward runs
// `tokens_per_device` new (uncached) prompt tokens. Pure functions; docs/sim.md has the formulas.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "sim/hardware.h"
#include "sim/layer_ops.h"
#include "sim/model_spec.h"

namespace moeserve::sim {

// Calibration against a measured trace (trace_calibration.h). The default is the identity:
// times straight from the kernel tables and the ideal overlap max(compute, all-to-all).
struct Calibration {
  bool active = false;
  // Measured / modelled time per operator group (layer_ops.h OpGroup) at the trace's shape.
  std::array<double, kOpGroups> op_scale{1, 1, 1, 1, 1, 1, 1, 1};
  // Decode: time a MoE layer by DeepSeek's published two-micro-batch schedule (profile-data
  // decode figure) instead of the ideal overlap: per micro-batch,
  // max(SHARED + ATTN-0, dispatch) + MLP + max(ATTN-1, combine).
  bool staged_decode = false;
  double layers_scale = 1;   // decode: measured / modelled time of all layers of a step
  double head_scale = 1;     // decode: measured / modelled rest of the step (MTP, heads, sampling)
  double forward_scale = 1;  // prefill: measured / modelled forward
};

struct UnitDeployment {
  int nodes_per_unit = 1;
  double ep = 8;  // devices per EP group (= devices in the unit)
  double redundant_experts = 0;
  double expert_imbalance = 1.0;  // busiest device's expert load over the mean (1: balanced)
  int micro_batches = 2;
  bool overlap = true;  // micro-batch i's all-to-all runs under micro-batch j's compute
  // Fraction of the device's compute left to GEMMs while all-to-all kernels run (DeepEP normal
  // kernels take 24 of 132 SMs in prefill; the decode kernels take none).
  double compute_share = 1.0;
  // Decode: sequences per device (absent: the largest batch meeting the speed target).
  // Prefill: new tokens per device per forward.
  std::optional<double> batch_per_device;
  int mtp_draft_tokens = 0;   // speculative tokens drafted by the MTP module per step
  double mtp_acceptance = 0;  // probability each drafted token is accepted
  Calibration calibration;
};

struct PromptBucket {
  double tokens = 0;    // prompt length
  double fraction = 0;  // share of requests
};

// Time of one layer (or of the whole step) split into what bounds it.
struct StepTime {
  double compute_s = 0;  // sum of compute over micro-batches
  double comm_s = 0;     // sum of all-to-all over micro-batches
  double total_s = 0;    // with overlap: max of the two per layer; without: their sum
};

struct DecodePoint {
  double batch = 0;  // sequences per device
  double step_s = 0;
  StepTime layers;               // all transformer layers (main model)
  double head_and_mtp_s = 0;     // lm_head + MTP module
  double tokens_per_step = 0;    // per sequence: 1 + accepted drafts
  double user_tokens_per_s = 0;  // per-sequence speed
  double device_tokens_per_s = 0;
  double kv_bytes_per_seq = 0;
  double max_batch_by_memory = 0;
};

struct PrefillPoint {
  double tokens_per_forward = 0;  // new tokens per device
  double forward_s = 0;
  StepTime layers;
  double computed_tokens_per_s = 0;  // per device
  double input_tokens_per_s = 0;     // per device, counting cache hits like DeepSeek does
  double cache_hit = 0;
};

// Per-operator breakdown of one decode MoE layer, one micro-batch (for reports), with the unit's
// calibration scales applied.
std::vector<OpCost> decode_layer_breakdown(const ModelSpec& m, const Hardware& hw,
                                           const UnitDeployment& u, double batch, double kv_len);

// Bytes of weights resident on one device of a unit (attention and dense layers replicated,
// routed experts split over EP, embedding and lm_head BF16).
double weight_bytes_per_device(const ModelSpec& m, const UnitDeployment& u);
// KV cache bytes a sequence holds per token of context (V3: the BF16 latent and rope key of
// every layer; V4: CSA entries and index keys per 4 tokens, HCA entries per 128), and a fixed
// part per sequence (V4: every layer's 128-entry window and the compressors' partial state).
double kv_bytes_per_token(const ModelSpec& m);
double kv_bytes_per_sequence_fixed(const ModelSpec& m);

DecodePoint decode_at(const ModelSpec& m, const Hardware& hw, const UnitDeployment& u, double batch,
                      double kv_len);
// The decode operating point: the given batch, or the largest batch that fits in memory and
// keeps the per-sequence speed at or above `min_user_tokens_per_s`.
Result<DecodePoint> decode_operating_point(const ModelSpec& m, const Hardware& hw,
                                           const UnitDeployment& u, double kv_len,
                                           double min_user_tokens_per_s);

Result<PrefillPoint> prefill_at(const ModelSpec& m, const Hardware& hw, const UnitDeployment& u,
                                const std::vector<PromptBucket>& prompts, double cache_hit);

}  // namespace moeserve::sim
