#!/usr/bin/env python3
"""Restart bench of the KV cache's disk tier (`serve --kv-disk DIR`).

Python 3.8+ standard library only; it starts and stops `moeserve serve` itself.

(a) Multi-turn conversations with a server restart in the middle: --conversations chats of
    --turns turns, one request at a time. Every turn appends a user message of --turn-len
    words (one token each, as in bench/load/loadgen.py) and the previous reply (the model's own
    text, --reply-len tokens) to the history, as a chat client does. The server is restarted
    after --restart-after turns. TTFT (request sent -> first token's chunk, streaming) and the
    prefix-cache hit rate (usage.prompt_tokens_details.cached_tokens / prompt_tokens; equal to
    DeepSeek's prompt_cache_hit_tokens) are reported for the turns before and after the restart,
    with the tier and without it (same server flags otherwise). The replies of both runs must be
    identical (temperature 0; the tier does not change outputs).
(b) A --long-len-token prompt (token ids via /v1/completions) fully on disk after a restart vs
    cold: --trials distinct prompts are sent to the first tier server (cold, writing them) and
    to a server without the tier (cold), then to the restarted tier server (all but the last
    partial block from disk). Min and median TTFT and the ratio disk / cold (goal: <= 5%).

Four server starts in all (tier: before and after the restart, then the same without the
tier). By default the objects' pages are dropped from the page cache (posix_fadvise
DONTNEED after fdatasync, only those files) before the tier server restarts, so its reads
come from the device (--keep-page-cache: leave them).

    ./build/moeserve make-model --preset bench --out models/bench   # once, ~3.5 GB
    python3 bench/kv_disk/restart.py --quick    # ~3 minutes
    python3 bench/kv_disk/restart.py            # ~10 minutes on 2 cores
"""

