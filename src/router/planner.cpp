#include "router/planner.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeserve {

namespace {

class SeasonalNaive final : public Forecaster {
 public:
  explicit SeasonalNaive(int64_t period) : period_(period) {}
  double next(const std::vector<double>& h) const override {
    if (h.empty()) return 0;
    const int64_t n = int64_t(h.size());
    return n >= period_ ? h[size_t(n - period_)] : h.back();
  }
  std::string name() const override { return "seasonal-naive"; }

 private:
  const int64_t period_;
};

class HoltWinters final : public Forecaster {
 public:
  HoltWinters(int64_t period, HoltWintersParams p) : period_(period), p_(p), naive_(period) {}

  double next(const std::vector<double>& h) const override {
    const int64_t m = period_, n = int64_t(h.size());
    if (n < 2 * m) return naive_.next(h);
    constexpr double kFloor = 1e-9;  // (a multiplicative season needs positive values)
    auto y = [&](int64_t t) { return std::max(h[size_t(t)], kFloor); };
    double first = 0, second = 0;
    for (int64_t t = 0; t < m; ++t) {
      first += y(t);
      second += y(m + t);
    }
    first /= double(m);
    second /= double(m);
    double level = first, trend = (second - first) / double(m);
    // The season starts as each interval's share of its day, averaged over every whole season of
    // the history (one season's shares carry that day's noise, which a small fitted gamma would
    // keep for weeks).
    const int64_t seasons = n / m;
    std::vector<double> season(static_cast<size_t>(m), 0.0);
    for (int64_t k = 0; k < seasons; ++k) {
      double mean = 0;
      for (int64_t t = 0; t < m; ++t) mean += y(k * m + t);
      mean = std::max(mean / double(m), kFloor);
      for (int64_t t = 0; t < m; ++t) season[size_t(t)] += y(k * m + t) / mean / double(seasons);
    }
    // statsmodels' recursion (ExponentialSmoothing, additive damped trend, multiplicative
    // season), whose fitted smoothing --planner-holt-winters takes: the season is updated against
    // the level the interval was forecast from, not the new one
    // (tests/data/planner/hw_fixture.json).
    for (int64_t t = m; t < n; ++t) {
      double& s = season[size_t(t % m)];
      const double expected = std::max(level + p_.phi * trend, kFloor);
      const double prev = level;
      level = p_.alpha * (y(t) / std::max(s, kFloor)) + (1 - p_.alpha) * expected;
      level = std::max(level, kFloor);
      trend = p_.beta * (level - prev) + (1 - p_.beta) * p_.phi * trend;
      s = p_.gamma * (y(t) / expected) + (1 - p_.gamma) * s;
    }
    return std::max(0.0, (level + p_.phi * trend) * season[size_t(n % m)]);
  }
  std::string name() const override { return "holt-winters"; }

 private:
  const int64_t period_;
  const HoltWintersParams p_;
  const SeasonalNaive naive_;
};

class Lstm final : public Forecaster {
 public:
  explicit Lstm(LstmWeights w) : w_(std::move(w)) {}

  double next(const std::vector<double>& h) const override {
    const int64_t n = int64_t(h.size()), day = w_.per_day, H = w_.hidden;
    if (n < day) return h.empty() ? 0 : h.back();
    std::vector<float> state(static_cast<size_t>(H), 0.f), cell(static_cast<size_t>(H), 0.f);
    std::vector<float> gates(static_cast<size_t>(4 * H));
    for (int64_t t = n - day; t < n; ++t) {
      const double phase = 2 * M_PI * double(t % day) / double(day);
      const float x[3] = {float(std::log1p(h[size_t(t)] / w_.scale)), float(std::sin(phase)),
                          float(std::cos(phase))};
      for (int64_t g = 0; g < 4 * H; ++g) {
        float v = w_.bias[size_t(g)];
        for (int k = 0; k < 3; ++k) v += w_.w_ih[size_t(g * 3 + k)] * x[k];
        for (int64_t k = 0; k < H; ++k) v += w_.w_hh[size_t(g * H + k)] * state[size_t(k)];
        gates[size_t(g)] = v;
      }
      auto sigmoid = [](float v) { return 1.f / (1.f + std::exp(-v)); };
      for (int64_t k = 0; k < H; ++k) {
        const float i = sigmoid(gates[size_t(k)]), f = sigmoid(gates[size_t(H + k)]),
                    g = std::tanh(gates[size_t(2 * H + k)]), o = sigmoid(gates[size_t(3 * H + k)]);
        cell[size_t(k)] = f * cell[size_t(k)] + i * g;
        state[size_t(k)] = o * std::tanh(cell[size_t(k)]);
      }
    }
    double out = w_.head_bias;
    for (int64_t k = 0; k < H; ++k) out += double(w_.head[size_t(k)]) * state[size_t(k)];
    return std::max(0.0, std::expm1(out) * w_.scale);
  }
  std::string name() const override { return "lstm"; }

