// `moeserve sim SCENARIO.json`: the cluster throughput and cost model (src/sim, docs/sim.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "router/planner.h"
#include "sim/economics.h"
#include "sim/report.h"
#include "sim/scenario.h"

namespace moeserve::cli {

namespace {

struct SimOptions {
  std::string scenario;
  bool json = false;
  std::string sweep;
  std::string plot;
  // --models: the same day priced for each of these models, side by side.
  std::vector<std::string> models;
  // --planner: the router's planner (docs/planner.md) run over the scenario's day.
  bool planner = false;
  int64_t planner_days = 14;
  std::string planner_forecaster = "holt-winters";
  double planner_headroom = 1.1;
  double planner_drift = 0.05;
  uint64_t planner_seed = 1;
};

// The planner's policy over the scenario's day (docs/planner.md "At DeepSeek's scale"): hourly
// intervals, units of the scenario's size and measured capacity (at its max_utilization). The
// planner first lives through `days` days like it (weekends at 0.8 and a random drift of each
// day's level, sd `drift`), then plans the day itself (the published one, factor 1) one hour
// ahead from that history: its nodes per hour beside the oracle's (each hour exactly what it
// needs: the plan above) and the published schedule, the day's cost and margin, and the hours
// it had less capacity than came.
std::string planner_day(const sim::SimResult& r, const SimOptions& o) {
  using sim::HourPlan;
  const sim::Scenario& sc = r.scenario;
  const double util = sc.max_utilization;
  const int pn = sc.prefill.nodes_per_unit, dn = sc.decode.nodes_per_unit;
  PlannerOptions po;
  po.prefill_tokens_per_s = r.prefill_input_tokens_per_s_per_node * pn * util;
  po.decode_tokens_per_s = r.decode_output_tokens_per_s_per_node * dn * util;
  po.headroom = o.planner_headroom;
  po.max_prefill = po.max_decode = 1 << 20;
  po.down_after = 1;  // (hourly decisions)
  const int64_t period = int64_t(r.plan.hours.size());
  Planner planner(po, o.planner_forecaster == "holt-winters"
                          ? holt_winters(period, HoltWintersParams{})
                          : seasonal_naive(period));
  std::mt19937_64 rng(o.planner_seed);
  std::normal_distribution<double> drift(0.0, o.planner_drift);
  int64_t prefill = 1, decode = 1;
  std::string out = fmt::format(
      "\nplanner over the day ({}, headroom {:.2f}, one hour ahead, after {} days of history; "
      "a unit carries {:.0f} input or {:.0f} output tok/s at {:.0f}% utilization):\n"
      "hour   forecast in/s  forecast out/s  prefill  decode  nodes  oracle  short\n",
      o.planner_forecaster, o.planner_headroom, o.planner_days, po.prefill_tokens_per_s,
      po.decode_tokens_per_s, util * 100);
  double node_h = 0, peak = 0, cost = 0, worst_short = 0;
  int short_hours = 0;
  const int devices = sc.hardware.node.devices;
  for (int64_t day = 0; day <= o.planner_days; ++day) {
    const bool held_out = day == o.planner_days;
    // The day planned is a Wednesday (weekday 2); Saturdays and Sundays (5, 6) carry 0.8.
    const int64_t weekday = ((day - o.planner_days + 2) % 7 + 7) % 7;
    const double factor = held_out ? 1.0 : (weekday >= 5 ? 0.8 : 1.0) * std::exp(drift(rng));
    for (int64_t h = 0; h < period; ++h) {
      const HourPlan& hp = r.plan.hours[size_t(h)];
      const PlanDecision d = planner.decide(prefill, decode);
      prefill = d.prefill;
      decode = d.decode;
      IntervalLoad actual;
      actual.input_tokens_per_s = hp.input_tokens_per_s * factor;
      actual.output_tokens_per_s = hp.output_tokens_per_s * factor;
      planner.observe(actual);
      if (!held_out) continue;
      const double nodes = double(prefill * pn + decode * dn);
      // Short: more came than the units carry at max_utilization.
      const double need =
          std::max(actual.input_tokens_per_s / po.prefill_tokens_per_s / double(prefill),
                   actual.output_tokens_per_s / po.decode_tokens_per_s / double(decode));
      const bool is_short = need > 1.0 + 1e-9;
      short_hours += is_short;
      worst_short = std::max(worst_short, need - 1.0);
      node_h += nodes;
      peak = std::max(peak, nodes);
      cost += sim::gpu_cost_usd(nodes, devices, 1.0, sc.workload.usd_per_device_hour);
      const double clock = std::fmod(sc.workload.window_start_hour + double(h), 24.0);
      out += fmt::format(
          "{:02.0f}:00  {:>13.0f}  {:>14.0f}  {:>7}  {:>6}  {:>5.0f}  {:>6.0f}  {}\n", clock,
          d.forecast.input_tokens_per_s, d.forecast.output_tokens_per_s, prefill * pn, decode * dn,
          nodes, r.plan.hours[size_t(h)].prefill_nodes + r.plan.hours[size_t(h)].decode_nodes,
          is_short ? fmt::format("{:.1f}%", (need - 1) * 100) : "");
    }
  }
  const double day_scale = 24.0 / double(period);
  cost *= day_scale;
  const double revenue = r.plan.daily_revenue_usd;
  out += fmt::format(
      "planner: average {:.2f} nodes, peak {:.0f}; cost ${:.0f}, revenue ${:.0f}, cost-profit "
      "margin {:.0f}%; {} of {} hours short{}\n",
      node_h / double(period), peak, cost, revenue, sim::cost_profit_margin(revenue, cost) * 100,
      short_hours, period,
      short_hours > 0 ? fmt::format(" (the worst {:.1f}% over)", worst_short * 100) : "");
  const double static_cost =
      sim::gpu_cost_usd(r.plan.peak_nodes, devices, 24.0, sc.workload.usd_per_device_hour);
  out += fmt::format(
      "against: oracle (each hour what it needs) {:.2f} nodes, margin {:.0f}%; static peak {:.0f} "
      "nodes all day, margin {:.0f}%",
      r.plan.avg_nodes, r.plan.cost_profit_margin * 100, r.plan.peak_nodes,
      sim::cost_profit_margin(revenue, static_cost) * 100);
  if (r.observed_avg_nodes) {
    out += fmt::format("; published schedule {:.2f} nodes, margin {:.0f}%", *r.observed_avg_nodes,
                       *r.observed_cost_profit_margin * 100);
  }
  out += fmt::format("\nplanner node-hours / oracle {:.3f}, / static peak {:.3f}",
                     node_h / double(period) / r.plan.avg_nodes,
                     node_h / double(period) / r.plan.peak_nodes);
  if (r.observed_avg_nodes) {
    out += fmt::format(", / published {:.3f}", node_h / double(period) / *r.observed_avg_nodes);
  }
  // The day's average over its peak: how much of the peak fleet the day pays for.
  out += fmt::format("\naverage / peak nodes: planner {:.3f}, oracle {:.3f}",
                     node_h / double(period) / peak, r.plan.avg_nodes / r.plan.peak_nodes);
  if (r.observed_avg_nodes) {
    double published_peak = 0;
    for (const auto& st : sc.workload.observed_nodes) {
      published_peak = std::max(published_peak, st.nodes);
    }
    out +=
        fmt::format(", published {:.3f} ({:.2f} of {:.0f})", *r.observed_avg_nodes / published_peak,
                    *r.observed_avg_nodes, published_peak);
  }
  return out + "\n";
}

int run_models(const SimOptions& o) {
  using namespace moeserve::sim;
  if (!o.sweep.empty() || !o.plot.empty() || o.planner) {
    std::fprintf(stderr,
                 "moeserve sim: --models does not combine with --sweep, --plot or "
                 "--planner\n");
    return 2;
  }
  auto s = load_scenario(o.scenario);
  if (!s.ok()) {
    std::fprintf(stderr, "moeserve sim: %s\n", s.status().to_string().c_str());
    return 1;
  }
  auto runs = sim::run_models(*s, o.models);
  if (!runs.ok()) {
    std::fprintf(stderr, "moeserve sim: %s\n", runs.status().to_string().c_str());
    return 1;
  }
  if (o.json) {
    std::string out = "[";
    for (size_t i = 0; i < runs->size(); ++i) {
      const SimResult& r = (*runs)[i];
      out += fmt::format("{}{{\"model\": \"{}\", \"result\": {}}}", i ? ",\n" : "",
                         r.scenario.model.name, to_json(r));
    }
    std::fputs((out + "]\n").c_str(), stdout);
  } else {
    std::fputs(format_model_comparison(*runs).c_str(), stdout);
  }
  return 0;
}

int run_sim(const SimOptions& o) {
  using namespace moeserve::sim;
  if (!o.models.empty()) return run_models(o);
  if (!o.sweep.empty()) {
    auto spec = parse_sweep(o.sweep);
    if (!spec.ok()) {
      std::fprintf(stderr, "moeserve sim: %s\n", spec.status().message().c_str());
      return 2;
    }
    // Check the file itself once, so a broken file is one error, not one per row.
    auto base = load_scenario(o.scenario);
    if (!base.ok()) {
      std::fprintf(stderr, "moeserve sim: %s\n", base.status().to_string().c_str());
      return 1;
    }
    std::vector<SweepRow> rows;
    for (double v : spec->values) {
      SweepRow row;
      row.value = v;
      auto s = load_scenario(o.scenario, {{spec->param, v}});
      if (!s.ok()) {
        row.error = s.status().message();
      } else if (auto r = run_scenario(*s); r.ok()) {
        row.result = std::move(r).value();
      } else {
        row.error = r.status().message();
      }
      rows.push_back(std::move(row));
    }
    std::fputs(format_sweep(spec->param, rows).c_str(), stdout);
    return 0;
  }
  auto s = load_scenario(o.scenario);
  if (!s.ok()) {
    std::fprintf(stderr, "moeserve sim: %s\n", s.status().to_string().c_str());
    return 1;
  }
  auto r = run_scenario(*s);
  if (!r.ok()) {
    std::fprintf(stderr, "moeserve sim: %s\n", r.status().to_string().c_str());
    return 1;
  }
  if (!o.plot.empty()) {
    std::ofstream out(o.plot);
    out << plot_svg(*r);
    if (!out) {
      std::fprintf(stderr, "moeserve sim: cannot write plot '%s'\n", o.plot.c_str());
      return 1;
    }
  }
  std::fputs((o.json ? to_json(*r) : format_report(*r)).c_str(), stdout);
  if (o.planner) std::fputs(planner_day(*r, o).c_str(), stdout);
  return 0;
}

}  // namespace

Subcommand add_sim_command(CLI::App& parent) {
  auto opts = std::make_shared<SimOptions>();
  auto* app = parent.add_subcommand(
      "sim",
      "cluster throughput and cost model: prefill/decode tokens/s per node, nodes per hour, "
      "daily cost, revenue and margin (docs/sim.md)");
  app->add_option("scenario", opts->scenario,
                  "scenario JSON (e.g. examples/sim/deepseek-v3-h800-day.json)")
      ->required();
  app->add_flag("--json", opts->json, "print the result as JSON");
  app->add_option("--sweep", opts->sweep,
                  "PARAM=a:b:step: rerun with a scenario field set to each value, e.g. "
                  "deployment.decode.batch_per_device=32:160:16");
  app->add_option("--plot", opts->plot, "write an SVG of nodes and cost over the day");
  app->add_option("--models", opts->models,
                  "price the scenario's day for each model preset or config.json, side by side, "
                  "e.g. deepseek-v3,deepseek-v4-flash,deepseek-v4-pro")
      ->delimiter(',');
  app->add_flag("--planner", opts->planner,
                "run the router's planner over the day, one hour ahead, after --planner-days "
                "of history (docs/planner.md)");
  app->add_option("--planner-days", opts->planner_days, "days of history before the day")
      ->capture_default_str()
      ->check(CLI::Range(1, 365));
  app->add_option("--planner-forecaster", opts->planner_forecaster)
      ->capture_default_str()
      ->check(CLI::IsMember({"seasonal-naive", "holt-winters"}));
  app->add_option("--planner-headroom", opts->planner_headroom)
      ->capture_default_str()
      ->check(CLI::Range(1.0, 10.0));
  app->add_option("--planner-drift", opts->planner_drift, "sd of a history day's level (log scale)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--planner-seed", opts->planner_seed)->capture_default_str();
  return {app, [opts] { return run_sim(*opts); }};
}

}  // namespace moeserve::cli