import argparse
import http.client
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
from loadgen import WORDS, percentile  # noqa: E402  (one-token English words; numpy's percentile)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_model  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """One `moeserve serve` process; stderr and stdout go to a log file."""

    def __init__(self, args, kv_dir, log_path):
        self.port = free_port()
        self.cmd = [args.binary, "serve", "--model", args.model, "--served-model-name", "bench",
                    "--port", str(self.port), "--kv-cache-gb", str(args.kv_cache_gb)]
        if args.threads:
            self.cmd += ["--threads", str(args.threads)]
        if kv_dir:
            self.cmd += ["--kv-disk", kv_dir]
        self.log_path = log_path
        self.log = open(log_path, "ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + args.start_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited ({self.proc.returncode}); see {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    break
            except Exception:
                time.sleep(0.25)
        else:
            self.stop()
            raise RuntimeError(f"serve not healthy after {args.start_timeout} s; see {log_path}")
        self.start_s = time.perf_counter() - t0

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line.startswith("moeserve_kv_disk_") or line.startswith("moeserve_prefix_cache"):
                    name, _, value = line.rpartition(" ")
                    out[name] = out.get(name, 0) + float(value)
            return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def stream(port, path, body, timeout):
    """POSTs a streaming request. Returns dict(ttft_s, text, usage)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request("POST", path, body=payload, headers={"Content-Type": "application/json",
                                                      "Accept": "text/event-stream"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, text, usage = None, [], None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev and "choices" not in ev:
            raise RuntimeError(f"stream error: {ev}")
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices") or []:
            piece = c["delta"].get("content", "") if "delta" in c else c.get("text", "")
            # logprobs are requested, so every token's chunk carries them (the chat API's
            # opening role chunk does not).
            if ttft is None and (c.get("logprobs") or piece):
                ttft = time.perf_counter() - t0
            text.append(piece or "")
    conn.close()
    if usage is None or ttft is None:
        raise RuntimeError("stream ended without a token or usage")
    return {"ttft_s": ttft, "text": "".join(text), "usage": usage}


def chat_turn(port, conv, args):
    body = {"model": "bench", "messages": conv["messages"], "max_tokens": args.reply_len,
            "temperature": 0, "logprobs": True, "ignore_eos": True}
    r = stream(port, "/v1/chat/completions", body, args.timeout)
    conv["messages"].append({"role": "assistant", "content": r["text"]})
    return r


def new_user_message(conv, rng, args):
    n = rng.randint(*args.turn_len)
    conv["messages"].append({"role": "user",
                             "content": " ".join(rng.choice(WORDS) for _ in range(n))})


def warmup(port, args):
    # Fewer than 64 tokens: no full block, nothing cached or written.
    stream(port, "/v1/completions", {"model": "bench", "prompt": [100, 200, 300, 400],
                                     "max_tokens": 2, "temperature": 0, "logprobs": 0,
                                     "ignore_eos": True}, args.timeout)


def long_prompt(trial, args):
    rng = random.Random(args.seed * 1000 + 777 + trial)
    return [rng.randrange(1000, 100000) for _ in range(args.long_len)]


def long_request(port, ids, args):
    return stream(port, "/v1/completions", {"model": "bench", "prompt": ids, "max_tokens": 2,
                                            "temperature": 0, "logprobs": 0, "ignore_eos": True},
                  args.timeout)


def drop_page_cache(kv_dir):
    """fdatasync + POSIX_FADV_DONTNEED on every object: the next reads come from the device."""
    n = 0
    for root, _, files in os.walk(kv_dir):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def run_config(args, tier, work, log):
    """Both halves of one configuration. Returns per-turn records and the long-prompt TTFTs."""
    kv_dir = os.path.join(work, "kv") if tier else None
    tag = "tier" if tier else "none"
    rng = random.Random(args.seed)  # the same conversations in both configurations
    convs = [{"messages": []} for _ in range(args.conversations)]
    turns = []  # dicts: conv, turn, ttft_s, prompt, cached, text
    long_cold, long_disk, long_cached = [], [], []

    def do_turns(server, lo, hi):
        for t in range(lo, hi + 1):
            for i, conv in enumerate(convs):
                new_user_message(conv, rng, args)
                r = chat_turn(server.port, conv, args)
                u = r["usage"]
                turns.append({"conv": i, "turn": t, "ttft_s": r["ttft_s"],
                              "prompt": u["prompt_tokens"],
                              "cached": u["prompt_tokens_details"]["cached_tokens"],
                              "text": r["text"]})
                log(f"  [{tag}] conversation {i + 1} turn {t}: prompt {u['prompt_tokens']}, "
                    f"cached {u['prompt_tokens_details']['cached_tokens']}, "
                    f"TTFT {r['ttft_s'] * 1000:.0f} ms")

    s = Server(args, kv_dir, os.path.join(work, f"serve-{tag}-1.log"))
    log(f"  [{tag}] server 1 up in {s.start_s:.1f} s: {shlex.join(s.cmd)}")
    starts, cmd = [s.start_s], s.cmd
    try:
        warmup(s.port, args)
        do_turns(s, 1, args.restart_after)
        if tier or not args.skip_uncached_cold:
            for k in range(args.trials):
                r = long_request(s.port, long_prompt(k, args), args)
                long_cold.append(r["ttft_s"])
                log(f"  [{tag}] {args.long_len}-token prompt {k + 1} cold: "
                    f"TTFT {r['ttft_s'] * 1000:.0f} ms (cached {r['usage']['prompt_tokens_details']['cached_tokens']})")
    finally:
        s.stop()
    if tier:
        log(f"  [{tag}] stopped; {kv_dir} holds {dir_bytes(kv_dir) / 1e6:.1f} MB")
        if not args.keep_page_cache:
            log(f"  [{tag}] dropped {drop_page_cache(kv_dir)} objects from the page cache")
    s = Server(args, kv_dir, os.path.join(work, f"serve-{tag}-2.log"))
    log(f"  [{tag}] server 2 (restarted) up in {s.start_s:.1f} s")
    starts.append(s.start_s)
    metrics = {}
    try:
        warmup(s.port, args)
        do_turns(s, args.restart_after + 1, args.turns)
        if tier:
            for k in range(args.trials):
                r = long_request(s.port, long_prompt(k, args), args)
                long_disk.append(r["ttft_s"])
                long_cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
                log(f"  [{tag}] {args.long_len}-token prompt {k + 1} after the restart: "
                    f"TTFT {r['ttft_s'] * 1000:.0f} ms (cached {long_cached[-1]})")
        metrics = s.metrics()
    finally:
        s.stop()
    return {"turns": turns, "long_cold": long_cold, "long_disk": long_disk,
            "long_cached": long_cached, "metrics": metrics, "starts": starts, "cmd": cmd}


def ms(v):
    return "-" if v is None else f"{v * 1000:.0f}"


def turn_rows(name, turns, lo, hi):
    sel = [t for t in turns if lo <= t["turn"] <= hi]
    if not sel:
        return None
    ttft = [t["ttft_s"] for t in sel]
    prompt = sum(t["prompt"] for t in sel)
    cached = sum(t["cached"] for t in sel)
    label = f"turn {lo}" if lo == hi else f"turns {lo}-{hi}"
    return (f"| {name} | {label} | {len(sel)} | {ms(percentile(ttft, 50))} | "
            f"{ms(percentile(ttft, 99))} | {100.0 * cached / prompt:.1f}% ({cached} / {prompt}) |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--binary", default="./build/moeserve")
    p.add_argument("--model", default="models/bench",
                   help="checkpoint (made with make-model --preset bench when missing)")
    p.add_argument("--workdir", default="",
                   help="where the tier's directory and server logs go (default: a new "
                        "temporary directory, removed at the end unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--threads", type=int, default=0, help="serve --threads (0: its default)")
    p.add_argument("--kv-cache-gb", type=float, default=2.0)
    p.add_argument("--quick", action="store_true",
                   help="a short run (~3 min): 2 conversations x 3 turns of 64-128 words, "
                        "replies of 8 tokens, 1 long prompt of 1024 tokens, none on the "
                        "tier-less server")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--restart-after", type=int, default=2, help="turns before the restart")
    p.add_argument("--turn-len", default="200,400", help="words per user message: LO,HI")
    p.add_argument("--reply-len", type=int, default=16, help="max_tokens of each turn")
    p.add_argument("--long-len", type=int, default=2000, help="tokens of the long prompt")
    p.add_argument("--trials", type=int, default=3, help="long prompts (distinct)")
    p.add_argument("--skip-uncached-cold", action="store_true",
                   help="no long prompts on the tier-less server (cold = the tier's first run)")
    p.add_argument("--keep-page-cache", action="store_true",
                   help="do not drop the objects' pages before the restart")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds per server start")
    p.add_argument("--json", default="", help="also write every measurement to this file")
    p.add_argument("--report", default="", metavar="FILE",
                   help="print the report of an earlier run's --json FILE and exit")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            return report(json.load(f))
    if args.quick:
        args.conversations, args.turns, args.restart_after = 2, 3, 2
        args.turn_len, args.reply_len, args.trials, args.long_len = "64,128", 8, 1, 1024
        args.skip_uncached_cold = True
    lo, _, hi = args.turn_len.partition(",")
    args.turn_len = (int(lo), int(hi or lo))
    if not 1 <= args.restart_after < args.turns:
        p.error("--restart-after must be in [1, --turns)")
    args.binary = os.path.abspath(args.binary)
    if not os.path.exists(os.path.join(args.model, "config.json")):
        print(f"making the bench model in {args.model} (once)", file=sys.stderr)
        subprocess.run([args.binary, "make-model", "--preset", "bench", "--out", args.model],
                       check=True)
    work = args.workdir or tempfile.mkdtemp(prefix="kv-disk-restart-")
    os.makedirs(work, exist_ok=True)
    if os.path.exists(os.path.join(work, "kv")):
        shutil.rmtree(os.path.join(work, "kv"))  # the tier must start empty
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    try:
        log("with the tier")
        tier = run_config(args, True, work, log)
        log("without the tier")
        none = run_config(args, False, work, log)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    run = {"args": vars(args), "tier": tier, "none": none,
           "wall_s": time.perf_counter() - t_start,
           "command": shlex.join([sys.executable] + sys.argv),
           "cpu": f"{cpu_model()}, {os.cpu_count()} logical cores",
           "loadavg": ", ".join(f"{x:.2f}" for x in os.getloadavg())}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(run, f, indent=1)
    return report(run)


def report(run):
    """Prints the markdown report of one run (a --json file's contents). 0: replies matched."""
    args = argparse.Namespace(**run["args"])
    tier, none, wall = run["tier"], run["none"], run["wall_s"]
    same = [a["text"] for a in tier["turns"]] == [b["text"] for b in none["turns"]]
    R, T = args.restart_after, args.turns
    print(f"## KV disk tier: restart bench\n")
    print(f"- command: `{run['command']}`")
    print(f"- CPU: {run['cpu']}; load average (1, 5, 15 min) at the end {run['loadavg']}")
    print(f"- servers: `{shlex.join(tier['cmd'])}` (without the tier: the same less `--kv-disk`, "
          f"another port); starts took "
          f"{', '.join(f'{s:.0f}' for s in tier['starts'] + none['starts'])} s")
    print(f"- page cache before the restart: "
          f"{'kept' if args.keep_page_cache else 'objects dropped (reads from the device)'}")
    print(f"- wall time: {wall / 60:.1f} min\n")
    print(f"(a) {args.conversations} conversations x {T} turns (user messages of "
          f"{args.turn_len[0]}-{args.turn_len[1]} words, replies of {args.reply_len} tokens), "
          f"one request at a time, server restarted after turn {R}. Replies identical with and "
          f"without the tier: {'yes' if same else 'NO'}.\n")
    print("| server | turns | requests | TTFT p50 ms | TTFT p99 ms | prefix-cache hits (cached / prompt tokens) |")
    print("|---|---|---:|---:|---:|---|")
    for name, res in (("--kv-disk", tier), ("no tier", none)):
        for lo_t, hi_t in dict.fromkeys(((1, R), (R + 1, R + 1), (R + 1, T))):
            row = turn_rows(name + (" (restarted)" if lo_t > R else ""), res["turns"], lo_t, hi_t)
            if row:
                print(row)
    cold_none, cold_tier, disk = none["long_cold"], tier["long_cold"], tier["long_disk"]
    print(f"\n(b) a {args.long_len}-token prompt (token ids, /v1/completions, max_tokens 2), "
          f"{args.trials} distinct prompt{'s' if args.trials > 1 else ''}:\n")
    print("| run | trials | TTFT min ms | TTFT median ms | cached tokens |")
    print("|---|---:|---:|---:|---|")
    if cold_none:
        print(f"| cold, no tier | {len(cold_none)} | {ms(min(cold_none))} | "
              f"{ms(statistics.median(cold_none))} | 0 |")
    print(f"| cold, --kv-disk (writing) | {len(cold_tier)} | {ms(min(cold_tier))} | "
          f"{ms(statistics.median(cold_tier))} | 0 |")
    print(f"| on disk, after a restart | {len(disk)} | {ms(min(disk))} | "
          f"{ms(statistics.median(disk))} | {', '.join(map(str, tier['long_cached']))} |")
    base = cold_none or cold_tier
    ratio_med = statistics.median(disk) / statistics.median(base)
    ratio_min = min(disk) / min(base)
    print(f"\nDisk / cold TTFT ({'no tier' if cold_none else 'tier'} cold): median "
          f"{100 * ratio_med:.1f}%, min {100 * ratio_min:.1f}% (goal <= 5%: "
          f"{'met' if ratio_med <= 0.05 else 'NOT met'}).")
    m = tier["metrics"]
    print(f"Restarted tier server's /metrics: "
          f"{int(m.get('moeserve_kv_disk_hit_blocks_total', 0))} disk hit blocks, "
          f"{int(m.get('moeserve_kv_disk_miss_blocks_total', 0))} misses, "
          f"{int(m.get('moeserve_kv_disk_rejected_total', 0))} rejected, "
          f"{int(m.get('moeserve_kv_disk_read_bytes_total', 0)) / 1e6:.1f} MB read.")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
