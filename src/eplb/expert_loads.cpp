#include "eplb/expert_loads.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "eplb/load_stats.h"

namespace moeserve::eplb {

Result<ExpertLoads> make_expert_loads(const std::vector<std::vector<double>>& rows) {
  if (rows.empty() || rows[0].empty()) {
    return InvalidArgument("loads: need at least one layer and one expert");
  }
  ExpertLoads loads(static_cast<int32_t>(rows.size()), static_cast<int32_t>(rows[0].size()));
  for (size_t l = 0; l < rows.size(); ++l) {
    if (rows[l].size() != rows[0].size()) {
      return InvalidArgument(fmt::format("loads: layer {} has {} experts, layer 0 has {}", l,
                                         rows[l].size(), rows[0].size()));
    }
    for (size_t e = 0; e < rows[l].size(); ++e) {
      const double v = rows[l][e];
      if (!std::isfinite(v) || v < 0) {
        return InvalidArgument(
            fmt::format("loads: layer {} expert {} is {}, must be finite and >= 0", l, e, v));
      }
      loads.at(int32_t(l), int32_t(e)) = v;
    }
  }
  return loads;
}

namespace {

Result<ExpertLoads> matrix_from_json(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) return InvalidArgument(what + ": expected an array of layers");
  std::vector<std::vector<double>> rows;
  for (size_t l = 0; l < j.size(); ++l) {
    if (!j[l].is_array()) {
      return InvalidArgument(fmt::format("{}: layer {} is not an array of numbers", what, l));
    }
    auto& row = rows.emplace_back();
    for (size_t e = 0; e < j[l].size(); ++e) {
      if (!j[l][e].is_number()) {
        return InvalidArgument(fmt::format("{}: layer {} expert {} is not a number", what, l, e));
      }
      row.push_back(j[l][e].get<double>());
    }
  }
  auto loads = make_expert_loads(rows);
  if (!loads.ok()) return loads.status().with_context(what);
  return loads;
}

}  // namespace

Result<LoadFile> parse_load_file(std::string_view json_text, const std::string& origin) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  if (j.is_array()) {
    ASSIGN_OR_RETURN(ExpertLoads loads, matrix_from_json(j, origin));
    return LoadFile{std::move(loads), std::nullopt};
  }
  if (!j.is_object()) {
    return InvalidArgument(origin + ": expected a [layers][experts] matrix or a stats object");
  }
  if (!j.contains("format") || j["format"] != kExpertStatsFormat) {
    return InvalidArgument(
        fmt::format("{}: object without \"format\": \"{}\"", origin, kExpertStatsFormat));
  }
  if (!j.contains("version") || j["version"] != kExpertStatsVersion) {
    return InvalidArgument(fmt::format("{}: unsupported stats version (this build reads {})",
                                       origin, kExpertStatsVersion));
  }
  if (!j.contains("tokens")) return InvalidArgument(origin + ": stats file without \"tokens\"");
  ASSIGN_OR_RETURN(ExpertLoads loads, matrix_from_json(j["tokens"], origin + ": tokens"));
  const std::pair<const char*, int32_t> sizes[] = {{"num_layers", loads.num_layers},
                                                   {"num_experts", loads.num_experts}};
  for (const auto& [key, want] : sizes) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() != want) {
      return InvalidArgument(
          fmt::format("{}: \"{}\" missing or not the size of \"tokens\" ({})", origin, key, want));
    }
  }
  if (!j.contains("steps") || !j["steps"].is_number_integer() || j["steps"].get<int64_t>() < 1) {
    return InvalidArgument(origin + ": \"steps\" missing or not an integer >= 1");
  }
  return LoadFile{std::move(loads), j["steps"].get<int64_t>()};
}

Result<LoadFile> read_load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IOError(fmt::format("{}: cannot open", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IOError(fmt::format("{}: read failed", path));
  return parse_load_file(text.str(), path);
}

}  // namespace moeserve::eplb
