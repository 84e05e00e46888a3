#include "sim/scenario.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeserve::sim {

namespace {

using nlohmann::json;

Status need_object(const json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(fmt::format("'{}' must be a JSON object", where));
  return Status::Ok();
}

// Reads a number at j[key]; absent keys keep *out unless required.
Status num(const json& j, const std::string& where, const char* key, double* out,
           bool required = false) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument(fmt::format("missing '{}.{}'", where, key));
    return Status::Ok();
  }
  if (!it->is_number()) return InvalidArgument(fmt::format("'{}.{}' must be a number", where, key));
  *out = it->get<double>();
  if (!std::isfinite(*out))
    return InvalidArgument(fmt::format("'{}.{}' is not finite", where, key));
  return Status::Ok();
}

Status integer(const json& j, const std::string& where, const char* key, int* out,
               bool required = false) {
  double v = *out;
  RETURN_IF_ERROR(num(j, where, key, &v, required));
  if (v != std::floor(v)) return InvalidArgument(fmt::format("'{}.{}' must be whole", where, key));
  *out = int(v);
  return Status::Ok();
}

Status boolean(const json& j, const std::string& where, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean())
    return InvalidArgument(fmt::format("'{}.{}' must be true or false", where, key));
  *out = it->get<bool>();
  return Status::Ok();
}

// Rows of numbers with `width` columns.
Result<std::vector<std::vector<double>>> rows(const json& j, const std::string& where,
                                              const char* key, size_t width) {
  std::vector<std::vector<double>> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return InvalidArgument(fmt::format("'{}.{}' must be an array", where, key));
  for (const auto& row : *it) {
    if (!row.is_array() || row.size() != width) {
      return InvalidArgument(
          fmt::format("'{}.{}': each row must have {} numbers", where, key, width));
    }
    std::vector<double> r;
    for (const auto& v : row) {
      if (!v.is_number())
        return InvalidArgument(fmt::format("'{}.{}': non-number in a row", where, key));
      r.push_back(v.get<double>());
    }
    out.push_back(std::move(r));
  }
  return out;
}

Status parse_device(const json& j, DeviceSpec* d) {
  const std::string w = "hardware.device";
  RETURN_IF_ERROR(need_object(j, w));
  d->name = j.value("name", "device");
  double fp8 = 0, bf16 = 0, bw = 0, gb = 0;
  RETURN_IF_ERROR(num(j, w, "fp8_tflops", &fp8));
  RETURN_IF_ERROR(num(j, w, "bf16_tflops", &bf16, true));
  RETURN_IF_ERROR(num(j, w, "mem_bw_gbps", &bw, true));
  RETURN_IF_ERROR(num(j, w, "mem_gb", &gb, true));
  d->fp8_flops = fp8 * 1e12;
  d->bf16_flops = bf16 * 1e12;
  d->mem_bw = bw * 1e9;
  d->mem_bytes = gb * 1e9;
  RETURN_IF_ERROR(num(j, w, "mem_usable_fraction", &d->mem_usable_fraction));
  RETURN_IF_ERROR(num(j, w, "gemm_compute_eff", &d->gemm_compute_eff));
  RETURN_IF_ERROR(num(j, w, "mem_bw_eff", &d->mem_bw_eff));
  ASSIGN_OR_RETURN(auto dense, rows(j, w, "gemm_fp8_dense", 4));
  for (auto& r : dense) d->gemm_dense.push_back({r[0], r[1], r[2], r[3]});
  ASSIGN_OR_RETURN(auto contig, rows(j, w, "gemm_fp8_grouped_contiguous", 5));
  for (auto& r : contig) d->gemm_grouped_contiguous.push_back({r[1], r[2], r[3], r[4]});
  ASSIGN_OR_RETURN(auto masked, rows(j, w, "gemm_fp8_grouped_masked", 5));
  for (auto& r : masked) d->gemm_grouped_masked.push_back({r[1], r[2], r[3], r[4]});
  if (auto a = j.find("attention"); a != j.end()) {
    double dec_bw = 0, dec_tf = 0, pre_tf = 0;
    RETURN_IF_ERROR(num(*a, w + ".attention", "decode_gbps", &dec_bw));
    RETURN_IF_ERROR(num(*a, w + ".attention", "decode_tflops", &dec_tf));
    RETURN_IF_ERROR(num(*a, w + ".attention", "prefill_tflops", &pre_tf));
    d->attn_decode_bw = dec_bw * 1e9;
    d->attn_decode_flops = dec_tf * 1e12;
    d->attn_prefill_flops = pre_tf * 1e12;
  }
  if (d->bf16_flops <= 0 || d->mem_bw <= 0 || d->mem_bytes <= 0 || d->fp8_flops < 0) {
    return InvalidArgument("hardware.device: TFLOPS, bandwidth and memory must be positive");
  }
  for (double f : {d->mem_usable_fraction, d->gemm_compute_eff, d->mem_bw_eff}) {
    if (f <= 0 || f > 1)
      return InvalidArgument("hardware.device: efficiency fractions must be in (0, 1]");
  }
  return Status::Ok();
}

