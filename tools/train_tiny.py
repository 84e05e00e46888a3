#!/usr/bin/env python3
"""Trains the embedded default model: DeepSeek-V3's architecture at tiny widths, on the Python
standard library's source, and exports it in the official FP8 checkpoint format.

The model code here is this project's own, written from DeepSeek-V3's published architecture
(technical report arXiv:2412.19437 §2; the formulas the C++ follows are in docs/hf-reference.md):

- MLA with q_lora, interleaved RoPE with V3's YaRN scaling (factor 40 over 4096 positions,
  beta 32/1, mscale = mscale_all_dim = 1: the softmax scale grows by (0.1 ln 40 + 1)^2);
- a dense first layer, then MoE layers: sigmoid affinities, `noaux_tc` group-limited top-k
  (groups ranked by the sum of their top-2 biased affinities), the weights normalized over the
  chosen experts (unbiased affinities) and scaled by routed_scaling_factor, one shared expert;
- V3's auxiliary-loss-free balancing: after every step each layer's `e_score_correction_bias`
  moves by GAMMA against the sign of its expert's load minus the mean load (§2.1.2), plus the
  complementary sequence-wise balance loss with a tiny alpha;
- one MTP module (§2.2): for position p, eh_proj(concat(enorm(embed(t[p+1])), hnorm(H[p])))
  with H the main model's final-normed hidden (the lm_head input), one decoder layer, the shared
  head's norm and the shared lm_head, predicting t[p+2]; trained with weight MTP_LAMBDA = 0.3.
  The order (embedding first) is the released checkpoint's, as its serving engines read it.

Vocabulary: the real DeepSeek-V3 tokenizer (129,280 ids). Only ids that occur at least twice in
the training split get trainable embedding and lm_head rows; all other rows are exactly zero in
training and in the export (so the committed checkpoint compresses), and the loss still counts
the full 129,280-way softmax: each zero row has logit exactly 0, so together they add one class
of logit ln(V - U) to the normalizer (U = trained rows).

Corpus: every `*.py` under /usr/lib/python3.11 (Debian 12's libpython3.11-minimal and
libpython3.11-stdlib, PSF License 2.0), each file's text preceded by BOS, in path order. A file
is held out iff the first byte of sha256(relative path) is < HELDOUT_BYTE (about 10%).

Deterministic for a seed and thread count (every draw comes from seeded generators).

Usage:
  tools/train_tiny.py --out DIR [--steps N] [--seed S] [--threads 2]
  tools/train_tiny.py --out DIR --export-only        # re-export DIR/train_state.pt
Needs torch, tokenizers and transformers (the export is checked against it; --no-hf-check skips
that); CI needs none of them.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_hf_fixtures as hf  # noqa: E402  (FP8 block quantization, rope, checkpoint writing)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from machine import cpu_model  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOKENIZER = os.path.join(ROOT, "assets", "tokenizer", "deepseek-v3", "tokenizer.json")
CORPUS_DIR = "/usr/lib/python3.11"
HELDOUT_BYTE = 26  # sha256(path)[0] < 26: held out (26/256 ~ 10%)
MIN_COUNT = 2  # ids seen fewer times in the train split keep zero rows
BOS, EOS = 0, 1

SEQ_LEN = 512
BATCH = 8
LR = 3e-3
LR_MIN = 3e-4
WARMUP = 30
WEIGHT_DECAY = 0.1
CLIP = 1.0
GAMMA = 0.002  # bias update speed (V3: 0.001 over ~15T tokens; we have ~2M tokens of steps)
ALPHA = 1e-4  # sequence-wise balance loss weight (V3: "extremely small", 0.0001)
MTP_LAMBDA = 0.3  # V3's MTP loss weight for the first 10T tokens
EVAL_TOKENS = 860 * SEQ_LEN  # held-out tokens evaluated: every whole window of the split

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "kv_lora_rank": 128,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 128,
    "moe_layer_freq": 1,
    "n_group": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 192,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {  # DeepSeek-V3's own values
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 32,
    "vocab_size": 129280,
}

# ---------------------------------------------------------------------------------------------
# Corpus.


def corpus_files():
    """(relative path, held out?) for every .py file of the corpus, in path order."""
    out = []
    for dirpath, dirnames, filenames in os.walk(CORPUS_DIR):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), CORPUS_DIR)
                out.append((rel, hashlib.sha256(rel.encode()).digest()[0] < HELDOUT_BYTE))
    out.sort()
    return out


def tokenize_corpus():
    """{"train": [ids], "heldout": [ids]} (BOS before each file) and per-split file counts."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(TOKENIZER)
    streams = {"train": [], "heldout": []}
    files = {"train": [], "heldout": []}
    for rel, held in corpus_files():
        with open(os.path.join(CORPUS_DIR, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        split = "heldout" if held else "train"
        streams[split].append(BOS)
        streams[split].extend(tok.encode(text, add_special_tokens=False).ids)
        files[split].append(rel)
    return streams, files


# ---------------------------------------------------------------------------------------------
# Model.


rope = hf.doc_rope  # interleaved pairs, docs/hf-reference.md section 4


class Linear(torch.nn.Module):
    """y = x W^T with W [out, in] (the checkpoint's layout), no bias."""

    def __init__(self, out_dim, in_dim, gen, std=None):
        super().__init__()
        std = std if std is not None else in_dim**-0.5
        self.weight = torch.nn.Parameter(torch.randn(out_dim, in_dim, generator=gen) * std)

    def forward(self, x):
        return x @ self.weight.T


class Norm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return hf.doc_rms(x, self.weight, self.eps)


class Mlp(torch.nn.Module):
    def __init__(self, d, inter, gen, out_std):
        super().__init__()
        self.gate_proj = Linear(inter, d, gen)
        self.up_proj = Linear(inter, d, gen)
        self.down_proj = Linear(d, inter, gen, out_std)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(torch.nn.Module):
    def __init__(self, c, gen, out_std):
        super().__init__()
        d, h = c["hidden_size"], c["num_attention_heads"]
        self.h, self.nope, self.dr, self.dv = h, c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kvl = c["kv_lora_rank"]
        self.q_a_proj = Linear(c["q_lora_rank"], d, gen)
        self.q_a_layernorm = Norm(c["q_lora_rank"])
        self.q_b_proj = Linear(h * (self.nope + self.dr), c["q_lora_rank"], gen)
        self.kv_a_proj_with_mqa = Linear(self.kvl + self.dr, d, gen)
        self.kv_a_layernorm = Norm(self.kvl)
        self.kv_b_proj = Linear(h * (self.nope + self.dv), self.kvl, gen)
        self.o_proj = Linear(d, h * self.dv, gen, out_std)

    def forward(self, x, cos, sin, scale):
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, self.h, self.nope + self.dr).transpose(1, 2)  # [B, H, T, nope+dr]
        q = torch.cat([q[..., : self.nope], rope(q[..., self.nope :], cos, sin)], -1)
        kv = self.kv_a_proj_with_mqa(x)  # [B, T, kvl+dr]
        c_kv = self.kv_a_layernorm(kv[..., : self.kvl])
        k_pe = rope(kv[..., self.kvl :], cos, sin)  # [B, T, dr], shared by all heads
        kvb = self.kv_b_proj(c_kv).view(b, t, self.h, self.nope + self.dv).transpose(1, 2)
        k = torch.cat([kvb[..., : self.nope], k_pe[:, None].expand(b, self.h, t, self.dr)], -1)
        v = kvb[..., self.nope :]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # [B, H, T, dv]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.h * self.dv))


class Moe(torch.nn.Module):
    """Sigmoid affinities, noaux_tc group-limited top-k, one shared expert. Keeps the step's
    per-expert loads for the bias update and the sequence-wise balance loss."""

    def __init__(self, c, gen, out_std):
        super().__init__()
        d, self.e, self.k = c["hidden_size"], c["n_routed_experts"], c["num_experts_per_tok"]
        self.c = c
        self.gate = Linear(self.e, d, gen)
        self.register_buffer("e_score_correction_bias", torch.zeros(self.e))
        mi = c["moe_intermediate_size"]
        self.experts = torch.nn.ModuleList(Mlp(d, mi, gen, out_std) for _ in range(self.e))
        self.shared_experts = Mlp(d, mi * c["n_shared_experts"], gen, out_std)
        self.load = None  # [E] tokens routed to each expert in the last forward
        self.balance_loss = None

    def route(self, h):
        """h [N, D] -> (weights [N, k], idx [N, k], affinities [N, E])."""
        return hf.doc_v3_gate(h @ self.gate.weight.T, self.e_score_correction_bias, self.c)

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        w, idx, s = self.route(h)
        flat = idx.reshape(-1)  # [N*k]
        self.load = torch.bincount(flat, minlength=self.e).detach()
        if self.training:
            # V3 eq. 17-20, per sequence: f_i = E/(k T) * #tokens choosing i, P_i = mean of the
            # affinities normalized over all experts.
            chosen = torch.zeros(b * t, self.e).scatter_(1, idx, 1.0).view(b, t, self.e)
            f = chosen.sum(1) * (self.e / (self.k * t))  # [B, E]
            p = (s / s.sum(-1, keepdim=True)).view(b, t, self.e).mean(1)  # [B, E]
            self.balance_loss = (f * p).sum(-1).mean()
        y = self.shared_experts(h)
        order = torch.argsort(flat, stable=True)
        rows = order // self.k
        counts = self.load.tolist()
        wf = w.reshape(-1)[order]
        start = 0
        outs = []
        for j, n in enumerate(counts):
            if n:
                r = rows[start : start + n]
                outs.append(self.experts[j](h[r]) * wf[start : start + n, None])
            start += n
        y = y.index_add(0, rows, torch.cat(outs))
        return y.view(b, t, d)


class Layer(torch.nn.Module):
    def __init__(self, c, i, gen):
        super().__init__()
        d = c["hidden_size"]
        out_std = (d**-0.5) / math.sqrt(2 * (c["num_hidden_layers"] + 1))
        self.input_layernorm = Norm(d, c["rms_norm_eps"])
        self.self_attn = Attention(c, gen, out_std)
        self.post_attention_layernorm = Norm(d, c["rms_norm_eps"])
        dense = i < c["first_k_dense_replace"]
        self.mlp = Mlp(d, c["intermediate_size"], gen, out_std) if dense else Moe(c, gen, out_std)

    def forward(self, x, cos, sin, scale):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, scale)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyV3(torch.nn.Module):
    """Main model over compact rows: `rows[id]` is an id's row in embed/lm_head, or U (a fixed
    zero row) for ids without one."""

    def __init__(self, c, n_rows, seed):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        d = c["hidden_size"]
        self.c, self.vocab, self.n_rows = c, c["vocab_size"], n_rows
        self.embed = torch.nn.Parameter(torch.randn(n_rows, d, generator=gen))
        self.layers = torch.nn.ModuleList(Layer(c, i, gen) for i in range(c["num_hidden_layers"]))
        self.norm = Norm(d, c["rms_norm_eps"])
        self.lm_head = torch.nn.Parameter(torch.randn(n_rows, d, generator=gen) * d**-0.5)
        # The MTP module (checkpoint layer num_hidden_layers); embed and head are shared.
        self.enorm = Norm(d, c["rms_norm_eps"])
        self.hnorm = Norm(d, c["rms_norm_eps"])
        self.eh_proj = Linear(d, 2 * d, gen)
        self.mtp_layer = Layer(c, c["num_hidden_layers"], gen)
        self.shared_head_norm = Norm(d, c["rms_norm_eps"])
        inv_freq, self.attn_factor, self.scale = hf.doc_rope_params(c)
        self.register_buffer("inv_freq", inv_freq)

    def moe_layers(self):
        return [m.mlp for m in list(self.layers) + [self.mtp_layer] if isinstance(m.mlp, Moe)]

    def embed_rows(self, r):
        zero = torch.zeros(1, self.embed.shape[1])
        return torch.cat([self.embed, zero])[r]

    def logits(self, h):
        """Trained rows' logits [.., U] (the other V - U ids have logit exactly 0)."""
        return h @ self.lm_head.T

    def nll(self, h, target_rows):
        """Per-position -log p(target) under the full vocab-way softmax. The V - U zero rows are
        one extra class of logit ln(V - U); a target without a row has logit 0, so its loss is
        that class's cross-entropy plus ln(V - U)."""
        extra = math.log(self.vocab - self.n_rows)
        w = torch.cat([self.lm_head, torch.zeros(1, self.lm_head.shape[1])])
        bias = torch.zeros(self.n_rows + 1)
        bias[-1] = extra
        z = F.linear(h.reshape(-1, h.shape[-1]), w, bias)
        t = target_rows.reshape(-1)
        loss = F.cross_entropy(z, t, reduction="none") + (t == self.n_rows) * extra
        return loss.view(target_rows.shape)

    def forward(self, r):
        """r [B, T] rows -> (main hidden after the final norm [B, T, D], MTP hidden [B, T-1, D])."""
        t = r.shape[1]
        ang = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq[None]
        cos, sin = ang.cos() * self.attn_factor, ang.sin() * self.attn_factor
        x = self.embed_rows(r)
        for layer in self.layers:
            x = layer(x, cos, sin, self.scale)
        hmain = self.norm(x)
        # MTP: position p sees H[p] and the embedding of token p+1; it predicts token p+2.
        e = self.enorm(self.embed_rows(r[:, 1:]))
        m = self.eh_proj(torch.cat([e, self.hnorm(hmain[:, :-1])], -1))
        m = self.mtp_layer(m, cos[: t - 1], sin[: t - 1], self.scale)
        return hmain, self.shared_head_norm(m)


