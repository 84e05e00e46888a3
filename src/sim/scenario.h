// A scenario is everything the cost model reads: model, hardware, deployment and workload.
// It is loaded from one JSON file (format in docs/sim.md; examples/sim/ has DeepSeek's day),
// validated once, and run to a SimResult: per-node prefill and decode throughput, the
// hour-by-hour node plan, daily cost, revenue and margin.
//
// Overrides ("deployment.decode.batch_per_device" = 96) patch the JSON before validation, so a
// sweep goes through the same checks as a file. Pure functions; no global state.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "sim/economics.h"
#include "sim/hardware.h"
#include "sim/model_spec.h"
#include "sim/phase_model.h"
#include "sim/trace_calibration.h"

namespace moeserve::sim {

struct Workload {
  DailyTraffic traffic;
  std::vector<PromptBucket> prompts;
  double decode_kv_tokens = 0;       // average KV length per output token
  double min_user_tokens_per_s = 0;  // per-sequence speed target for decode
  Prices prices;
  double usd_per_device_hour = 0;
  double window_start_hour = 0;              // clock hour of hourly_weights[0], for the plot
  std::vector<ScheduleStep> observed_nodes;  // a published schedule to price, if any
  double cache_hit() const {
    return traffic.input_tokens > 0 ? traffic.cached_input_tokens / traffic.input_tokens : 0;
  }
};

struct Scenario {
  std::string name;
  ModelSpec model;
  Hardware hardware;
  UnitDeployment prefill, decode;
  double max_utilization = 1.0;
  double fleet_nodes = 0;  // if set: how much of this traffic a fleet of this size can serve
  Workload workload;
  // Measured traces to calibrate against instead of the kernel tables alone (run_scenario
  // applies them to the units; the result's scenario carries the calibrated units).
  std::optional<TraceCalibration> trace_calibration;
};

struct SimResult {
  Scenario scenario;
  PrefillPoint prefill;
  DecodePoint decode;
  double prefill_input_tokens_per_s_per_node = 0;  // capacity, cache hits included
  double decode_output_tokens_per_s_per_node = 0;  // capacity at the speed target
  DayPlan plan;
  // With fleet_nodes: the multiple of the workload's traffic the fleet serves at its busiest
  // hour (fractional nodes, no unit rounding), and the tokens per day that makes.
  std::optional<double> fleet_traffic_scale, fleet_input_tokens_per_day,
      fleet_output_tokens_per_day;
  // Pricing of the published schedule, when the workload carries one.
  std::optional<double> observed_avg_nodes, observed_daily_cost_usd, observed_cost_profit_margin;
};

using Override = std::pair<std::string, double>;

// `base_dir` resolves a relative model config path.
Result<Scenario> parse_scenario(const std::string& json_text, const std::string& base_dir,
                                const std::vector<Override>& overrides = {});
Result<Scenario> load_scenario(const std::string& path,
                               const std::vector<Override>& overrides = {});
Result<SimResult> run_scenario(const Scenario& s);

// The scenario's day priced once per model (presets or config.json paths): the scenario's own
// model replaced, everything else kept (docs/sim.md "DeepSeek-V4 on the same day"). A unit's
// redundant experts are raised, if needed, to the fewest that give every device of the EP group
// the same number of expert slots (V4-Pro's 384 experts: 416 slots do not split over EP144, 432
// do). Scenarios with trace_calibration are refused: the traces measure V3.
Result<Scenario> with_model(const Scenario& s, const std::string& model);
Result<std::vector<SimResult>> run_models(const Scenario& s,
                                          const std::vector<std::string>& models);

}  // namespace moeserve::sim
