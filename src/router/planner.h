// Planner: how many prefill and decode units should run in the next interval (issue 45's
// decision core; docs/planner.md). Each interval it is given what the router measured (requests,
// input, cached and output tokens, TTFT and TPOT p99); it forecasts the next interval's load
// with a Forecaster, turns it into unit counts from the measured capacity of one unit and the
// SLO targets, corrects by measured against expected latency, and keeps the counts from
// flapping (scale up at once; down after `down_after` intervals in a row below, to the largest
// need among them). Each decision says why (forecast, capacity, target, action) for the log and
// /metrics.
//
// Not thread-safe: one owner calls observe() and decide() in turn.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve {

// What the router measured over one interval (rates per second).
struct IntervalLoad {
  double requests_per_s = 0;
  double input_tokens_per_s = 0;   // all prompt tokens
  double cached_tokens_per_s = 0;  // of those, served by a prefix cache (no prefill work)
  double output_tokens_per_s = 0;
  double ttft_p99_s = 0;  // 0: no request finished its first token this interval
  double tpot_p99_s = 0;
};

// The next value of a series from its history (oldest first).
class Forecaster {
 public:
  virtual ~Forecaster() = default;
  virtual double next(const std::vector<double>& history) const = 0;
  virtual std::string name() const = 0;
};

// The value one season (`period` intervals) before; before a season of history, the last value.
std::unique_ptr<Forecaster> seasonal_naive(int64_t period);

// Holt-Winters: additive damped trend, multiplicative season of `period` intervals, with the
// smoothing parameters fitted offline (tools/traces/forecast.py prints them); one step ahead. The
// first season initialises level and season; before two seasons of history it falls back to
// seasonal naive.
struct HoltWintersParams {
  double alpha = 0.3;  // level
  double beta = 0.05;  // trend
  double gamma = 0.1;  // season
  double phi = 0.98;   // trend damping
};
std::unique_ptr<Forecaster> holt_winters(int64_t period, HoltWintersParams p);

// An LSTM as DeepSeek forecasts its fleet's load with, trained offline by
// tools/traces/train_lstm.py (one per series): from the last day of intervals, each as
// (log1p(value / scale), sin and cos of its time of day), one layer of `hidden` units and a linear
// head give log1p(next / scale). Interval 0 of the history is 00:00. Before a day of history it
// falls back to the last value.
struct LstmWeights {
  int64_t hidden = 0;
  int64_t per_day = 0;  // intervals in a day
  double scale = 1;     // the training days' mean
  // PyTorch's layout and gate order (input, forget, cell, output): [4 hidden][3], [4 hidden]
  // [hidden], the two biases summed [4 hidden]; the head [hidden] and its bias.
  std::vector<float> w_ih, w_hh, bias, head;
  float head_bias = 0;
};
std::unique_ptr<Forecaster> lstm(LstmWeights w);

// The weights train_lstm.py --out writes: a JSON object of series ("requests", "input tokens",
// "output tokens"), each {scale, per_day, state: PyTorch's state_dict}. Errors name the file.
struct LstmSeries {
  LstmWeights requests, input, output;
};
Result<LstmSeries> read_lstm_weights(const std::string& path);

struct PlannerOptions {
  // kForecast: units for the forecast of the next interval (the planner proper). kReactive: the
  // threshold policy of reactive autoscalers (a baseline): from the last interval's measured load,
  // above `up_utilization` of the running units' capacity scale to what that load needs, below
  // `down_utilization` one unit down (after `down_after` intervals in a row), between the two hold.
  enum class Policy { kForecast, kReactive } policy = Policy::kForecast;
  double up_utilization = 0.8, down_utilization = 0.5;
  // One unit's capacity, measured (a calibration run of moeserve-bench or the sim): uncached
  // prompt tokens a prefill unit prefills per second within the TTFT target, output tokens a
  // decode unit generates per second within the TPOT target.
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  double headroom = 1.2;  // capacity kept above the forecast
  // > 0: the headroom is at least this quantile of what came over what was forecast, over the
  // last `error_window` intervals (a planner sizes for a high quantile of its forecast, not its
  // mean: the forecast's own misses set the margin; at most 4). 0: the fixed headroom alone.
  double error_quantile = 0;
  int64_t error_window = 96;
  double ttft_p99_target_s = 2.0;
  double tpot_p99_target_s = 0.1;
  int64_t min_prefill = 1, max_prefill = 16;
  int64_t min_decode = 1, max_decode = 16;
  int64_t down_after = 3;  // intervals in a row below the count before it goes down
};

struct PlanDecision {
  IntervalLoad measured;  // the last interval observed
  IntervalLoad forecast;
  double correction_prefill = 1, correction_decode = 1;  // measured / target latency, >= 1
  double headroom_prefill = 1, headroom_decode = 1;      // kept above the forecast
  int64_t need_prefill = 0, need_decode = 0;             // before hysteresis and bounds
  int64_t prefill = 0, decode = 0;                       // the counts to run
  std::string action;                                    // "hold", "scale up", ...

  // One log line: forecast, capacity, target, action.
  std::string explain(const PlannerOptions& o, int64_t current_prefill,
                      int64_t current_decode) const;
};

// Past intervals a planner starts from (its store of history: a restarted planner forecasts from
// the first interval): a CSV file with the header
// `requests_per_s,input_tokens_per_s,cached_tokens_per_s,output_tokens_per_s` and one row per
// interval, oldest first. Errors name the file and the line.
Result<std::vector<IntervalLoad>> read_interval_history(const std::string& path);

class Planner {
 public:
  // One forecaster for every series, or one per series (requests, uncached input tokens, output
  // tokens: the LSTM's weights are per series).
  Planner(PlannerOptions options, std::unique_ptr<Forecaster> forecaster);
  Planner(PlannerOptions options, std::unique_ptr<Forecaster> requests,
          std::unique_ptr<Forecaster> uncached, std::unique_ptr<Forecaster> output);

  void observe(const IntervalLoad& load);
  // The counts for the next interval, given those running now.
  PlanDecision decide(int64_t current_prefill, int64_t current_decode);
  // Prometheus lines of the last decision.
  std::string metrics_text() const;

  // Intervals in a row the need stayed below the count, and the largest need among them.
  struct Below {
    int64_t intervals = 0, highest = 0;
  };

 private:
  const PlannerOptions o_;
  std::shared_ptr<Forecaster> f_requests_, f_uncached_, f_output_;
  std::vector<double> uncached_, output_, requests_;  // per interval, oldest first
  // What came over what was forecast, per interval (the last error_window).
  std::vector<double> miss_uncached_, miss_output_;
  IntervalLoad last_;
  Below below_prefill_, below_decode_;
  PlanDecision last_decision_;
};

}  // namespace moeserve
