// The planner's decision core (docs/planner.md): forecasters on series whose next value is known,
// unit counts from forecast and capacity, the latency correction, hysteresis and bounds.
#include "router/planner.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace moeserve {
namespace {

// A day of `period` intervals: a diurnal curve between 0.3 and 1.0 of `peak`.
double diurnal(int64_t t, int64_t period, double peak) {
  const double phase = 2 * M_PI * double(t % period) / double(period);
  return peak * (0.65 - 0.35 * std::cos(phase));
}

TEST(Planner, SeasonalNaiveIsTheValueADayBefore) {
  auto f = seasonal_naive(4);
  EXPECT_EQ(f->next({}), 0);
  EXPECT_EQ(f->next({5, 7}), 7);  // (less than a season: the last value)
  EXPECT_EQ(f->next({1, 2, 3, 4, 5, 6}), 3);
}

TEST(Planner, HoltWintersLearnsASeasonWithATrend) {
  const int64_t m = 24;
  std::vector<double> y;
  for (int64_t t = 0; t < 10 * m; ++t) y.push_back(diurnal(t, m, 100) * (1 + 0.002 * double(t)));
  auto hw = holt_winters(m, {0.3, 0.05, 0.2, 0.98});
  auto naive = seasonal_naive(m);
  double hw_err = 0, naive_err = 0;
  for (int64_t t = 8 * m; t < 10 * m; ++t) {
    const std::vector<double> h(y.begin(), y.begin() + t);
    hw_err += std::abs(hw->next(h) - y[size_t(t)]) / y[size_t(t)];
    naive_err += std::abs(naive->next(h) - y[size_t(t)]) / y[size_t(t)];
  }
  hw_err /= 2.0 * double(m);
  naive_err /= 2.0 * double(m);
  // The growth is what seasonal naive misses (about one day's 2.4%); Holt-Winters follows it.
  EXPECT_LT(hw_err, 0.01);
  EXPECT_GT(naive_err, 0.015);
  // Before two seasons it is seasonal naive.
  const std::vector<double> short_h(y.begin(), y.begin() + m + 3);
  EXPECT_EQ(hw->next(short_h), naive->next(short_h));
}

PlannerOptions options() {
  PlannerOptions o;
  o.prefill_tokens_per_s = 1000;
  o.decode_tokens_per_s = 200;
  o.headroom = 1.2;
  o.min_prefill = o.min_decode = 1;
  o.max_prefill = o.max_decode = 8;
  o.down_after = 3;
  return o;
}

TEST(Planner, UnitsFollowTheForecastWithHeadroom) {
  Planner p(options(), seasonal_naive(1));  // (period 1: the forecast is the last interval)
  IntervalLoad l;
  l.input_tokens_per_s = 3000;
  l.cached_tokens_per_s = 1000;  // 2000 to prefill: 2400 with headroom -> 3 units
  l.output_tokens_per_s = 500;   // 600 with headroom -> 3 units
  p.observe(l);
  PlanDecision d = p.decide(1, 1);
  EXPECT_EQ(d.need_prefill, 3);
  EXPECT_EQ(d.need_decode, 3);
  EXPECT_EQ(d.prefill, 3);
  EXPECT_EQ(d.decode, 3);
  EXPECT_EQ(d.action, "scale up");
  EXPECT_NE(d.explain(options(), 1, 1).find("1 -> 3 prefill"), std::string::npos)
      << d.explain(options(), 1, 1);
  EXPECT_NE(p.metrics_text().find("moeserve_planner_target_decode_units 3"), std::string::npos);
  // Bounds: far more load than 8 units carry.
  l.output_tokens_per_s = 1e6;
  p.observe(l);
  EXPECT_EQ(p.decide(3, 3).decode, 8);
}

TEST(Planner, ALatencyAboveItsTargetAddsUnits) {
  Planner p(options(), seasonal_naive(1));
  IntervalLoad l;
  l.output_tokens_per_s = 500;
  l.tpot_p99_s = 0.15;  // 1.5x the 0.1 s target: a unit carries less than calibrated
  p.observe(l);
  PlanDecision d = p.decide(3, 3);
  EXPECT_DOUBLE_EQ(d.correction_decode, 1.5);
  EXPECT_EQ(d.need_decode, 5);                  // ceil(500 x 1.2 x 1.5 / 200)
  EXPECT_DOUBLE_EQ(d.correction_prefill, 1.0);  // no TTFT measured
}

TEST(Planner, ScalesDownAfterAStabilizationWindowAndNeverFlaps) {
  Planner p(options(), seasonal_naive(1));
  IntervalLoad high, low;
  high.output_tokens_per_s = 1000;  // 6 decode units
  low.output_tokens_per_s = 100;    // 1
  p.observe(high);
  int64_t decode = p.decide(1, 1).decode;
  ASSERT_EQ(decode, 6);
  std::vector<int64_t> seen;
  for (int i = 0; i < 5; ++i) {
    p.observe(low);
    decode = p.decide(1, decode).decode;
    seen.push_back(decode);
  }
  // After 3 intervals in a row below, down to what they needed, at once.
  EXPECT_EQ(seen, (std::vector<int64_t>{6, 6, 1, 1, 1}));
  // Needs of 4, 2 and 3 units below 6: down to the largest, 4.
  p.observe(high);
  ASSERT_EQ(p.decide(1, 1).decode, 6);
  seen.clear();
  for (double out : {600.0, 300.0, 450.0}) {  // x 1.2 / 200: 3.6, 1.8, 2.7 -> 4, 2, 3
    IntervalLoad l;
    l.output_tokens_per_s = out;
    p.observe(l);
    seen.push_back(p.decide(1, 6).decode);
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{6, 6, 4}));
  decode = 4;
  // Load back: up at once, and the count below resets.
  p.observe(high);
  EXPECT_EQ(p.decide(1, decode).decode, 6);
  p.observe(low);
  EXPECT_EQ(p.decide(1, 6).decode, 6);
  // A load that alternates does not move the count down.
  for (int i = 0; i < 10; ++i) {
    p.observe(i % 2 ? high : low);
    EXPECT_EQ(p.decide(1, 6).decode, 6) << i;
  }
}

