#!/usr/bin/env python3
"""Trains the trained tiny DeepSeek-V4's MTP module (one next-next-token block) with the main
model frozen, and exports it in DeepSeek's format beside the model (docs/mtp.md,
"DeepSeek-V4's module"), so that MTP speculative decoding has a module whose drafts mean something.

transformers' deepseek_v4 leaves the MTP module out; it is built here from transformers' own V4
parts as DeepSeek's inference/model.py (MTPBlock) composes it: for row p, carrying the main
model's residual streams after token p (before hc_head) and the embedding of token p + 1,
    x = e_proj(enorm(embed(t_{p+1}))) + h_proj(hnorm(streams_p))     (per stream)
    x = Block(x)       a V4 decoder layer (mHC, sliding-window attention, top-k MoE): the layer
                       after the main ones, ratio 0, not hash-routed
    logits = head(norm(hc_head(x)))                                   (the main model's head)
trained to predict t_{p+2} by cross entropy over tiny-v4's training split (tiny-py's corpus and
vocabulary; tools/train_tiny_v4.py). The block starts as a copy of the main model's last layer
(also sliding-window and top-k), h_proj as the identity and e_proj small, the norms and hc_head
as the main model's.

The card (mtp_train_log.json): held-out nats per token of t_{p+2}, and how often the module's
argmax equals the main model's argmax for the same position (the greedy acceptance of one draft
with the true context), trained and as exported (FP8 / FP4 rounded).

Export: mtp.safetensors (mtp.0.*, DeepSeek's names and formats: FP8 e4m3 with UE8M0 per
128 x 128, FP4 experts with UE8M0 per 32, BF16 norms, F32 mHC), the index gains its tensors and
config.json num_nextn_predict_layers 1 with the module's ratio 0 appended to compress_ratios.

  tools/train_tiny_v4_mtp.py --model build/models/tiny-v4 --out DIR [--steps N]
Needs torch, tokenizers, safetensors and transformers >= 5 (deepseek_v4); CI needs none.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_v4_fixture as fx  # noqa: E402
import train_tiny as tt  # noqa: E402
import train_tiny_v4 as tv  # noqa: E402

STEPS = 200
LR = 1e-3
LR_MIN = 1e-4
EVAL_WINDOWS = 96  # held-out windows of 512 scored (of 860)


def lr_at(step, steps):
    if step < tt.WARMUP:
        return LR * (step + 1) / tt.WARMUP
    p = (step - tt.WARMUP) / max(1, steps - tt.WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * p))


class Mtp(torch.nn.Module):
    """model.py's MTPBlock from transformers' V4 parts (embed and head are the main model's)."""

    def __init__(self, cfg, main):
        super().__init__()
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        D, n = cfg.hidden_size, cfg.num_hidden_layers - 1  # cfg counts the module's layer
        self.block = m.DeepseekV4DecoderLayer(cfg, n)
        self.block.load_state_dict(main.model.layers[n - 1].state_dict())
        self.e_proj = torch.nn.Linear(D, D, bias=False)
        self.h_proj = torch.nn.Linear(D, D, bias=False)
        with torch.no_grad():
            self.e_proj.weight.normal_(0, 0.1 / math.sqrt(D))
            self.h_proj.weight.copy_(torch.eye(D))
        self.enorm = m.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.hnorm = m.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.norm = m.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.norm.load_state_dict(main.model.norm.state_dict())
        self.hc_head = m.DeepseekV4HyperHead(cfg)
        self.hc_head.load_state_dict(main.model.hc_head.state_dict())
        self.cfg = cfg

    def forward(self, main, streams, next_ids, first_position=0, with_streams=False):
        from transformers.masking_utils import create_sliding_window_causal_mask

        e = self.enorm(main.model.embed_tokens(next_ids))
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(self.hnorm(streams))
        pos = torch.arange(first_position, first_position + x.shape[1]).unsqueeze(0)
        rope = main.model.rotary_emb
        pe = {"main": rope(e, position_ids=pos, layer_type="main"),
              "compress": rope(e, position_ids=pos, layer_type="compress")}
        mask = create_sliding_window_causal_mask(config=self.cfg, inputs_embeds=e,
                                                 attention_mask=None, cache=None, position_ids=pos)
        x = self.block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask,
                       input_ids=next_ids)
        logits = main.lm_head(self.norm(self.hc_head(x)))
        return (logits, x) if with_streams else logits


def main_streams(main, ids):
    """The main model's residual streams before hc_head [B, S, hc, D], and its logits."""
    got = {}
    h = main.model.hc_head.register_forward_hook(lambda mod, inp, out: got.update(s=inp[0]))
    with torch.no_grad():
        logits = main(input_ids=ids).logits
    h.remove()
    return got["s"], logits


