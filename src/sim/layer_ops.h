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

// DeepSeek-V4 attention counts, summed over query tokens (or, for cache reads, over what is
// read). One query token that sees p positions (itself included) attends to min(window, p) window
// keys plus, in an HCA layer, every complete compressed entry floor(p / hca_ratio), in a CSA
// layer the indexer's min(index_topk, floor(p / csa_ratio)) picks, for which the indexer scores
// all floor(p / csa_ratio) entries.
struct V4Counts {
  double window = 0;
  double hca = 0;
  double csa = 0;
  double index = 0;
};
V4Counts v4_counts(const ModelSpec& m, double positions);
// Sum over `fresh` new tokens after `cached` positions (causal: the i-th sees cached + i).
V4Counts v4_counts_causal(const ModelSpec& m, double cached, double fresh);
V4Counts operator*(const V4Counts& c, double k);
V4Counts operator+(const V4Counts& a, const V4Counts& b);

// One micro-batch on one device.
struct MicroBatch {
  double tokens = 0;      // query tokens (new tokens in prefill; 1 + draft per sequence in decode)
  double sequences = 0;   // sequences they belong to
  double attn_pairs = 0;  // sum over query tokens of the KV positions each one attends to
  double kv_tokens = 0;   // decode: latent-cache tokens read; prefill: cached-prefix tokens whose
                          // K/V must be expanded from the latent (kv_b_proj)
  bool decode = false;    // absorbed MLA over the latent cache (decode) or naive MLA (prefill)
  // DeepSeek-V4 only: attention pairs summed over the query tokens, and (decode) cache entries
  // read: window, HCA entries and index keys once per sequence, CSA picks per query token.
  V4Counts v4_pairs = {};
  V4Counts v4_reads = {};
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

// The operators of one layer (`moe` selects MoE or dense MLP FFN) for micro-batch `mb`. For
// DeepSeek-V4 (every layer MoE) `compress_ratio` picks the layer kind: 0 (window only),
// m.csa_ratio (CSA) or m.hca_ratio (HCA).
std::vector<OpCost> layer_ops(const ModelSpec& m, const DeviceSpec& d, const NodeSpec& n,
                              const ExpertLayout& e, const MicroBatch& mb, bool moe,
                              int compress_ratio = 0);

// Weights of one V4 layer of `compress_ratio` outside the routed experts, in bytes as stored
// (FP8 projections and shared expert, BF16 wo_a, compressors, weights_proj and gate, F32 mHC).
double v4_layer_resident_bytes(const ModelSpec& m, int compress_ratio);

// lm_head over `rows` tokens (BF16 weights, vocab x hidden; V4 adds the mHC collapse hc_head).
OpCost lm_head_op(const ModelSpec& m, const DeviceSpec& d, double rows);

}  // namespace moeserve::sim
