// Money terms on hand-checked cases, and DeepSeek's published cost, revenue and margin.
#include "sim/economics.h"

#include <gtest/gtest.h>

namespace moeserve::sim {
namespace {

const Prices kR1{0.14, 0.55, 2.19};  // USD per million tokens: cache hit, cache miss, output

TEST(Economics, GpuCost) {
  EXPECT_DOUBLE_EQ(gpu_cost_usd(1, 8, 1, 2), 16);
  EXPECT_DOUBLE_EQ(gpu_cost_usd(10, 8, 3, 2), 480);
  // DeepSeek: 226.75 nodes on average, 8 H800 each, 24 h at $2/GPU-hour = $87,072.
  EXPECT_DOUBLE_EQ(gpu_cost_usd(226.75, 8, 24, 2), 87072);
}

TEST(Economics, Revenue) {
  EXPECT_DOUBLE_EQ(revenue_usd(1e6, 0, 0, kR1), 0.14);
  EXPECT_DOUBLE_EQ(revenue_usd(0, 2e6, 1e6, kR1), 1.10 + 2.19);
  // The day: 342B cached, 608B - 342B uncached, 168B output. DeepSeek states $562,027; the
  // rounded token counts give $562,100, 0.013% off.
  double r = revenue_usd(342e9, 266e9, 168e9, kR1);
  EXPECT_DOUBLE_EQ(r, 47880 + 146300 + 367920);
  EXPECT_NEAR(r, 562027, 562027 * 0.001);
}

TEST(Economics, Margin) {
  EXPECT_DOUBLE_EQ(cost_profit_margin(300, 100), 2.0);
  EXPECT_DOUBLE_EQ(cost_profit_margin(50, 100), -0.5);
  // 545%: (562027 - 87072) / 87072 = 5.4548.
  EXPECT_NEAR(cost_profit_margin(562027, 87072), 5.45, 0.005);
}

TEST(Economics, NodesRoundUpToUnits) {
  EXPECT_DOUBLE_EQ(nodes_for(0, 100, 4, 1), 0);
  EXPECT_DOUBLE_EQ(nodes_for(400, 100, 4, 1), 4);
  EXPECT_DOUBLE_EQ(nodes_for(401, 100, 4, 1), 8);
  EXPECT_DOUBLE_EQ(nodes_for(400, 100, 4, 0.5), 8);
  EXPECT_DOUBLE_EQ(nodes_for(1, 100, 18, 1), 18);
}

TEST(Economics, PublishedScheduleAverages226_75Nodes) {
  // DeepSeek's node-count chart, hours since 12:00.
  std::vector<ScheduleStep> steps = {{0, 278},     {12, 218},   {13.25, 188}, {14, 158},
                                     {14.75, 128}, {15, 98},    {15.5, 68},   {18.5, 98},
                                     {19, 128},    {19.5, 188}, {20, 218},    {20.5, 278}};
  EXPECT_DOUBLE_EQ(schedule_avg_nodes(steps, 24), 226.75);
  EXPECT_DOUBLE_EQ(schedule_avg_nodes({{0, 10}, {1, 20}}, 2), 15);
}

TEST(Economics, PlanTwoHoursByHand) {
  // Hour 0 carries 3/4 of the tokens, hour 1 a quarter; one node does 1000 input or 100
  // output tokens/s; units of 1 node. Window of 2 h scales money to 24 h.
  DailyTraffic t{7.2e6, 3.6e6, 0.72e6, {3, 1}};
  Capacity c{1000, 100, 1, 1, 8, 1.0};
  DayPlan d = plan_day(t, kR1, c, 2);
  ASSERT_EQ(d.hours.size(), 2u);
  EXPECT_DOUBLE_EQ(d.hours[0].input_tokens_per_s, 1500);  // 5.4e6 / 3600
  EXPECT_DOUBLE_EQ(d.hours[0].prefill_nodes, 2);
  EXPECT_DOUBLE_EQ(d.hours[0].decode_nodes, 2);  // 150 tok/s
  EXPECT_DOUBLE_EQ(d.hours[1].prefill_nodes, 1);
  EXPECT_DOUBLE_EQ(d.hours[1].decode_nodes, 1);
  EXPECT_DOUBLE_EQ(d.avg_nodes, 3);
  EXPECT_DOUBLE_EQ(d.peak_nodes, 4);
  EXPECT_DOUBLE_EQ(d.daily_cost_usd, (4 + 2) * 8 * 2 * 12.0);
  EXPECT_NEAR(d.daily_revenue_usd, 12 * revenue_usd(3.6e6, 3.6e6, 0.72e6, kR1), 1e-9);
  // 7.2e6 input tokens over 3 prefill node-hours, scaled to the day.
  EXPECT_DOUBLE_EQ(d.prefill_input_tokens_per_s_per_node_day, 7.2e6 / (3 * 12 * 3600.0));
}

}  // namespace
}  // namespace moeserve::sim