# ---------------------------------------------------------------------------------------------
# Training.


def lr_at(step, steps):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * p))


def make_rows(train_ids, vocab):
    counts = torch.bincount(torch.tensor(train_ids), minlength=vocab)
    counts[BOS] = max(int(counts[BOS]), MIN_COUNT)
    counts[EOS] = max(int(counts[EOS]), MIN_COUNT)
    active = torch.nonzero(counts >= MIN_COUNT).flatten()  # sorted ids with rows
    rows = torch.full((vocab,), len(active), dtype=torch.long)
    rows[active] = torch.arange(len(active))
    return active, rows, counts


def train(model, rows, train_ids, steps, seed, log):
    data = rows[torch.tensor(train_ids)]
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": other, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 1)
    moes = model.moe_layers()
    t0 = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(data) - SEQ_LEN - 1, (BATCH,), generator=gen)
        batch = torch.stack([data[s : s + SEQ_LEN + 1] for s in starts.tolist()])
        inp, tgt = batch[:, :-1], batch[:, 1:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        model.train()
        hmain, hmtp = model(inp)
        main = model.nll(hmain, tgt).mean()
        mtp = model.nll(hmtp, tgt[:, 1:]).mean()
        bal = sum(m.balance_loss for m in moes)
        loss = main + MTP_LAMBDA * mtp + ALPHA * bal
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        with torch.no_grad():  # V3's auxiliary-loss-free bias update, per layer
            for m in moes:
                load = m.load.float()
                m.e_score_correction_bias -= GAMMA * torch.sign(load - load.mean())
        rec = {"step": step, "loss": round(main.item(), 4), "mtp_loss": round(mtp.item(), 4),
               "balance": round(bal.item(), 4), "grad_norm": round(float(gnorm), 3),
               "lr": round(lr_at(step, steps), 6), "seconds": round(time.time() - t0, 1),
               "max_over_mean_load": [round(float(m.load.max() / m.load.float().mean()), 3)
                                      for m in moes]}
        log.append(rec)
        if step % 10 == 0 or step == steps - 1:
            print(json.dumps(rec), flush=True)
    return time.time() - t0


@torch.no_grad()
def evaluate(model, rows, ids, eval_tokens):
    """Held-out nats/token of the main model and the MTP module over the first EVAL_TOKENS
    tokens (windows of SEQ_LEN + 1), and per MoE layer the expert loads."""
    model.eval()
    n = min(eval_tokens, (len(ids) - 1) // SEQ_LEN * SEQ_LEN)
    data = rows[torch.tensor(ids[: n + 1])]
    main_sum, mtp_sum, main_n, mtp_n = 0.0, 0.0, 0, 0
    loads = [torch.zeros(m.e, dtype=torch.long) for m in model.moe_layers()]
    for s in range(0, n, SEQ_LEN * BATCH):
        wins = [data[i : i + SEQ_LEN + 1] for i in range(s, min(s + SEQ_LEN * BATCH, n), SEQ_LEN)]
        batch = torch.stack(wins)
        hmain, hmtp = model(batch[:, :-1])
        main_sum += model.nll(hmain, batch[:, 1:]).sum().item()
        mtp_sum += model.nll(hmtp, batch[:, 2:]).sum().item()
        main_n += hmain.shape[0] * hmain.shape[1]
        mtp_n += hmtp.shape[0] * hmtp.shape[1]
        for acc, m in zip(loads, model.moe_layers()):
            acc += m.load
    return {
        "tokens": main_n,
        "nats_per_token": main_sum / main_n,
        "perplexity": math.exp(main_sum / main_n),
        "mtp_nats_per_token": mtp_sum / mtp_n,
        "mtp_perplexity": math.exp(mtp_sum / mtp_n),
        "expert_load": [l.tolist() for l in loads],
        "max_over_mean_load": [float(l.max() / l.float().mean()) for l in loads],
    }


def bigram_baseline(train_ids, heldout_ids, vocab, eval_tokens):
    """Witten-Bell interpolated bigram counted on the train split, over the full vocabulary,
    scored on the same (previous, next) pairs as evaluate()."""
    tr = torch.tensor(train_ids)
    uni = torch.bincount(tr, minlength=vocab).double()
    p_uni = (uni + 1) / (uni.sum() + vocab)  # add-one unigram: every id has mass
    pair = tr[:-1] * vocab + tr[1:]
    keys, cnt = torch.unique(pair, return_counts=True)
    prev_of_key = keys // vocab
    c_prev = torch.bincount(prev_of_key, weights=cnt.double(), minlength=vocab)
    types = torch.bincount(prev_of_key, minlength=vocab).double()  # distinct successors
    n = min(eval_tokens, (len(heldout_ids) - 1) // SEQ_LEN * SEQ_LEN)
    ho = torch.tensor(heldout_ids[: n + 1])
    total, count = 0.0, 0
    for s in range(0, n, SEQ_LEN):
        w = ho[s : s + SEQ_LEN + 1]
        prev, nxt = w[:-1], w[1:]
        k = prev * vocab + nxt
        pos = torch.searchsorted(keys, k).clamp(max=len(keys) - 1)
        c = torch.where(keys[pos] == k, cnt[pos].double(), torch.zeros(len(k), dtype=torch.float64))
        cp, tp = c_prev[prev], types[prev]
        p = torch.where(cp > 0, (c + tp * p_uni[nxt]) / (cp + tp), p_uni[nxt])
        total += float(-p.log().sum())
        count += len(k)
    return {"tokens": count, "nats_per_token": total / count, "perplexity": math.exp(total / count)}


# ---------------------------------------------------------------------------------------------
# Export in the official layout.


def bf16(t):
    return t.detach().to(torch.bfloat16).contiguous()


def export_tensors(model, active):
    """Checkpoint tensors in order, named as DeepSeek's release (MTP as layer L)."""
    c, vocab = model.c, model.vocab
    t = {}
    full_embed = torch.zeros(vocab, c["hidden_size"])
    full_embed[active] = model.embed.detach()
    full_head = torch.zeros(vocab, c["hidden_size"])
    full_head[active] = model.lm_head.detach()

    def proj(name, lin):
        q, s = hf.quantize_fp8_blocks(lin.weight.detach().float())
        t[name + ".weight"] = q
        t[name + ".weight_scale_inv"] = s

    def mlp(p, m):
        for k in ("gate_proj", "up_proj", "down_proj"):
            proj(p + k, getattr(m, k))

    def layer(p, lay):
        t[p + "input_layernorm.weight"] = bf16(lay.input_layernorm.weight)
        a = lay.self_attn
        proj(p + "self_attn.q_a_proj", a.q_a_proj)
        t[p + "self_attn.q_a_layernorm.weight"] = bf16(a.q_a_layernorm.weight)
        proj(p + "self_attn.q_b_proj", a.q_b_proj)
        proj(p + "self_attn.kv_a_proj_with_mqa", a.kv_a_proj_with_mqa)
        t[p + "self_attn.kv_a_layernorm.weight"] = bf16(a.kv_a_layernorm.weight)
        proj(p + "self_attn.kv_b_proj", a.kv_b_proj)
        proj(p + "self_attn.o_proj", a.o_proj)
        t[p + "post_attention_layernorm.weight"] = bf16(lay.post_attention_layernorm.weight)
        if isinstance(lay.mlp, Mlp):
            mlp(p + "mlp.", lay.mlp)
            return
        m = lay.mlp
        t[p + "mlp.gate.weight"] = bf16(m.gate.weight)
        # Shifted to a minimum of 0: a constant added to every bias changes no choice, and a
        # non-negative bias makes DeepSeek's hub code (0.0-masking) choose as -inf masking does.
        b = m.e_score_correction_bias.detach().float()
        t[p + "mlp.gate.e_score_correction_bias"] = (b - b.min()).contiguous()
        for j, e in enumerate(m.experts):
            mlp(p + f"mlp.experts.{j}.", e)
        mlp(p + "mlp.shared_experts.", m.shared_experts)

    t["model.embed_tokens.weight"] = bf16(full_embed)
    for i, lay in enumerate(model.layers):
        layer(f"model.layers.{i}.", lay)
    t["model.norm.weight"] = bf16(model.norm.weight)
    t["lm_head.weight"] = bf16(full_head)
    p = f"model.layers.{c['num_hidden_layers']}."
    t[p + "embed_tokens.weight"] = bf16(full_embed)
    t[p + "enorm.weight"] = bf16(model.enorm.weight)
    t[p + "hnorm.weight"] = bf16(model.hnorm.weight)
    t[p + "eh_proj.weight"] = bf16(model.eh_proj.weight)  # BF16 in DeepSeek's release too
    layer(p, model.mtp_layer)
    t[p + "shared_head.norm.weight"] = bf16(model.shared_head_norm.weight)
    t[p + "shared_head.head.weight"] = bf16(full_head)
    return t


def load_exported(model, ckpt_dir, active, optional=lambda name: False):
    """Loads the exported (FP8-dequantized, BF16-rounded) weights back into the model, by the
    checkpoint's names; a parameter the checkpoint lacks is an error unless optional(name)."""
    w = hf.dequantize_all(hf.read_checkpoint(ckpt_dir))
    c = model.c
    L = c["num_hidden_layers"]
    with torch.no_grad():
        model.embed.copy_(w["model.embed_tokens.weight"][active])
        model.lm_head.copy_(w["lm_head.weight"][active])
        model.norm.weight.copy_(w["model.norm.weight"])
        model.enorm.weight.copy_(w[f"model.layers.{L}.enorm.weight"])
        model.hnorm.weight.copy_(w[f"model.layers.{L}.hnorm.weight"])
        model.eh_proj.weight.copy_(w[f"model.layers.{L}.eh_proj.weight"])
        model.shared_head_norm.weight.copy_(w[f"model.layers.{L}.shared_head.norm.weight"])
        layers = list(model.layers) + [model.mtp_layer]
        for i, lay in enumerate(layers):
            p = f"model.layers.{i}."
            for name, ref in lay.named_parameters():  # names are the checkpoint's
                if p + name not in w and optional(name):
                    continue
                ref.copy_(w[p + name])
            if isinstance(lay.mlp, Moe):
                lay.mlp.e_score_correction_bias.copy_(w[p + "mlp.gate.e_score_correction_bias"])


@torch.no_grad()
def full_logprobs(model, ids, rows):
    """[T, vocab] log-probabilities of the main model for a token sequence."""
    model.eval()
    hmain, _ = model(rows[torch.tensor(ids)][None])
    z = model.logits(hmain[0])  # [T, U]
    full = torch.zeros(len(ids), model.vocab)
    full[:, model.active] = z
    return full.log_softmax(-1)


def hf_check(model, ckpt_dir, ids, rows):
    """Max |logprob difference| over every position and every id between this model (holding
    the exported weights) and transformers' DeepseekV3ForCausalLM on the exported checkpoint."""
    hf_model, _, _ = hf.build_hf_model(ckpt_dir)
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    return float((theirs.log_softmax(-1) - full_logprobs(model, ids, rows)).abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--steps", type=int, default=720)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--export-only", action="store_true", help="re-export OUT/train_state.pt")
    ap.add_argument("--no-hf-check", action="store_true",
                    help="skip the comparison with transformers on the export")
    ap.add_argument("--eval-tokens", type=int, default=EVAL_TOKENS)
    ap.add_argument("--max-shard-mb", type=float, default=64.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    state_path = os.path.join(args.out, "train_state.pt")

    streams, files = tokenize_corpus()
    active, rows, counts = make_rows(streams["train"], CONFIG["vocab_size"])
    print(f"corpus: train {len(files['train'])} files / {len(streams['train'])} tokens, held out "
          f"{len(files['heldout'])} / {len(streams['heldout'])}; {len(active)} ids with rows",
          flush=True)
    model = TinyV3(CONFIG, len(active), args.seed)
    model.active = active
    log_path = os.path.join(args.out, "train_log.json")
    if args.export_only:
        state = torch.load(state_path)
        model.load_state_dict(state["model"])
        info = state["info"]
    else:
        log = []
        train_s = train(model, rows, streams["train"], args.steps, args.seed, log)
        info = {"steps": args.steps, "train_seconds": round(train_s, 1), "log": log}
        torch.save({"model": model.state_dict(), "info": info}, state_path)
    before = evaluate(model, rows, streams["heldout"], args.eval_tokens)
    print(f"held out before export: {before['nats_per_token']:.4f} nats, ppl {before['perplexity']:.2f}"
          f"; MTP {before['mtp_nats_per_token']:.4f}", flush=True)
    tensors = export_tensors(model, active)
    hf.write_checkpoint(args.out, CONFIG, tensors, max_shard_bytes=int(args.max_shard_mb * 1e6))
    load_exported(model, args.out, active)
    after = evaluate(model, rows, streams["heldout"], args.eval_tokens)
    bigram = bigram_baseline(streams["train"], streams["heldout"], CONFIG["vocab_size"],
                             args.eval_tokens)
    print(f"held out as exported: {after['nats_per_token']:.4f} nats, ppl {after['perplexity']:.2f}"
          f"; MTP {after['mtp_nats_per_token']:.4f}; bigram {bigram['nats_per_token']:.4f} / "
          f"{bigram['perplexity']:.2f}", flush=True)
    hf_diff = None
    if not args.no_hf_check:
        probe = streams["heldout"][:SEQ_LEN]
        hf_diff = hf_check(model, args.out, probe, rows)
        print(f"transformers vs this model on the exported weights, {len(probe)} positions x "
              f"{CONFIG['vocab_size']} ids: max |dlogprob| {hf_diff:.2e}", flush=True)
    summary = {
        "config": {"seq_len": SEQ_LEN, "batch": BATCH, "lr": LR, "lr_min": LR_MIN,
                   "warmup": WARMUP, "weight_decay": WEIGHT_DECAY, "clip": CLIP, "gamma": GAMMA,
                   "alpha": ALPHA, "mtp_lambda": MTP_LAMBDA, "seed": args.seed,
                   "threads": args.threads, "min_count": MIN_COUNT},
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "corpus": {"dir": CORPUS_DIR, "heldout_rule": f"sha256(relative path)[0] < {HELDOUT_BYTE}",
                   "train_files": len(files["train"]), "train_tokens": len(streams["train"]),
                   "heldout_files": len(files["heldout"]),
                   "heldout_tokens": len(streams["heldout"]),
                   "heldout_file_list": files["heldout"]},
        "ids_with_rows": len(active),
        "steps": info["steps"],
        "train_tokens_seen": info["steps"] * BATCH * SEQ_LEN,
        "train_seconds": info["train_seconds"],
        "total_seconds": round(time.time() - t_start, 1),
        "heldout_before_export": before,
        "heldout_as_exported": after,
        "bigram_baseline": bigram,
        "transformers_max_abs_dlogprob": hf_diff,
        "log": info["log"],
    }
    with open(log_path, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} ({summary['total_seconds']:.0f} s in all)")


if __name__ == "__main__":
    main()
