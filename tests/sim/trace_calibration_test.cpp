// Calibration to measured traces (src/sim/trace_calibration.h): the scales are pinned to the
// trace numbers themselves, never to the day averages the model is checked against. At the
// trace's own configuration the calibrated model must reproduce the trace; the staged decode
// schedule is checked by hand on the trace's operator times.
#include <gtest/gtest.h>

#include "sim/scenario.h"
#include "sim/trace_calibration.h"

namespace moeserve::sim {
namespace {

constexpr char kProfiled[] = "examples/sim/deepseek-v3-h800-day-profiled.json";

Scenario profiled() {
  auto s = load_scenario(kProfiled);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->trace_calibration.has_value());
  return std::move(s).value();
}

// The decode trace's numbers as the example carries them (microseconds, one micro-batch).
TEST(TraceCalibration, ExampleCarriesTheTraceNumbers) {
  Scenario s = profiled();
  const DecodeTrace& t = *s.trace_calibration->decode;
  EXPECT_EQ(t.batch_per_device, 128);
  EXPECT_EQ(t.ep, 128);
  EXPECT_EQ(t.kv_tokens, 4096);
  EXPECT_EQ(t.mtp_draft_tokens, 1);
  // attention = 63 + 255 + 70 = 388 us, the trace's attention sum.
  double attn = t.op_s[size_t(OpGroup::kAttnPre)] + t.op_s[size_t(OpGroup::kAttnCore)] +
                t.op_s[size_t(OpGroup::kAttnPost)];
  EXPECT_NEAR(attn, 388e-6, 1e-12);
  EXPECT_NEAR(t.op_s[size_t(OpGroup::kRouted)], (81 + 8 + 39) * 1e-6, 1e-12);
  EXPECT_NEAR(t.op_s[size_t(OpGroup::kShared)], (3 + 17 + 4 + 10) * 1e-6, 1e-12);
  EXPECT_DOUBLE_EQ(t.layers_s, 0.08732);
  EXPECT_DOUBLE_EQ(t.step_s, 0.096);
  EXPECT_DOUBLE_EQ(s.trace_calibration->prefill->computed_tokens_per_s_per_node, 62713);
}

// Scales are measured / modelled at the trace's configuration, so the calibrated operator
// times at that configuration are the trace's.
TEST(TraceCalibration, CalibratedOperatorsReproduceTheTraceAtItsConfiguration) {
  Scenario s = profiled();
  const DecodeTrace& t = *s.trace_calibration->decode;
  auto u = calibrate_decode(s.model, s.hardware, s.decode, t);
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  auto modelled = modelled_decode_groups(s.model, s.hardware, s.decode, t);
  for (int i = 0; i < kOpGroups; ++i) {
    EXPECT_NEAR(u->calibration.op_scale[i] * modelled[i], t.op_s[i], 1e-12) << "group " << i;
  }
  UnitDeployment at_trace = *u;
  at_trace.ep = t.ep;
  at_trace.redundant_experts = t.redundant_experts;
  DecodePoint p = decode_at(s.model, s.hardware, at_trace, t.batch_per_device, t.kv_tokens);
  EXPECT_NEAR(p.layers.total_s, 0.08732, 1e-9);
  EXPECT_NEAR(p.step_s, 0.096, 1e-9);
  // The unit's own deployment is kept.
  EXPECT_EQ(u->ep, 144);
  EXPECT_TRUE(u->calibration.staged_decode);
}

// DeepSeek's decode schedule on the trace's own times, by hand: per micro-batch
// max(SHARED 34 + ATTN-0 63, dispatch 187) + MLP 128 + max(ATTN-1 255 + 70 + 19, combine 394)
// = 187 + 128 + 394 = 709 us; two micro-batches: 1418 us per MoE layer. (The ideal overlap
// max(2 x 569, 2 x 581) would say 1162 us; the trace's 61 layers average 1431 us.)
TEST(TraceCalibration, StagedScheduleByHand) {
  Scenario s = profiled();
  const DecodeTrace& t = *s.trace_calibration->decode;
  auto u = calibrate_decode(s.model, s.hardware, s.decode, t);
  ASSERT_TRUE(u.ok());
  ModelSpec one_layer = s.model;
  one_layer.layers = 1;
  one_layer.first_dense_layers = 0;
  one_layer.mtp_layers = 0;
  UnitDeployment at_trace = *u;
  at_trace.ep = t.ep;
  at_trace.redundant_experts = t.redundant_experts;
  at_trace.calibration.layers_scale = 1;
  DecodePoint p = decode_at(one_layer, s.hardware, at_trace, t.batch_per_device, t.kv_tokens);
  EXPECT_NEAR(p.layers.total_s, 1418e-6, 1e-9);
  EXPECT_NEAR(p.layers.compute_s, 2 * 569e-6, 1e-9);
  EXPECT_NEAR(p.layers.comm_s, 2 * 581e-6, 1e-9);
}

// Prefill: at the trace's configuration (EP32, 16K tokens per GPU, 4K prompts, no cache) the
// calibrated forward runs 16384 x 8 / 62713 = 2.0900 s, i.e. 62,713 computed tokens/s/node.
TEST(TraceCalibration, PrefillReproducesTheTraceThroughput) {
  Scenario s = profiled();
  const PrefillTrace& t = *s.trace_calibration->prefill;
  auto u = calibrate_prefill(s.model, s.hardware, s.prefill, t);
  ASSERT_TRUE(u.ok());
  u->redundant_experts = t.redundant_experts;
  auto p = prefill_at(s.model, s.hardware, *u, {{4096, 1.0}}, 0.0);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->forward_s, 16384.0 * 8 / 62713, 1e-9);
  EXPECT_NEAR(p->computed_tokens_per_s * 8, 62713, 1e-6);
}