Status parse_node(const json& j, NodeSpec* n) {
  const std::string w = "hardware.node";
  RETURN_IF_ERROR(need_object(j, w));
  n->name = j.value("name", "node");
  double up = 0, out = 0;
  RETURN_IF_ERROR(integer(j, w, "devices", &n->devices, true));
  RETURN_IF_ERROR(num(j, w, "scale_up_gbps", &up, true));
  RETURN_IF_ERROR(num(j, w, "scale_out_gbps", &out, true));
  RETURN_IF_ERROR(num(j, w, "comm_eff", &n->comm_eff));
  n->scale_up_bw = up * 1e9;
  n->scale_out_bw = out * 1e9;
  for (auto [key, table] : {std::pair{"a2a_normal", &n->comm_normal},
                            std::pair{"a2a_low_latency", &n->comm_low_latency}}) {
    ASSIGN_OR_RETURN(auto r, rows(j, w, key, 3));
    for (auto& row : r) {
      if (row[0] < 1 || row[1] <= 0 || row[2] <= 0) {
        return InvalidArgument(fmt::format("'{}.{}': EP and bandwidths must be positive", w, key));
      }
      table->push_back({row[0], row[1] * 1e9, row[2] * 1e9});
    }
  }
  if (n->devices < 1 || n->scale_up_bw <= 0 || n->scale_out_bw <= 0 || n->comm_eff <= 0 ||
      n->comm_eff > 1) {
    return InvalidArgument(
        "hardware.node: devices and link bandwidths must be positive, comm_eff in (0, 1]");
  }
  return Status::Ok();
}

