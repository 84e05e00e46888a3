#include "sim/trace_calibration.h"

#include <fmt/format.h>

namespace moeserve::sim {

namespace {

// The unit as the trace ran it, uncalibrated.
UnitDeployment trace_unit(UnitDeployment u, const DecodeTrace& t) {
  u.ep = t.ep;
  u.redundant_experts = t.redundant_experts;
  u.batch_per_device = t.batch_per_device;
  u.mtp_draft_tokens = t.mtp_draft_tokens;
  u.expert_imbalance = 1.0;  // the traces simulate perfectly balanced routing
  u.calibration = Calibration{};
  return u;
}

}  // namespace

std::array<double, kOpGroups> modelled_decode_groups(const ModelSpec& m, const Hardware& hw,
                                                     const UnitDeployment& u,
                                                     const DecodeTrace& t) {
  UnitDeployment tu = trace_unit(u, t);
  std::array<double, kOpGroups> g{};
  for (const auto& op : decode_layer_breakdown(m, hw, tu, t.batch_per_device, t.kv_tokens)) {
    g[size_t(op.group)] += op.seconds;
  }
  return g;
}

Result<UnitDeployment> calibrate_decode(const ModelSpec& m, const Hardware& hw, UnitDeployment u,
                                        const DecodeTrace& t) {
  if (t.batch_per_device <= 0 || t.ep < 1 || t.kv_tokens <= 0 || t.layers_s <= 0 ||
      t.step_s <= t.layers_s) {
    return InvalidArgument(
        "decode trace: batch, ep, kv_tokens and layers time must be positive and the step "
        "longer than its layers");
  }
  if (u.micro_batches != 2 || !u.overlap) {
    return InvalidArgument(
        "decode trace calibration needs two overlapped micro-batches (the traced schedule)");
  }
  Calibration cal;
  cal.active = true;
  cal.staged_decode = true;
  auto modelled = modelled_decode_groups(m, hw, u, t);
  for (int i = 0; i < kOpGroups; ++i) {
    if (t.op_s[i] <= 0 || modelled[i] <= 0) {
      return InvalidArgument(
          fmt::format("decode trace: operator group {} has no measured or modelled time", i));
    }
    cal.op_scale[i] = t.op_s[i] / modelled[i];
  }
  // What is left between the per-operator times and the measured layers (launch gaps, the
  // dense layers' MLP) and the rest of the step (MTP module, lm_head, sampling).
  UnitDeployment tu = trace_unit(u, t);
  tu.calibration = cal;
  DecodePoint p = decode_at(m, hw, tu, t.batch_per_device, t.kv_tokens);
  cal.layers_scale = t.layers_s / p.layers.total_s;
  cal.head_scale = (t.step_s - t.layers_s) / p.head_and_mtp_s;
  u.calibration = cal;
  return u;
}

Result<UnitDeployment> calibrate_prefill(const ModelSpec& m, const Hardware& hw, UnitDeployment u,
                                         const PrefillTrace& t) {
  if (t.tokens_per_device <= 0 || t.ep < 1 || t.prompt_tokens < 1 ||
      t.computed_tokens_per_s_per_node <= 0) {
    return InvalidArgument(
        "prefill trace: tokens, ep, prompt length and throughput must be positive");
  }
  UnitDeployment tu = u;
  tu.ep = t.ep;
  tu.redundant_experts = t.redundant_experts;
  tu.batch_per_device = t.tokens_per_device;
  tu.expert_imbalance = 1.0;
  tu.calibration = Calibration{};
  ASSIGN_OR_RETURN(PrefillPoint p, prefill_at(m, hw, tu, {{t.prompt_tokens, 1.0}}, 0.0));
  double measured_forward_s =
      t.tokens_per_device * hw.node.devices / t.computed_tokens_per_s_per_node;
  u.calibration.active = true;
  u.calibration.forward_scale = measured_forward_s / p.forward_s;
  return u;
}

}  // namespace moeserve::sim
