#!/usr/bin/env python3
"""A BF16 copy of a DeepSeek-V3 FP8 block-scaled checkpoint (e4m3 weights with 128x128
weight_scale_inv), for vLLM's CPU backend on CPUs without AMX (docs/peers.md: it refuses the FP8
checkpoint there). Each weight times its block's scale, rounded to BF16; everything else copied.
Runs in the vLLM venv (torch, safetensors).

usage: python dequant_bf16.py SRC_DIR DST_DIR
"""
import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    bs = cfg.get("quantization_config", {}).get("weight_block_size", [128, 128])
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "bfloat16"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in os.listdir(src):
        if f.startswith("tokenizer") or f in ("generation_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    weight_map = {}
    for sh in shards:
        out = {}
        with safe_open(os.path.join(src, sh), "pt") as r:
            keys = set(r.keys())
            for k in keys:
                if k.endswith(".weight_scale_inv"):
                    continue
                t = r.get_tensor(k)
                if t.dtype == torch.float8_e4m3fn:
                    if k + "_scale_inv" not in keys:
                        sys.exit(f"{sh}: no scale for {k}")
                    s = r.get_tensor(k + "_scale_inv")
                    o, i = t.shape
                    s = s.float().repeat_interleave(bs[0], 0)[:o].repeat_interleave(bs[1], 1)[:, :i]
                    t = (t.float() * s).to(torch.bfloat16)
                out[k] = t.contiguous()
                weight_map[k] = sh
        save_file(out, os.path.join(dst, sh), metadata={"format": "pt"})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    print(f"wrote {dst}: {len(weight_map)} tensors, {len(shards)} shards")


if __name__ == "__main__":
    main()