TEST(Planner, ReactiveActsOnThresholdsOfTheLastInterval) {
  PlannerOptions o = options();
  o.policy = PlannerOptions::Policy::kReactive;  // up above 0.8, one down below 0.5
  Planner p(o, seasonal_naive(1));
  IntervalLoad l;
  l.input_tokens_per_s = 100;
  l.output_tokens_per_s = 700;  // 4 units at 200: 0.875 of them -> what 700 needs: 5
  p.observe(l);
  PlanDecision d = p.decide(1, 4);
  EXPECT_EQ(d.decode, 5);
  EXPECT_EQ(d.prefill, 1);  // 0.1 of one prefill unit: at the minimum
  EXPECT_NE(d.explain(o, 1, 4).find("last interval (reactive) "), std::string::npos);
  l.output_tokens_per_s = 600;  // 0.6 of 5 units: hold (the forecast policy: 4)
  for (int i = 0; i < 5; ++i) {
    p.observe(l);
    EXPECT_EQ(p.decide(1, 5).decode, 5) << i;
  }
  l.output_tokens_per_s = 820;  // 0.82 of 5 units: up, to ceil(820 x 1.2 / 200) = 5 -> 6
  p.observe(l);
  EXPECT_EQ(p.decide(1, 5).decode, 6);
  l.output_tokens_per_s = 400;  // 0.33 of 6: one down after 3 intervals
  std::vector<int64_t> seen;
  int64_t decode = 6;
  for (int i = 0; i < 6; ++i) {
    p.observe(l);
    decode = p.decide(1, decode).decode;
    seen.push_back(decode);
  }
  // 6 6 5, then 400 is 0.4 of 5: 5 5 4.
  EXPECT_EQ(seen, (std::vector<int64_t>{6, 6, 5, 5, 5, 4}));
}

