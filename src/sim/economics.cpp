#include "sim/economics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moeserve::sim {

double gpu_cost_usd(double nodes, int devices_per_node, double hours, double usd_per_device_hour) {
  return nodes * devices_per_node * hours * usd_per_device_hour;
}

double revenue_usd(double cached_input_tokens, double uncached_input_tokens, double output_tokens,
                   const Prices& p) {
  return (cached_input_tokens * p.cached_input_per_mtok + uncached_input_tokens * p.input_per_mtok +
          output_tokens * p.output_per_mtok) /
         1e6;
}

double cost_profit_margin(double revenue, double cost) {
  return cost > 0 ? (revenue - cost) / cost : 0;
}

double nodes_for(double demand, double per_node, int unit_nodes, double max_utilization) {
  if (demand <= 0) return 0;
  double nodes = demand / (per_node * max_utilization);
  return std::ceil(nodes / unit_nodes - 1e-9) * unit_nodes;
}

double schedule_avg_nodes(const std::vector<ScheduleStep>& steps, double window_hours) {
  double area = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    double end = i + 1 < steps.size() ? steps[i + 1].at_hour : window_hours;
    area += steps[i].nodes * (std::min(end, window_hours) - steps[i].at_hour);
  }
  return window_hours > 0 ? area / window_hours : 0;
}

DayPlan plan_day(const DailyTraffic& t, const Prices& p, const Capacity& c,
                 double usd_per_device_hour) {
  std::vector<double> w = t.hourly_weights;
  if (w.empty()) w.assign(24, 1.0);
  const double hours = double(w.size());
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  DayPlan d;
  double prefill_node_h = 0, decode_node_h = 0;
  for (double wh : w) {
    double share = sum > 0 ? wh / sum : 1.0 / hours;  // this hour's share of the day's tokens
    HourPlan h;
    h.input_tokens_per_s = t.input_tokens * share / 3600;
    h.output_tokens_per_s = t.output_tokens * share / 3600;
    h.prefill_nodes = nodes_for(h.input_tokens_per_s, c.prefill_input_tokens_per_s_per_node,
                                c.prefill_unit_nodes, c.max_utilization);
    h.decode_nodes = nodes_for(h.output_tokens_per_s, c.decode_output_tokens_per_s_per_node,
                               c.decode_unit_nodes, c.max_utilization);
    double nodes = h.prefill_nodes + h.decode_nodes;
    h.cost_usd = gpu_cost_usd(nodes, c.devices_per_node, 1.0, usd_per_device_hour);
    h.revenue_usd = share * revenue_usd(t.cached_input_tokens,
                                        t.input_tokens - t.cached_input_tokens, t.output_tokens, p);
    prefill_node_h += h.prefill_nodes;
    decode_node_h += h.decode_nodes;
    d.peak_nodes = std::max(d.peak_nodes, nodes);
    d.daily_cost_usd += h.cost_usd;
    d.daily_revenue_usd += h.revenue_usd;
    d.hours.push_back(h);
  }
  // The plan covers `hours` hours; scale a shorter window's money to a day.
  double day = 24.0 / hours;
  d.daily_cost_usd *= day;
  d.daily_revenue_usd *= day;
  d.avg_nodes = (prefill_node_h + decode_node_h) / hours;
  d.cost_profit_margin = cost_profit_margin(d.daily_revenue_usd, d.daily_cost_usd);
  if (prefill_node_h > 0) {
    d.prefill_input_tokens_per_s_per_node_day = t.input_tokens / (prefill_node_h * day * 3600);
  }
  if (decode_node_h > 0) {
    d.decode_output_tokens_per_s_per_node_day = t.output_tokens / (decode_node_h * day * 3600);
  }
  return d;
}

}  // namespace moeserve::sim
