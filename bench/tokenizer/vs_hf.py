#!/usr/bin/env python3
"""Runs tokenizer-bench and Hugging Face tokenizers on the same inputs in the same run and prints
MB/s of both and their ratio (native / HF), one JSON object per input, then a summary line.
Both are single-thread (HF: one encode() per corpus line / input, RAYON_NUM_THREADS=1) and
best-of-3. Also checks that both produced the same ids (count and FNV-1a hash).

Usage (from the repository root): python3 bench/tokenizer/vs_hf.py BUILD_DIR/tokenizer-bench
"""
import json
import os
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402

TOK_DIR = "assets/tokenizer/deepseek-v3"
CORPUS = "tests/data/tokenizer/corpus.jsonl"
MASK = (1 << 64) - 1


class Lcg:  # the same generator as inputs.h
    def __init__(self):
        self.x = 42

    def next(self):
        self.x = (self.x * 6364136223846793005 + 1442695040888963407) & MASK
        return self.x >> 33


def adversarial(kind, n):
    g = Lcg()
    if kind == "repeated_char":
        return "a" * n
    if kind == "spaces":
        return " " * n
    if kind == "one_word":
        return "".join(chr(ord("a") + g.next() % 26) for _ in range(n))
    if kind == "digits":
        return "".join(chr(ord("0") + g.next() % 10) for _ in range(n))
    raise ValueError(kind)


def fnv(ids, h=1469598103934665603):
    for i in ids:
        h ^= i & 0xFFFFFFFF
        h = (h * 1099511628211) & MASK
    return h


def best_of(fn, reps=3):
    best, out = 1e30, None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    native = {}
    proc = subprocess.run([sys.argv[1]], capture_output=True, text=True, check=True)
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        native[r["input"]] = r

    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(os.path.join(TOK_DIR, "tokenizer.json"))
    hf_load = time.perf_counter() - t0
    lines = [json.loads(l)["text"] for l in open(CORPUS, encoding="utf-8") if l.strip()]
    inputs = {"corpus": lines}
    for kind in ("repeated_char", "one_word", "digits", "spaces"):
        for n in (1 << 18, 1 << 20):
            inputs[f"{kind}_{n >> 10}k"] = [adversarial(kind, n)]

    rows = []
    print(json.dumps({"input": "load", "native_s": round(native["load"]["seconds"], 4),
                      "hf_s": round(hf_load, 4)}))
    for name, texts in inputs.items():
        nbytes = sum(len(t.encode()) for t in texts)

        def run():
            n, h = 0, 1469598103934665603
            for t in texts:
                ids = tok.encode(t, add_special_tokens=False).ids
                n += len(ids)
                h = fnv(ids, h)
            return n, h

        secs, (n, h) = best_of(run)
        nat = native[name]
        same = nat["ids"] == n and nat["hash"] == f"{h:016x}"
        row = {"input": name, "bytes": nbytes, "native_mb_s": round(nat["mb_per_s"], 2),
               "hf_mb_s": round(nbytes / secs / 1e6, 2),
               "ratio": round(nat["mb_per_s"] / (nbytes / secs / 1e6), 2), "same_ids": same}
        rows.append(row)
        print(json.dumps(row))
    # Linearity: MB/s at 1 MB over MB/s at 256 KB (1.0 = linear; quadratic would be ~0.25).
    for kind in ("repeated_char", "one_word", "digits", "spaces"):
        a, b = native[f"{kind}_256k"], native[f"{kind}_1024k"]
        print(json.dumps({"input": kind, "native_linearity_1m_vs_256k": round(b["mb_per_s"] / a["mb_per_s"], 2)}))
    if not all(r["same_ids"] for r in rows):
        print("MISMATCH between native and HF ids", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
