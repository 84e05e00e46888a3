// Per-operator FLOPs, bytes and time of one transformer layer of a DeepSeek-V3-class model for
// one micro-batch on one device, in the order the forward pass runs them (see
// docs/engine.md "The step"). Attention is data-parallel (each device runs its own
// sequences); routed experts are expert-parallel across `ep` devices; dispatch and combine are
// the all-to-all between them.
//
// Pure functions of their arguments; docs/sim.md derives every count below.
#pragma once

#include <string>
#include <vector>

#include "sim/hardware.h"
#include "sim/model_spec.h"

namespace moeserve::sim {

// One micro-batch on one device.
struct MicroBatch {
  double tokens = 0;      // query tokens (new tokens in prefill; 1 + draft per sequence in decode)
  double sequences = 0;   // sequences they belong to
  double attn_pairs = 0;  // sum over query tokens of the KV positions each one attends to
  double kv_tokens = 0;   // decode: latent-cache tokens read; prefill: cached-prefix tokens whose
                          // K/V must be expanded from the latent (kv_b_proj)
  bool decode = false;    // absorbed MLA over the latent cache (decode) or naive MLA (prefill)
};

// How the experts are laid out and moved.
struct ExpertLayout {
  double ep = 1;                 // devices in the EP group
  double redundant_experts = 0;  // replicas added by EPLB
  int devices_per_node = 8;
  CommMode comm = CommMode::kNormal;
  // Load of the busiest device over the mean (routed GEMMs and all-to-all wait for it); 1 is
  // the perfect balance EPLB aims at.
  double imbalance = 1.0;
};

// Where an operator sits in DeepSeek's two-micro-batch schedule (profile-data decode figure):
// ATTN-0 = everything before core attention (norms, q/kv projections, W_UK), ATTN-1 = core
// attention, W_UV and o_proj, then the router gate; SHARED = shared expert; MLP = routed experts
// (and a dense layer's MLP); dispatch and combine the all-to-all.
enum class OpGroup { kAttnPre, kAttnCore, kAttnPost, kGate, kShared, kRouted, kDispatch, kCombine };
inline constexpr int kOpGroups = 8;

struct OpCost {
  std::string name;
  double flops = 0;
  double bytes = 0;
  double seconds = 0;
  bool comm = false;  // all-to-all (overlappable with the other micro-batch's compute)
  OpGroup group = OpGroup::kAttnPre;
};

// Experts per device and tokens each routed expert receives from a micro-batch of `tokens` per
// device, with tokens spread evenly over all expert slots (EPLB's goal).
double experts_per_device(const ModelSpec& m, const ExpertLayout& e);
double tokens_per_expert(const ModelSpec& m, const ExpertLayout& e, double tokens);
// Expected distinct nodes that one token's top-k experts land on, experts spread evenly over
// `nodes` nodes (1 - (1 - 1/nodes)^k per node).
double expected_nodes_touched(double nodes, int k);

// Bytes one device sends for a micro-batch: dispatch (FP8 + one fp32 scale per 128 values) and
// combine (BF16). Low-latency kernels send one copy per (token, expert); normal kernels one copy
// per target node (NVLink forwarding inside the node).
double dispatch_bytes(const ModelSpec& m, const ExpertLayout& e, double tokens);
double combine_bytes(const ModelSpec& m, const ExpertLayout& e, double tokens);

// The operators of one layer (`moe` selects MoE or dense MLP FFN) for micro-batch `mb`.
std::vector<OpCost> layer_ops(const ModelSpec& m, const DeviceSpec& d, const NodeSpec& n,
                              const ExpertLayout& e, const MicroBatch& mb, bool moe);

// lm_head over `rows` tokens (BF16 weights, vocab x hidden).
OpCost lm_head_op(const ModelSpec& m, const DeviceSpec& d, double rows);

}  // namespace moeserve::sim
