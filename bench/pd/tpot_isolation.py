#!/usr/bin/env python3
"""Decode TPOT isolation under arriving prompts: PD against co-located serving (docs/pd.md).

Runs against one OpenAI-compatible base URL (a `moeserve router` or a `moeserve serve`):
  1. --streams streaming requests decode for the whole run (ignore_eos, long max_tokens);
  2. quiet phase (--quiet-s): only those streams; every gap between two content chunks of a
     stream is one inter-token time;
  3. busy phase (--busy-s): meanwhile a client sends --prompt-len-token prompts one after the
     other (each unique from its first token, so no prefix cache hit; max_tokens 2), to --url
     or, with --busy-url, to another server (a control: the prompts' compute beside the
     streams' server with no hand-off to it);
Prints one JSON object: inter-token p50/p99 per phase, their ratio, prompts completed and their
TTFT. Standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request

WORDS = ("the of and to in is was for on that with as by at from his it an were are which this "
         "be or has had not also have but first one their its after new who they two her she "
         "been other when time during there into school more may years over only city would some "
         "later world about").split()


def percentile(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1)))]


MODEL = "m"


def served_model(url):
    with urllib.request.urlopen(url + "/v1/models") as r:
        return json.load(r)["data"][0]["id"]


class Stream(threading.Thread):
    def __init__(self, url, i, max_tokens, stop):
        super().__init__(daemon=True)
        self.url, self.i, self.max_tokens, self.stop = url, i, max_tokens, stop
        self.times = []  # arrival time of each content chunk
        self.error = None

    def run(self):
        u = urllib.parse.urlparse(self.url)
        body = {"model": MODEL, "stream": True, "max_tokens": self.max_tokens, "ignore_eos": True,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"stream {self.i}: tell a long story"}]}
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
            c.request("POST", "/v1/chat/completions", json.dumps(body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                self.error = f"HTTP {r.status}: {r.read()[:200]}"
                return
            while not self.stop.is_set():
                line = r.fp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if any(ch.get("delta", {}).get("content") for ch in d.get("choices", [])):
                    self.times.append(time.monotonic())
            c.close()
        except Exception as e:  # noqa: BLE001 - reported
            self.error = repr(e)


def prompt_sender(url, n_tokens, stop, ttfts, done_at, seed):
    rng = random.Random(seed)
    u = urllib.parse.urlparse(url)
    k = 0
    while not stop.is_set():
        k += 1
        text = f"{k} {rng.random()} " + " ".join(rng.choice(WORDS) for _ in range(n_tokens))
        body = {"model": MODEL, "max_tokens": 2, "temperature": 0, "prompt": text}
        t0 = time.monotonic()
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=900)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status == 200 and not stop.is_set():
            ttfts.append(time.monotonic() - t0)
            done_at.append(time.monotonic())
        c.close()


def gaps(streams, t_from, t_to, ends=None):
    out = []
    for s in streams:
        ts = [t for t in s.times if t_from <= t <= t_to]
        out += [b - a for a, b in zip(ts, ts[1:])]
        if ends is not None:
            ends += [(b, b - a) for a, b in zip(ts, ts[1:])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--busy-url", help="send the busy phase's prompts here (default: --url)")
    ap.add_argument("--label", default="")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=2000)
    ap.add_argument("--warmup-s", type=float, default=5)
    ap.add_argument("--quiet-s", type=float, default=20)
    ap.add_argument("--busy-s", type=float, default=40)
    ap.add_argument("--max-tokens", type=int, default=4000)
    a = ap.parse_args()
    global MODEL
    MODEL = served_model(a.url)
    busy_url = a.busy_url or a.url
    if served_model(busy_url) != MODEL:
        sys.exit(f"{busy_url} serves {served_model(busy_url)}, not {MODEL}")
    stop = threading.Event()
    streams = [Stream(a.url, i, a.max_tokens, stop) for i in range(a.streams)]
    for s in streams:
        s.start()
    time.sleep(a.warmup_s)
    q0 = time.monotonic()
    time.sleep(a.quiet_s)
    q1 = time.monotonic()
    pstop = threading.Event()
    ttfts, done_at = [], []
    sender = threading.Thread(target=prompt_sender, args=(busy_url, a.prompt_len, pstop, ttfts, done_at, 1),
                              daemon=True)
    sender.start()
    b0 = time.monotonic()
    time.sleep(a.busy_s)
    b1 = time.monotonic()
    pstop.set()
    stop.set()
    errors = [s.error for s in streams if s.error]
    ends = []
    quiet, busy = gaps(streams, q0, q1), gaps(streams, b0, b1, ends)
    # Where the tail is: the slowest busy gaps (when they ended, from the busy phase's start)
    # beside the moments the prompts completed (a PD hand-off joins the decode unit then).
    slowest = sorted(ends, key=lambda e: -e[1])[:12]
    res = {
        "label": a.label, "streams": a.streams, "prompt_len_words": a.prompt_len,
        "quiet": {"gaps": len(quiet), "p50_ms": 1e3 * percentile(quiet, 0.5),
                  "p99_ms": 1e3 * percentile(quiet, 0.99)} if quiet else None,
        "busy": {"gaps": len(busy), "p50_ms": 1e3 * percentile(busy, 0.5),
                 "p99_ms": 1e3 * percentile(busy, 0.99)} if busy else None,
        "prompts_completed": len(ttfts),
        "prompts_done_at_s": [round(t - b0, 2) for t in done_at],
        "busy_slowest_gaps": [[round(t - b0, 2), round(1e3 * g)] for t, g in slowest],
        "prompt_ttft_s_mean": statistics.mean(ttfts) if ttfts else None,
        "errors": errors,
    }
    if quiet and busy:
        res["p99_busy_over_quiet"] = res["busy"]["p99_ms"] / res["quiet"]["p99_ms"]
        res["p50_busy_over_quiet"] = res["busy"]["p50_ms"] / res["quiet"]["p50_ms"]
    print(json.dumps(res))
    return 1 if errors or not quiet or not busy else 0


if __name__ == "__main__":
    sys.exit(main())
