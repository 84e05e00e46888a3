#include "sim/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeserve::sim {

namespace {

std::string hour_label(double start, size_t i) {
  int h = int(std::fmod(start + double(i), 24.0));
  return fmt::format("{:02d}:00", h);
}

}  // namespace

std::string format_report(const SimResult& r) {
  const Scenario& s = r.scenario;
  const DecodePoint& d = r.decode;
  const PrefillPoint& p = r.prefill;
  std::string o;
  o += fmt::format("scenario: {}\nmodel: {} | device: {} | node: {} x {}\n\n", s.name, s.model.name,
                   s.hardware.device.name, s.hardware.node.devices, s.hardware.device.name);
  if (s.trace_calibration) {
    const Calibration& pc = s.prefill.calibration;
    const Calibration& dc = s.decode.calibration;
    o += fmt::format("calibrated to measured traces: {}\n", s.trace_calibration->source);
    o += fmt::format("  prefill forward x{:.3f}", pc.forward_scale);
    o += fmt::format(
        "; decode (staged schedule {}) attn-pre x{:.2f} core x{:.2f} post x{:.2f} gate x{:.2f} "
        "shared x{:.2f} routed x{:.2f} dispatch x{:.2f} combine x{:.2f}, layers x{:.3f}, "
        "head+MTP x{:.2f}\n\n",
        dc.staged_decode ? "on" : "off", dc.op_scale[0], dc.op_scale[1], dc.op_scale[2],
        dc.op_scale[3], dc.op_scale[4], dc.op_scale[5], dc.op_scale[6], dc.op_scale[7],
        dc.layers_scale, dc.head_scale);
  }
  o += fmt::format(
      "prefill unit: {} nodes, EP{}, {} micro-batches{}, {:.0f} new tokens/device/forward\n",
      s.prefill.nodes_per_unit, s.prefill.ep, s.prefill.micro_batches,
      s.prefill.overlap ? " overlapped" : "", p.tokens_per_forward);
  o += fmt::format("  forward {:.1f} ms (layers: compute {:.1f} ms, all-to-all {:.1f} ms)\n",
                   p.forward_s * 1e3, p.layers.compute_s * 1e3, p.layers.comm_s * 1e3);
  o += fmt::format("  computed tokens/s/device {:.0f}; cache hit {:.1f}%\n",
                   p.computed_tokens_per_s, p.cache_hit * 100);
  o += fmt::format("  input tokens/s per node (cache hits included): {:.0f}\n\n",
                   r.prefill_input_tokens_per_s_per_node);
  o += fmt::format("decode unit: {} nodes, EP{}, {} micro-batches{}, MTP {} draft @ {:.0f}%\n",
                   s.decode.nodes_per_unit, s.decode.ep, s.decode.micro_batches,
                   s.decode.overlap ? " overlapped" : "", s.decode.mtp_draft_tokens,
                   s.decode.mtp_acceptance * 100);
  o += fmt::format(
      "  batch {:.0f} sequences/device (memory holds {:.0f}; KV {:.0f} tokens = {:.2f} GB each)\n",
      d.batch, d.max_batch_by_memory, s.workload.decode_kv_tokens, d.kv_bytes_per_seq / 1e9);
  o += fmt::format(
      "  step {:.1f} ms (layers: compute {:.1f} ms, all-to-all {:.1f} ms; head+MTP {:.1f} ms)\n",
      d.step_s * 1e3, d.layers.compute_s * 1e3, d.layers.comm_s * 1e3, d.head_and_mtp_s * 1e3);
  o += fmt::format("  {:.2f} tokens/step, {:.1f} tokens/s per user, {:.1f} ms per token\n",
                   d.tokens_per_step, d.user_tokens_per_s, 1e3 / d.user_tokens_per_s);
  o += fmt::format("  output tokens/s per node: {:.0f}\n", r.decode_output_tokens_per_s_per_node);
  o += "  one MoE layer, one micro-batch:   GFLOP      MB      us\n";
  for (const auto& op : decode_layer_breakdown(s.model, s.hardware, s.decode, d.batch,
                                               s.workload.decode_kv_tokens)) {
    o += fmt::format("    {:<28} {:>8.1f} {:>7.1f} {:>7.1f}\n", op.name, op.flops / 1e9,
                     op.bytes / 1e6, op.seconds * 1e6);
  }
  o += "\n";

  const DayPlan& day = r.plan;
  o += "hour   input tok/s  output tok/s  prefill  decode  nodes   cost $  revenue $\n";
  for (size_t i = 0; i < day.hours.size(); ++i) {
    const HourPlan& h = day.hours[i];
    o += fmt::format("{}  {:>11.0f}  {:>12.0f}  {:>7.0f}  {:>6.0f}  {:>5.0f}  {:>7.0f}  {:>9.0f}\n",
                     hour_label(s.workload.window_start_hour, i), h.input_tokens_per_s,
                     h.output_tokens_per_s, h.prefill_nodes, h.decode_nodes,
                     h.prefill_nodes + h.decode_nodes, h.cost_usd, h.revenue_usd);
  }
  o += fmt::format("\nnodes: average {:.2f}, peak {:.0f}\n", day.avg_nodes, day.peak_nodes);
  o += fmt::format(
      "day-average throughput per node: prefill {:.0f} input tok/s, decode {:.0f} output tok/s\n",
      day.prefill_input_tokens_per_s_per_node_day, day.decode_output_tokens_per_s_per_node_day);
  o += fmt::format(
      "daily cost ${:.0f} at ${}/device-hour | revenue ${:.0f} | cost-profit margin {:.0f}%\n",
      day.daily_cost_usd, s.workload.usd_per_device_hour, day.daily_revenue_usd,
      day.cost_profit_margin * 100);
  if (r.fleet_traffic_scale) {
    o += fmt::format(
        "a fleet of {:.0f} nodes serves {:.3g}x this traffic: {:.3g}B input and {:.3g}B "
        "output tokens per day\n",
        r.scenario.fleet_nodes, *r.fleet_traffic_scale, *r.fleet_input_tokens_per_day / 1e9,
        *r.fleet_output_tokens_per_day / 1e9);
  }
  if (r.observed_avg_nodes) {
    o += fmt::format("published schedule: average {:.2f} nodes, cost ${:.0f}, margin {:.0f}%\n",
                     *r.observed_avg_nodes, *r.observed_daily_cost_usd,
                     *r.observed_cost_profit_margin * 100);
  }
  return o;
}