// The kernel-table scenario stays uncalibrated.
TEST(TraceCalibration, KernelTableModeIsUntouched) {
  auto s = load_scenario("examples/sim/deepseek-v3-h800-day.json");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->trace_calibration.has_value());
  auto r = run_scenario(*s);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->scenario.decode.calibration.active);
  EXPECT_FALSE(r->scenario.prefill.calibration.active);
  EXPECT_DOUBLE_EQ(r->scenario.prefill.calibration.forward_scale, 1.0);
}

TEST(TraceCalibration, RejectsIncompleteTraces) {
  Scenario s = profiled();
  DecodeTrace t = *s.trace_calibration->decode;
  t.op_s[size_t(OpGroup::kGate)] = 0;
  EXPECT_FALSE(calibrate_decode(s.model, s.hardware, s.decode, t).ok());
  t = *s.trace_calibration->decode;
  t.step_s = t.layers_s;  // no time left for the rest of the step
  EXPECT_FALSE(calibrate_decode(s.model, s.hardware, s.decode, t).ok());
  UnitDeployment one_mb = s.decode;
  one_mb.micro_batches = 1;
  EXPECT_FALSE(calibrate_decode(s.model, s.hardware, one_mb, *s.trace_calibration->decode).ok());
  auto bad = load_scenario(kProfiled, {{"trace_calibration.decode.op_us.combine", -1}});
  ASSERT_TRUE(bad.ok());  // parsed; the calibration itself refuses it
  EXPECT_FALSE(run_scenario(*bad).ok());
}

// What the calibrated example predicts for the day (docs/sim.md). Pinned as regression values
// of the calibration, not against DeepSeek's day averages (which it does not reach).
TEST(TraceCalibration, DayPredictionOfTheProfiledExample) {
  auto r = run_scenario(profiled());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->scenario.decode.calibration.staged_decode);
  EXPECT_NEAR(r->prefill_input_tokens_per_s_per_node, 119.6e3, 0.5e3);
  EXPECT_NEAR(r->decode_output_tokens_per_s_per_node, 19.26e3, 0.1e3);
  EXPECT_GE(r->decode.user_tokens_per_s, 20.0);
}

}  // namespace
}  // namespace moeserve::sim
