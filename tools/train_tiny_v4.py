#!/usr/bin/env python3
"""Trains a tiny DeepSeek-V4 on the embedded default model's corpus and exports it in DeepSeek's
published V4 format, to judge the fast path's formats on trained weights (docs/deepseek-v4.md,
"The trained tiny V4").

The model is transformers' DeepseekV4ForCausalLM (its own modeling of V4: sliding-window,
compressed sparse and heavily compressed attention with the lightning indexer, mHC, hash and
top-k sqrtsoftplus MoE, clipped SwiGLU), at tiny-py's widths where V4 has them (hidden 256, 4
layers, 4 heads, 16 experts of 128, top 4, one shared), V4's own sliding window (128), ratios and
RoPE settings, trained in float32 eager mode. What it does not train: the indexer (its top-k
selection passes no gradient; DeepSeek warms it up by KL to the main attention, which
transformers does not model), so its picks are those of its initial weights; the MTP module
(transformers leaves it out: the export has none); expert load balancing (no bias updates).

Corpus, vocabulary and schedule are tiny-py's (tools/train_tiny.py): the Python standard
library's source with the DeepSeek-V3 tokenizer, the same held-out split, ids seen fewer than
twice with zero head rows (one extra class of logit ln(V - U) in training stands for them, as
tiny-py's) and one shared trained embedding row (a zero row, as tiny-py keeps, would feed mHC's
RMS-scaled mixes an all-zero stream, whose gradient 1/sqrt(eps) swamps every other one), AdamW (0.9, 0.95), weight decay 0.1 on matrices, warm-up then cosine,
8 windows of 512 tokens a step.

Export: DeepSeek's names and formats (tools/gen_v4_fixture.py's tensor_specs): FP8 e4m3 with
UE8M0 scales per 128 x 128, FP4 e2m1 experts with a UE8M0 scale per 32, BF16 and F32 as V4 ships
them, the hash table as I64. The card (train_log.json): held-out nats per token of the trained
float32 model and of the exported (rounded) weights, beside tiny-py's.

  tools/train_tiny_v4.py --out DIR [--steps N] [--seed S]
Needs torch, tokenizers, safetensors and transformers >= 5 (deepseek_v4); CI needs none.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_v4_fixture as fx  # noqa: E402
import train_tiny as tt  # noqa: E402

STEPS = 480  # ~4.8 s a step on 2 Zen 4 cores: about tiny-py's 2,400 s of training

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 80,  # 64 non-RoPE values: whole FP8 tiles of 64, as V4-Flash's 448
    "qk_rope_head_dim": 16,
    "q_lora_rank": 192,
    "o_groups": 2,
    "o_lora_rank": 128,
    "sliding_window": 128,
    "compress_ratios": [4, 128, 4, 0],
    "compress_rope_theta": 160000.0,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 16,
    "index_head_dim": 64,
    "index_topk": 32,  # of the 128 4-token entries of a 512-token window: sparse past 128 tokens
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "topk_method": "noaux_tc",
    "num_hash_layers": 1,
    "swiglu_limit": 10.0,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 1048576,
    "bos_token_id": tt.BOS,
    "eos_token_id": tt.EOS,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
}


def hf_config(c, vocab):
    from transformers import DeepseekV4Config

    hf = {k: v for k, v in c.items() if k not in ("quantization_config", "expert_dtype")}
    hf["vocab_size"] = vocab
    cfg = DeepseekV4Config(**hf)
    cfg._attn_implementation = "eager"
    return cfg


def nll(logits, tgt, other):
    """Per-token nats over the trained rows plus one class of logit `other` (ln(V - U)) for the
    untrained ids, which the export gives zero rows (logit 0 each)."""
    z = logits.float()
    z = torch.cat([z[..., :-1], torch.full_like(z[..., :1], other)], -1)
    return F.cross_entropy(z.flatten(0, 1), tgt.flatten(), reduction="none").view(tgt.shape)


@torch.no_grad()
def heldout(model, rows, ids, other, eval_tokens):
    model.eval()
    n = min(eval_tokens, (len(ids) - 1) // tt.SEQ_LEN * tt.SEQ_LEN)
    data = rows[torch.tensor(ids[: n + 1])]
    total, count = 0.0, 0
    for s in range(0, n, tt.SEQ_LEN * tt.BATCH):
        wins = [data[i: i + tt.SEQ_LEN + 1] for i in range(s, min(s + tt.SEQ_LEN * tt.BATCH, n), tt.SEQ_LEN)]
        b = torch.stack(wins)
        total += nll(model(input_ids=b[:, :-1]).logits, b[:, 1:], other).sum().item()
        count += b[:, 1:].numel()
    return total / count


def quantize_fp8(w):
    """[out, in] -> (e4m3, UE8M0 [ceil(out/128), ceil(in/128)]): 2^ceil(log2(amax/448)) per block."""
    B = fx.FP8_BLOCK
    o, i = w.shape
    nr, nc = fx._ceil_div(o, B), fx._ceil_div(i, B)
    pad = torch.zeros(nr * B, nc * B)
    pad[:o, :i] = w
    amax = pad.view(nr, B, nc, B).abs().amax(dim=(1, 3)).clamp_min(1e-30)
    exp = fx.ue8m0_exponent(amax / fx.FP8_MAX)
    s = torch.exp2(exp.float()).repeat_interleave(B, 0).repeat_interleave(B, 1)[:o, :i]
    return (w / s).clamp(-fx.FP8_MAX, fx.FP8_MAX).to(torch.float8_e4m3fn), fx.e8m0_tensor(exp)


def official_tensors(sd, c, active, tid2eid_full):
    """transformers' state dict (compact vocabulary) -> DeepSeek's names and stored formats."""
    V = c["vocab_size"]
    W = {}
    for a, b in fx._HF_TOP:
        W[a] = sd[b].float()
    # Back to the full vocabulary: the untrained ids share the embedding's last row and have
    # zero head rows (logit 0).
    for name in ("embed.weight", "head.weight"):
        full = torch.zeros(V, W[name].shape[1])
        if name == "embed.weight":
            full[:] = W[name][len(active)]
        full[active] = W[name][: len(active)]
        W[name] = full
    I = c["moe_intermediate_size"]
    for L in range(c["num_hidden_layers"]):
        p, q = f"layers.{L}.", f"model.layers.{L}."
        for a, b in fx._HF_SUB:
            if q + b in sd:
                W[p + a] = sd[q + b]
        gu, dn = sd[q + "mlp.experts.gate_up_proj"], sd[q + "mlp.experts.down_proj"]
        for e in range(c["n_routed_experts"]):
            W[f"{p}ffn.experts.{e}.w1.weight"] = gu[e, :I]
            W[f"{p}ffn.experts.{e}.w3.weight"] = gu[e, I:]
            W[f"{p}ffn.experts.{e}.w2.weight"] = dn[e]
        if p + "ffn.gate.tid2eid" in W:
            W[p + "ffn.gate.tid2eid"] = tid2eid_full[L]
    out = {}
    for name, shape, kind, _ in fx.tensor_specs(c):
        w = W.pop(name)
        assert tuple(w.shape) == tuple(shape), (name, tuple(w.shape), shape)
        if kind == "fp8":
            out[name], out[name[: -len(".weight")] + ".scale"] = quantize_fp8(w.float())
        elif kind == "fp4":
            out[name], out[name[: -len(".weight")] + ".scale"] = fx.quantize_fp4(w.float())
        elif kind == "bf16":
            out[name] = w.float().to(torch.bfloat16)
        elif kind == "i64":
            out[name] = w.long()
        else:
            out[name] = w.float()
    assert not W, f"not exported: {sorted(W)}"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-tokens", type=int, default=tt.EVAL_TOKENS,
                    help="held-out tokens scored (tiny-py's: every whole window of the split)")
    args = ap.parse_args()
    from safetensors.torch import save_file
    from transformers import DeepseekV4ForCausalLM

    t_start = time.time()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    c = json.loads(json.dumps(CONFIG))
    streams, files = tt.tokenize_corpus()
    V = c["vocab_size"]
    active, rows, _ = tt.make_rows(streams["train"], V)
    U = len(active)
    other = math.log(V - U)
    model = DeepseekV4ForCausalLM(hf_config(c, U + 1)).float()
    model.set_experts_implementation("eager")
    # The hash layers' frozen table: distinct random experts per id (the compact ids' rows;
    # the export gives the untrained ids random rows of their own).
    g = torch.Generator().manual_seed(args.seed + 7)
    E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    tid2eid_full = {}
    for L in range(c["num_hash_layers"]):
        full = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(V)]).long()
        tid2eid_full[L] = full
        compact = torch.cat([full[active], full[:1]])  # the "other" row: never routed on (zero)
        buf = dict(model.named_buffers()).get(f"model.layers.{L}.mlp.gate.tid2eid")
        if buf is None:
            buf = dict(model.named_parameters())[f"model.layers.{L}.mlp.gate.tid2eid"]
        buf.data.copy_(compact.to(buf.dtype))

    data = rows[torch.tensor(streams["train"])]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and p.requires_grad]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 and p.requires_grad]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tt.WEIGHT_DECAY},
                             {"params": rest, "weight_decay": 0.0}], lr=tt.LR, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed + 1)
    log, t0 = [], time.time()
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - tt.SEQ_LEN - 1, (tt.BATCH,), generator=gen)
        batch = torch.stack([data[s: s + tt.SEQ_LEN + 1] for s in starts.tolist()])
        for grp in opt.param_groups:
            grp["lr"] = tt.lr_at(step, args.steps)
        model.train()
        loss = nll(model(input_ids=batch[:, :-1]).logits, batch[:, 1:], other).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tt.CLIP)
        opt.step()
        rec = {"step": step, "loss": round(loss.item(), 4), "grad_norm": round(float(gnorm), 3),
               "lr": round(tt.lr_at(step, args.steps), 6), "seconds": round(time.time() - t0, 1)}
        log.append(rec)
        if step % 10 == 0 or step == args.steps - 1:
            print(json.dumps(rec), flush=True)
    train_seconds = time.time() - t0

    trained = heldout(model, rows, streams["heldout"], other, args.eval_tokens)
    os.makedirs(args.out, exist_ok=True)
    tensors = official_tensors({k: v.detach() for k, v in model.state_dict().items()}, c, active,
                               tid2eid_full)
    st_path = os.path.join(args.out, "model.safetensors")
    save_file(tensors, st_path, metadata={"format": "pt"})
    os.chmod(st_path, 0o644)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the DeepSeek-V3 tokenizer
        shutil.copy(os.path.join(os.path.dirname(tt.TOKENIZER), name), args.out)
    # The exported (rounded) weights read back through the fixture's byte parser, in the model.
    W, _ = fx.parse_safetensors_bytes(st_path)
    sd = fx.official_to_hf(W, c)
    untrained = int(torch.nonzero(rows == U)[0])
    sd["model.embed_tokens.weight"] = torch.cat([W["embed.weight"][active],
                                                 W["embed.weight"][untrained: untrained + 1]])
    sd["lm_head.weight"] = torch.cat([W["head.weight"][active], torch.zeros(1, c["hidden_size"])])
    for L in range(c["num_hash_layers"]):
        sd[f"model.layers.{L}.mlp.gate.tid2eid"] = torch.cat([tid2eid_full[L][active],
                                                              tid2eid_full[L][:1]])
    own = model.state_dict()
    model.load_state_dict({n: sd[n].to(own[n].dtype) for n in own}, strict=True)
    exported = heldout(model, rows, streams["heldout"], other, args.eval_tokens)
    tiny_py = json.load(open(os.path.join(tt.ROOT, "assets", "models", "tiny-py", "train_log.json")))
    card = {
        "model": "tiny DeepSeek-V4 (transformers' deepseek_v4), tools/train_tiny_v4.py",
        "cpu": open("/proc/cpuinfo").read().split("model name\t: ")[1].split("\n")[0],
        "torch": torch.__version__,
        "steps": args.steps, "batch": tt.BATCH, "seq_len": tt.SEQ_LEN,
        "train_tokens_seen": args.steps * tt.BATCH * tt.SEQ_LEN,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "ids_with_rows": U,
        "heldout_nats_per_token": {"trained_f32": trained, "exported_fp8_fp4": exported},
        "tiny_py": {"steps": tiny_py["steps"], "train_tokens_seen": tiny_py["train_tokens_seen"],
                    "train_seconds": tiny_py["train_seconds"], "cpu": tiny_py["cpu"],
                    "heldout_nats_per_token": {
                        "trained_f32": tiny_py["heldout_before_export"]["nats_per_token"],
                        "exported_fp8": tiny_py["heldout_as_exported"]["nats_per_token"]}},
        "log": log,
    }
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(card, f, indent=1)
    print(json.dumps({k: card[k] for k in card if k != "log"}, indent=1))


if __name__ == "__main__":
    main()
