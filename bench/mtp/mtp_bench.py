#!/usr/bin/env python3
"""MTP speculative decoding on the trained default model: decode tokens/s with K = 1, 2, 3 draft
tokens against none, at 1, 8 and 32 streams, and the acceptance per draft position, on held-out
prompts (docs/mtp.md "Bench").

Python standard library only; runs `moeserve generate` (greedy, ignore_eos) and prints a
markdown report with the CPU model and the exact commands. Prompts: the held-out files of
tools/train_tiny.py's corpus (/usr/lib/python3.11, sha256(relative path)[0] < 26), each cut
after a `def ...:` line past its first 600 characters, the last 1,500 characters of it. Every
configuration's text must equal K = 0's (exit status 1 otherwise).

Timing: each run's own figure (generate: tokens / wall time of the generation, load excluded);
configurations alternate run by run so that DRAM drift hits them alike; ratios are of sums.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_model  # noqa: E402

CORPUS_DIR = "/usr/lib/python3.11"
HELDOUT_BYTE = 26  # tools/train_tiny.py's split


def heldout_prompts(n):
    out = []
    for dirpath, dirnames, filenames in os.walk(CORPUS_DIR):
        dirnames.sort()
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), CORPUS_DIR)
            if hashlib.sha256(rel.encode()).digest()[0] >= HELDOUT_BYTE:
                continue
            with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            offset = 0
            for line in text.splitlines(keepends=True):
                offset += len(line)
                head = line.lstrip()
                if offset > 600 and head.startswith("def ") and line.rstrip().endswith(":"):
                    out.append((rel, text[max(0, offset - 1500):offset]))
                    break
    out.sort()
    if len(out) < n:
        raise SystemExit(f"only {len(out)} held-out prompts under {CORPUS_DIR}")
    return out[:n]


def run(binary, model, prompts, k, max_tokens, max_rows, threads):
    cmd = [binary, "generate", "--model", model, "--max-tokens", str(max_tokens), "--ignore-eos",
           "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    for p in prompts:
        cmd += ["--prompt", p]
    if k > 0:
        cmd += ["--speculative", "mtp", "--num-draft-tokens", str(k)]
        if max_rows is not None:
            cmd += ["--speculative-max-rows", str(max_rows)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:8])} ...: exit {r.returncode}\n{r.stderr[-2000:]}")
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    texts = [l["text"] for l in lines if "text" in l]
    spec = next((l["speculative"] for l in lines if "speculative" in l), None)
    m = re.search(r"(\d+) tokens in ([0-9.]+) s", r.stderr)
    return {"texts": texts, "tokens": int(m.group(1)), "seconds": float(m.group(2)), "spec": spec}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/moeserve")
    ap.add_argument("--model", default="build/models/tiny-py")
    ap.add_argument("--prompts", type=int, default=16, help="batch-1 prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration at 8 and 32 streams")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    held = heldout_prompts(max(args.prompts, 32))
    texts = [t for _, t in held]
    print(f"# MTP speculative decoding: {args.model}\n")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; `{' '.join(sys.argv)}`; "
          f"greedy, {args.max_tokens} tokens per prompt, ignore_eos; held-out prompts from "
          f"{len(set(r for r, _ in held))} files of {CORPUS_DIR}.\n")
    failures = []

    # Batch 1: every prompt alone, configurations alternating; drafts always on (the module's
    # speed as it is), then the measured policy's choice.
    configs = [(0, None), (1, 0), (2, 0), (3, 0), (1, None), (3, None)]
    tot = {c: [0, 0.0, 0, 0] for c in configs}
    acc = {c: [[0, 0] for _ in range(c[0])] for c in configs}
    for i, prompt in enumerate(texts[:args.prompts]):
        outs = {}
        for c in configs[i % len(configs):] + configs[:i % len(configs)]:
            r = run(args.bin, args.model, [prompt], c[0], args.max_tokens, c[1], args.threads)
            outs[c] = r
            tot[c][0] += r["tokens"]
            tot[c][1] += r["seconds"]
            if r["spec"]:
                tot[c][2] += r["spec"]["off_steps"]
                tot[c][3] += r["spec"]["steps"]
                for j in range(c[0]):
                    acc[c][j][0] += r["spec"]["accepted"][j]
                    acc[c][j][1] += r["spec"]["verified"][j]
        for c in configs[1:]:
            if outs[c]["texts"] != outs[(0, None)]["texts"]:
                failures.append(f"batch 1, prompt {i}, K={c[0]}: text differs")
    base = tot[(0, None)][0] / tot[(0, None)][1]
    print("## Batch 1 (one stream)\n")
    print("| K | policy | tokens/s | vs no MTP | acceptance by draft position | tokens per verify step | steps without drafts |")
    print("|---|---|---|---|---|---|---|")
    for c in configs:
        k = c[0]
        tps = tot[c][0] / tot[c][1]
        a = [x / max(1, v) for x, v in acc[c]]
        per_step = 1 + sum(x for x, _ in acc[c]) / max(1, acc[c][0][1]) if k else 1.0
        policy = "-" if k == 0 else ("measured" if c[1] is None else "always")
        off = f"{tot[c][2]} of {tot[c][3]}" if k else "-"
        print(f"| {k} | {policy} | {tps:.1f} | {tps / base:.2f}x | "
              f"{' / '.join(f'{x:.3f}' for x in a) or '-'} | {per_step:.2f} | {off} |")
    print()

    # 8 and 32 streams: one batch, the automatic policy and drafts forced on.
    print("## Many streams (one batch)\n")
    print("| streams | K | policy | tokens/s | vs no MTP | steps without drafts | acceptance (first) |")
    print("|---|---|---|---|---|---|---|")
    for streams in (8, 32):
        batch = texts[:streams]
        configs = [(0, None), (1, None), (1, 0), (2, None), (2, 0)]
        tot = {c: [0, 0.0, 0, 0, 0, 0] for c in configs}
        ref = None
        for rep in range(args.repeats):
            for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
                r = run(args.bin, args.model, batch, c[0], args.max_tokens, c[1], args.threads)
                t = tot[c]
                t[0] += r["tokens"]
                t[1] += r["seconds"]
                if r["spec"]:
                    t[2] += r["spec"]["off_steps"]
                    t[3] += r["spec"]["accepted"][0]
                    t[4] += r["spec"]["verified"][0]
                    t[5] += r["spec"]["steps"]
                if c == (0, None):
                    ref = r["texts"]
                elif ref is not None and r["texts"] != ref:
                    failures.append(f"{streams} streams, K={c[0]}: text differs")
        base = tot[(0, None)][0] / tot[(0, None)][1]
        for c in configs:
            t = tot[c]
            tps = t[0] / t[1]
            policy = "-" if c[0] == 0 else ("measured" if c[1] is None else "always")
            off = f"{t[2]} of {t[5]}" if c[0] > 0 else "-"
            a = f"{t[3] / t[4]:.3f}" if t[4] else "-"
            print(f"| {streams} | {c[0]} | {policy} | {tps:.1f} | {tps / base:.2f}x | {off} | {a} |")
    print()
    if failures:
        print("**Output differed:** " + "; ".join(failures))
        sys.exit(1)
    print("Every configuration's text equals K = 0's.")


if __name__ == "__main__":
    main()
