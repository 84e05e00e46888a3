#!/usr/bin/env python3
"""The cost of constrained decoding (docs/structured-outputs.md), against a running server.

For each concurrency (default 1 and 32), alternated rounds of: C streams of json_schema requests
(the "person" schema of tests/server/structured_outputs_test.py, greedy), then C streams of the
same prompts without a grammar (ignore_eos, max_tokens set to the constrained replies' mean
length, so both decode the same number of tokens). Prints one JSON object per concurrency:

  tpot_ms_grammar / tpot_ms_plain   mean client-side TPOT ((end - first token) / (tokens - 1))
  tpot_ratio                        their ratio (what the grammar costs a client, all in)
  mask_ms_per_token                 from /metrics: moeserve_grammar_mask_seconds_total per
                                    moeserve_grammar_tokens_total (mask, apply, advance; summed
                                    over the sampling threads)
  mask_share_of_tpot                mask_ms_per_token x C / min(C, threads) / tpot_ms_grammar:
                                    the share of a decode step the masks take (goal <= 0.10)

Standard library only (HTTP and SSE by hand), like bench/load/loadgen.py.
"""
import argparse
import json
import sys
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "languages": {"type": "array", "items": {"enum": ["python", "c", "rust", "go"]},
                      "maxItems": 4},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


def metrics(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition(" ")
            out[k] = float(v)
    return out


def stream(base, body, out):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    out.append({"tokens": tokens, "tpot": (last - first) / max(tokens - 1, 1) if first else 0,
                "ttft": (first or t0) - t0})


def round_of(base, model, c, grammar, max_tokens):
    results, threads = [], []
    for i in range(c):
        body = {"model": model, "messages": [{"role": "user", "content": f"Person {i} as JSON:"}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        if grammar:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "person", "strict": True, "schema": SCHEMA}}
        else:
            body["ignore_eos"] = True
        t = threading.Thread(target=stream, args=(base, body, results))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2, help="the server's compute threads")
    a = ap.parse_args()
    for c in [int(x) for x in a.concurrency.split(",")]:
        g_tpot, p_tpot, mask_s, mask_tok = [], [], 0.0, 0.0
        round_of(a.base_url, a.model, c, True, a.max_tokens)  # warm-up (compiles the schema)
        for _ in range(a.rounds):
            m0 = metrics(a.base_url)
            g = round_of(a.base_url, a.model, c, True, a.max_tokens)
            m1 = metrics(a.base_url)
            mask_s += m1["moeserve_grammar_mask_seconds_total"] - m0["moeserve_grammar_mask_seconds_total"]
            mask_tok += m1["moeserve_grammar_tokens_total"] - m0["moeserve_grammar_tokens_total"]
            mean_len = max(2, round(sum(r["tokens"] for r in g) / len(g)))
            p = round_of(a.base_url, a.model, c, False, mean_len)
            g_tpot += [r["tpot"] for r in g if r["tokens"] > 1]
            p_tpot += [r["tpot"] for r in p if r["tokens"] > 1]
        tg = 1e3 * sum(g_tpot) / len(g_tpot)
        tp = 1e3 * sum(p_tpot) / len(p_tpot)
        mask_ms = 1e3 * mask_s / max(mask_tok, 1)
        print(json.dumps({
            "concurrency": c, "tpot_ms_grammar": round(tg, 3), "tpot_ms_plain": round(tp, 3),
            "tpot_ratio": round(tg / tp, 4), "mask_ms_per_token": round(mask_ms, 4),
            "mask_share_of_tpot": round(mask_ms * c / min(c, a.threads) / tg, 4),
            "grammar_tokens": int(mask_tok)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