TEST(Planner, ReadsItsHistoryAndNamesTheFileOfABadOne) {
  const std::string path = ::testing::TempDir() + "planner_history.csv";
  {
    std::ofstream f(path);
    f << "requests_per_s,input_tokens_per_s,cached_tokens_per_s,output_tokens_per_s\n"
      << "1.5,300,100,80\n2,400.5,0,90\n";
  }
  auto h = read_interval_history(path);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_DOUBLE_EQ((*h)[0].requests_per_s, 1.5);
  EXPECT_DOUBLE_EQ((*h)[0].cached_tokens_per_s, 100);
  EXPECT_DOUBLE_EQ((*h)[1].input_tokens_per_s, 400.5);
  EXPECT_DOUBLE_EQ((*h)[1].output_tokens_per_s, 90);
  // A planner that starts from it forecasts at once (period 2: the value two intervals before).
  Planner p(options(), seasonal_naive(2));
  for (const IntervalLoad& l : *h) p.observe(l);
  IntervalLoad now;
  p.observe(now);
  EXPECT_DOUBLE_EQ(p.decide(1, 1).forecast.output_tokens_per_s, 90);
  for (const char* bad : {"1,2,3\n", "1,2,3,x\n", "1,2,-3,4\n", "1,2,3,4,5\n"}) {
    {
      std::ofstream f(path);
      f << "requests_per_s,input_tokens_per_s,cached_tokens_per_s,output_tokens_per_s\n"
        << "1,2,3,4\n"
        << bad;
    }
    auto r = read_interval_history(path);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(path + "' line 3"), std::string::npos)
        << r.status().message();
  }
  {
    std::ofstream f(path);
    f << "a,b\n";
  }
  EXPECT_FALSE(read_interval_history(path).ok());
  std::remove(path.c_str());
  EXPECT_NE(read_interval_history(path).status().message().find("cannot open"), std::string::npos);
}

// The C++ LSTM against PyTorch: tests/data/planner/lstm_fixture.json holds weights trained by
// tools/traces/train_lstm.py, a series and PyTorch's forecasts of its first four held-out intervals
// (tests/data/planner/make_lstm_fixture.sh).
TEST(Planner, LstmForecastsAsPyTorchDoes) {
  const std::string path = "tests/data/planner/lstm_fixture.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string weights = ::testing::TempDir() + "lstm_weights.json";
  std::ofstream(weights) << j.at("weights").dump();
  auto w = read_lstm_weights(weights);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->requests.hidden, 8);
  EXPECT_EQ(w->requests.per_day, 24);
  const int64_t split = j.at("split").get<int64_t>();
  for (auto [name, lw] : {std::pair{"requests", &w->requests}, std::pair{"input tokens", &w->input},
                          std::pair{"output tokens", &w->output}}) {
    auto f = lstm(*lw);
    const auto series = j.at("series").at(name).at("series").get<std::vector<double>>();
    const auto want = j.at("series").at(name).at("forecasts").get<std::vector<double>>();
    ASSERT_EQ(want.size(), 4u);
    for (int64_t k = 0; k < 4; ++k) {
      std::vector<double> h(series.begin(), series.begin() + split + k);
      EXPECT_NEAR(f->next(h), want[size_t(k)], 1e-4 * want[size_t(k)]) << name << " " << k;
    }
    // Less than a day of history: the last value.
    EXPECT_EQ(f->next({3.0, 5.0}), 5.0);
  }
  // A planner with one LSTM per series forecasts each with its own.
  Planner p(options(), lstm(w->requests), lstm(w->input), lstm(w->output));
  const auto out = j.at("series").at("output tokens").at("series").get<std::vector<double>>();
  const auto req = j.at("series").at("requests").at("series").get<std::vector<double>>();
  const auto inp = j.at("series").at("input tokens").at("series").get<std::vector<double>>();
  for (int64_t t = 0; t < split; ++t) {
    IntervalLoad l;
    l.requests_per_s = req[size_t(t)];
    l.input_tokens_per_s = inp[size_t(t)];
    l.output_tokens_per_s = out[size_t(t)];
    p.observe(l);
  }
  const PlanDecision d = p.decide(1, 1);
  const auto want_out = j.at("series").at("output tokens").at("forecasts")[0].get<double>();
  const auto want_req = j.at("series").at("requests").at("forecasts")[0].get<double>();
  EXPECT_NEAR(d.forecast.output_tokens_per_s, want_out, 1e-4 * want_out);
  EXPECT_NEAR(d.forecast.requests_per_s, want_req, 1e-4 * want_req);
  // Bad weights name the file and what is wrong.
  nlohmann::json bad = j.at("weights");
  bad["output tokens"]["state"]["lstm.weight_hh_l0"][0].erase(0);
  std::ofstream(weights) << bad.dump();
  auto r = read_lstm_weights(weights);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(weights), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("lstm.weight_hh_l0"), std::string::npos)
      << r.status().message();
  bad = j.at("weights");
  bad.erase("requests");
  std::ofstream(weights) << bad.dump();
  EXPECT_NE(read_lstm_weights(weights).status().message().find("no series 'requests'"),
            std::string::npos);
  std::ofstream(weights) << "{";
  EXPECT_FALSE(read_lstm_weights(weights).ok());
  std::remove(weights.c_str());
}