Status parse_unit(const json& j, const std::string& w, int devices_per_node, bool decode,
                  UnitDeployment* u) {
  RETURN_IF_ERROR(need_object(j, w));
  RETURN_IF_ERROR(integer(j, w, "nodes_per_unit", &u->nodes_per_unit, true));
  if (u->nodes_per_unit < 1) return InvalidArgument(w + ".nodes_per_unit must be at least 1");
  double unit_devices = double(u->nodes_per_unit) * devices_per_node;
  u->ep = unit_devices;
  RETURN_IF_ERROR(num(j, w, "ep", &u->ep));
  if (u->ep != unit_devices) {
    return InvalidArgument(
        fmt::format("{}.ep = {} but the unit has {} devices ({} nodes x {}); "
                    "EP spans the whole unit",
                    w, u->ep, unit_devices, u->nodes_per_unit, devices_per_node));
  }
  double dp = u->ep;
  RETURN_IF_ERROR(num(j, w, "dp_attention", &dp));
  if (dp != u->ep) {
    return Unimplemented(w +
                         ".dp_attention must equal ep (attention data-parallel on every "
                         "device; tensor-parallel attention is not modelled)");
  }
  RETURN_IF_ERROR(num(j, w, "redundant_experts", &u->redundant_experts));
  RETURN_IF_ERROR(num(j, w, "expert_imbalance", &u->expert_imbalance));
  if (u->expert_imbalance < 1)
    return InvalidArgument(w + ".expert_imbalance must be >= 1 (max/mean)");
  RETURN_IF_ERROR(integer(j, w, "micro_batches", &u->micro_batches));
  RETURN_IF_ERROR(boolean(j, w, "overlap", &u->overlap));
  RETURN_IF_ERROR(num(j, w, "compute_share", &u->compute_share));
  const char* batch_key = decode ? "batch_per_device" : "tokens_per_device";
  double batch = 0;
  RETURN_IF_ERROR(num(j, w, batch_key, &batch));
  if (batch > 0) u->batch_per_device = batch;
  if (decode) {
    RETURN_IF_ERROR(integer(j, w, "mtp_draft_tokens", &u->mtp_draft_tokens));
    RETURN_IF_ERROR(num(j, w, "mtp_acceptance", &u->mtp_acceptance));
  }
  if (u->redundant_experts < 0 || u->micro_batches < 1 || u->compute_share <= 0 ||
      u->compute_share > 1 || u->mtp_draft_tokens < 0 || u->mtp_acceptance < 0 ||
      u->mtp_acceptance > 1) {
    return InvalidArgument(w +
                           ": redundant_experts >= 0, micro_batches >= 1, compute_share and "
                           "mtp_acceptance in (0, 1], mtp_draft_tokens >= 0");
  }
  return Status::Ok();
}

Status parse_workload(const json& j, Workload* wl) {
  const std::string w = "workload";
  RETURN_IF_ERROR(need_object(j, w));
  DailyTraffic& t = wl->traffic;
  RETURN_IF_ERROR(num(j, w, "input_tokens_per_day", &t.input_tokens, true));
  RETURN_IF_ERROR(num(j, w, "output_tokens_per_day", &t.output_tokens, true));
  RETURN_IF_ERROR(num(j, w, "cached_input_tokens_per_day", &t.cached_input_tokens));
  if (j.contains("cache_hit_ratio")) {
    double hit = 0;
    RETURN_IF_ERROR(num(j, w, "cache_hit_ratio", &hit));
    t.cached_input_tokens = hit * t.input_tokens;
  }
  if (t.input_tokens <= 0 || t.output_tokens <= 0 || t.cached_input_tokens < 0 ||
      t.cached_input_tokens >= t.input_tokens) {
    return InvalidArgument("workload: token counts must be positive and cached < input");
  }
  if (auto it = j.find("hourly_weights"); it != j.end()) {
    if (!it->is_array()) return InvalidArgument("workload.hourly_weights must be an array");
    for (const auto& v : *it) {
      if (!v.is_number() || v.get<double>() < 0) {
        return InvalidArgument("workload.hourly_weights must be non-negative numbers");
      }
      t.hourly_weights.push_back(v.get<double>());
    }
  }
  ASSIGN_OR_RETURN(auto buckets, rows(j, w, "prompt_tokens", 2));
  for (auto& r : buckets) wl->prompts.push_back({r[0], r[1]});
  if (wl->prompts.empty())
    return InvalidArgument("workload.prompt_tokens: give [[tokens, fraction], ...]");
  RETURN_IF_ERROR(num(j, w, "decode_kv_tokens", &wl->decode_kv_tokens, true));
  RETURN_IF_ERROR(num(j, w, "user_tokens_per_s_target", &wl->min_user_tokens_per_s, true));
  RETURN_IF_ERROR(num(j, w, "usd_per_device_hour", &wl->usd_per_device_hour, true));
  RETURN_IF_ERROR(num(j, w, "window_start_hour", &wl->window_start_hour));
  if (auto p = j.find("prices_usd_per_mtok"); p != j.end()) {
    const std::string pw = w + ".prices_usd_per_mtok";
    RETURN_IF_ERROR(num(*p, pw, "cached_input", &wl->prices.cached_input_per_mtok, true));
    RETURN_IF_ERROR(num(*p, pw, "input", &wl->prices.input_per_mtok, true));
    RETURN_IF_ERROR(num(*p, pw, "output", &wl->prices.output_per_mtok, true));
  }
  ASSIGN_OR_RETURN(auto steps, rows(j, w, "observed_nodes", 2));
  for (auto& r : steps) wl->observed_nodes.push_back({r[0], r[1]});
  return Status::Ok();
}