 private:
  const LstmWeights w_;
};

int64_t units_for(double load, double capacity, double headroom, double correction) {
  if (capacity <= 0) return 0;
  return int64_t(std::ceil(load * headroom * correction / capacity - 1e-9));
}

// Measured p99 over its target, at least 1 and at most 2: a unit carries less than calibrated.
double correction(double measured, double target) {
  if (measured <= 0 || target <= 0) return 1;
  return std::clamp(measured / target, 1.0, 2.0);
}

// The count to run: up at once; down only after `down_after` intervals in a row below the count,
// then to the largest need of those intervals (a stabilization window, as Kubernetes' HPA scales
// down: no flapping, and a fleet far too big for the night comes down in one step); in bounds.
int64_t settle(int64_t need, int64_t current, int64_t lo, int64_t hi, int64_t down_after,
               Planner::Below& below) {
  need = std::clamp(need, lo, hi);
  if (need >= current) {
    below = {};
    return need;
  }
  below.highest = below.intervals == 0 ? need : std::max(below.highest, need);
  if (++below.intervals < down_after) return std::clamp(current, lo, hi);
  const int64_t to = below.highest;
  below = {};
  return to;
}

}  // namespace

std::unique_ptr<Forecaster> seasonal_naive(int64_t period) {
  return std::make_unique<SeasonalNaive>(period);
}

std::unique_ptr<Forecaster> holt_winters(int64_t period, HoltWintersParams p) {
  return std::make_unique<HoltWinters>(period, p);
}

std::unique_ptr<Forecaster> lstm(LstmWeights w) {
  return std::make_unique<Lstm>(std::move(w));
}

namespace {

// A tensor of the state_dict, flattened, with the shape checked.
Result<std::vector<float>> tensor(const nlohmann::json& state, const std::string& key, int64_t rows,
                                  int64_t cols) {
  auto it = state.find(key);
  if (it == state.end()) return InvalidArgument(fmt::format("no tensor '{}'", key));
  std::vector<float> out;
  const nlohmann::json& t = *it;
  auto bad = [&] {
    return InvalidArgument(fmt::format("tensor '{}' is not {}x{}", key, rows, cols));
  };
  if (cols == 0) {  // a vector
    if (!t.is_array() || int64_t(t.size()) != rows) return bad();
    for (const auto& v : t) out.push_back(v.get<float>());
    return out;
  }
  if (!t.is_array() || int64_t(t.size()) != rows) return bad();
  for (const auto& row : t) {
    if (!row.is_array() || int64_t(row.size()) != cols) return bad();
    for (const auto& v : row) out.push_back(v.get<float>());
  }
  return out;
}

Result<LstmWeights> lstm_series(const nlohmann::json& j) {
  LstmWeights w;
  w.scale = j.at("scale").get<double>();
  w.per_day = j.at("per_day").get<int64_t>();
  const nlohmann::json& st = j.at("state");
  const auto& head = st.at("head.weight");
  if (!head.is_array() || head.size() != 1 || !head[0].is_array() || head[0].empty()) {
    return InvalidArgument("tensor 'head.weight' is not 1xH");
  }
  const int64_t H = int64_t(head[0].size());
  w.hidden = H;
  if (w.per_day <= 0 || !(w.scale > 0)) return InvalidArgument("per_day and scale must be > 0");
  ASSIGN_OR_RETURN(w.w_ih, tensor(st, "lstm.weight_ih_l0", 4 * H, 3));
  ASSIGN_OR_RETURN(w.w_hh, tensor(st, "lstm.weight_hh_l0", 4 * H, H));
  ASSIGN_OR_RETURN(std::vector<float> b_ih, tensor(st, "lstm.bias_ih_l0", 4 * H, 0));
  ASSIGN_OR_RETURN(std::vector<float> b_hh, tensor(st, "lstm.bias_hh_l0", 4 * H, 0));
  ASSIGN_OR_RETURN(w.head, tensor(st, "head.weight", 1, H));
  ASSIGN_OR_RETURN(std::vector<float> hb, tensor(st, "head.bias", 1, 0));
  w.bias.resize(size_t(4 * H));
  for (size_t i = 0; i < w.bias.size(); ++i) w.bias[i] = b_ih[i] + b_hh[i];
  w.head_bias = hb[0];
  return w;
}

}  // namespace

