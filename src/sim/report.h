// Output of `moeserve sim`: the readable table, the --json document, the --sweep table and the
// SVG plot of nodes and cost over the day. Formatting only; every number comes from SimResult.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "sim/scenario.h"

namespace moeserve::sim {

std::string format_report(const SimResult& r);
std::string to_json(const SimResult& r);
std::string plot_svg(const SimResult& r);
// The same day priced for several models (run_models), one column per model.
std::string format_model_comparison(const std::vector<SimResult>& runs);

struct SweepSpec {
  std::string param;
  std::vector<double> values;
};
// "deployment.decode.batch_per_device=32:160:16" (a:b:step, b included).
Result<SweepSpec> parse_sweep(const std::string& spec);

struct SweepRow {
  double value = 0;
  std::optional<SimResult> result;
  std::string error;  // set when this value gives no result (does not fit, misses the target)
};
std::string format_sweep(const std::string& param, const std::vector<SweepRow>& rows);

}  // namespace moeserve::sim
