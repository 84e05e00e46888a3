#!/usr/bin/env python3
"""An LSTM forecaster of a trace's load, as DeepSeek describes forecasting its fleet's (issue 45
item 2; bench/traces/README.md), trained offline and measured beside tools/traces/forecast.py's.

Usage: train_lstm.py --trace trace.csv [--bin-s 900] [--held-out-days 2] [--epochs 300]
       [--seed 1] [--out lstm.json] [--hidden 32] [--day-seconds 86400]
       [--fixture FILE]   (the weights, the series and PyTorch's forecasts of the first held-out
                           intervals: tests/router/data/lstm_fixture.json, that the planner's
                           C++ LSTM must reproduce)

Per series (requests, input tokens, output tokens), the same one-interval-ahead task as
forecast.py: from the last day of intervals (each with the hour of day as sin/cos) predict the
next interval's value, scaled by the training days' mean. A one-layer LSTM (32 units) and a
linear head, trained with Adam on the training days (MSE of the log), then run over the
held-out days; prints MAPE and the under-forecast share per series as forecast.py's table rows.
--out writes the weights as JSON (for a planner that runs it). Needs PyTorch (CPU) and numpy.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forecast import add_trace_args, bins  # noqa: E402 (forecast.py's intervals and arguments)


class Net(torch.nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1, :]).squeeze(-1)


def windows(z, per_day, start, end):
    """Inputs (log value, sin, cos of the hour) of the day before each t in [start, end)."""
    t_of_day = np.arange(len(z)) % per_day * 2 * math.pi / per_day
    feats = np.stack([np.log1p(z), np.sin(t_of_day), np.cos(t_of_day)], axis=1)
    xs = np.stack([feats[t - per_day:t] for t in range(start, end)])
    ys = np.log1p(z[start:end])
    return torch.tensor(xs, dtype=torch.float32), torch.tensor(ys, dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser()
    add_trace_args(ap)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--fixture", default="")
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    days, series = bins(a.trace, a.bin_s, a.day_seconds)
    per_day = int(round(a.day_seconds / a.bin_s))
    split = (days - a.held_out_days) * per_day
    saved = {}
    fixture = {}
    for name, y in series.items():
        scale = float(np.mean(y[:split])) or 1.0
        z = y / scale
        x_train, y_train = windows(z, per_day, per_day, split)
        x_test, _ = windows(z, per_day, split, len(z))
        net = Net(a.hidden)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        for _ in range(a.epochs):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x_train), y_train)
            loss.backward()
            opt.step()
        with torch.no_grad():
            f = np.expm1(net(x_test).numpy()) * scale
        actual = y[split:]
        mask = actual > 0
        mape = float(np.mean(np.abs(f[mask] - actual[mask]) / actual[mask]))
        under = float(np.mean(f[mask] < actual[mask]))
        print(f"| {name} | LSTM | {mape:.3f} | {under:.2f} |", flush=True)
        saved[name] = {"scale": scale, "per_day": per_day,
                       "state": {k: v.tolist() for k, v in net.state_dict().items()}}
        fixture[name] = {"series": y[:split + 4].tolist(),
                         "forecasts": [float(v) for v in f[:4]]}  # of intervals split..split+3
    if a.out:
        json.dump(saved, open(a.out, "w"))
    if a.fixture:
        json.dump({"weights": saved, "split": split, "series": fixture}, open(a.fixture, "w"))


if __name__ == "__main__":
    main()
