// The money side of the model: nodes needed hour by hour for a day's traffic, what they cost,
// what the tokens would earn at a price table, and the cost-profit margin.
//
// Elastic scaling is hourly and in whole units (a prefill or decode unit is a fixed number of
// nodes). Pure functions of plain values.
#pragma once

#include <vector>

namespace moeserve::sim {

struct Prices {
  double cached_input_per_mtok = 0;  // USD per million input tokens that hit the KV cache
  double input_per_mtok = 0;         // USD per million input tokens that miss
  double output_per_mtok = 0;        // USD per million output tokens
};

struct DailyTraffic {
  double input_tokens = 0;         // per day, cache hits included
  double cached_input_tokens = 0;  // of which hit the KV cache
  double output_tokens = 0;
  // Relative load of each hour of the window (any positive scale; normalized to mean 1).
  std::vector<double> hourly_weights;
};

// A step in a published node-count schedule: `nodes` from `at_hour` (hours since the window
// opens) until the next step.
struct ScheduleStep {
  double at_hour = 0;
  double nodes = 0;
};

struct HourPlan {
  double input_tokens_per_s = 0;
  double output_tokens_per_s = 0;
  double prefill_nodes = 0;
  double decode_nodes = 0;
  double cost_usd = 0;
  double revenue_usd = 0;
};

struct DayPlan {
  std::vector<HourPlan> hours;
  double avg_nodes = 0;
  double peak_nodes = 0;
  double daily_cost_usd = 0;
  double daily_revenue_usd = 0;
  double cost_profit_margin = 0;
  // Throughput per node averaged over the day as DeepSeek reports it: tokens of the day over
  // the node-seconds deployed for that phase.
  double prefill_input_tokens_per_s_per_node_day = 0;
  double decode_output_tokens_per_s_per_node_day = 0;
};

struct Capacity {
  double prefill_input_tokens_per_s_per_node = 0;  // cache hits included
  double decode_output_tokens_per_s_per_node = 0;
  int prefill_unit_nodes = 1;
  int decode_unit_nodes = 1;
  int devices_per_node = 8;
  double max_utilization = 1.0;  // plan nodes so that none runs above this share of capacity
};

double gpu_cost_usd(double nodes, int devices_per_node, double hours, double usd_per_device_hour);
double revenue_usd(double cached_input_tokens, double uncached_input_tokens, double output_tokens,
                   const Prices& p);
// (revenue - cost) / cost; DeepSeek's "cost profit margin".
double cost_profit_margin(double revenue, double cost);
// Whole units of `unit_nodes` nodes serving `demand` tokens/s at `per_node` tokens/s each, run
// at most at `max_utilization`.
double nodes_for(double demand, double per_node, int unit_nodes, double max_utilization);
// Average node count of a step schedule over `window_hours`.
double schedule_avg_nodes(const std::vector<ScheduleStep>& steps, double window_hours);

// Hour-by-hour plan for the day (24 hourly weights, or one flat hour if none given).
DayPlan plan_day(const DailyTraffic& t, const Prices& p, const Capacity& c,
                 double usd_per_device_hour);

}  // namespace moeserve::sim
