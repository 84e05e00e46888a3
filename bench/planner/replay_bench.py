#!/usr/bin/env python3
"""The planner's replay bench (issue 45; docs/planner.md "Replay bench").

A compressed day of a held-out trace (tools/traces/make_trace.py: DeepSeek's day shape, the
Azure traces' arrivals and lengths) replayed open-loop against a router with prefill and decode
units on this machine (loopback), three times:

  static     units for the day's peak interval (the held-out day's own, with the headroom)
             all day: what a fleet without a planner runs;
  reactive   the router's threshold policy (--planner-policy reactive): from the last
             interval's measured load, up above 80% of the running units' capacity, one down
             below 50%;
  planner    the router's planner (Holt-Winters fitted on the training days, their intervals as
             its history, a headroom of the 0.9 quantile of its own misses); at 55% of the day
             one decode unit gets kill -9 and the planner's next decision starts another (the
             hook runs again while the units alive differ from the targets).

Units are started and retired by scripts/scale_units.sh (the planner's hook), each with a CPU
quota (--quota cores, a cgroup as a container's limit) so that a unit carries what its quota
does and not the machine's idle cores: one unit's capacity is measured first (closed loop, the
most tokens/s within the TTFT and TPOT targets) and is what the planner and the static count
use. Then co-located serving (one `serve`, both roles, the cores of the planner's units on
average) replays the same minutes around the kill with its process killed at the same moment
(scripts/supervise.sh starts it again).

Per policy: unit-seconds (unit processes alive, sampled every 0.5 s), requests, failed, SLO
attainment (requests with TTFT <= --ttft and TPOT <= --tpot, of all), TTFT/TPOT p50/p99, the
forecast's error (MAPE of its output and uncached input tokens/s against the next interval's
measured); for the kill, per phase (ended before, running at some moment of the two intervals
after, started after): completed, failed, TTFT/TPOT p99. Prints tables, then one JSON object.

Usage: python3 bench/planner/replay_bench.py [--quick] [--keep DIR]
  --quick: a day of 24 x 10 s (about 19 minutes in all); default 24 x 30 s (about 45 minutes).
Needs root for the quotas (without: --quota 0, and the units share the machine), the standard
library, and statsmodels for the fitted Holt-Winters (without: its defaults).
"""
import argparse
import asyncio
import csv
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from loadgen import make_text, percentile, stream_chat  # noqa: E402
from machine import cpu_model  # noqa: E402