// The C++ Holt-Winters against statsmodels' ExponentialSmoothing from the same starting state
// (tests/data/planner/make_hw_fixture.py): the smoothing statsmodels fits is what
// --planner-holt-winters takes, so the recursion must be statsmodels'.
TEST(Planner, HoltWintersForecastsAsStatsmodelsDoes) {
  std::ifstream in("tests/data/planner/hw_fixture.json");
  ASSERT_TRUE(in);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto& p = j.at("params");
  auto f = holt_winters(j.at("period").get<int64_t>(),
                        {p.at("alpha").get<double>(), p.at("beta").get<double>(),
                         p.at("gamma").get<double>(), p.at("phi").get<double>()});
  const auto y = j.at("series").get<std::vector<double>>();
  const auto want = j.at("forecasts").get<std::vector<double>>();
  const int64_t first = j.at("first_k").get<int64_t>();
  ASSERT_EQ(int64_t(want.size()), int64_t(y.size()) - first + 1);
  for (size_t i = 0; i < want.size(); ++i) {
    const std::vector<double> h(y.begin(), y.begin() + first + int64_t(i));
    EXPECT_NEAR(f->next(h), want[i], 1e-9 * want[i]) << "forecast of y[" << h.size() << "]";
  }
}

TEST(Planner, HeadroomCoversTheForecastsOwnMisses) {
  PlannerOptions o = options();  // decode units carry 200 tok/s; headroom 1.2
  o.error_quantile = 0.9;
  o.error_window = 20;
  Planner p(o, seasonal_naive(2));  // (the value two intervals before)
  // An alternating load: seasonal naive with a period of 2 is right... until the phase shifts.
  const std::vector<double> load = {100, 300, 100, 300, 100, 300, 300, 100, 300, 100, 300, 100};
  auto last_decision = [&](Planner& planner) {
    PlanDecision d;
    for (double v : load) {
      IntervalLoad l;
      l.output_tokens_per_s = v;
      planner.observe(l);
      d = planner.decide(1, 1);
    }
    return d;
  };
  PlanDecision d = last_decision(p);
  // After the shift every forecast is off by 3x either way: the 0.9 quantile of came/forecast is 3.
  EXPECT_DOUBLE_EQ(d.headroom_decode, 3.0);
  EXPECT_EQ(d.need_decode, 5);  // ceil(300 (the forecast) x 3 / 200)
  EXPECT_NE(d.explain(o, 1, 1).find("headroom 1.20 / 3.00"), std::string::npos)
      << d.explain(o, 1, 1);
  // Off: the fixed headroom.
  Planner fixed(options(), seasonal_naive(2));
  d = last_decision(fixed);
  EXPECT_DOUBLE_EQ(d.headroom_decode, 1.2);
}

}  // namespace
}  // namespace moeserve
