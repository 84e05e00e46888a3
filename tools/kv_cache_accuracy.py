#!/usr/bin/env python3
"""What a KV cache format costs in accuracy, measured through `moeserve generate`.

Teacher forcing: the reference configuration decodes each prompt greedily for --steps tokens;
then every configuration is asked for the next-token distribution after each prefix of that
path (all prefixes of all prompts in one batch: max_tokens 1, --logprobs 20). Against the
reference's top-5 at every step it reports the max and mean |logprob delta| (a token missing
from a configuration's top-20 is counted in `missing` and measured at the 20th logprob, which
understates its delta) and the share of steps whose argmax agrees; and, free-running, the share of greedy tokens equal to the
reference's before the first difference (a flip on a near tie ends a comparison early).

With --hf the reference is a Hugging Face fixture's expected.json (tests/data/hf/<name>: its
prompts, greedy path and top-5 logprobs) instead of a configuration.

Usage:
  tools/kv_cache_accuracy.py BIN MODEL --ref f32:fast --configs bf16:fast fp8:fast
      [--steps 16] [--lengths 64 256 1000] [--threads 2]
  tools/kv_cache_accuracy.py BIN tests/data/hf/v3 --hf --configs bf16:fast f32:reference
A configuration is KV_DTYPE:COMPUTE[:FLAG...] (--kv-cache-dtype, --compute, then flags without
their dashes: bf16:fast:gemm-int8:lm-head-int8 adds --gemm-int8 --lm-head-int8, and
bf16:fast:expert-dtype=int4 adds --expert-dtype int4).
"""

import argparse
import json
import subprocess
import sys


def generate(bin_, model, config, prompts, max_tokens, logprobs, threads):
    kv, compute, *flags = config.split(":")
    cmd = [bin_, "generate", "--model", model, "--kv-cache-dtype", kv, "--compute", compute,
           "--threads", str(threads), "--max-tokens", str(max_tokens),
           "--logprobs", str(logprobs), "--json", "--ignore-eos"]
    for f in flags:  # FLAG or FLAG=VALUE
        name, _, value = f.partition("=")
        cmd += ["--" + name] + ([value] if value else [])
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def reference_from_config(args, prompts):
    runs = generate(args.bin, args.model, args.ref, prompts, args.steps, 5, args.threads)
    return [(p, r["tokens"], None) for p, r in zip(prompts, runs)]


def reference_from_hf(model):
    with open(model + "/expected.json") as f:
        fixture = json.load(f)
    ref = []
    for p in fixture["prompts"]:
        tops = [{t["id"]: t["logprob"] for t in step} for step in p["top_logprobs"]]
        ref.append((p["prompt_ids"], p["tokens"], tops))
    return ref


def teacher_forced(args, config, ref):
    """Per step of every reference path: the configuration's {id: logprob} (top 20)."""
    prefixes = [p + path[:k] for p, path, _ in ref for k in range(len(path))]
    runs = generate(args.bin, args.model, config, prefixes, 1, 20, args.threads)
    return [{t["id"]: t["logprob"] for t in r["top_logprobs"][0]} for r in runs]


def measure(args, config, ref, ref_steps):
    got = teacher_forced(args, config, ref)
    deltas, agree, missing = [], 0, 0
    for want, have in zip(ref_steps, got):
        floor = min(have.values())
        top5 = sorted(want, key=want.get, reverse=True)[:5]
        deltas += [abs(want[i] - have.get(i, floor)) for i in top5]
        missing += sum(i not in have for i in top5)
        agree += max(have, key=have.get) == top5[0]
    free = generate(args.bin, args.model, config, [p for p, _, _ in ref], args.steps, 1,
                    args.threads)
    same = total = 0
    for (_, path, _), r in zip(ref, free):
        n = len(path)
        k = next((i for i in range(n) if r["tokens"][i] != path[i]), n)
        same, total = same + k, total + n
    return {"config": config, "steps": len(got), "max_dlogprob": max(deltas),
            "mean_dlogprob": sum(deltas) / len(deltas), "argmax_agree": agree / len(got),
            "greedy_prefix_agree": same / total, "missing": missing}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--ref", default="f32:fast", help="reference configuration")
    ap.add_argument("--hf", action="store_true", help="reference: MODEL/expected.json")
    ap.add_argument("--configs", nargs="+", default=["bf16:fast", "fp8:fast"])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1000])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.hf:
        ref = reference_from_hf(args.model)
        ref = [(p, path[:args.steps], tops[:args.steps]) for p, path, tops in ref]
        ref_steps = [t for _, _, tops in ref for t in tops]
    else:
        # Deterministic prompts of the given lengths (ids below 1000: every vocabulary has them).
        prompts = [[(i * 37 + n * 101 + 11) % 1000 for i in range(n)] for n in args.lengths]
        ref = reference_from_config(args, prompts)
        ref_steps = teacher_forced(args, args.ref, ref)
    print(f"reference: {'HF ' + args.model if args.hf else args.ref}", file=sys.stderr)
    for config in args.configs:
        print(json.dumps(measure(args, config, ref, ref_steps)), flush=True)


if __name__ == "__main__":
    main()
