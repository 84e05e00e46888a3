#!/usr/bin/env python3
"""Writes hw_fixture.json: statsmodels' Holt-Winters (additive damped trend, multiplicative
season) one step ahead over a seasonal series with a trend and noise, started from the state the
planner's C++ Holt-Winters starts from (the first season's mean as the level, the second's mean
minus the first's over the period as the trend, each interval's share of its season averaged over
every whole season of the history as the season; one fit per history length), so that tests/router/planner_test.cpp checks the C++ recursion against statsmodels'.
    python3 tests/data/planner/make_hw_fixture.py   (needs numpy and statsmodels)
"""
import json
import math
import os

import numpy as np
from statsmodels.tsa.holtwinters import ExponentialSmoothing

m, days = 12, 6
rng = np.random.default_rng(3)
t = np.arange(m * days)
y = (100 + 0.8 * t) * (1 + 0.4 * np.sin(2 * math.pi * t / m)) * rng.lognormal(0, 0.08, len(t))
params = {"alpha": 0.35, "beta": 0.08, "gamma": 0.2, "phi": 0.95}


def forecast(k):
    """statsmodels' forecast of y[k] from y[:k]."""
    h = y[:k]
    first, second = h[:m].mean(), h[m:2 * m].mean()
    days = h[:k // m * m].reshape(-1, m)
    season = (days / days.mean(axis=1, keepdims=True)).mean(axis=0)
    fit = ExponentialSmoothing(
        h[m:], trend="add", damped_trend=True, seasonal="mul", seasonal_periods=m,
        initialization_method="known", initial_level=first, initial_trend=(second - first) / m,
        initial_seasonal=season).fit(
        smoothing_level=params["alpha"], smoothing_trend=params["beta"],
        smoothing_seasonal=params["gamma"], damping_trend=params["phi"], optimized=False)
    return float(fit.forecast(1)[0])


# The forecast of y[k] from y[:k], for k = 2m .. len(y) (the last: beyond the series).
forecasts = [forecast(k) for k in range(2 * m, len(y) + 1)]
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hw_fixture.json")
json.dump({"period": m, "params": params, "series": y.tolist(), "first_k": 2 * m,
           "forecasts": forecasts}, open(out, "w"))
print(out, len(forecasts), "forecasts")