def load_main(model_dir, c, rows, active):
    """tiny-v4 as exported, in transformers' compact-vocabulary form (train_tiny_v4's)."""
    from transformers import DeepseekV4ForCausalLM

    W, _ = fx.parse_safetensors_bytes(os.path.join(model_dir, "model.safetensors"))
    U = len(active)
    model = DeepseekV4ForCausalLM(tv.hf_config(c, U + 1)).float()
    model.set_experts_implementation("eager")
    sd = fx.official_to_hf(W, c)
    untrained = int(torch.nonzero(rows == U)[0])
    sd["model.embed_tokens.weight"] = torch.cat([W["embed.weight"][active],
                                                 W["embed.weight"][untrained: untrained + 1]])
    sd["lm_head.weight"] = torch.cat([W["head.weight"][active], torch.zeros(1, c["hidden_size"])])
    for L in range(c["num_hash_layers"]):
        full = W[f"layers.{L}.ffn.gate.tid2eid"]
        sd[f"model.layers.{L}.mlp.gate.tid2eid"] = torch.cat([full[active], full[:1]])
    own = model.state_dict()
    model.load_state_dict({n: sd[n].to(own[n].dtype) for n in own}, strict=True)
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    return model


@torch.no_grad()
def evaluate(main, mtp, data, other, windows):
    """Held-out nats per token of t_{p+2} and the share of rows whose argmax is the main
    model's argmax at p + 1."""
    mtp.eval()
    L = tt.SEQ_LEN
    total, agree, count = 0.0, 0, 0
    starts = list(range(0, windows * L, L))
    for s in range(0, len(starts), tt.BATCH):
        b = torch.stack([data[i: i + L + 1] for i in starts[s: s + tt.BATCH]])
        streams, logits = main_streams(main, b[:, :L])
        z = mtp(main, streams[:, : L - 1], b[:, 1:L])
        total += tv.nll(z, b[:, 2:], other).sum().item()
        agree += (z[..., :-1].argmax(-1) == logits[:, 1:, :-1].argmax(-1)).sum().item()
        count += b[:, 2:].numel()
    return total / count, agree / count


def export(mtp, c):
    """The module's official tensors (mtp.0.*) in DeepSeek's stored formats."""
    sd = {k: v.detach().float() for k, v in mtp.block.state_dict().items()}
    p = "mtp.0."
    W = {}
    for a, b in fx._HF_SUB:
        if b in sd:
            W[p + a] = sd[b]
    I = c["moe_intermediate_size"]
    gu, dn = sd["mlp.experts.gate_up_proj"], sd["mlp.experts.down_proj"]
    for e in range(c["n_routed_experts"]):
        W[f"{p}ffn.experts.{e}.w1.weight"] = gu[e, :I]
        W[f"{p}ffn.experts.{e}.w3.weight"] = gu[e, I:]
        W[f"{p}ffn.experts.{e}.w2.weight"] = dn[e]
    W[p + "e_proj.weight"] = mtp.e_proj.weight.detach()
    W[p + "h_proj.weight"] = mtp.h_proj.weight.detach()
    for n in ("enorm", "hnorm", "norm"):
        W[f"{p}{n}.weight"] = getattr(mtp, n).weight.detach()
    W[p + "hc_head_fn"] = mtp.hc_head.hc_fn.detach()
    W[p + "hc_head_base"] = mtp.hc_head.hc_base.detach()
    W[p + "hc_head_scale"] = mtp.hc_head.hc_scale.detach()
    out = {}
    for name, shape, kind, _ in fx.tensor_specs(c):
        if not name.startswith(p):
            continue
        w = W.pop(name).float()
        assert tuple(w.shape) == tuple(shape), (name, tuple(w.shape), shape)
        if kind == "fp8":
            out[name], out[name[: -len(".weight")] + ".scale"] = tv.quantize_fp8(w)
        elif kind == "fp4":
            out[name], out[name[: -len(".weight")] + ".scale"] = fx.quantize_fp4(w)
        elif kind == "bf16":
            out[name] = w.to(torch.bfloat16)
        else:
            out[name] = w
    assert not W, f"not exported: {sorted(W)}"
    return out


