#!/usr/bin/env python3
"""Continues the embedded default model (tiny-py, tools/train_tiny.py) as DeepSeek-V3.2: adds a
lightning indexer to every layer (the MTP layer's too) and trains it with DeepSeek's recipe
(DeepSeek-V3.2 report, "Continued pre-training", docs/dsa.md), then exports it in the official
FP8 layout as `model_type` `deepseek_v32`.

1. Dense warm-up: the main model frozen and dense; only the indexers train, each toward its
   layer's attention: the target of query t is the main attention's probabilities summed over
   the heads and L1-normalised over the context, the loss KL(target || softmax(I[t, :])).
2. Sparse training: every query attends to the top INDEX_TOPK of its indexer's scores (fewer
   while its context is shorter); the main model trains on the language-model loss (and MTP's,
   as tiny-py did), the indexer on the KL divergence over the selected tokens only, its inputs
   detached from the main model's graph so that each gets only its own loss.

The indexer is transformers' `deepseek_v32` form (no Hadamard rotation, no FP8 rounding: the
rotation is orthogonal and the rounding an inference detail), RoPE on its first
qk_rope_head_dim dims as rotate-half pairs with MLA's (YaRN) frequencies:

    q[t,h] = RoPE_half(wq_b(q_latent_t)[h])      k[s] = RoPE_half(LayerNorm(wk(x_s)))
    I[t,s] = sum_h weights_proj(x_t)[h] * n_heads^-1/2 * ReLU(q[t,h] . k[s] * head_dim^-1/2)

The training context (SEQ_LEN 512) is 8 times the top-k (64), so a query past position 64 sees
an eighth of its context or less. The card (train_log.json) gives held-out loss sparse against
dense on the same weights (dense: every query attends to its whole context), and tiny-py's.

Usage:
  tools/train_tiny_v32.py --base assets/models/tiny-py --out DIR [--warmup-steps N] [--sparse-steps N]
Needs torch, tokenizers and transformers (the export is checked against transformers'
DeepseekV32ForCausalLM; --no-hf-check skips that); CI needs none of them.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_hf_fixtures as hf  # noqa: E402
import train_tiny as tt  # noqa: E402

INDEX_N_HEADS = 16
INDEX_HEAD_DIM = 128  # DeepSeek's: one FP8 scale per key, a 128-point Hadamard at inference
INDEX_TOPK = 64
WARMUP_LR = 1e-3  # DeepSeek's warm-up learning rate
SPARSE_LR = 3e-4  # tiny-py's final learning rate, cosine to SPARSE_LR_MIN
SPARSE_LR_MIN = 1e-4
INDEXER_LR = 1e-3

CONFIG = dict(tt.CONFIG)
CONFIG.update({
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "index_n_heads": INDEX_N_HEADS,
    "index_head_dim": INDEX_HEAD_DIM,
    "index_topk": INDEX_TOPK,
})


def rope_half(v, cos, sin):
    """Rotate-half RoPE over v's last dim (pairs i, i + d/2); cos/sin broadcast to v[..., :d/2]."""
    h = v.shape[-1] // 2
    a, b = v[..., :h], v[..., h:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class Indexer(torch.nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        d = c["hidden_size"]
        self.nh, self.hd, self.dr = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
        self.wq_b = tt.Linear(self.nh * self.hd, c["q_lora_rank"], gen)
        self.wk = tt.Linear(self.hd, d, gen)
        self.k_norm = torch.nn.LayerNorm(self.hd, eps=1e-6)
        self.weights_proj = tt.Linear(self.nh, d, gen)

    def forward(self, x, q_latent, cos, sin):
        """x [B, T, D], q_latent [B, T, q_lora] -> scores [B, T(query), T(key)] (not masked)."""
        b, t, _ = x.shape
        q = self.wq_b(q_latent).view(b, t, self.nh, self.hd)
        q = torch.cat([rope_half(q[..., : self.dr], cos[None, :, None], sin[None, :, None]),
                       q[..., self.dr :]], -1)
        k = self.k_norm(self.wk(x))
        k = torch.cat([rope_half(k[..., : self.dr], cos[None], sin[None]), k[..., self.dr :]], -1)
        w = self.weights_proj(x) * self.nh**-0.5  # [B, T, H]
        s = torch.matmul(q.reshape(b, t * self.nh, self.hd), k.transpose(1, 2))  # [B, T*H, S]
        s = F.relu(s.view(b, t, self.nh, t) * self.hd**-0.5)
        return torch.matmul(w.unsqueeze(-2), s).squeeze(-2)  # [B, T, S]


class SparseAttention(tt.Attention):
    """MLA as in tiny-py plus the indexer. `mode`: "dense" (no indexer), "warmup" (dense
    attention, the indexer's KL to it) or "sparse" (top-k attention, the KL over the selection).
    `ix_loss` / `ix_kl` hold the last forward's indexer cross-entropy and KL divergence."""

    def __init__(self, c, gen, out_std):
        super().__init__(c, gen, out_std)
        self.indexer = Indexer(c, gen)
        self.topk = c["index_topk"]
        self.mode = "dense"
        self.ix_loss = None
        self.ix_kl = None

    def forward(self, x, cos, sin, scale):
        b, t, _ = x.shape
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(b, t, self.h, self.nope + self.dr).transpose(1, 2)
        q = torch.cat([q[..., : self.nope], tt.rope(q[..., self.nope :], cos, sin)], -1)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv = self.kv_a_layernorm(kv[..., : self.kvl])
        k_pe = tt.rope(kv[..., self.kvl :], cos, sin)
        kvb = self.kv_b_proj(c_kv).view(b, t, self.h, self.nope + self.dv).transpose(1, 2)
        k = torch.cat([kvb[..., : self.nope], k_pe[:, None].expand(b, self.h, t, self.dr)], -1)
        v = kvb[..., self.nope :]
        allowed = torch.ones(t, t, dtype=torch.bool).tril()[None].expand(b, t, t)
        scores_ix = None
        if self.mode != "dense":
            cos_h, sin_h = cos[:, : self.dr // 2], sin[:, : self.dr // 2]
            scores_ix = self.indexer(x.detach(), q_latent.detach(), cos_h, sin_h)
            if self.mode == "sparse" and self.topk < t:
                pick = scores_ix.detach().masked_fill(~allowed, float("-inf"))
                idx = pick.topk(self.topk, -1).indices
                sel = torch.zeros(b, t, t, dtype=torch.bool).scatter_(2, idx, True)
                allowed = sel & allowed
        att = (q @ k.transpose(-1, -2)) * scale
        att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)  # [B, H, T, T]
        o = att @ v
        self.ix_loss = self.ix_kl = None
        if scores_ix is not None and torch.is_grad_enabled():
            target = att.detach().sum(1)
            target = target / target.sum(-1, keepdim=True)
            logq = scores_ix.masked_fill(~allowed, float("-inf")).log_softmax(-1)
            ce = -(target * logq.masked_fill(~allowed, 0.0)).sum(-1)  # [B, T]
            ent = -(target * target.clamp_min(1e-30).log()).sum(-1)
            self.ix_loss = ce.mean()
            self.ix_kl = (ce - ent).mean().detach()
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.h * self.dv))