Result<LstmSeries> read_lstm_weights(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(fmt::format("LSTM weights '{}': cannot open", path));
  LstmSeries out;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (auto [name, w] :
         {std::pair{"requests", &out.requests}, std::pair{"input tokens", &out.input},
          std::pair{"output tokens", &out.output}}) {
      if (!j.contains(name)) {
        return InvalidArgument(fmt::format("LSTM weights '{}': no series '{}'", path, name));
      }
      Result<LstmWeights> r = lstm_series(j.at(name));
      if (!r.ok()) {
        return InvalidArgument(
            fmt::format("LSTM weights '{}', series '{}': {}", path, name, r.status().message()));
      }
      *w = std::move(*r);
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(fmt::format("LSTM weights '{}': {}", path, e.what()));
  }
  return out;
}

std::string PlanDecision::explain(const PlannerOptions& o, int64_t current_prefill,
                                  int64_t current_decode) const {
  return fmt::format(
      "planner: measured {:.2f} req/s, {:.0f} uncached input tok/s, {:.0f} output tok/s; "
      "{} {:.2f} req/s, {:.0f} uncached input tok/s, {:.0f} output tok/s; "
      "capacity {:.0f} prefill tok/s and {:.0f} decode tok/s a unit, headroom {:.2f} / {:.2f}, "
      "latency "
      "correction {:.2f} / {:.2f}; need {} prefill, {} decode; {} -> {} prefill, {} -> {} decode "
      "({})",
      measured.requests_per_s, measured.input_tokens_per_s - measured.cached_tokens_per_s,
      measured.output_tokens_per_s,
      o.policy == PlannerOptions::Policy::kReactive ? "last interval (reactive)" : "forecast",
      forecast.requests_per_s, forecast.input_tokens_per_s, forecast.output_tokens_per_s,
      o.prefill_tokens_per_s, o.decode_tokens_per_s, headroom_prefill, headroom_decode,
      correction_prefill, correction_decode, need_prefill, need_decode, current_prefill, prefill,
      current_decode, decode, action);
}

Planner::Planner(PlannerOptions options, std::unique_ptr<Forecaster> forecaster)
    : o_(options),
      f_requests_(std::move(forecaster)),
      f_uncached_(f_requests_),
      f_output_(f_requests_) {}

Planner::Planner(PlannerOptions options, std::unique_ptr<Forecaster> requests,
                 std::unique_ptr<Forecaster> uncached, std::unique_ptr<Forecaster> output)
    : o_(options),
      f_requests_(std::move(requests)),
      f_uncached_(std::move(uncached)),
      f_output_(std::move(output)) {}

void Planner::observe(const IntervalLoad& load) {
  uncached_.push_back(std::max(0.0, load.input_tokens_per_s - load.cached_tokens_per_s));
  output_.push_back(load.output_tokens_per_s);
  requests_.push_back(load.requests_per_s);
  last_ = load;
}