std::string to_json(const SimResult& r) {
  nlohmann::json j;
  const DayPlan& day = r.plan;
  j["scenario"] = r.scenario.name;
  j["prefill_input_tokens_per_s_per_node"] = r.prefill_input_tokens_per_s_per_node;
  j["decode_output_tokens_per_s_per_node"] = r.decode_output_tokens_per_s_per_node;
  j["prefill_input_tokens_per_s_per_node_day_average"] =
      day.prefill_input_tokens_per_s_per_node_day;
  j["decode_output_tokens_per_s_per_node_day_average"] =
      day.decode_output_tokens_per_s_per_node_day;
  j["trace_calibrated"] = r.scenario.trace_calibration.has_value();
  j["prefill_forward_s"] = r.prefill.forward_s;
  j["prefill_computed_tokens_per_s_per_device"] = r.prefill.computed_tokens_per_s;
  j["decode_batch_per_device"] = r.decode.batch;
  j["decode_max_batch_by_memory"] = r.decode.max_batch_by_memory;
  j["decode_step_s"] = r.decode.step_s;
  j["decode_tokens_per_step"] = r.decode.tokens_per_step;
  j["decode_user_tokens_per_s"] = r.decode.user_tokens_per_s;
  j["decode_latency_per_token_s"] = 1.0 / r.decode.user_tokens_per_s;
  j["avg_nodes"] = day.avg_nodes;
  j["peak_nodes"] = day.peak_nodes;
  j["daily_cost_usd"] = day.daily_cost_usd;
  j["daily_revenue_usd"] = day.daily_revenue_usd;
  j["cost_profit_margin"] = day.cost_profit_margin;
  if (r.observed_avg_nodes) {
    j["observed_avg_nodes"] = *r.observed_avg_nodes;
    j["observed_daily_cost_usd"] = *r.observed_daily_cost_usd;
    j["observed_cost_profit_margin"] = *r.observed_cost_profit_margin;
  }
  if (r.fleet_traffic_scale) {
    j["fleet_nodes"] = r.scenario.fleet_nodes;
    j["fleet_traffic_scale"] = *r.fleet_traffic_scale;
    j["fleet_input_tokens_per_day"] = *r.fleet_input_tokens_per_day;
    j["fleet_output_tokens_per_day"] = *r.fleet_output_tokens_per_day;
  }
  nlohmann::json hours = nlohmann::json::array();
  for (const auto& h : day.hours) {
    hours.push_back({{"prefill_nodes", h.prefill_nodes},
                     {"decode_nodes", h.decode_nodes},
                     {"cost_usd", h.cost_usd},
                     {"revenue_usd", h.revenue_usd}});
  }
  j["hours"] = hours;
  return j.dump(2) + "\n";
}