Status parse_trace_calibration(const json& j, TraceCalibration* tc) {
  const std::string w = "trace_calibration";
  RETURN_IF_ERROR(need_object(j, w));
  tc->source = j.value("source", "");
  if (auto d = j.find("decode"); d != j.end() && !d->is_null()) {
    const std::string dw = w + ".decode";
    RETURN_IF_ERROR(need_object(*d, dw));
    DecodeTrace t;
    RETURN_IF_ERROR(num(*d, dw, "batch_per_device", &t.batch_per_device, true));
    RETURN_IF_ERROR(num(*d, dw, "ep", &t.ep, true));
    RETURN_IF_ERROR(num(*d, dw, "redundant_experts", &t.redundant_experts));
    RETURN_IF_ERROR(num(*d, dw, "kv_tokens", &t.kv_tokens, true));
    RETURN_IF_ERROR(integer(*d, dw, "mtp_draft_tokens", &t.mtp_draft_tokens));
    double layers_ms = 0, step_ms = 0;
    RETURN_IF_ERROR(num(*d, dw, "layers_ms", &layers_ms, true));
    RETURN_IF_ERROR(num(*d, dw, "step_ms", &step_ms, true));
    t.layers_s = layers_ms / 1e3;
    t.step_s = step_ms / 1e3;
    auto ops = d->find("op_us");
    if (ops == d->end()) return InvalidArgument("missing '" + dw + ".op_us'");
    const std::string ow = dw + ".op_us";
    RETURN_IF_ERROR(need_object(*ops, ow));
    static constexpr std::pair<const char*, OpGroup> kKeys[] = {
        {"attn_pre", OpGroup::kAttnPre},   {"attn_core", OpGroup::kAttnCore},
        {"attn_post", OpGroup::kAttnPost}, {"gate", OpGroup::kGate},
        {"shared", OpGroup::kShared},      {"routed", OpGroup::kRouted},
        {"dispatch", OpGroup::kDispatch},  {"combine", OpGroup::kCombine}};
    for (const auto& [key, group] : kKeys) {
      double us = 0;
      RETURN_IF_ERROR(num(*ops, ow, key, &us, true));
      t.op_s[size_t(group)] = us / 1e6;
    }
    tc->decode = t;
  }
  if (auto p = j.find("prefill"); p != j.end() && !p->is_null()) {
    const std::string pw = w + ".prefill";
    RETURN_IF_ERROR(need_object(*p, pw));
    PrefillTrace t;
    RETURN_IF_ERROR(num(*p, pw, "tokens_per_device", &t.tokens_per_device, true));
    RETURN_IF_ERROR(num(*p, pw, "ep", &t.ep, true));
    RETURN_IF_ERROR(num(*p, pw, "redundant_experts", &t.redundant_experts));
    RETURN_IF_ERROR(num(*p, pw, "prompt_tokens", &t.prompt_tokens, true));
    RETURN_IF_ERROR(
        num(*p, pw, "computed_tokens_per_s_per_node", &t.computed_tokens_per_s_per_node, true));
    tc->prefill = t;
  }
  return Status::Ok();
}