PlanDecision Planner::decide(int64_t current_prefill, int64_t current_decode) {
  PlanDecision d;
  d.measured = last_;
  d.correction_prefill = correction(last_.ttft_p99_s, o_.ttft_p99_target_s);
  d.correction_decode = correction(last_.tpot_p99_s, o_.tpot_p99_target_s);
  if (o_.policy == PlannerOptions::Policy::kReactive) {
    // What the last interval brought, not a forecast.
    d.forecast = last_;
    d.forecast.input_tokens_per_s = uncached_.empty() ? 0 : uncached_.back();
    d.forecast.cached_tokens_per_s = 0;
  } else {
    d.forecast.requests_per_s = f_requests_->next(requests_);
    d.forecast.input_tokens_per_s = f_uncached_->next(uncached_);  // (the uncached part)
    d.forecast.output_tokens_per_s = f_output_->next(output_);
  }
  // The forecast's misses so far (the last decision's forecast against what came).
  auto headroom = [&](std::vector<double>& misses, double forecast, double came) {
    if (last_decision_.action.empty() || o_.error_quantile <= 0) return o_.headroom;
    if (forecast > 0 && came > 0) {
      misses.push_back(came / forecast);
      if (int64_t(misses.size()) > o_.error_window) misses.erase(misses.begin());
    }
    if (misses.empty()) return o_.headroom;
    std::vector<double> v = misses;
    const size_t k = std::min(v.size() - 1, size_t(o_.error_quantile * double(v.size())));
    std::nth_element(v.begin(), v.begin() + int64_t(k), v.end());
    return std::clamp(v[k], o_.headroom, 4.0);  // (a forecast near 0 misses by any ratio)
  };
  d.headroom_prefill = headroom(miss_uncached_, last_decision_.forecast.input_tokens_per_s,
                                d.measured.input_tokens_per_s - d.measured.cached_tokens_per_s);
  d.headroom_decode = headroom(miss_output_, last_decision_.forecast.output_tokens_per_s,
                               d.measured.output_tokens_per_s);
  d.need_prefill = units_for(d.forecast.input_tokens_per_s, o_.prefill_tokens_per_s,
                             d.headroom_prefill, d.correction_prefill);
  d.need_decode = units_for(d.forecast.output_tokens_per_s, o_.decode_tokens_per_s,
                            d.headroom_decode, d.correction_decode);
  if (o_.policy == PlannerOptions::Policy::kReactive) {
    // Thresholds on the running units' utilization: above `up`, what the load needs; below
    // `down`, one fewer (settle() waits `down_after` intervals); between, hold.
    auto threshold = [&](double load, double capacity, int64_t current, int64_t need) {
      const double used = current > 0 ? load / (double(current) * capacity) : 1.0;
      if (used > o_.up_utilization) return std::max(need, current + 1);
      if (used < o_.down_utilization) return current - 1;
      return current;
    };
    d.need_prefill = threshold(d.forecast.input_tokens_per_s, o_.prefill_tokens_per_s,
                               current_prefill, d.need_prefill);
    d.need_decode = threshold(d.forecast.output_tokens_per_s, o_.decode_tokens_per_s,
                              current_decode, d.need_decode);
  }
  d.prefill = settle(d.need_prefill, current_prefill, o_.min_prefill, o_.max_prefill, o_.down_after,
                     below_prefill_);
  d.decode = settle(d.need_decode, current_decode, o_.min_decode, o_.max_decode, o_.down_after,
                    below_decode_);
  const bool up = d.prefill > current_prefill || d.decode > current_decode;
  const bool down = d.prefill < current_prefill || d.decode < current_decode;
  d.action = up && down ? "rebalance" : up ? "scale up" : down ? "scale down" : "hold";
  last_decision_ = d;
  return d;
}

Result<std::vector<IntervalLoad>> read_interval_history(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(fmt::format("planner history '{}': cannot open", path));
  constexpr const char* kHeader =
      "requests_per_s,input_tokens_per_s,cached_tokens_per_s,output_tokens_per_s";
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    return InvalidArgument(
        fmt::format("planner history '{}': the first line must be '{}'", path, kHeader));
  }
  std::vector<IntervalLoad> out;
  for (int64_t n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::istringstream row(line);
    double v[4];
    char comma = 0;
    bool ok = bool(row >> v[0]);
    for (int i = 1; i < 4 && ok; ++i) ok = (row >> comma >> v[i]) && comma == ',';
    row >> std::ws;
    if (!ok || !row.eof() || *std::min_element(v, v + 4) < 0 ||
        !std::isfinite(v[0] + v[1] + v[2] + v[3])) {
      return InvalidArgument(fmt::format(
          "planner history '{}' line {}: want four non-negative numbers, got '{}'", path, n, line));
    }
    IntervalLoad l;
    l.requests_per_s = v[0];
    l.input_tokens_per_s = v[1];
    l.cached_tokens_per_s = v[2];
    l.output_tokens_per_s = v[3];
    out.push_back(l);
  }
  return out;
}

std::string Planner::metrics_text() const {
  const PlanDecision& d = last_decision_;
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  gauge("moeserve_planner_forecast_requests_per_s", "The planner's forecast of the next interval",
        d.forecast.requests_per_s);
  gauge("moeserve_planner_forecast_uncached_input_tokens_per_s",
        "Forecast prompt tokens to prefill per second", d.forecast.input_tokens_per_s);
  gauge("moeserve_planner_forecast_output_tokens_per_s", "Forecast output tokens per second",
        d.forecast.output_tokens_per_s);
  gauge("moeserve_planner_target_prefill_units", "Prefill units the planner runs next",
        double(d.prefill));
  gauge("moeserve_planner_target_decode_units", "Decode units the planner runs next",
        double(d.decode));
  gauge("moeserve_planner_headroom_prefill", "Prefill capacity kept above the forecast (x)",
        d.headroom_prefill);
  gauge("moeserve_planner_headroom_decode", "Decode capacity kept above the forecast (x)",
        d.headroom_decode);
  gauge("moeserve_planner_latency_correction_prefill", "Measured TTFT p99 over its target (>= 1)",
        d.correction_prefill);
  gauge("moeserve_planner_latency_correction_decode", "Measured TPOT p99 over its target (>= 1)",
        d.correction_decode);
  return out;
}

}  // namespace moeserve