std::string plot_svg(const SimResult& r) {
  const DayPlan& day = r.plan;
  const size_t n = day.hours.size();
  const double W = 760, H = 360, L = 60, R = 60, T = 40, B = 50;
  const double pw = W - L - R, ph = H - T - B;
  double max_nodes = std::max(1.0, day.peak_nodes);
  if (r.observed_avg_nodes) {
    for (const auto& st : r.scenario.workload.observed_nodes)
      max_nodes = std::max(max_nodes, st.nodes);
  }
  max_nodes *= 1.1;
  double max_cost = 1;
  for (const auto& h : day.hours) max_cost = std::max(max_cost, h.cost_usd);
  max_cost *= 1.1;
  auto x = [&](double hour) { return L + pw * hour / double(std::max<size_t>(n, 1)); };
  auto yn = [&](double v) { return T + ph * (1 - v / max_nodes); };
  auto yc = [&](double v) { return T + ph * (1 - v / max_cost); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  s += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"14\">{}: nodes and cost per hour</text>\n",
                   L, r.scenario.name);
  // Cost bars (right axis).
  for (size_t i = 0; i < n; ++i) {
    double c = day.hours[i].cost_usd;
    s += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f5b400\" "
        "opacity=\"0.6\"/>\n",
        x(i) + 2, yc(c), pw / n - 4, T + ph - yc(c));
  }
  // Planned nodes (step line, left axis).
  std::string path;
  for (size_t i = 0; i < n; ++i) {
    double v = day.hours[i].prefill_nodes + day.hours[i].decode_nodes;
    path += fmt::format("{}{:.1f},{:.1f} L{:.1f},{:.1f} ", i == 0 ? "M" : "L", x(i), yn(v),
                        x(i + 1), yn(v));
  }
  s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n", path);
  if (r.observed_avg_nodes) {
    const auto& st = r.scenario.workload.observed_nodes;
    std::string op;
    for (size_t i = 0; i < st.size(); ++i) {
      double end = i + 1 < st.size() ? st[i + 1].at_hour : double(n);
      op += fmt::format("{}{:.1f},{:.1f} L{:.1f},{:.1f} ", i == 0 ? "M" : "L", x(st[i].at_hour),
                        yn(st[i].nodes), x(end), yn(st[i].nodes));
    }
    s += fmt::format(
        "<path d=\"{}\" fill=\"none\" stroke=\"#555\" stroke-dasharray=\"5,3\" "
        "stroke-width=\"1.5\"/>\n",
        op);
  }
  // Axes and labels.
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", L, T,
                   T + ph);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", L,
                   T + ph, L + pw);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", L + pw,
                   T, T + ph);
  for (int k = 0; k <= 4; ++k) {
    double v = max_nodes * k / 4, c = max_cost * k / 4;
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n", L - 5,
                     yn(v) + 4, v);
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\">${:.0f}</text>\n", L + pw + 5, yc(c) + 4, c);
  }
  for (size_t i = 0; i < n; i += 3) {
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n", x(i),
                     T + ph + 15, hour_label(r.scenario.workload.window_start_hour, i));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#1f77b4\">planned nodes (left)</text>\n", L,
                   H - 12);
  s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#b38300\">cost per hour (right)</text>\n",
                   L + 170, H - 12);
  if (r.observed_avg_nodes) {
    s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">published nodes (dashed)</text>\n",
                     L + 340, H - 12);
  }
  s += "</svg>\n";
  return s;
}