HEADROOM = 1.2


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def wait_for(cond, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def active_units(router):
    us = get_json(router + "/admin/units")["units"]
    return [u for u in us if u["state"] == "active"]


def moeserve_pids(*words):
    """Pids of moeserve processes whose arguments hold every one of `words`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0].decode()) == "moeserve" and all(
                w.encode() in argv for w in words):
            out.append(int(pid))
    return out


def unit_processes(router):
    """Unit processes alive for this router, by role (starting, serving or draining)."""
    return {role: len(moeserve_pids("serve", "--router", router, "--role", role))
            for role in ("prefill", "decode")}


def rmdir_cgroups():
    for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup"):
        if os.path.isdir(base):
            for d in os.listdir(base):
                if d.startswith("moeserve-"):
                    try:
                        os.rmdir(os.path.join(base, d))
                    except OSError:
                        pass


class Bench:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.join(ROOT, "build", "moeserve")
        self.model = a.model
        self.name = os.path.basename(os.path.normpath(a.model))
        self.dir = a.keep or tempfile.mkdtemp(prefix="replay-")
        os.makedirs(self.dir, exist_ok=True)
        self.procs = []
        self.unit_flags = (f"--threads 1 --kv-cache-gb 0.2 --max-model-len {a.max_len} "
                           f"--max-num-seqs {a.max_num_seqs}")

    # --- processes -----------------------------------------------------------------------

    def start_router(self, tag, extra):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(os.path.join(self.dir, f"router-{tag}.log"), "w")
        p = subprocess.Popen([self.bin, "router", "--model", self.model, "--host", "127.0.0.1",
                              "--port", str(port), "--max-model-len", str(self.a.max_len),
                              "--unit-timeout-ms", str(self.a.unit_timeout_ms)] +
                             extra(url), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        wait_for(lambda: get_json(url + "/health") is not None, 60, "the router")
        return url, p

    def hook(self, tag, url):
        quota = f" --cpu-quota {self.a.quota}" if self.a.quota > 0 else ""
        return (f"{ROOT}/scripts/scale_units.sh --state {self.dir}/units-{tag} --router {url} "
                f"--model {self.model} --bin {self.bin} --serve-flags '{self.unit_flags}'{quota}")

    def stop(self, url, router_proc):
        router_proc.send_signal(signal.SIGKILL)
        router_proc.wait()
        for pid in moeserve_pids("--router", url):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        rmdir_cgroups()

    # --- requests ------------------------------------------------------------------------

    async def one(self, url, prompt_tokens, max_tokens, rng, rec):
        body = {"model": self.name, "prompt": make_text(rng, prompt_tokens - 1),
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        rec["start"] = time.time()
        try:
            ttft, e2e, _, usage, _ = await stream_chat(url + "/v1/completions", {}, body, 300)
            n = usage["completion_tokens"]
            rec.update(ok=True, ttft=ttft, tokens=n, input=usage["prompt_tokens"],
                       tpot=(e2e - ttft) / (n - 1) if n > 1 else None)
        except Exception as e:  # noqa: BLE001 (a failed request, counted)
            rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:200]}")
        rec["end"] = time.time()

    async def replay(self, url, requests, on_tick=None):
        """Open loop: each (time_s, context, generated) sent at its time from now."""
        rng = random.Random(7)
        t0 = time.time()
        records = []
        tasks = []

        async def ticker():
            while True:
                if on_tick:
                    on_tick(time.time() - t0)
                await asyncio.sleep(0.5)

        tick = asyncio.ensure_future(ticker())
        for t, ctx, gen in requests:
            delay = t0 + t - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = {"at": t}
            records.append(rec)
            tasks.append(asyncio.ensure_future(self.one(url, ctx, gen, rng, rec)))
        await asyncio.gather(*tasks)
        tick.cancel()
        return t0, records

    async def closed_loop(self, url, concurrency, seconds, prompt, gen):
        rng = random.Random(concurrency)
        end = time.time() + seconds
        records = []

        async def worker():
            while time.time() < end:
                rec = {}
                await self.one(url, prompt, gen, rng, rec)
                records.append(rec)

        t0 = time.time()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        return records, time.time() - t0

    # --- steps ---------------------------------------------------------------------------

    def calibrate(self):
        """One prefill and one decode unit (each under its quota): the most tokens/s within the
        targets, closed loop at growing concurrency."""
        url, rp = self.start_router("calibration", lambda u: [])
        subprocess.run(self.hook("calibration", url) + " 1 1", shell=True, check=True)
        wait_for(lambda: len(active_units(url)) == 2, 60, "the calibration units")
        s = self.a.calibration_s
        asyncio.run(self.closed_loop(url, 2, 2, 64, 16))  # (warm)
        steps = []
        decode_cap = prefill_cap = 0.0
        tpot_alone = None
        for c in (1, 2, 4, 6, 8, 12):
            recs, wall = asyncio.run(self.closed_loop(url, c, s, 64, 128))
            ok = [r for r in recs if r["ok"]]
            tps = sum(r["tokens"] for r in ok) / wall
            p99 = percentile([r["tpot"] for r in ok if r["tpot"]], 99)
            steps.append({"role": "decode", "concurrency": c, "output_tok_s": round(tps, 1),
                          "tpot_p99_s": p99, "failed": len(recs) - len(ok)})
            if c == 1:
                tpot_alone = percentile([r["tpot"] for r in ok if r["tpot"]], 50)
            if p99 is not None and p99 <= self.a.tpot and len(ok) == len(recs):
                decode_cap = max(decode_cap, tps)
        for c in (1, 2, 4, 8, 12):
            # Two tokens: the prompt is prefilled and handed off (a decode unit pulls its KV from
            # the prefill unit, which costs the prefill unit too), as every request of the trace.
            recs, wall = asyncio.run(self.closed_loop(url, c, s, 512, 2))
            ok = [r for r in recs if r["ok"]]
            tps = sum(r["input"] for r in ok) / wall
            p99 = percentile([r["ttft"] for r in ok], 99)
            steps.append({"role": "prefill", "concurrency": c, "input_tok_s": round(tps, 1),
                          "ttft_p99_s": p99, "failed": len(recs) - len(ok)})
            if p99 is not None and p99 <= self.a.ttft and len(ok) == len(recs):
                prefill_cap = max(prefill_cap, tps)
        self.stop(url, rp)
        if decode_cap <= 0 or prefill_cap <= 0:
            raise RuntimeError(f"no concurrency met the targets: {steps}")
        return {"decode_tok_s": round(decode_cap, 1), "prefill_tok_s": round(prefill_cap, 1),
                "tpot_alone_s": tpot_alone, "steps": steps}

    def make_trace(self, mean_rps):
        a = self.a
        path = os.path.join(self.dir, "trace.csv")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools/traces/make_trace.py"),
                        "--days", str(a.training_days + 1), "--day-seconds", str(a.day_s),
                        "--mean-rps", f"{mean_rps:.4f}", "--seed", str(a.seed),
                        "--max-context", str(a.max_len // 2), "--max-generated", "512",
                        "--out", path], check=True, stdout=subprocess.DEVNULL)
        rows = list(csv.DictReader(open(path)))
        day_start = a.training_days * a.day_s
        train = [r for r in rows if float(r["time_s"]) < day_start]
        held = [(float(r["time_s"]) - day_start, int(r["context_tokens"]),
                 int(r["generated_tokens"])) for r in rows if float(r["time_s"]) >= day_start]
        tpath = os.path.join(self.dir, "training.csv")
        with open(tpath, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(train)
        return tpath, train, held

    def intervals(self, reqs, n, tpot):
        """Per interval of --interval s: requests, input and output tokens per second, as the
        router measures them: a request and its prompt when it comes, its output tokens spread
        over its generation at `tpot` s a token."""
        iv = self.a.interval
        out = [[0.0, 0.0, 0.0] for _ in range(n)]
        for t, ctx, gen in reqs:
            i = int(t // iv)
            if 0 <= i < n:
                out[i][0] += 1
                out[i][1] += ctx
            end = t + gen * tpot
            j = i
            while j < n and j * iv < end:
                lo, hi = max(t, j * iv), min(end, (j + 1) * iv)
                if hi > lo:
                    out[j][2] += gen * (hi - lo) / (end - t)
                j += 1
        return [[v / iv for v in row] for row in out]

    def run_policy(self, tag, router_flags, static_counts, held, cal, kill_at=None):
        a = self.a
        url, rp = self.start_router(tag, router_flags)
        if static_counts:
            subprocess.run(self.hook(tag, url) + f" {static_counts[0]} {static_counts[1]}",
                           shell=True, check=True)
        # The fleet up (the planner's first decision is made at its start).
        wait_for(lambda: len(active_units(url)) >= 2 and
                 {u["role"] for u in active_units(url)} >= {"prefill", "decode"}, 90,
                 f"{tag}'s first units")
        # A few requests first (a fleet's first requests page its weights in; a static fleet
        # has been up all along).
        asyncio.run(self.closed_loop(url, 4, 2, 64, 8))
        samples = []
        events = {}

        def tick(t):
            n = unit_processes(url)
            samples.append((t, n["prefill"], n["decode"]))
            if kill_at is not None and t >= kill_at and "kill" not in events:
                state = os.path.join(self.dir, f"units-{tag}")
                decode = sorted(f for f in os.listdir(state) if f.startswith("decode."))
                pid = int(open(os.path.join(state, decode[0])).read())
                os.kill(pid, signal.SIGKILL)
                events["kill"] = t
                events["killed"] = decode[0]
                events["decode_before"] = n["decode"]
            if "kill" in events and "joined" not in events and t > events["kill"] + 0.6:
                live = [u for u in active_units(url) if u["role"] == "decode"]
                if len(live) >= events["decode_before"]:
                    events["joined"] = t

        t0, records = asyncio.run(self.replay(url, held, tick))
        log = open(os.path.join(self.dir, f"router-{tag}.log")).read()
        json.dump({"t0": t0, "records": records, "samples": samples, "events": events},
                  open(os.path.join(self.dir, f"records-{tag}.json"), "w"))
        self.stop(url, rp)
        for r in records:
            r["start"] -= t0
            r["end"] -= t0
        unit_s = sum(0.5 * (p + d) for _, p, d in samples)
        res = self.summarize(records)
        res.update(unit_seconds=round(unit_s, 1),
                   units_mean=round(unit_s / max(1e-9, 0.5 * len(samples)), 2),
                   decode_units_max=max(d for _, _, d in samples),
                   prefill_units_max=max(p for _, p, _ in samples))
        res["forecast_error"] = forecast_error(log)
        if kill_at is not None:
            res["kill"] = self.phases(records, events)
        return res, records

    def summarize(self, records):
        a = self.a
        ok = [r for r in records if r["ok"]]
        met = [r for r in ok if r["ttft"] <= a.ttft and (r["tpot"] is None or r["tpot"] <= a.tpot)]
        tp = [r["tpot"] for r in ok if r["tpot"] is not None]
        return {"requests": len(records), "failed": len(records) - len(ok),
                "slo_attainment": round(len(met) / max(1, len(records)), 4),
                "ttft_p50_s": percentile([r["ttft"] for r in ok], 50),
                "ttft_p99_s": percentile([r["ttft"] for r in ok], 99),
                "tpot_p50_s": percentile(tp, 50), "tpot_p99_s": percentile(tp, 99),
                "errors": sorted({r["error"] for r in records if not r["ok"]})[:3]}

    def phases(self, records, events):
        """Ended before the kill; running at some moment of the window after it; started
        after the window."""
        k = events["kill"]
        w = 2 * self.a.interval
        out = {"kill_at_s": round(k, 1), "window_s": w,
               "replacement_active_after_s": round(events["joined"] - k, 2)
               if "joined" in events else None}
        for name, sel in (("before", lambda r: r["end"] < k),
                          ("during", lambda r: r["start"] < k + w and r["end"] >= k),
                          ("after", lambda r: r["start"] >= k + w)):
            s = self.summarize([r for r in records if sel(r)])
            out[name] = {key: s[key] for key in ("requests", "failed", "ttft_p99_s",
                                                 "tpot_p99_s", "slo_attainment")}
        return out

    def colocated(self, held, kill_at, quota):
        """One co-located `serve` under scripts/supervise.sh, the minutes around the kill."""
        a = self.a
        w = 2 * a.interval
        lo, hi = kill_at - 2 * w, kill_at + 3 * w
        reqs = [(t - lo, c, g) for t, c, g in held if lo <= t < hi]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cg = ""
        if quota > 0:
            cg = "/sys/fs/cgroup/cpu/moeserve-colocated"
            os.makedirs(cg, exist_ok=True)
            open(f"{cg}/cpu.cfs_period_us", "w").write("10000")
            open(f"{cg}/cpu.cfs_quota_us", "w").write(str(int(quota * 10000)))
        flags = self.unit_flags.replace("--threads 1", f"--threads {max(1, round(quota))}")
        cmd = (f"[[ -z '{cg}' ]] || echo $$ > '{cg}/cgroup.procs'; exec {self.bin} serve --model "
               f"{self.model} --host 127.0.0.1 --port {port} {flags}")
        log = open(os.path.join(self.dir, "colocated.log"), "w")
        sup = subprocess.Popen(["bash", os.path.join(ROOT, "scripts/supervise.sh"), "bash", "-c",
                                cmd], stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: get_json(url + "/health") is not None, 60, "the co-located server")
        events = {}

        def tick(t):
            if t >= 2 * w and "kill" not in events:
                for pid in moeserve_pids("serve", str(port)):
                    os.kill(pid, signal.SIGKILL)
                events["kill"] = t
            if "kill" in events and "joined" not in events and t > events["kill"] + 0.3:
                try:
                    get_json(url + "/health", timeout=0.3)
                    events["joined"] = t
                except Exception:  # noqa: BLE001 (still down)
                    pass

        t0, records = asyncio.run(self.replay(url, reqs, tick))
        sup.send_signal(signal.SIGTERM)
        sup.wait()
        time.sleep(0.3)
        rmdir_cgroups()
        for r in records:
            r["start"] -= t0
            r["end"] -= t0
        out = self.phases(records, events)
        out["quota_cores"] = quota
        return out


def forecast_error(log):
    """MAPE of each decision's forecast (output, uncached input tokens/s) against what the next
    interval measured, from the router's planner lines."""
    import re
    pat = re.compile(r"planner: measured [\d.]+ req/s, ([\d.]+) uncached input tok/s, ([\d.]+) "
                     r"output tok/s; (?:forecast|last interval \(reactive\)) [\d.]+ req/s, "
                     r"([\d.]+) uncached input tok/s, ([\d.]+) output tok/s")
    rows = [tuple(float(x) for x in m.groups()) for m in pat.finditer(log)]
    out = {}
    for name, mi, fi in (("input", 0, 2), ("output", 1, 3)):
        errs = [abs(f[fi] - m[mi]) / m[mi] for f, m in zip(rows, rows[1:]) if m[mi] > 0]
        under = [f[fi] < m[mi] for f, m in zip(rows, rows[1:]) if m[mi] > 0]
        out[name] = {"mape": round(sum(errs) / len(errs), 3) if errs else None,
                     "under_share": round(sum(under) / len(under), 2) if under else None,
                     "intervals": len(errs)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="24 x 10 s (default 24 x 30 s)")
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "tiny-py"))
    ap.add_argument("--keep", default="", help="a directory for the logs (kept)")
    ap.add_argument("--quota", type=float, default=0.2, help="cores per unit (0: none)")
    ap.add_argument("--max-num-seqs", type=int, default=4,
                    help="sequences a unit runs at once (its slots: a unit's KV memory)")
    ap.add_argument("--unit-timeout-ms", type=int, default=10000,
                    help="the router's heartbeat timeout (a unit at its quota under load "
                         "heartbeats late; a killed unit is noticed by its broken streams)")
    ap.add_argument("--ttft", type=float, default=2.0, help="TTFT target (s)")
    ap.add_argument("--tpot", type=float, default=0.05, help="TPOT target (s)")
    ap.add_argument("--peak-decode", type=float, default=3.0,
                    help="decode units the day's mean peak needs (sets the trace's rate)")
    ap.add_argument("--training-days", type=int, default=0, help="default 7 (quick) or 14")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    a.day_s = 240.0 if a.quick else 720.0
    a.interval = a.day_s / 48  # half a compressed hour
    a.calibration_s = 5.0 if a.quick else 10.0
    a.training_days = a.training_days or (7 if a.quick else 14)
    if a.quota > 0 and not (os.access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", os.W_OK)):
        print("replay_bench: no writable cgroup v1 cpu controller: units run without a quota "
              "(--quota 0)", file=sys.stderr)
        a.quota = 0
    b = Bench(a)
    started = time.time()
    try:
        result = run(a, b)
    finally:
        for p in b.procs:
            if p.poll() is None:
                p.kill()
        rmdir_cgroups()
        if not a.keep:
            shutil.rmtree(b.dir, ignore_errors=True)
    result["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(result))


def run(a, b):
    log = lambda *x: print(*x, file=sys.stderr, flush=True)  # noqa: E731
    cal = b.calibrate()
    log(f"calibration: one unit ({a.quota} cores): {cal['decode_tok_s']} output tok/s within "
        f"TPOT p99 {a.tpot} s, {cal['prefill_tok_s']} prompt tok/s within TTFT p99 {a.ttft} s")
    # The trace's rate: the day's mean peak (DeepSeek's shape peaks at 1.33x the mean) needs
    # --peak-decode units.
    pilot = b.make_trace(1.0)[2]
    gen_per_req = sum(g for _, _, g in pilot) / len(pilot)
    mean_rps = a.peak_decode * cal["decode_tok_s"] / HEADROOM / 1.33 / gen_per_req
    tpath, train, held = b.make_trace(mean_rps)
    log(f"trace: {a.training_days} training days and one held-out day of {a.day_s:.0f} s, "
        f"{mean_rps:.2f} req/s on average; {len(held)} requests to replay")
    per_day = int(round(a.day_s / a.interval))
    tpot = cal["tpot_alone_s"]
    hist = b.intervals([(float(r["time_s"]), int(r["context_tokens"]),
                         int(r["generated_tokens"])) for r in train],
                       a.training_days * per_day, tpot)
    hpath = os.path.join(b.dir, "history.csv")
    with open(hpath, "w") as f:
        f.write("requests_per_s,input_tokens_per_s,cached_tokens_per_s,output_tokens_per_s\n")
        for q, i, o in hist:
            f.write(f"{q:.4f},{i:.2f},0,{o:.2f}\n")
    hw = []
    try:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tools/traces/forecast.py"),
                            "--trace", tpath, "--bin-s", str(a.interval), "--day-seconds",
                            str(a.day_s), "--params"], capture_output=True, text=True, check=True)
        hw = ["--planner-holt-winters", p.stdout.strip()]
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        log(f"no fitted Holt-Winters (statsmodels?): its defaults: {getattr(e, 'stderr', e)}")
    # Static: the held-out day's peak interval with the headroom.
    day = b.intervals(held, per_day, tpot)
    static = (max(1, math.ceil(max(r[1] for r in day) * HEADROOM / cal["prefill_tok_s"])),
              max(1, math.ceil(max(r[2] for r in day) * HEADROOM / cal["decode_tok_s"])))
    log(f"static peak provisioning: {static[0]} prefill, {static[1]} decode units")
    planner_common = lambda url: [  # noqa: E731
        "--planner-interval", str(a.interval),
        "--planner-prefill-capacity", str(cal["prefill_tok_s"]),
        "--planner-decode-capacity", str(cal["decode_tok_s"]),
        "--planner-headroom", str(HEADROOM), "--planner-ttft-p99", str(a.ttft),
        "--planner-tpot-p99", str(a.tpot), "--planner-max-prefill", str(static[0] + 2),
        "--planner-max-decode", str(static[1] + 2), "--planner-down-after", "2",
        "--planner-history", hpath, "--planner-period", str(per_day)]
    out = {"machine": f"{cpu_model()}, {os.cpu_count()} cores", "day_s": a.day_s, "interval_s": a.interval,
           "quota_cores": a.quota, "ttft_target_s": a.ttft, "tpot_target_s": a.tpot,
           "calibration": cal, "mean_rps": round(mean_rps, 3), "requests": len(held),
           "holt_winters": hw[1] if hw else "defaults", "static_units": list(static)}
    res, _ = b.run_policy("static", lambda url: [], static, held, cal)
    out["static"] = res
    log(f"static: {json.dumps(res)}")
    res, _ = b.run_policy("reactive", lambda url: planner_common(url) + [
        "--planner-policy", "reactive", "--planner-hook", b.hook("reactive", url)], None, held,
        cal)
    out["reactive"] = res
    log(f"reactive: {json.dumps(res)}")
    kill_at = a.day_s * 0.55
    res, _ = b.run_policy("planner", lambda url: planner_common(url) + hw + [
        "--planner-forecaster", "holt-winters", "--planner-error-quantile", "0.9",
        "--planner-hook", b.hook("planner", url)], None,
        held, cal, kill_at=kill_at)
    out["planner"] = res
    log(f"planner: {json.dumps(res)}")
    for k in ("reactive", "planner", "static"):
        out[k]["unit_seconds_vs_static"] = round(
            out[k]["unit_seconds"] / out["static"]["unit_seconds"], 3)
    units_at_kill = out["planner"]["units_mean"]
    out["colocated_kill"] = b.colocated(held, kill_at, a.quota * math.ceil(units_at_kill))
    log(f"co-located kill: {json.dumps(out['colocated_kill'])}")
    print_tables(out)
    return out


