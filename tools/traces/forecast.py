#!/usr/bin/env python3
"""Forecasters of a trace's load, chosen by measured accuracy (issue 45 item 2;
bench/traces/README.md).

Usage: forecast.py --trace trace.csv [--bin-s 900] [--held-out-days 2] [--day-seconds 86400]
       forecast.py --trace train.csv --params   (the fitted Holt-Winters smoothing of the
                                                 output tokens: alpha,beta,gamma,phi, for the
                                                 planner's --planner-holt-winters)

Bins the trace (tools/traces/make_trace.py) into intervals of --bin-s seconds and forecasts,
for each interval of the held-out days (the last --held-out-days), its requests, input tokens
and output tokens from everything before it (one interval ahead: the planner's next decision),
with each forecaster:

  naive            the interval before
  seasonal naive   the same interval the day before
  Holt-Winters     additive trend (damped) and multiplicative daily season, parameters fitted
                   by statsmodels (ExponentialSmoothing) on the training days, then run over
                   the held-out days with those parameters (one-step-ahead, no refit)

and prints, per series and forecaster, MAPE (mean |forecast - actual| / actual over intervals
with load) and the under-forecast share (intervals forecast below what came: the ones a planner
would under-provision), as a markdown table. Needs numpy and statsmodels (PyPI).
"""
import argparse
import csv

import numpy as np


def bins(path, bin_s, day_s=86400.0):
    rows = list(csv.DictReader(open(path)))
    days = max(int(r["day"]) for r in rows) + 1
    n = int(round(days * day_s / bin_s))
    req = np.zeros(n)
    inp = np.zeros(n)
    out = np.zeros(n)
    for r in rows:
        i = min(n - 1, int(float(r["time_s"]) // bin_s))
        req[i] += 1
        inp[i] += int(r["context_tokens"])
        out[i] += int(r["generated_tokens"])
    return days, {"requests": req, "input tokens": inp, "output tokens": out}


def add_trace_args(ap):
    """The arguments every forecaster script takes: the trace, its intervals, the held-out days."""
    ap.add_argument("--trace", required=True)
    ap.add_argument("--bin-s", type=float, default=900)
    ap.add_argument("--held-out-days", type=int, default=2)
    ap.add_argument("--day-seconds", type=float, default=86400.0)


def scores(forecast, actual):
    mask = actual > 0
    mape = float(np.mean(np.abs(forecast[mask] - actual[mask]) / actual[mask]))
    under = float(np.mean(forecast[mask] < actual[mask]))
    return mape, under


def main():
    from statsmodels.tsa.holtwinters import ExponentialSmoothing  # (only here: bins() is shared)

    ap = argparse.ArgumentParser()
    add_trace_args(ap)
    ap.add_argument("--params", action="store_true")
    a = ap.parse_args()
    days, series = bins(a.trace, a.bin_s, a.day_seconds)
    per_day = int(round(a.day_seconds / a.bin_s))
    if a.params:
        y = np.maximum(series["output tokens"], 1.0)
        p = ExponentialSmoothing(y, trend="add", damped_trend=True, seasonal="mul",
                                 seasonal_periods=per_day).fit().params
        print(",".join(f"{p[k]:.4f}" for k in ("smoothing_level", "smoothing_trend",
                                               "smoothing_seasonal", "damping_trend")))
        return
    split = (days - a.held_out_days) * per_day
    print(f"{days} days, {per_day} intervals of {a.bin_s} s a day; training days 0-"
          f"{days - a.held_out_days - 1}, held out {days - a.held_out_days}-{days - 1}\n")
    print("| series | forecaster | MAPE | under-forecast share |")
    print("|---|---|---|---|")
    for name, y in series.items():
        actual = y[split:]
        results = {
            "naive": y[split - 1:-1],
            "seasonal naive": y[split - per_day:len(y) - per_day],
        }
        train = np.maximum(y[:split], 1.0)  # (a multiplicative season needs positive data)
        fit = ExponentialSmoothing(train, trend="add", damped_trend=True, seasonal="mul",
                                   seasonal_periods=per_day).fit()
        p = fit.params
        run = ExponentialSmoothing(np.maximum(y, 1.0), trend="add", damped_trend=True,
                                   seasonal="mul", seasonal_periods=per_day).fit(
            smoothing_level=p["smoothing_level"], smoothing_trend=p["smoothing_trend"],
            smoothing_seasonal=p["smoothing_seasonal"], damping_trend=p["damping_trend"],
            optimized=False)
        results["Holt-Winters"] = run.fittedvalues[split:]
        for fname, f in results.items():
            mape, under = scores(np.asarray(f), actual)
            print(f"| {name} | {fname} | {mape:.3f} | {under:.2f} |")


if __name__ == "__main__":
    main()