Result<SweepSpec> parse_sweep(const std::string& spec) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument(
        "--sweep wants PARAM=a:b:step, e.g. deployment.decode.batch_per_device=32:160:16");
  }
  SweepSpec s;
  s.param = spec.substr(0, eq);
  std::string range = spec.substr(eq + 1);
  double a = 0, b = 0, step = 0;
  char extra = 0;
  if (std::sscanf(range.c_str(), "%lf:%lf:%lf%c", &a, &b, &step, &extra) != 3) {
    return InvalidArgument(fmt::format("--sweep range '{}' is not a:b:step", range));
  }
  if (!(step > 0) || b < a) return InvalidArgument("--sweep needs step > 0 and b >= a");
  if ((b - a) / step > 10000) return InvalidArgument("--sweep: more than 10000 points");
  for (int i = 0; a + i * step <= b + step * 1e-9; ++i) s.values.push_back(a + i * step);
  return s;
}

std::string format_sweep(const std::string& param, const std::vector<SweepRow>& rows) {
  std::string o = fmt::format("{:>12}  {:>6}  {:>8}  {:>9}  {:>12}  {:>12}  {:>8}  {:>10}  {:>7}\n",
                              param.substr(param.rfind('.') + 1), "batch", "step ms", "user t/s",
                              "dec tok/s/n", "pre tok/s/n", "avg nodes", "cost $/day", "margin");
  for (const auto& row : rows) {
    if (!row.result) {
      o += fmt::format("{:>12.4g}  {}\n", row.value, row.error);
      continue;
    }
    const SimResult& r = *row.result;
    o += fmt::format(
        "{:>12.4g}  {:>6.0f}  {:>8.1f}  {:>9.1f}  {:>12.0f}  {:>12.0f}  {:>8.1f}  {:>10.0f}  "
        "{:>6.0f}%\n",
        row.value, r.decode.batch, r.decode.step_s * 1e3, r.decode.user_tokens_per_s,
        r.decode_output_tokens_per_s_per_node, r.prefill_input_tokens_per_s_per_node,
        r.plan.avg_nodes, r.plan.daily_cost_usd, r.plan.cost_profit_margin * 100);
  }
  return o;
}

