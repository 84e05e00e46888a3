// Calibration of the cost model against measured profiler traces of the real system, the
// alternative to the kernel-table mode (docs/sim.md "Calibrating to DeepSeek's profile traces").
//
// A trace gives measured times at one configuration (EP size, batch, context). The model is run
// at exactly that configuration with the kernel tables; measured / modelled per operator group
// (decode) or per forward (prefill) become scales that the unit then carries to any other
// configuration (Calibration in phase_model.h). Decode also switches to DeepSeek's published
// two-micro-batch schedule, the one the trace was taken under. Nothing here looks at the
// figures the scenario is checked against. Pure functions.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "core/status.h"
#include "sim/hardware.h"
#include "sim/layer_ops.h"
#include "sim/model_spec.h"
#include "sim/phase_model.h"

namespace moeserve::sim {

// Decode trace: one MoE layer, one micro-batch, measured per operator group (seconds), plus
// the whole step.
struct DecodeTrace {
  double batch_per_device = 0;  // sequences per device (both micro-batches)
  double ep = 0;
  double redundant_experts = 0;
  double kv_tokens = 0;  // context length of every sequence
  int mtp_draft_tokens = 0;
  std::array<double, kOpGroups> op_s{};  // indexed by OpGroup
  double layers_s = 0;                   // all transformer layers of one step
  double step_s = 0;                     // the whole step
};

// Prefill trace: throughput of whole forwards at one configuration, no cache hits.
struct PrefillTrace {
  double tokens_per_device = 0;
  double ep = 0;
  double redundant_experts = 0;
  double prompt_tokens = 0;
  double computed_tokens_per_s_per_node = 0;
};

struct TraceCalibration {
  std::string source;
  std::optional<DecodeTrace> decode;
  std::optional<PrefillTrace> prefill;
};

// Modelled time (seconds) per operator group of one decode MoE layer, one micro-batch, at the
// trace's configuration, kernel tables only.
std::array<double, kOpGroups> modelled_decode_groups(const ModelSpec& m, const Hardware& hw,
                                                     const UnitDeployment& u, const DecodeTrace& t);

// `u` with a calibration derived from the trace (scales and the staged decode schedule); the
// unit's own EP size, batch and MTP settings are kept.
Result<UnitDeployment> calibrate_decode(const ModelSpec& m, const Hardware& hw, UnitDeployment u,
                                        const DecodeTrace& t);
Result<UnitDeployment> calibrate_prefill(const ModelSpec& m, const Hardware& hw, UnitDeployment u,
                                         const PrefillTrace& t);

}  // namespace moeserve::sim
