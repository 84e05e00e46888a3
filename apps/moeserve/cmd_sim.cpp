// `moeserve sim SCENARIO.json`: the cluster throughput and cost model (src/sim, docs/sim.md).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "commands.h"
#include "sim/report.h"
#include "sim/scenario.h"

namespace moeserve::cli {

namespace {

struct SimOptions {
  std::string scenario;
  bool json = false;
  std::string sweep;
  std::string plot;
};

int run_sim(const SimOptions& o) {
  using namespace moeserve::sim;
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
  return {app, [opts] { return run_sim(*opts); }};
}

}  // namespace moeserve::cli
