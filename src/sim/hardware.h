// Hardware description for the cost model, and the two lookups everything else is timed with:
// how long a GEMM of a given shape takes on a device, and how fast an EP all-to-all runs.
//
// Achieved speeds come from published kernel tables carried in the hardware input (DeepGEMM's
// TFLOPS per shape, FlashMLA's GB/s and TFLOPS, DeepEP's GB/s per EP size; docs/sim.md lists
// them with their sources). Shapes or EP sizes a table does not cover fall back to a roofline with
// the device's documented efficiency fractions. Plain values; all functions are pure.
#pragma once

#include <string>
#include <vector>

namespace moeserve::sim {

// One published row: a (grouped) GEMM with `m` rows per group, output width n, depth k, that
// ran at `tflops` (aggregate over groups).
struct GemmPoint {
  double m = 0, n = 0, k = 0;
  double tflops = 0;
};

enum class GemmKind { kDense, kGroupedContiguous, kGroupedMasked };

struct DeviceSpec {
  std::string name;
  double fp8_flops =
      0;  // dense peak FLOP/s with FP8 inputs; 0: none (FP8 weights computed in BF16)
  double bf16_flops = 0;             // dense peak FLOP/s with BF16 inputs
  double mem_bw = 0;                 // bytes/s, peak
  double mem_bytes = 0;              // capacity
  double mem_usable_fraction = 0.9;  // the rest: activations, comm buffers, runtime
  // Roofline fallback for shapes no table covers: achieved fraction of peak FLOP/s (large M)
  // and of peak bandwidth (small M, weights dominate).
  double gemm_compute_eff = 0.5;
  double mem_bw_eff = 0.8;
  std::vector<GemmPoint> gemm_dense, gemm_grouped_contiguous, gemm_grouped_masked;  // FP8 tables
  // Attention kernels, achieved: decode (absorbed MLA over the latent cache) is a roofline of
  // these two; prefill attention runs at attn_prefill_flops. 0 = use the fallback fractions.
  double attn_decode_bw = 0;
  double attn_decode_flops = 0;
  double attn_prefill_flops = 0;
};

// One published all-to-all measurement at EP size `ep`: bandwidth as the library counts it.
struct CommPoint {
  double ep = 0;
  double dispatch_bw = 0;  // bytes/s
  double combine_bw = 0;
};

struct NodeSpec {
  std::string name;
  int devices = 8;
  double scale_up_bw = 0;   // per device, bytes/s, inside the node (NVLink; socket link on CPUs)
  double scale_out_bw = 0;  // per device, bytes/s, across nodes (RDMA NIC)
  double comm_eff = 0.8;    // achieved fraction of the link when no table row applies
  // Bandwidth tables by EP size. `normal`: the throughput kernels (prefill; NVLink forwarding,
  // bytes counted once per target node). `low_latency`: pure-RDMA kernels (decode; bytes counted
  // once per (token, expert) pair).
  std::vector<CommPoint> comm_normal, comm_low_latency;
};

struct Hardware {
  DeviceSpec device;
  NodeSpec node;
};

struct GemmShape {
  double m = 0;  // rows per group (tokens)
  double n = 0;  // output width
  double k = 0;  // depth
  double groups = 1;
};

// FLOPs and bytes of a GEMM: weights `weight_bytes` per element (1 for FP8, 2 for BF16),
// activations in `act_bytes`, output BF16.
double gemm_flops(const GemmShape& s);
double gemm_bytes(const GemmShape& s, double weight_bytes, double act_bytes);

// Seconds for one (grouped) GEMM with FP8 weights and activations (the DeepGEMM path): table
// lookup by exact (n, k), interpolated in log(m) between rows; below the smallest tabulated m
// the time scales with bytes moved (weight-bound), above the largest the TFLOPS stays flat.
// Without a matching row, a roofline at the fallback fractions.
double fp8_gemm_seconds(const DeviceSpec& d, GemmKind kind, const GemmShape& s);
// Roofline seconds of a GEMM at the fallback fractions: `peak` FLOP/s and weights of
// `weight_bytes` per element (FP4 routed experts: 0.53125; F32 mHC mixes: 4).
double roofline_gemm_seconds(const DeviceSpec& d, const GemmShape& s, double weight_bytes,
                             double act_bytes, double peak);
// Seconds for a BF16 GEMM (lm_head, router gate, absorbed attention products): roofline at the
// fallback fractions of the BF16 peak.
double bf16_gemm_seconds(const DeviceSpec& d, const GemmShape& s);
// Seconds for memory-bound elementwise work moving `bytes`.
double memory_seconds(const DeviceSpec& d, double bytes);

enum class CommMode { kNormal, kLowLatency };
// Achieved dispatch and combine bandwidth (bytes/s per device) at EP size `ep`: the table for
// `mode` interpolated in log(ep) and clamped at its ends; without a table, the scale-up link
// inside one node or the scale-out link beyond it, times comm_eff.
double dispatch_bw(const NodeSpec& n, CommMode mode, double ep);
double combine_bw(const NodeSpec& n, CommMode mode, double ep);

}  // namespace moeserve::sim