def attentions(model):
    return [lay.self_attn for lay in list(model.layers) + [model.mtp_layer]]


def set_mode(model, mode):
    for a in attentions(model):
        a.mode = mode


def make_model(c, n_rows, seed):
    """tiny-py's module tree with SparseAttention in every layer (fresh indexers from seed)."""
    model = tt.TinyV3(c, n_rows, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    d = c["hidden_size"]
    out_std = (d**-0.5) / math.sqrt(2 * (c["num_hidden_layers"] + 1))
    for lay in list(model.layers) + [model.mtp_layer]:
        lay.self_attn = SparseAttention(c, gen, out_std)
    return model


def load_weights(model, ckpt_dir, active, allow_missing_indexer):
    """train_tiny's loader; the indexers keep their initialisation when the checkpoint has none
    (tiny-py's)."""
    tt.load_exported(model, ckpt_dir, active,
                     optional=lambda name: allow_missing_indexer and ".indexer." in name)


def export_tensors(model, active):
    t = tt.export_tensors(model, active)
    for i, lay in enumerate(list(model.layers) + [model.mtp_layer]):
        ix = lay.self_attn.indexer
        p = f"model.layers.{i}.self_attn.indexer."
        for name in ("wq_b", "wk"):  # FP8 with 128x128 scales, as released
            q, s = hf.quantize_fp8_blocks(getattr(ix, name).weight.detach().float())
            t[p + name + ".weight"] = q
            t[p + name + ".weight_scale_inv"] = s
        t[p + "k_norm.weight"] = tt.bf16(ix.k_norm.weight)
        t[p + "k_norm.bias"] = tt.bf16(ix.k_norm.bias)
        t[p + "weights_proj.weight"] = tt.bf16(ix.weights_proj.weight)
    return t


def batches(data, gen, steps):
    for _ in range(steps):
        starts = torch.randint(0, len(data) - tt.SEQ_LEN - 1, (tt.BATCH,), generator=gen)
        yield torch.stack([data[s : s + tt.SEQ_LEN + 1] for s in starts.tolist()])


def warmup(model, data, steps, seed, log):
    """Only the indexers train, toward the dense attention of a frozen main model."""
    set_mode(model, "warmup")
    ix_params = [p for a in attentions(model) for p in a.indexer.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in ix_params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(ix_params, lr=WARMUP_LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 11)
    t0 = time.time()
    model.eval()  # no MoE balance statistics while frozen
    for step, batch in enumerate(batches(data, gen, steps)):
        model(batch[:, :-1])
        loss = sum(a.ix_loss for a in attentions(model))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        rec = {"phase": "warmup", "step": step, "indexer_kl": [round(float(a.ix_kl), 4)
                                                              for a in attentions(model)],
               "seconds": round(time.time() - t0, 1)}
        log.append(rec)
        if step % 10 == 0 or step == steps - 1:
            print(json.dumps(rec), flush=True)
    for p in model.parameters():
        p.requires_grad_(True)
    return time.time() - t0


def sparse_train(model, data, steps, seed, log):
    set_mode(model, "sparse")
    ix_ids = {id(p) for a in attentions(model) for p in a.indexer.parameters()}
    ix = [p for p in model.parameters() if id(p) in ix_ids]
    decay = [p for p in model.parameters() if id(p) not in ix_ids and p.dim() == 2]
    other = [p for p in model.parameters() if id(p) not in ix_ids and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tt.WEIGHT_DECAY, "main": True},
                             {"params": other, "weight_decay": 0.0, "main": True},
                             {"params": ix, "weight_decay": 0.0, "lr": INDEXER_LR, "main": False}],
                            lr=SPARSE_LR, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 13)
    moes = model.moe_layers()
    t0 = time.time()
    for step, batch in enumerate(batches(data, gen, steps)):
        lr = SPARSE_LR_MIN + 0.5 * (SPARSE_LR - SPARSE_LR_MIN) * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            if g["main"]:
                g["lr"] = lr
        model.train()
        inp, tgt = batch[:, :-1], batch[:, 1:]
        hmain, hmtp = model(inp)
        main = model.nll(hmain, tgt).mean()
        mtp = model.nll(hmtp, tgt[:, 1:]).mean()
        bal = sum(m.balance_loss for m in moes)
        ixl = sum(a.ix_loss for a in attentions(model))
        loss = main + tt.MTP_LAMBDA * mtp + tt.ALPHA * bal + ixl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(decay + other, tt.CLIP)
        opt.step()
        with torch.no_grad():
            for m in moes:
                load = m.load.float()
                m.e_score_correction_bias -= tt.GAMMA * torch.sign(load - load.mean())
        rec = {"phase": "sparse", "step": step, "loss": round(main.item(), 4),
               "mtp_loss": round(mtp.item(), 4), "grad_norm": round(float(gnorm), 3),
               "lr": round(lr, 6), "indexer_kl": [round(float(a.ix_kl), 4) for a in attentions(model)],
               "seconds": round(time.time() - t0, 1)}
        log.append(rec)
        if step % 10 == 0 or step == steps - 1:
            print(json.dumps(rec), flush=True)
    return time.time() - t0


