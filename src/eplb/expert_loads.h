// ExpertLoads: tokens routed to each logical expert of each MoE layer, the input of the load
// balancer, and the two files it is read from (docs/eplb.md, "File formats"):
//   - a plain JSON matrix [layers][experts] of non-negative numbers;
//   - the expert-statistics file that serving writes (`--expert-stats-out`, load_stats.h),
//     an object {"format": "moeserve.expert_stats", "version": 1, ..., "tokens": [[...]]}.
// Both are validated once here (rectangular, non-empty, finite, >= 0); code past this point
// trusts an ExpertLoads. A plain value: copy it freely, no thread affinity.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::eplb {

struct ExpertLoads {
  int32_t num_layers = 0;
  int32_t num_experts = 0;     // logical experts per layer
  std::vector<double> tokens;  // [num_layers][num_experts], row-major

  ExpertLoads() = default;
  ExpertLoads(int32_t layers, int32_t experts)
      : num_layers(layers), num_experts(experts), tokens(size_t(layers) * experts, 0.0) {}

  double& at(int32_t layer, int32_t expert) { return tokens[size_t(layer) * num_experts + expert]; }
  double at(int32_t layer, int32_t expert) const {
    return tokens[size_t(layer) * num_experts + expert];
  }
  std::span<const double> layer(int32_t l) const {
    return {tokens.data() + size_t(l) * num_experts, size_t(num_experts)};
  }
};

// Builds loads from nested rows, checking shape and values (for callers holding vectors).
Result<ExpertLoads> make_expert_loads(const std::vector<std::vector<double>>& rows);

// The content of a loads file. `steps` (the number of steps the tokens were counted over) is
// present only in the stats format; a plain matrix carries no step count.
struct LoadFile {
  ExpertLoads loads;
  std::optional<int64_t> steps;
};

// Parses either file format from its text; `origin` names the source in error messages.
Result<LoadFile> parse_load_file(std::string_view json_text, const std::string& origin);

// Reads and parses a file in either format.
Result<LoadFile> read_load_file(const std::string& path);

}  // namespace moeserve::eplb