def print_tables(o):
    f = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa
    print("| policy | unit-s | vs static | requests | failed | SLO attainment | TTFT p99 | "
          "TPOT p99 | decode units max | forecast MAPE out/in |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in ("static", "reactive", "planner"):
        r = o[k]
        fe = r["forecast_error"]
        print(f"| {k} | {r['unit_seconds']} | {r['unit_seconds_vs_static']} | {r['requests']} | "
              f"{r['failed']} | {r['slo_attainment']} | {f(r['ttft_p99_s'])} | "
              f"{f(r['tpot_p99_s'])} | {r['decode_units_max']} | "
              f"{f(fe['output']['mape'])} / {f(fe['input']['mape'])} |")
    print()
    print("| kill | phase | requests | failed | TTFT p99 | TPOT p99 | SLO attainment |")
    print("|---|---|---|---|---|---|---|")
    for name, k in (("PD, decode unit kill -9, planner starts another", o["planner"]["kill"]),
                    ("co-located, process kill -9, supervised restart", o["colocated_kill"])):
        for ph in ("before", "during", "after"):
            r = k[ph]
            print(f"| {name} | {ph} | {r['requests']} | {r['failed']} | {f(r['ttft_p99_s'])} | "
                  f"{f(r['tpot_p99_s'])} | {r['slo_attainment']} |")
    print()


if __name__ == "__main__":
    main()