def evaluate(model, rows, ids, eval_tokens, mode):
    set_mode(model, mode)
    with torch.no_grad():
        r = tt.evaluate(model, rows, ids, eval_tokens)
    return {k: r[k] for k in ("tokens", "nats_per_token", "perplexity", "mtp_nats_per_token")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=os.path.join(tt.ROOT, "assets", "models", "tiny-py"),
                    help="tiny-py: a checkpoint directory or assets/models/tiny-py (weights.tar.xz)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup-steps", type=int, default=40)
    ap.add_argument("--sparse-steps", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-tokens", type=int, default=200 * tt.SEQ_LEN)
    ap.add_argument("--no-hf-check", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # subnormals (below 1.2e-38) are slow on x86
    torch.manual_seed(args.seed)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)

    streams, files = tt.tokenize_corpus()
    active, rows, _ = tt.make_rows(streams["train"], CONFIG["vocab_size"])
    model = make_model(CONFIG, len(active), args.seed)
    model.active = active
    with tempfile.TemporaryDirectory() as tmp:
        base = args.base
        if os.path.exists(os.path.join(base, "weights.tar.xz")):
            subprocess.run(["tar", "-xJf", os.path.join(base, "weights.tar.xz"), "-C", tmp],
                           check=True)
            for f in ("config.json", "model.safetensors.index.json"):
                subprocess.run(["cp", os.path.join(base, f), tmp], check=True)
            base = tmp
        load_weights(model, base, active, allow_missing_indexer=True)
    data = rows[torch.tensor(streams["train"])]
    held = streams["heldout"]
    card = {"base_dense": evaluate(model, rows, held, args.eval_tokens, "dense")}
    print("tiny-py, dense:", json.dumps(card["base_dense"]), flush=True)
    log = []
    warm_s = warmup(model, data, args.warmup_steps, args.seed, log)
    card["after_warmup_sparse"] = evaluate(model, rows, held, args.eval_tokens, "sparse")
    print("after the warm-up, sparse:", json.dumps(card["after_warmup_sparse"]), flush=True)
    sparse_s = sparse_train(model, data, args.sparse_steps, args.seed, log)
    tensors = export_tensors(model, active)
    hf.write_checkpoint(args.out, CONFIG, tensors, max_shard_bytes=64_000_000)
    load_weights(model, args.out, active, allow_missing_indexer=False)
    card["exported_sparse"] = evaluate(model, rows, held, args.eval_tokens, "sparse")
    card["exported_dense"] = evaluate(model, rows, held, args.eval_tokens, "dense")
    print("exported, sparse:", json.dumps(card["exported_sparse"]), flush=True)
    print("exported, dense: ", json.dumps(card["exported_dense"]), flush=True)
    hf_diff = None
    if not args.no_hf_check:
        set_mode(model, "sparse")
        probe = held[: tt.SEQ_LEN]
        hf_diff = tt.hf_check(model, args.out, probe, rows)
        print(f"transformers' DeepseekV32 vs this model on the export, {len(probe)} positions: "
              f"max |dlogprob| {hf_diff:.2e}", flush=True)
    summary = {
        "recipe": {"seq_len": tt.SEQ_LEN, "batch": tt.BATCH, "index_topk": INDEX_TOPK,
                   "index_n_heads": INDEX_N_HEADS, "index_head_dim": INDEX_HEAD_DIM,
                   "warmup_steps": args.warmup_steps, "warmup_lr": WARMUP_LR,
                   "sparse_steps": args.sparse_steps, "sparse_lr": [SPARSE_LR, SPARSE_LR_MIN],
                   "indexer_lr": INDEXER_LR, "seed": args.seed, "threads": args.threads},
        "cpu": tt.cpu_model(),
        "torch": torch.__version__,
        "warmup_seconds": round(warm_s, 1),
        "sparse_seconds": round(sparse_s, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "heldout": card,
        "transformers_max_abs_dlogprob": hf_diff,
        "log": log,
    }
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} ({summary['total_seconds']:.0f} s in all)")


if __name__ == "__main__":
    main()