// Sets j[a][b][c] = value for "a.b.c", creating objects on the way.
Status apply_override(json* j, const Override& o) {
  json* node = j;
  std::stringstream ss(o.first);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  if (parts.empty()) return InvalidArgument("empty parameter name");
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object())
      return InvalidArgument(fmt::format("'{}': not an object on the way", o.first));
    node = &(*node)[parts[i]];
    if (node->is_null()) *node = json::object();
  }
  if (!node->is_object())
    return InvalidArgument(fmt::format("'{}': not an object on the way", o.first));
  const std::string& key = parts.back();
  (*node)[key] = o.second;
  // A unit's size and its EP size are one fact: changing one drops or derives the other.
  if (key == "nodes_per_unit") {
    node->erase("ep");
    node->erase("dp_attention");
  } else if (key == "ep") {
    node->erase("dp_attention");
    auto devices = j->value("/hardware/node/devices"_json_pointer, 0.0);
    if (devices > 0) (*node)["nodes_per_unit"] = o.second / devices;
  }
  return Status::Ok();
}

}  // namespace

Result<Scenario> parse_scenario(const std::string& json_text, const std::string& base_dir,
                                const std::vector<Override>& overrides) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("scenario: not a JSON object");
  for (const auto& o : overrides) RETURN_IF_ERROR(apply_override(&j, o));
  Scenario s;
  s.name = j.value("name", "scenario");

  auto model = j.find("model");
  if (model == j.end() || !model->is_string()) {
    return InvalidArgument("'model' must be a preset name (\"deepseek-v3\") or a config.json path");
  }
  std::string m = model->get<std::string>();
  bool is_path = m.find('/') != std::string::npos || m.ends_with(".json");
  if (is_path && !std::filesystem::exists(m) && !base_dir.empty()) {
    m = (std::filesystem::path(base_dir) / m).string();
  }
  ASSIGN_OR_RETURN(s.model, load_model_spec(m));

  auto hw = j.find("hardware");
  if (hw == j.end() || !hw->is_object()) return InvalidArgument("missing 'hardware' object");
  RETURN_IF_ERROR(parse_device(hw->value("device", json()), &s.hardware.device));
  RETURN_IF_ERROR(parse_node(hw->value("node", json()), &s.hardware.node));

  auto dep = j.find("deployment");
  if (dep == j.end() || !dep->is_object()) return InvalidArgument("missing 'deployment' object");
  int dev = s.hardware.node.devices;
  RETURN_IF_ERROR(
      parse_unit(dep->value("prefill", json()), "deployment.prefill", dev, false, &s.prefill));
  RETURN_IF_ERROR(
      parse_unit(dep->value("decode", json()), "deployment.decode", dev, true, &s.decode));
  RETURN_IF_ERROR(num(*dep, "deployment", "max_utilization", &s.max_utilization));
  RETURN_IF_ERROR(num(*dep, "deployment", "fleet_nodes", &s.fleet_nodes));
  if (s.fleet_nodes < 0) return InvalidArgument("deployment.fleet_nodes must not be negative");
  if (s.max_utilization <= 0 || s.max_utilization > 1) {
    return InvalidArgument("deployment.max_utilization must be in (0, 1]");
  }
  for (const UnitDeployment* u : {&s.prefill, &s.decode}) {
    if (u->ep < s.model.experts_per_token && u->ep > 1) {
      return InvalidArgument("EP group smaller than the experts a token selects");
    }
  }
  auto wl = j.find("workload");
  if (wl == j.end()) return InvalidArgument("missing 'workload' object");
  RETURN_IF_ERROR(parse_workload(*wl, &s.workload));
  if (auto tc = j.find("trace_calibration"); tc != j.end() && !tc->is_null()) {
    TraceCalibration cal;
    RETURN_IF_ERROR(parse_trace_calibration(*tc, &cal));
    s.trace_calibration = cal;
  }
  return s;
}

