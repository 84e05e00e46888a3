#!/usr/bin/env python3
"""Multi-day request traces from the Azure LLM inference traces and DeepSeek's day (issue 45's
traces; bench/traces/README.md).

Usage: make_trace.py --days 7 --out trace.csv [--mean-rps 2.0] [--seed 1]
       [--length-scale 0.125] [--generated-scale 1] [--max-context 4096] [--max-generated 512]
       [--day-seconds 86400]

--day-seconds compresses the day (the replay bench's "24 hours of 30 s": 720): the day's shape
and the rate in requests per second are kept, the hours are shorter.

The shape over a day is DeepSeek's published one (examples/sim/deepseek-v3-h800-day.json:
`hourly_weights`, its hourly theoretical income, hour 0 = 12:00), as a rate that moves smoothly
from hour to hour (linear between hour midpoints). Each day is scaled by a factor of its own
(weekends lower, and a random drift of a few percent a day), so that no two days are alike. The
arrivals within the day follow the Azure traces' own burstiness: the load is the sum of --streams
independent walks through the Azure arrival times (code and conversation traces, alternating by
hour), each stretching or squeezing the trace's gaps by the ratio of the trace's mean rate to its
share of the target rate, so bursts stay bursts (one stream: the raw trace's minutes-long lulls;
more: the smoother aggregate of many services).
Each request takes the context and generated tokens of the Azure request it came from, scaled
(--length-scale, --generated-scale: to what this machine serves) and capped.

Writes CSV: time_s (from the start of day 0, 00:00), day, context_tokens, generated_tokens,
source (code or conv). Deterministic for a seed. Standard library only.
"""
import argparse
import bisect
import csv
import datetime
import gzip
import json
import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def load_json_with_comments(path):
    """The scenario files have // comments (outside strings)."""
    out = []
    for line in open(path, encoding="utf-8"):
        in_str = False
        i = 0
        while i < len(line):
            c = line[i]
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            if not in_str and line.startswith("//", i):
                line = line[:i] + "\n"
                break
            i += 1
        out.append(line)
    return json.loads("".join(out))


def day_weights():
    """DeepSeek's hourly weights, re-indexed from 12:00 to 00:00, normalised to mean 1."""
    w = load_json_with_comments(os.path.join(ROOT, "examples", "sim", "deepseek-v3-h800-day.json"))
    wl = w["workload"]
    start = int(wl.get("window_start_hour", 0))
    hourly = wl["hourly_weights"]
    by_clock = [0.0] * 24
    for i, v in enumerate(hourly):
        by_clock[(start + i) % 24] = float(v)
    mean = sum(by_clock) / 24
    return [v / mean for v in by_clock]


def rate_at(weights, t_in_day):
    """The relative rate at second t of the day: linear between hour midpoints (periodic)."""
    h = t_in_day / 3600.0 - 0.5
    i = math.floor(h)
    f = h - i
    return weights[i % 24] * (1 - f) + weights[(i + 1) % 24] * f


def load_azure(name):
    path = os.path.join(ROOT, "bench", "traces", "azure", f"AzureLLMInferenceTrace_{name}.csv.gz")
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            ts = r["TIMESTAMP"]
            # "2023-11-16 18:17:03.9799600": seconds with 7 fractional digits
            base, frac = ts.split(".") if "." in ts else (ts, "0")
            t = datetime.datetime.strptime(base, "%Y-%m-%d %H:%M:%S").timestamp() + float("0." + frac)
            rows.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    rows.sort()
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mean-rps", type=float, default=2.0, help="requests/s over a whole day")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--length-scale", type=float, default=0.125, help="context tokens x this")
    ap.add_argument("--generated-scale", type=float, default=1.0, help="generated tokens x this")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--max-generated", type=int, default=512)
    ap.add_argument("--weekend-factor", type=float, default=0.8)
    ap.add_argument("--daily-drift", type=float, default=0.05, help="sd of a day's scale")
    ap.add_argument("--streams", type=int, default=16, help="independent walks summed")
    ap.add_argument("--day-seconds", type=float, default=86400.0, help="a day's length")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    weights = day_weights()
    sources = {name: load_azure(name) for name in ("code", "conv")}
    # Each Azure trace's mean rate, for turning its gaps into the target's.
    azure_rate = {n: len(r) / (r[-1][0] - r[0][0]) for n, r in sources.items()}
    times = {n: [r[0] for r in rows] for n, rows in sources.items()}

    def start(name):
        """A random moment of the Azure trace, uniform in time, and the first request after it.
        (The walk goes on in the trace's time, so a walk of a few requests neither starts in a
        burst as often as bursts hold rows nor skips the lull it lands in.)"""
        ts = times[name]
        u = rng.uniform(ts[0], ts[-2])
        return u, bisect.bisect_left(ts, u)

    events = []
    for day in range(a.days):
        scale = (a.weekend_factor if day % 7 in (5, 6) else 1.0) * math.exp(
            rng.gauss(0.0, a.daily_drift))
        # The load as the sum of --streams independent walks (services, customers), each at its
        # share of the rate: bursty at the scale of seconds, as the Azure traces are, and smoother
        # in aggregate the more streams there are.
        day_s, hour_s = a.day_seconds, a.day_seconds / 24.0
        for stream in range(a.streams):
            t = 0.0
            while t < day_s:
                hour = int(t // hour_s)
                name = "code" if (day * 24 + hour + stream) % 2 == 0 else "conv"
                rows = sources[name]
                u, i = start(name)
                while t < day_s and int(t // hour_s) == hour:
                    target = a.mean_rps * scale * rate_at(weights, t * 86400.0 / day_s) / a.streams
                    t_next = t + (rows[i][0] - u) * azure_rate[name] / target
                    if t_next >= min(day_s, (hour + 1) * hour_s):
                        # The hour ends in this gap: the next hour walks from a moment of its own.
                        t = (hour + 1) * hour_s
                        break
                    t = t_next
                    u, ctx, gen = rows[i]
                    ctx = max(1, min(a.max_context, round(ctx * a.length_scale)))
                    gen = max(1, min(a.max_generated, round(gen * a.generated_scale)))
                    events.append((day * day_s + t, day, ctx, gen, name))
                    i += 1
                    if i >= len(rows):
                        u, i = start(name)
    events.sort()
    n = len(events)
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "day", "context_tokens", "generated_tokens", "source"])
        for t, day, ctx, gen, name in events:
            w.writerow([f"{t:.3f}", day, ctx, gen, name])
    print(f"{a.out}: {n} requests over {a.days} days (mean {n / (a.days * a.day_seconds):.3f} req/s)")


if __name__ == "__main__":
    main()
