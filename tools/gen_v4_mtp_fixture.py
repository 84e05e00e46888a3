#!/usr/bin/env python3
"""DeepSeek-V4's MTP module on the V4 fixture, from DeepSeek's own inference/model.py.

transformers' deepseek_v4 leaves the MTP module (mtp.0.*) out, so the module is held to
DeepSeek's code itself: `inference/model.py` and `kernel.py` of the DeepSeek-V4-Pro model
repository (a public copy without weights: github.com/Nicooo-Wang/DeepSeek-V4-Pro-code, whose
kernel.py is the pure-torch form of the tilelang kernels). Its quantization simulation is turned
off (act_quant, fp4_act_quant and the Hadamard rotation as identities; weights dequantized to
F32 and run through F.linear), which makes it transformers' arithmetic (docs/deepseek-v4.md,
"Where the two references part"); the fixture's main-model logits are checked against the
transformers top-5 already in expected.json first, so the two references are seen to agree.

For the fixture's prompt: the main model's residual streams at every position (model.py's
Transformer.forward, keeping the streams before hc_head), then the module as model.py runs it:
a prefill of rows 0..P-1 (row p carries token t_{p+1} and the streams at p), then one row at a
time to the prompt's second-to-last position, each step's top-5 log-probabilities of t_{p+2}.

  python3 tools/gen_v4_mtp_fixture.py --deepseek-code DIR/inference [--model tests/data/v4/tiny]

writes <model>/mtp_expected.json. Needs torch (>= 2.7, for float8 dtypes) and safetensors.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_v4_fixture as fx  # noqa: E402  (its byte parser and top5)

PREFILL = 200  # rows of the module's prefill; the rest of the prompt goes one row at a time


def model_args(model, c):
    ratios = c["compress_ratios"]
    return model.ModelArgs(
        max_batch_size=1, max_seq_len=512, dtype="bf16", scale_fmt=None, expert_dtype=None,
        scale_dtype="fp32", vocab_size=c["vocab_size"], dim=c["hidden_size"],
        moe_inter_dim=c["moe_intermediate_size"], n_layers=c["num_hidden_layers"],
        n_hash_layers=c["num_hash_layers"], n_mtp_layers=1, n_heads=c["num_attention_heads"],
        n_routed_experts=c["n_routed_experts"], n_shared_experts=c["n_shared_experts"],
        n_activated_experts=c["num_experts_per_tok"], score_func=c["scoring_func"],
        route_scale=c["routed_scaling_factor"], swiglu_limit=c["swiglu_limit"],
        q_lora_rank=c["q_lora_rank"], head_dim=c["head_dim"], rope_head_dim=c["qk_rope_head_dim"],
        norm_eps=c["rms_norm_eps"], o_groups=c["o_groups"], o_lora_rank=c["o_lora_rank"],
        window_size=c["sliding_window"], compress_ratios=tuple(ratios),
        compress_rope_theta=c["compress_rope_theta"],
        original_seq_len=c["rope_scaling"]["original_max_position_embeddings"],
        rope_theta=c["rope_theta"], rope_factor=c["rope_scaling"]["factor"],
        beta_fast=c["rope_scaling"]["beta_fast"], beta_slow=c["rope_scaling"]["beta_slow"],
        index_n_heads=c["index_n_heads"], index_head_dim=c["index_head_dim"],
        index_topk=c["index_topk"], hc_mult=c["hc_mult"], hc_sinkhorn_iters=c["hc_sinkhorn_iters"],
        hc_eps=c["hc_eps"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepseek-code", required=True, help="DeepSeek-V4's inference/ directory")
    ap.add_argument("--model", default="tests/data/v4/tiny")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.deepseek_code))
    import kernel  # noqa: F401  (model.py imports it by name)
    import model

    # The quantization simulation off: transformers' arithmetic.
    ident = lambda x, *a, **k: x  # noqa: E731
    model.act_quant = ident
    model.fp4_act_quant = ident
    model.rotate_activation = ident
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)

    c = json.load(open(os.path.join(args.model, "config.json")))
    want = json.load(open(os.path.join(args.model, "expected.json")))["prompts"][0]
    # The fixture generator's own byte parser: every tensor dequantized to float (FP8 and FP4
    # times their UE8M0 scales).
    W, _ = fx.parse_safetensors_bytes(os.path.join(args.model, "model.safetensors"))

    m = model.Transformer(model_args(model, c))
    m = m.float()
    state = m.state_dict()
    loaded = set()
    for name, t in state.items():
        if name not in W:
            continue  # buffers (caches, rope tables)
        src = W[name]
        assert tuple(src.shape) == tuple(t.shape), (name, tuple(src.shape), tuple(t.shape))
        t.copy_(src.to(t.dtype))
        loaded.add(name)
    params = {n for n, _ in m.named_parameters()}
    missing = sorted(params - loaded)
    # The module shares the main model's embedding and head (model.py assigns them).
    assert not [n for n in missing if not n.startswith(("mtp.0.embed", "mtp.0.head"))], missing
    unused = sorted(set(W) - loaded)
    assert not unused, unused

    ids = torch.tensor([want["prompt_ids"]])
    n = ids.size(1)
    with torch.inference_mode():
        # model.py's Transformer.forward, keeping the streams before hc_head.
        h = m.embed(ids).unsqueeze(2).repeat(1, 1, m.hc_mult, 1)
        for layer in m.layers:
            h = layer(h, 0, ids)
        logits = m.head(h, m.hc_head_fn, m.hc_head_scale, m.hc_head_base, m.norm)
        main_dev = fx.max_top5_dev(logits, [want["prompt_top_logprobs"][n - 1]])
        assert main_dev < 1e-4, f"model.py's main model against transformers: {main_dev}"
        mtp = m.mtp[0]
        rows = []
        out = mtp(h[:, :PREFILL], 0, ids[:, 1:PREFILL + 1])
        rows.append({"position": PREFILL - 1, "top": fx.top5(out[0])})
        for p in range(PREFILL, n - 1):
            out = mtp(h[:, p:p + 1], p, ids[:, p + 1:p + 2])
            rows.append({"position": p, "top": fx.top5(out[0])})
    path = os.path.join(args.model, "mtp_expected.json")
    with open(path, "w") as f:
        json.dump({"source": "DeepSeek-V4-Pro inference/model.py (MTPBlock), quantization "
                             "simulation off, on this directory's model.safetensors",
                   "prefill_rows": PREFILL,
                   "main_model_vs_transformers_last_position": main_dev,
                   "rows": rows}, f, indent=1)
    print(f"{path}: {len(rows)} rows; model.py's main model within {main_dev:.2e} of transformers")


if __name__ == "__main__":
    main()