Result<Scenario> load_scenario(const std::string& path, const std::vector<Override>& overrides) {
  std::ifstream in(path);
  if (!in) return IOError(fmt::format("cannot open scenario '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto s = parse_scenario(ss.str(), std::filesystem::path(path).parent_path().string(), overrides);
  if (!s.ok()) return s.status().with_context(path);
  return s;
}

Result<SimResult> run_scenario(const Scenario& scenario) {
  SimResult r;
  r.scenario = scenario;
  if (const auto& tc = scenario.trace_calibration) {
    Scenario& c = r.scenario;
    if (tc->decode) {
      ASSIGN_OR_RETURN(c.decode, calibrate_decode(c.model, c.hardware, c.decode, *tc->decode));
    }
    if (tc->prefill) {
      ASSIGN_OR_RETURN(c.prefill, calibrate_prefill(c.model, c.hardware, c.prefill, *tc->prefill));
    }
  }
  const Scenario& s = r.scenario;
  const Workload& w = s.workload;
  ASSIGN_OR_RETURN(r.prefill, prefill_at(s.model, s.hardware, s.prefill, w.prompts, w.cache_hit()));
  ASSIGN_OR_RETURN(r.decode, decode_operating_point(s.model, s.hardware, s.decode,
                                                    w.decode_kv_tokens, w.min_user_tokens_per_s));
  const int dev = s.hardware.node.devices;
  r.prefill_input_tokens_per_s_per_node = r.prefill.input_tokens_per_s * dev;
  r.decode_output_tokens_per_s_per_node = r.decode.device_tokens_per_s * dev;
  Capacity c{r.prefill_input_tokens_per_s_per_node,
             r.decode_output_tokens_per_s_per_node,
             s.prefill.nodes_per_unit,
             s.decode.nodes_per_unit,
             dev,
             s.max_utilization};
  r.plan = plan_day(w.traffic, w.prices, c, w.usd_per_device_hour);
  if (s.fleet_nodes > 0) {
    double peak = 0;  // nodes the busiest hour needs, before rounding to units
    for (const auto& h : r.plan.hours) {
      peak = std::max(peak, (h.input_tokens_per_s / c.prefill_input_tokens_per_s_per_node +
                             h.output_tokens_per_s / c.decode_output_tokens_per_s_per_node) /
                                s.max_utilization);
    }
    if (peak > 0) {
      r.fleet_traffic_scale = s.fleet_nodes / peak;
      r.fleet_input_tokens_per_day = *r.fleet_traffic_scale * w.traffic.input_tokens;
      r.fleet_output_tokens_per_day = *r.fleet_traffic_scale * w.traffic.output_tokens;
    }
  }
  if (!w.observed_nodes.empty()) {
    double hours = w.traffic.hourly_weights.empty() ? 24 : double(w.traffic.hourly_weights.size());
    double avg = schedule_avg_nodes(w.observed_nodes, hours);
    r.observed_avg_nodes = avg;
    r.observed_daily_cost_usd = gpu_cost_usd(avg, dev, 24, w.usd_per_device_hour);
    r.observed_cost_profit_margin =
        cost_profit_margin(r.plan.daily_revenue_usd, *r.observed_daily_cost_usd);
  }
  return r;
}

Result<Scenario> with_model(const Scenario& base, const std::string& model) {
  if (base.trace_calibration) {
    return Unimplemented(
        "pricing other models: the scenario's trace_calibration measures DeepSeek-V3; use the "
        "kernel-table scenario");
  }
  Scenario s = base;
  ASSIGN_OR_RETURN(s.model, load_model_spec(model));
  for (UnitDeployment* u : {&s.prefill, &s.decode}) {
    if (u->ep > 1 && u->ep < s.model.experts_per_token) {
      return InvalidArgument("EP group smaller than the experts a token selects");
    }
    if (u->ep <= 1) continue;
    const double slots = s.model.routed_experts + u->redundant_experts;
    const double per_device = std::ceil(slots / u->ep - 1e-9);
    u->redundant_experts = per_device * u->ep - s.model.routed_experts;
  }
  return s;
}

Result<std::vector<SimResult>> run_models(const Scenario& base,
                                          const std::vector<std::string>& models) {
  if (models.empty()) return InvalidArgument("no models to price");
  std::vector<SimResult> out;
  for (const auto& name : models) {
    auto s = with_model(base, name);
    if (!s.ok()) return s.status().with_context(name);
    auto r = run_scenario(*s);
    if (!r.ok()) return r.status().with_context(name);
    out.push_back(std::move(r).value());
  }
  return out;
}

}  // namespace moeserve::sim
