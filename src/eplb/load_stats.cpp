#include "eplb/load_stats.h"

#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace moeserve::eplb {

ExpertLoadStats::ExpertLoadStats(int32_t num_layers, int32_t num_experts, int32_t window_steps)
    : num_layers_(num_layers), num_experts_(num_experts), window_steps_(window_steps) {
  CHECK(num_layers >= 1 && num_experts >= 1 && window_steps >= 1,
        "expert stats need >= 1 layer, expert and window step");
  current_.assign(size_t(num_layers) * num_experts, 0);
  totals_.assign(current_.size(), 0);
}

void ExpertLoadStats::add(int32_t layer, int32_t expert, int64_t tokens) {
  CHECK(layer >= 0 && layer < num_layers_ && expert >= 0 && expert < num_experts_,
        "expert id out of range (the gate produces ids < num_experts)");
  current_[index(layer, expert)] += tokens;
}

void ExpertLoadStats::add_routed(int32_t layer, std::span<const int32_t> expert_ids) {
  for (int32_t e : expert_ids) add(layer, e, 1);
}

void ExpertLoadStats::end_step() {
  // Make room for one step: drop whole blocks from the front (a seeded block leaves at once).
  while (!window_.empty() && steps_in_window_ + 1 > window_steps_) {
    Block& old = window_.front();
    for (size_t i = 0; i < totals_.size(); ++i) totals_[i] -= old.tokens[i];
    steps_in_window_ -= old.steps;
    window_.pop_front();
  }
  for (size_t i = 0; i < totals_.size(); ++i) totals_[i] += current_[i];
  Block step{1, false, std::vector<int64_t>(current_.size(), 0)};
  step.tokens.swap(current_);  // current_ is now zeroed for the next step
  window_.push_back(std::move(step));
  ++steps_in_window_;
  ++steps_completed_;
}

Status ExpertLoadStats::seed(const ExpertLoads& totals, int64_t steps) {
  if (totals.num_layers != num_layers_ || totals.num_experts != num_experts_) {
    return InvalidArgument(fmt::format(
        "expert stats: saved loads are [{}][{}], this model has {} MoE layers x {} experts",
        totals.num_layers, totals.num_experts, num_layers_, num_experts_));
  }
  if (steps < 1 || steps > window_steps_) {
    return InvalidArgument(
        fmt::format("expert stats: seed of {} steps, must be in 1..{}", steps, window_steps_));
  }
  for (double v : totals.tokens) {
    if (v > 9.0e18) {  // int64 token counters; an ExpertLoads is already finite and >= 0
      return InvalidArgument(fmt::format("expert stats: saved total {} is out of range", v));
    }
  }
  Block block{steps, true, std::vector<int64_t>(totals.tokens.size())};
  for (size_t i = 0; i < block.tokens.size(); ++i) {
    block.tokens[i] = std::llround(totals.tokens[i]);  // saved totals are token counts
  }
  if (!window_.empty() && window_.front().seeded) {  // replace an earlier seed
    for (size_t i = 0; i < totals_.size(); ++i) totals_[i] -= window_.front().tokens[i];
    steps_in_window_ -= window_.front().steps;
    window_.pop_front();
  }
  // The seed is older than every real step; drop real steps that no longer fit.
  while (!window_.empty() && steps_in_window_ + steps > window_steps_) {
    for (size_t i = 0; i < totals_.size(); ++i) totals_[i] -= window_.front().tokens[i];
    steps_in_window_ -= window_.front().steps;
    window_.pop_front();
  }
  for (size_t i = 0; i < totals_.size(); ++i) totals_[i] += block.tokens[i];
  steps_in_window_ += steps;
  window_.push_front(std::move(block));
  return Status::Ok();
}

ExpertLoads ExpertLoadStats::window_totals() const {
  ExpertLoads out(num_layers_, num_experts_);
  for (size_t i = 0; i < totals_.size(); ++i) out.tokens[i] = static_cast<double>(totals_[i]);
  return out;
}

ExpertLoads ExpertLoadStats::moving_average() const {
  ExpertLoads out = window_totals();
  if (steps_in_window_ > 0) {
    for (double& v : out.tokens) v /= static_cast<double>(steps_in_window_);
  }
  return out;
}

std::string ExpertLoadStats::to_json() const {
  nlohmann::json tokens = nlohmann::json::array();
  for (int32_t l = 0; l < num_layers_; ++l) {
    tokens.push_back(std::vector<int64_t>(totals_.begin() + index(l, 0),
                                          totals_.begin() + index(l, 0) + num_experts_));
  }
  nlohmann::ordered_json j;
  j["format"] = kExpertStatsFormat;
  j["version"] = kExpertStatsVersion;
  j["num_layers"] = num_layers_;
  j["num_experts"] = num_experts_;
  j["window_steps"] = window_steps_;
  j["steps"] = steps_in_window_;
  j["tokens"] = std::move(tokens);
  return j.dump() + "\n";
}

Status ExpertLoadStats::write(const std::string& path) const {
  // Write to a temporary name and rename, so a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return IOError(fmt::format("{}: cannot open for writing", tmp));
    out << to_json();
    out.flush();
    if (!out) return IOError(fmt::format("{}: write failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return IOError(fmt::format("{}: cannot rename to {}", tmp, path));
  }
  return Status::Ok();
}

}  // namespace moeserve::eplb
