#include "sim/hardware.h"

#include <algorithm>
#include <cmath>

namespace moeserve::sim {

double gemm_flops(const GemmShape& s) {
  return 2.0 * s.groups * s.m * s.n * s.k;
}

double gemm_bytes(const GemmShape& s, double weight_bytes, double act_bytes) {
  return s.groups * (s.n * s.k * weight_bytes + s.m * s.k * act_bytes + s.m * s.n * 2.0);
}

namespace {

double roofline_seconds(const DeviceSpec& d, double flops, double bytes, double peak) {
  double compute = flops / (peak * d.gemm_compute_eff);
  double memory = bytes / (d.mem_bw * d.mem_bw_eff);
  return std::max(compute, memory);
}

const std::vector<GemmPoint>& table_for(const DeviceSpec& d, GemmKind kind) {
  switch (kind) {
    case GemmKind::kGroupedContiguous:
      return d.gemm_grouped_contiguous;
    case GemmKind::kGroupedMasked:
      return d.gemm_grouped_masked;
    case GemmKind::kDense:
      break;
  }
  return d.gemm_dense;
}

// Rows of `table` with this exact (n, k), sorted by m.
std::vector<GemmPoint> rows_for(const std::vector<GemmPoint>& table, double n, double k) {
  std::vector<GemmPoint> rows;
  for (const auto& p : table) {
    if (p.n == n && p.k == k && p.m > 0 && p.tflops > 0) rows.push_back(p);
  }
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.m < b.m; });
  return rows;
}

// Seconds for one group of `s` from tabulated rows (non-empty, sorted by m).
double table_seconds_one_group(const std::vector<GemmPoint>& rows, GemmShape s) {
  s.groups = 1;
  auto seconds_at = [&](const GemmPoint& p, double m) {
    return 2.0 * m * s.n * s.k / (p.tflops * 1e12);
  };
  if (s.m <= rows.front().m) {
    const GemmPoint& p = rows.front();
    GemmShape at = s;
    at.m = p.m;
    // Weight-bound below the table: same kernel time per byte moved.
    return seconds_at(p, p.m) * gemm_bytes(s, 1, 1) / gemm_bytes(at, 1, 1);
  }
  if (s.m >= rows.back().m) return seconds_at(rows.back(), s.m);
  for (size_t i = 1; i < rows.size(); ++i) {
    if (s.m <= rows[i].m) {
      const GemmPoint& a = rows[i - 1];
      const GemmPoint& b = rows[i];
      double t = std::log(s.m / a.m) / std::log(b.m / a.m);
      double tflops = a.tflops + t * (b.tflops - a.tflops);
      return 2.0 * s.m * s.n * s.k / (tflops * 1e12);
    }
  }
  return seconds_at(rows.back(), s.m);  // unreachable: s.m < rows.back().m
}

double interpolate_log(const std::vector<CommPoint>& table, double ep, bool dispatch) {
  std::vector<CommPoint> rows = table;
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.ep < b.ep; });
  auto bw = [&](const CommPoint& p) { return dispatch ? p.dispatch_bw : p.combine_bw; };
  if (ep <= rows.front().ep) return bw(rows.front());
  if (ep >= rows.back().ep) return bw(rows.back());
  for (size_t i = 1; i < rows.size(); ++i) {
    if (ep <= rows[i].ep) {
      double t = std::log(ep / rows[i - 1].ep) / std::log(rows[i].ep / rows[i - 1].ep);
      return bw(rows[i - 1]) + t * (bw(rows[i]) - bw(rows[i - 1]));
    }
  }
  return bw(rows.back());
}

double link_bw(const NodeSpec& n, double ep) {
  double link = ep <= n.devices ? n.scale_up_bw : n.scale_out_bw;
  return link * n.comm_eff;
}

}  // namespace

double fp8_gemm_seconds(const DeviceSpec& d, GemmKind kind, const GemmShape& s) {
  if (s.m <= 0) return 0;
  // A device without FP8 tensor math has no FP8 kernel table: FP8 weights, BF16 arithmetic.
  if (d.fp8_flops <= 0)
    return roofline_seconds(d, gemm_flops(s), gemm_bytes(s, 1, 2), d.bf16_flops);
  auto rows = rows_for(table_for(d, kind), s.n, s.k);
  if (rows.empty() && kind != GemmKind::kDense) rows = rows_for(d.gemm_dense, s.n, s.k);
  if (rows.empty()) return roofline_seconds(d, gemm_flops(s), gemm_bytes(s, 1, 1), d.fp8_flops);
  return s.groups * table_seconds_one_group(rows, s);
}

double roofline_gemm_seconds(const DeviceSpec& d, const GemmShape& s, double weight_bytes,
                             double act_bytes, double peak) {
  if (s.m <= 0) return 0;
  return roofline_seconds(d, gemm_flops(s), gemm_bytes(s, weight_bytes, act_bytes), peak);
}

double bf16_gemm_seconds(const DeviceSpec& d, const GemmShape& s) {
  if (s.m <= 0) return 0;
  return roofline_seconds(d, gemm_flops(s), gemm_bytes(s, 2, 2), d.bf16_flops);
}

double memory_seconds(const DeviceSpec& d, double bytes) {
  return bytes / (d.mem_bw * d.mem_bw_eff);
}

double dispatch_bw(const NodeSpec& n, CommMode mode, double ep) {
  const auto& table = mode == CommMode::kNormal ? n.comm_normal : n.comm_low_latency;
  if (table.empty()) return link_bw(n, ep);
  return interpolate_log(table, ep, /*dispatch=*/true);
}

double combine_bw(const NodeSpec& n, CommMode mode, double ep) {
  const auto& table = mode == CommMode::kNormal ? n.comm_normal : n.comm_low_latency;
  if (table.empty()) return link_bw(n, ep);
  return interpolate_log(table, ep, /*dispatch=*/false);
}

}  // namespace moeserve::sim
