#!/usr/bin/env python3
"""transformers' outputs on the trained tiny V4 (tools/train_tiny_v4.py), for the C++ forward
pass to be judged on trained weights (tests/model/deepseek_v4_test.cpp, V4Trained).

Reads the exported checkpoint in DeepSeek's format through tools/gen_v4_fixture.py's byte parser
(FP8 and FP4 dequantized), runs transformers' DeepseekV4ForCausalLM in float32 (eager) on three
prompts cut from held-out files of the corpus (tiny-py's split), and writes expected.json: per
prompt the ids, the top-5 log-probabilities at every prompt position (one full forward) and
40 greedy steps decoded with transformers' cache, each step's token and top-5.

  tools/gen_v4_trained_fixture.py --model DIR [--out tests/data/v4/tiny-v4]
Needs torch, tokenizers, transformers >= 5; CI needs none.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_v4_fixture as fx  # noqa: E402
import train_tiny as tt  # noqa: E402

PROMPT_LEN = 300  # past the 128-token window, two 128-token groups, 75 indexer entries (top 32)
STEPS = 40


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=os.path.join(tt.ROOT, "tests", "data", "v4", "tiny-v4"))
    args = ap.parse_args()
    from tokenizers import Tokenizer

    torch.set_num_threads(2)
    c = json.load(open(os.path.join(args.model, "config.json")))
    W, _ = fx.parse_safetensors_bytes(os.path.join(args.model, "model.safetensors"))
    model, cfg = fx.build_hf_model(c, W)
    tok = Tokenizer.from_file(tt.TOKENIZER)
    held = [rel for rel, h in tt.corpus_files() if h]
    prompts = []

    def first_long(start):  # the first held-out file from `start` with PROMPT_LEN ids
        for j in range(len(held)):
            rel = held[(start + j) % len(held)]
            text = open(os.path.join(tt.CORPUS_DIR, rel), encoding="utf-8", errors="replace").read()
            ids = [tt.BOS] + tok.encode(text, add_special_tokens=False).ids
            if len(ids) >= PROMPT_LEN:
                return rel, ids[:PROMPT_LEN]
        raise SystemExit("no held-out file is long enough")

    for k in range(3):  # three places spread over the held-out split
        rel, ids = first_long(k * (len(held) // 3))
        logits, _ = fx.full_forward(model, cfg, ids)
        tokens, dec, _ = fx.cached_greedy(model, cfg, ids, STEPS)
        lp = dec.log_softmax(-1).sort(-1, descending=True).values
        prompts.append({
            "file": rel, "prompt_ids": ids,
            "prompt_top_logprobs": [fx.top5(r) for r in logits],
            "tokens": tokens, "top_logprobs": [fx.top5(r) for r in dec],
            "min_greedy_top2_gap": float((lp[:, 0] - lp[:, 1]).min()),
        })
        print(f"{rel}: {len(ids)} prompt ids, greedy {tokens[:8]}..., "
              f"smallest top-2 gap {prompts[-1]['min_greedy_top2_gap']:.3f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump({"checkpoint": "tiny-v4", "transformers": __import__("transformers").__version__,
                   "torch": torch.__version__, "prompts": prompts}, f)
    print(f"{args.out}/expected.json")


if __name__ == "__main__":
    main()