std::string format_model_comparison(const std::vector<SimResult>& runs) {
  if (runs.empty()) return "";
  const Scenario& s0 = runs.front().scenario;
  std::string o =
      fmt::format("scenario: {} | device: {} | node: {} x {}\n", s0.name, s0.hardware.device.name,
                  s0.hardware.node.devices, s0.hardware.device.name);
  o += fmt::format(
      "prefill units of {} nodes (EP{:.0f}), decode units of {} nodes (EP{:.0f}); same traffic, "
      "prices and per-user speed target for every model\n\n",
      s0.prefill.nodes_per_unit, s0.prefill.ep, s0.decode.nodes_per_unit, s0.decode.ep);
  auto row = [&](const std::string& label, auto cell) {
    o += fmt::format("{:<44}", label);
    for (const auto& r : runs) o += fmt::format("{:>20}", cell(r));
    o += "\n";
  };
  row("", [](const SimResult& r) { return r.scenario.model.name; });
  row("KV bytes per token of context", [](const SimResult& r) {
    return fmt::format("{:.0f}", kv_bytes_per_token(r.scenario.model));
  });
  row("KV per decode sequence (GB)",
      [](const SimResult& r) { return fmt::format("{:.3f}", r.decode.kv_bytes_per_seq / 1e9); });
  row("weights per GPU, prefill / decode (GB)", [](const SimResult& r) {
    const Scenario& s = r.scenario;
    return fmt::format("{:.1f} / {:.1f}", weight_bytes_per_device(s.model, s.prefill) / 1e9,
                       weight_bytes_per_device(s.model, s.decode) / 1e9);
  });
  row("expert slots per GPU, prefill / decode", [](const SimResult& r) {
    const Scenario& s = r.scenario;
    return fmt::format("{:.0f} / {:.0f}",
                       (s.model.routed_experts + s.prefill.redundant_experts) / s.prefill.ep,
                       (s.model.routed_experts + s.decode.redundant_experts) / s.decode.ep);
  });
  row("prefill forward (ms)",
      [](const SimResult& r) { return fmt::format("{:.1f}", r.prefill.forward_s * 1e3); });
  row("prefill input tok/s/node (cache incl.)", [](const SimResult& r) {
    return fmt::format("{:.0f}", r.prefill_input_tokens_per_s_per_node);
  });
  row("decode batch/GPU (memory holds)", [](const SimResult& r) {
    return fmt::format("{:.0f} ({:.0f})", r.decode.batch, r.decode.max_batch_by_memory);
  });
  row("decode step (ms), tok/s/user", [](const SimResult& r) {
    return fmt::format("{:.1f}, {:.1f}", r.decode.step_s * 1e3, r.decode.user_tokens_per_s);
  });
  row("decode output tok/s/node", [](const SimResult& r) {
    return fmt::format("{:.0f}", r.decode_output_tokens_per_s_per_node);
  });
  auto phase_nodes = [](const SimResult& r, bool prefill) {
    double n = 0;
    for (const auto& h : r.plan.hours) n += prefill ? h.prefill_nodes : h.decode_nodes;
    return r.plan.hours.empty() ? 0.0 : n / double(r.plan.hours.size());
  };
  row("nodes: prefill + decode avg", [&](const SimResult& r) {
    return fmt::format("{:.1f} + {:.1f}", phase_nodes(r, true), phase_nodes(r, false));
  });
  row("nodes: average (peak)", [](const SimResult& r) {
    return fmt::format("{:.2f} ({:.0f})", r.plan.avg_nodes, r.plan.peak_nodes);
  });
  row("cost per day (USD)",
      [](const SimResult& r) { return fmt::format("{:.0f}", r.plan.daily_cost_usd); });
  // Per-token cost: each phase's node-hours at the device price over that phase's tokens.
  row("cost per M input / output tokens (USD)", [&](const SimResult& r) {
    const Scenario& s = r.scenario;
    const double hours = 24.0 / double(std::max<size_t>(1, r.plan.hours.size()));
    auto usd = [&](bool prefill) {
      return phase_nodes(r, prefill) * double(r.plan.hours.size()) * hours *
             s.hardware.node.devices * s.workload.usd_per_device_hour;
    };
    const DailyTraffic& t = s.workload.traffic;
    return fmt::format("{:.4f} / {:.4f}", usd(true) / (t.input_tokens / 1e6),
                       usd(false) / (t.output_tokens / 1e6));
  });
  row("revenue per day (USD)",
      [](const SimResult& r) { return fmt::format("{:.0f}", r.plan.daily_revenue_usd); });
  row("cost-profit margin",
      [](const SimResult& r) { return fmt::format("{:.0f}%", r.plan.cost_profit_margin * 100); });
  const SimResult& base = runs.front();
  row(fmt::format("cost relative to {}", base.scenario.model.name), [&](const SimResult& r) {
    return fmt::format("{:.3f}", r.plan.daily_cost_usd / base.plan.daily_cost_usd);
  });
  return o;
}

}  // namespace moeserve::sim