def tensor_bytes(path):
    """The bytes of a safetensors file's tensors (its header's data offsets)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for n, t in header.items()
               if n != "__metadata__")


def load_exported(mtp, path, c):
    """The module's weights from its exported (rounded) tensors, through the fixture's parser."""
    Wm, _ = fx.parse_safetensors_bytes(path)
    p = "mtp.0."
    bsd = {}
    for a, b in fx._HF_SUB:
        if p + a in Wm:
            bsd[b] = Wm[p + a]
    E = c["n_routed_experts"]
    bsd["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([Wm[f"{p}ffn.experts.{e}.w1.weight"], Wm[f"{p}ffn.experts.{e}.w3.weight"]], 0)
         for e in range(E)])
    bsd["mlp.experts.down_proj"] = torch.stack([Wm[f"{p}ffn.experts.{e}.w2.weight"] for e in range(E)])
    own = mtp.block.state_dict()
    for n in own:
        if n not in bsd:  # (buffers the export does not carry: kept)
            bsd[n] = own[n]
    mtp.block.load_state_dict({n: bsd[n].to(own[n].dtype) for n in own}, strict=True)
    with torch.no_grad():
        mtp.e_proj.weight.copy_(Wm[p + "e_proj.weight"])
        mtp.h_proj.weight.copy_(Wm[p + "h_proj.weight"])
        for n in ("enorm", "hnorm", "norm"):
            getattr(mtp, n).weight.copy_(Wm[f"{p}{n}.weight"])
        mtp.hc_head.hc_fn.copy_(Wm[p + "hc_head_fn"])
        mtp.hc_head.hc_base.copy_(Wm[p + "hc_head_base"])
        mtp.hc_head.hc_scale.copy_(Wm[p + "hc_head_scale"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="tiny-v4 (build/models/tiny-v4)")
    ap.add_argument("--out", required=True, help="a copy of the model with the module")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-windows", type=int, default=EVAL_WINDOWS,
                    help="held-out windows of 512 scored")
    args = ap.parse_args()
    from safetensors.torch import save_file

    t_start = time.time()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    c = json.load(open(os.path.join(args.model, "config.json")))
    c["compress_ratios"] = c["compress_ratios"][: c["num_hidden_layers"]]
    c["num_nextn_predict_layers"] = 0
    streams, _ = tt.tokenize_corpus()
    V = c["vocab_size"]
    active, rows, _ = tt.make_rows(streams["train"], V)
    other = math.log(V - len(active))
    main_model = load_main(args.model, c, rows, active)
    cm = dict(c, num_hidden_layers=c["num_hidden_layers"] + 1,
              compress_ratios=c["compress_ratios"] + [0])
    cfg = tv.hf_config(cm, len(active) + 1)
    cfg._experts_implementation = "eager"  # (the main model's: its weights as parameters)
    mtp = Mtp(cfg, main_model).float()

    train = rows[torch.tensor(streams["train"])]
    held = rows[torch.tensor(streams["heldout"])]
    before = evaluate(main_model, mtp, held, other, args.eval_windows)
    print(json.dumps({"before": before}), flush=True)
    params = [p for p in mtp.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tt.WEIGHT_DECAY},
                             {"params": rest, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed + 1)
    L, log, t0 = tt.SEQ_LEN, [], time.time()
    for step in range(args.steps):
        starts = torch.randint(0, len(train) - L - 1, (tt.BATCH,), generator=gen)
        b = torch.stack([train[s: s + L + 1] for s in starts.tolist()])
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, args.steps)
        s, _ = main_streams(main_model, b[:, :L])
        mtp.train()
        loss = tv.nll(mtp(main_model, s[:, : L - 1], b[:, 1:L]), b[:, 2:], other).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, tt.CLIP)
        opt.step()
        rec = {"step": step, "loss": round(loss.item(), 4), "grad_norm": round(float(gnorm), 3),
               "lr": round(lr_at(step, args.steps), 6), "seconds": round(time.time() - t0, 1)}
        log.append(rec)
        if step % 10 == 0 or step == args.steps - 1:
            print(json.dumps(rec), flush=True)
    train_seconds = time.time() - t0
    trained = evaluate(main_model, mtp, held, other, args.eval_windows)

    # The copy with the module: the main files as they are, mtp.safetensors, the index and config.
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.model):
        if f.endswith(".safetensors") or f.startswith("tokenizer"):
            shutil.copy(os.path.join(args.model, f), args.out)
    cm_out = json.load(open(os.path.join(args.model, "config.json")))
    cm_out["num_nextn_predict_layers"] = 1
    cm_out["compress_ratios"] = c["compress_ratios"] + [0]
    tensors = export(mtp, cm_out)
    st_path = os.path.join(args.out, "mtp.safetensors")
    save_file(tensors, st_path, metadata={"format": "pt"})
    os.chmod(st_path, 0o644)
    index = json.load(open(os.path.join(args.model, "model.safetensors.index.json")))
    for name in tensors:
        index["weight_map"][name] = "mtp.safetensors"
    index["metadata"]["total_size"] = sum(  # (the main shards' bytes and the module's)
        tensor_bytes(os.path.join(args.out, f)) for f in set(index["weight_map"].values()))
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cm_out, f, indent=2)
        f.write("\n")

    # The exported (rounded) module read back through the fixture's byte parser.
    load_exported(mtp, st_path, cm_out)
    exported = evaluate(main_model, mtp, held, other, args.eval_windows)
    card = {
        "model": "tiny DeepSeek-V4's MTP module, tools/train_tiny_v4_mtp.py",
        "cpu": open("/proc/cpuinfo").read().split("model name\t: ")[1].split("\n")[0],
        "torch": torch.__version__,
        "steps": args.steps, "batch": tt.BATCH, "seq_len": L,
        "train_tokens_seen": args.steps * tt.BATCH * L,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "heldout_windows": args.eval_windows,
        "heldout_next_next_nats_per_token": {"initial": before[0], "trained_f32": trained[0],
                                             "exported_fp8_fp4": exported[0]},
        "agreement_with_main_argmax": {"initial": before[1], "trained_f32": trained[1],
                                       "exported_fp8_fp4": exported[1]},
        "log": log,
    }
    with open(os.path.join(args.out, "mtp_train_log.json"), "w") as f:
        json.dump(card, f, indent=1)
    print(json.dumps({k: card[k] for k in card if k != "log"}, indent=1))


if __name__ == "__main__":
    main()
