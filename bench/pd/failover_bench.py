#!/usr/bin/env python3
"""A load run with a unit killed and another joined in the middle (docs/fault-tolerance.md).

--concurrency clients each stream completions one after the other (closed loop) against --url
for --duration s, cycling through --prompts prompts of 1-30 lines (greedy, and seeded sampled
for odd prompts). At --kill-at s it runs --kill (a shell command: kill -9 of a unit, or of a
co-located server); at --join-at s it runs --join (a unit started). A client whose request
failed waits --backoff s before its next (as a client with retries would), so a server that is
down is not counted once per millisecond.

Every finished request is compared with the same request, unstreamed, from --refs (a JSON file
written by the first run, from --ref: a co-located serve before any kill). Requests are put
into three phases: "before" (ended before the kill), "during" (running at some moment of
[kill, kill + --window)) and "after" (started after that). Per phase: requests completed,
failed, changed; TTFT p50/p99; TPOT p50/p99 (per request: (last token - first) / (tokens - 1), tokens counted by their logprobs);
the longest gap between two tokens of a stream; output tokens/s; and when the last failed
request ended, counted from the kill. Prints one JSON line.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import threading
import time

import openai

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--ref", help="co-located server for the reference outputs (when --refs is absent)")
ap.add_argument("--refs", required=True, help="JSON file of reference outputs (read, or written)")
ap.add_argument("--label", default="")
ap.add_argument("--model", default="tiny-py")
ap.add_argument("--duration", type=float, default=150)
ap.add_argument("--concurrency", type=int, default=6)
ap.add_argument("--prompts", type=int, default=24)
ap.add_argument("--max-tokens", type=int, default=48)
ap.add_argument("--kill-at", type=float, default=50)
ap.add_argument("--kill", default="")
ap.add_argument("--join-at", type=float, default=65)
ap.add_argument("--join", default="")
ap.add_argument("--window", type=float, default=30)
ap.add_argument("--backoff", type=float, default=0.5)
ap.add_argument("--timeout", type=float, default=60)
a = ap.parse_args()


def params(i):
    lines = 1 + (i * 7) % 30
    body = "".join(f"def handler_{i}_{j}(request, x={j}):\n    total = {i} + x\n" for j in range(lines))
    p = dict(model=a.model, prompt=body, max_tokens=a.max_tokens, logprobs=1)
    if i % 2:
        p.update(temperature=0.8, seed=1000 + i)
    else:
        p.update(temperature=0)
    return p


if os.path.exists(a.refs):
    with open(a.refs) as f:
        want = [tuple(w) for w in json.load(f)]
    assert len(want) == a.prompts, f"{a.refs} holds {len(want)} prompts, not {a.prompts}"
else:
    ref = openai.OpenAI(base_url=a.ref, api_key="none", max_retries=0, timeout=a.timeout)

    def reference(i):
        r = ref.completions.create(**params(i)).choices[0]
        return r.text, r.finish_reason

    want = list(cf.ThreadPoolExecutor(4).map(reference, range(a.prompts)))
    with open(a.refs, "w") as f:
        json.dump(want, f)

client = openai.OpenAI(base_url=a.url, api_key="none", max_retries=0, timeout=a.timeout)
# One untimed pass of every prompt (weights paged in, the prefix caches as the reference pass
# left the co-located server's).
for w in cf.ThreadPoolExecutor(4).map(lambda i: client.completions.create(**params(i)), range(a.prompts)):
    pass
records = []
lock = threading.Lock()
t0 = time.monotonic()
stop_at = t0 + a.duration


def one(i):
    start = time.monotonic()
    times, text, reason, error = [], "", None, None
    try:
        for ch in client.completions.create(stream=True, **params(i)):
            if not ch.choices:
                continue
            c = ch.choices[0]
            n = len(c.logprobs.token_logprobs) if c.logprobs else 0  # tokens in this chunk
            times += [time.monotonic()] * n
            text += c.text or ""
            reason = c.finish_reason or reason
    except Exception as e:  # noqa: BLE001 (a failed request, counted)
        error = f"{type(e).__name__}: {str(e)[:160]}"
    return dict(prompt=i, start=start - t0, end=time.monotonic() - t0,
                times=[t - t0 for t in times], error=error,
                changed=error is None and (text, reason) != want[i])


def client_loop(k):
    n = k
    while time.monotonic() < stop_at:
        r = one(n % a.prompts)
        n += a.concurrency
        with lock:
            records.append(r)
        if r["error"]:
            time.sleep(a.backoff)


events = {}


def timeline():
    for name, at, cmd in (("kill", a.kill_at, a.kill), ("join", a.join_at, a.join)):
        if not cmd:
            continue
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        events[name] = round(time.monotonic() - t0, 3)
        subprocess.run(cmd, shell=True, check=False)


with cf.ThreadPoolExecutor(a.concurrency + 1) as ex:
    futs = [ex.submit(client_loop, k) for k in range(a.concurrency)] + [ex.submit(timeline)]
    for f in futs:
        f.result()


def pct(v, q):
    v = sorted(v)
    return round(v[min(len(v) - 1, int(q * (len(v) - 1)))], 4) if v else None


kill = events.get("kill", a.kill_at)
phases = {"before": lambda r: r["end"] < kill,
          "during": lambda r: r["end"] >= kill and r["start"] < kill + a.window,
          "after": lambda r: r["start"] >= kill + a.window}
out = dict(label=a.label, concurrency=a.concurrency, duration_s=a.duration, events_s=events,
           window_s=a.window)
for name, member in phases.items():
    rs = [r for r in records if member(r)]
    ok = [r for r in rs if r["error"] is None]
    ttft = [r["times"][0] - r["start"] for r in ok if r["times"]]
    tpot = [(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in ok if len(r["times"]) > 1]
    gaps = [b - x for r in rs for x, b in zip([r["start"]] + r["times"], r["times"])]
    span = max((r["end"] for r in rs), default=0) - min((r["start"] for r in rs), default=0)
    out[name] = dict(
        completed=len(ok), failed=len(rs) - len(ok), changed=sum(r["changed"] for r in rs),
        ttft_p50_s=pct(ttft, 0.5), ttft_p99_s=pct(ttft, 0.99),
        tpot_p50_ms=None if not tpot else round(pct(tpot, 0.5) * 1e3, 2),
        tpot_p99_ms=None if not tpot else round(pct(tpot, 0.99) * 1e3, 2),
        longest_gap_s=round(max(gaps), 3) if gaps else None,
        output_tok_s=round(sum(len(r["times"]) for r in ok) / span, 1) if span > 0 else None,
        errors=sorted({r["error"] for r in rs if r["error"]})[:3])
failed_ends = [r["end"] - kill for r in records if r["error"] and r["end"] >= kill]
out["last_failure_after_kill_s"] = round(max(failed_ends), 3) if failed_ends else None
print(json.dumps(out), flush=True)
