#!/usr/bin/env python3
"""Reference fixtures for the DeepSeek forward pass, from Hugging Face transformers.

Writes small random DeepSeek checkpoints in the official FP8 format (config.json, sharded
safetensors with an index, F8_E4M3 projection weights with 128x128-block F32 `weight_scale_inv`)
and, for each, tests/data/hf/<name>/expected.json: greedy decoding by transformers'
DeepseekV3ForCausalLM / DeepseekV2ForCausalLM in float32 (eager attention, no KV cache: the
full sequence is recomputed at every step) over the weights read back from those files and
dequantized here (fp8 -> float32 times the block scale).

Usage:
  tools/gen_hf_fixtures.py [--out tests/data/hf] [--only v3,yarn]   # (re)generate fixtures
  tools/gen_hf_fixtures.py --check DIR --prompt-ids 1,2,3 [--prompt-ids 4,5] [--steps 24]
      # run HF on any checkpoint directory (e.g. from `moeserve make-model`), print JSON

Semantics the C++ must follow are written down in docs/hf-reference.md.
Needs torch, transformers (5.x) and safetensors; CI only reads the committed fixtures.
Deterministic: every random draw comes from a torch.Generator seeded per fixture.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

BLOCK = 128  # weight_block_size of the official checkpoints
FP8_MAX = 448.0  # largest finite float8_e4m3fn
STEPS = 24
NEAR_TIE = 0.05  # top-2 logprob gap below which a step counts as a near-tie
MIN_GAP = 0.1  # prompts are drawn until every greedy step has at least this top-2 gap
PROXY_TOL = 0.1  # max |logprob| deviation of the BF16-input proxy on the recorded top-5 ids
MAX_ATTEMPTS = 40
EXPERT_OWN = 0.5  # share of a routed expert's weights (in std) that is its own
DOC_TOLERANCE = 1e-4  # max |logprob| difference allowed between transformers and doc_forward

# ---------------------------------------------------------------------------------------------
# Fixture definitions. Dimensions are deliberately not multiples of 128 (partial FP8 blocks).

_COMMON = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 0,
    "pretraining_tp": 1,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
    },
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "seq_aux": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
}

_V3 = dict(
    _COMMON,
    architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3",
    vocab_size=1024,
    hidden_size=200,
    intermediate_size=264,
    moe_intermediate_size=72,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    q_lora_rank=96,
    kv_lora_rank=160,
    qk_nope_head_dim=48,
    qk_rope_head_dim=32,
    v_head_dim=40,
    max_position_embeddings=4096,
    rope_scaling=None,
)

_V2LITE = dict(
    _COMMON,
    architectures=["DeepseekV2ForCausalLM"],
    model_type="deepseek_v2",
    bos_token_id=0,
    eos_token_id=1,
    vocab_size=1024,
    hidden_size=200,
    intermediate_size=264,
    moe_intermediate_size=72,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=8,
    num_key_value_heads=8,
    n_routed_experts=12,
    n_shared_experts=2,
    num_experts_per_tok=4,
    n_group=1,
    topk_group=1,
    topk_method="greedy",
    scoring_func="softmax",
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    q_lora_rank=None,
    kv_lora_rank=160,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    max_position_embeddings=4096,
    rope_scaling=None,
)
del _V2LITE["num_nextn_predict_layers"]  # V2 configs do not have MTP

_YARN_ROPE = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 4.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 64,
    "rope_type": "yarn",
    "type": "yarn",
}

_YARN = dict(_V3, max_position_embeddings=256, rope_scaling=dict(_YARN_ROPE))

# Optional variant: mscale != mscale_all_dim (cos/sin get attention_factor != 1). DeepSeek ships
# only equal values; this follows HF / DeepSeek's hub code (see docs/hf-reference.md).
_YARN_MSCALE = dict(
    _V3,
    num_hidden_layers=2,
    max_position_embeddings=256,
    rope_scaling=dict(_YARN_ROPE, mscale=1.0, mscale_all_dim=0.8),
)

FIXTURES = {
    "v3": {"config": _V3, "seed": 3, "prompt_lens": [1, 10, 70]},
    "v2lite": {"config": _V2LITE, "seed": 2, "prompt_lens": [1, 10, 70]},
    "yarn": {"config": _YARN, "seed": 5, "prompt_lens": [1, 50, 100]},
    "yarn_mscale": {"config": _YARN_MSCALE, "seed": 7, "prompt_lens": [50, 100]},
    # v3 and an MTP module (docs/mtp.md; drawn after every v3 tensor, so the main model and its
    # prompts are v3's): the module's draft rows are recorded too.
    "v3_mtp": {"config": dict(_V3, num_nextn_predict_layers=1), "seed": 3, "prompt_lens": [1, 10, 70]},
}

# ---------------------------------------------------------------------------------------------
# Weight generation and FP8 block quantization.


def _ceil_div(a, b):
    return (a + b - 1) // b


def quantize_fp8_blocks(w):
    """[out, in] float32 -> (fp8 [out, in], scale_inv f32 [ceil(out/128), ceil(in/128)])."""
    out_dim, in_dim = w.shape
    nbr, nbc = _ceil_div(out_dim, BLOCK), _ceil_div(in_dim, BLOCK)
    scale = torch.empty(nbr, nbc, dtype=torch.float32)
    q = torch.empty(out_dim, in_dim, dtype=torch.float8_e4m3fn)
    for br in range(nbr):
        for bc in range(nbc):
            rs = slice(br * BLOCK, min((br + 1) * BLOCK, out_dim))
            cs = slice(bc * BLOCK, min((bc + 1) * BLOCK, in_dim))
            blk = w[rs, cs]
            s = blk.abs().max().item() / FP8_MAX
            scale[br, bc] = s
            q[rs, cs] = (blk / scale[br, bc]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8_blocks(q, scale_inv):
    """fp8 [out, in] and f32 block scales -> float32 [out, in] (value * scale of its block)."""
    out_dim, in_dim = q.shape
    s = scale_inv.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return q.float() * s[:out_dim, :in_dim]


def _fp8_weight(gen, out_dim, in_dim, gain=1.0, base=None):
    """Random projection ~N(0, gain^2/in) with per-128x128-block gains in [e^-0.7, e^0.7].
    With `base` (a unit-variance [out, in] draw) the weight mixes it with its own draw."""
    w = torch.randn(out_dim, in_dim, generator=gen)
    if base is not None:
        w = math.sqrt(1 - EXPERT_OWN**2) * base + EXPERT_OWN * w
    w = w * (gain / math.sqrt(in_dim))
    nbr, nbc = _ceil_div(out_dim, BLOCK), _ceil_div(in_dim, BLOCK)
    gain = torch.exp((torch.rand(nbr, nbc, generator=gen) - 0.5) * 1.4)
    w = w * gain.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out_dim, :in_dim]
    return quantize_fp8_blocks(w)


def _norm_weight(gen, n):
    return (1.0 + 0.1 * (2.0 * torch.rand(n, generator=gen) - 1.0)).to(torch.bfloat16)


def make_weights(cfg, seed):
    """Checkpoint tensors in order, named as the official HF DeepSeek checkpoints."""
    gen = torch.Generator().manual_seed(seed)
    d, vocab = cfg["hidden_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    t = {}

    def proj(name, out_dim, in_dim, gain=1.0, base=None):
        q, s = _fp8_weight(gen, out_dim, in_dim, gain, base)
        t[name + ".weight"] = q
        t[name + ".weight_scale_inv"] = s

    def mlp(prefix, inter, base=(None, None, None)):
        proj(prefix + ".gate_proj", inter, d, 1.0, base[0])
        proj(prefix + ".up_proj", inter, d, 1.0, base[1])
        proj(prefix + ".down_proj", d, inter, 1.0, base[2])

    t["model.embed_tokens.weight"] = torch.randn(vocab, d, generator=gen).to(torch.bfloat16)

    def layer(i):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = _norm_weight(gen, d)
        if cfg["q_lora_rank"] is None:
            proj(p + "self_attn.q_proj", heads * qk_head, d)
        else:
            proj(p + "self_attn.q_a_proj", cfg["q_lora_rank"], d)
            t[p + "self_attn.q_a_layernorm.weight"] = _norm_weight(gen, cfg["q_lora_rank"])
            proj(p + "self_attn.q_b_proj", heads * qk_head, cfg["q_lora_rank"])
        proj(p + "self_attn.kv_a_proj_with_mqa", cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], d)
        t[p + "self_attn.kv_a_layernorm.weight"] = _norm_weight(gen, cfg["kv_lora_rank"])
        proj(
            p + "self_attn.kv_b_proj",
            heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]),
            cfg["kv_lora_rank"],
        )
        proj(p + "self_attn.o_proj", d, heads * cfg["v_head_dim"])
        t[p + "post_attention_layernorm.weight"] = _norm_weight(gen, d)
        if i < cfg["first_k_dense_replace"]:
            mlp(p + "mlp", cfg["intermediate_size"])
            return
        n_exp = cfg["n_routed_experts"]
        # Gate logits ~N(0, 2^2) on unit-RMS inputs: routing clearly prefers some experts.
        gate = torch.randn(n_exp, d, generator=gen) * (2.0 / math.sqrt(d))
        t[p + "mlp.gate.weight"] = gate.to(torch.bfloat16)
        if cfg["topk_method"] == "noaux_tc":
            # Non-negative so that 0.0-masking (DeepSeek's hub code) and -inf masking agree.
            t[p + "mlp.gate.e_score_correction_bias"] = 0.2 * torch.rand(n_exp, generator=gen)
        # Routed experts share a common component, so that a routing flip caused by rounding
        # (a near-tie between two experts) moves the output less than a routing bug does.
        mi = cfg["moe_intermediate_size"]
        base = (torch.randn(mi, d, generator=gen), torch.randn(mi, d, generator=gen),
                torch.randn(d, mi, generator=gen))
        for j in range(n_exp):
            mlp(p + f"mlp.experts.{j}", mi, base)
        mlp(p + "mlp.shared_experts", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])

    for i in range(cfg["num_hidden_layers"]):
        layer(i)
    t["model.norm.weight"] = _norm_weight(gen, d)
    # Logits ~N(0, 4^2): peaked enough that greedy steps are rarely near-ties.
    lm = torch.randn(vocab, d, generator=gen) * (4.0 / math.sqrt(d))
    t["lm_head.weight"] = lm.to(torch.bfloat16)
    if cfg.get("num_nextn_predict_layers", 0) > 0:
        # The MTP module as released: its own decoder layer, enorm/hnorm, a BF16 eh_proj over
        # [embedding; hidden], shared_head.norm, and copies of the embedding and the head.
        n = cfg["num_hidden_layers"]
        p = f"model.layers.{n}."
        layer(n)
        t[p + "enorm.weight"] = _norm_weight(gen, d)
        t[p + "hnorm.weight"] = _norm_weight(gen, d)
        eh = torch.randn(d, 2 * d, generator=gen) * (1.0 / math.sqrt(2 * d))
        t[p + "eh_proj.weight"] = eh.to(torch.bfloat16)
        t[p + "shared_head.norm.weight"] = _norm_weight(gen, d)
        t[p + "embed_tokens.weight"] = t["model.embed_tokens.weight"].clone()
        t[p + "shared_head.head.weight"] = t["lm_head.weight"].clone()
    return t


# ---------------------------------------------------------------------------------------------
# Checkpoint writing (official layout: config.json + 2 shards + model.safetensors.index.json).


def write_checkpoint(out_dir, cfg, tensors, max_shard_bytes=None):
    """Without max_shard_bytes: 2 shards, split near half of the bytes between a weight and its
    scale_inv. With it: shards in tensor order, each at most max_shard_bytes (or one tensor)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    names = list(tensors)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    if max_shard_bytes:
        shards, acc = [[]], 0
        for n, size in zip(names, sizes):
            if shards[-1] and acc + size > max_shard_bytes:
                shards.append([])
                acc = 0
            shards[-1].append(n)
            acc += size
    else:
        # Split near half of the bytes, at a point between a weight and its scale_inv, so that
        # a companion scale lives in another shard than its weight (the index must be followed).
        acc, split = 0, None
        for k, n in enumerate(names):
            acc += sizes[k]
            if acc >= total // 2 and n.endswith(".weight") and names[k + 1] == n + "_scale_inv":
                split = k + 1
                break
        assert split is not None
        shards = [names[:split], names[split:]]
    weight_map = {}
    for si, shard in enumerate(shards):
        fname = f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in shard}, os.path.join(out_dir, fname),
                  metadata={"format": "pt"})
        for n in shard:
            weight_map[n] = fname
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Loading a checkpoint directory into transformers (float32, dequantized).


def read_checkpoint(ckpt_dir):
    """All tensors of a directory (index.json shards, or a single model.safetensors)."""
    from safetensors.torch import load_file

    index_path = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fname in files:
        tensors.update(load_file(os.path.join(ckpt_dir, fname)))
    return tensors


def dequantize_all(raw):
    """Checkpoint tensors -> float32, FP8 weights multiplied by their 128x128 block scales."""
    out = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            assert name[: -len("_scale_inv")] in raw, f"orphan scale {name}"
            continue
        if t.dtype == torch.float8_e4m3fn:
            scale = raw.get(name + "_scale_inv")
            assert scale is not None, f"FP8 tensor {name} has no {name}_scale_inv"
            out[name] = dequantize_fp8_blocks(t, scale)
        else:
            assert name + "_scale_inv" not in raw, f"scale for non-FP8 tensor {name}"
            out[name] = t.float()
    return out


def to_hf_state_dict(weights, cfg):
    """Per-expert checkpoint names -> transformers' fused expert tensors."""
    n_layers = cfg["num_hidden_layers"]
    # transformers builds no MTP module: the checkpoint's layers >= num_hidden_layers are skipped.
    sd = {k: v for k, v in weights.items()
          if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= n_layers)}
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        gate_up, down = [], []
        for j in range(cfg["n_routed_experts"]):
            g = sd.pop(f"{p}{j}.gate_proj.weight")
            u = sd.pop(f"{p}{j}.up_proj.weight")
            gate_up.append(torch.cat([g, u], 0))  # [2I, D]
            down.append(sd.pop(f"{p}{j}.down_proj.weight"))  # [D, I]
        sd[p + "gate_up_proj"] = torch.stack(gate_up)  # [E, 2I, D]
        sd[p + "down_proj"] = torch.stack(down)  # [E, D, I]
    return sd


def build_hf_model(ckpt_dir):
    from transformers import (
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
    )

    with open(os.path.join(ckpt_dir, "config.json")) as f:
        cfg = json.load(f)
    hf_cfg_dict = {k: v for k, v in cfg.items() if k != "quantization_config"}
    hf_cfg_dict.pop("auto_map", None)
    if cfg["model_type"] == "deepseek_v3":
        config_cls, model_cls = DeepseekV3Config, DeepseekV3ForCausalLM
        if cfg.get("scoring_func", "sigmoid") != "sigmoid":
            raise SystemExit("transformers' DeepseekV3 router only implements scoring_func=sigmoid")
    elif cfg["model_type"] == "deepseek_v32":  # DeepSeek Sparse Attention (docs/dsa.md)
        from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

        config_cls, model_cls = DeepseekV32Config, DeepseekV32ForCausalLM
    elif cfg["model_type"] == "deepseek_v2":
        config_cls, model_cls = DeepseekV2Config, DeepseekV2ForCausalLM
        if cfg.get("norm_topk_prob"):
            print("warning: transformers' DeepseekV2 ignores norm_topk_prob", file=sys.stderr)
    else:
        raise SystemExit(f"unsupported model_type {cfg['model_type']}")
    hf_cfg = config_cls(**hf_cfg_dict)
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"
    torch.manual_seed(0)  # init values are all overwritten; keep it deterministic anyway
    model = model_cls(hf_cfg).float().eval()
    weights = dequantize_all(read_checkpoint(ckpt_dir))
    sd = to_hf_state_dict(weights, cfg)
    expected = set(model.state_dict().keys())
    missing, unexpected = expected - set(sd), set(sd) - expected
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={sorted(missing)} "
                         f"unexpected={sorted(unexpected)}")
    result = model.load_state_dict(sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for name, param in model.state_dict().items():
        assert param.dtype == torch.float32, f"{name} is {param.dtype}"
    return model, cfg, weights


# ---------------------------------------------------------------------------------------------
# Independent forward pass written from the formulas in docs/hf-reference.md (not from
# transformers). Generation checks that it agrees with transformers, which keeps the document
# that the C++ follows honest.


def doc_rms(v, w, eps):
    """RMSNorm (section 2)."""
    return w * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps))


def doc_rope(v, cos, sin):
    """Interleaved-pair RoPE (section 4): v [..., T, d_r], cos/sin [T, d_r/2]."""
    a, b = v[..., 0::2], v[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _mscale(factor, m):
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def doc_rope_params(cfg):
    """(inv_freq [d_r/2], attention_factor, softmax_scale) per docs/hf-reference.md."""
    d = cfg["qk_rope_head_dim"]
    base = float(cfg["rope_theta"])
    base_f = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # [d/2]
    scale = (cfg["qk_nope_head_dim"] + d) ** -0.5
    rs = cfg.get("rope_scaling")
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return base_f.float(), 1.0, scale
    assert rs.get("rope_type", rs.get("type")) == "yarn"
    f = rs.get("factor") or cfg["max_position_embeddings"] / rs["original_max_position_embeddings"]
    l0 = rs["original_max_position_embeddings"]

    def corr(n):
        return d * math.log(l0 / (n * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(rs.get("beta_fast") or 32)), 0)
    high = min(math.ceil(corr(rs.get("beta_slow") or 1)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrap = 1 - ramp
    inv_freq = base_f / f * (1 - extrap) + base_f * extrap
    ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
    if rs.get("attention_factor") is not None:
        attn = rs["attention_factor"]
    elif ms and msa:
        attn = _mscale(f, ms) / _mscale(f, msa)
    else:
        attn = _mscale(f, 1.0)
    if msa:
        scale *= _mscale(f, msa) ** 2
    return inv_freq.float(), attn, scale


def doc_v3_gate(logits, bias, cfg):
    """V3 routing (section 5): logits [T, E] -> (weights [T, k], indices [T, k], sigmoid
    affinities [T, E]). The choice carries no gradient; the weights do (tools/train_tiny.py)."""
    e, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    s = logits.sigmoid()
    with torch.no_grad():
        sb = s + bias
        gscore = sb.view(-1, ng, e // ng).topk(2, dim=-1).values.sum(-1)  # [T, ng]
        keep = torch.zeros_like(gscore, dtype=torch.bool)
        keep.scatter_(1, gscore.topk(tg, dim=-1).indices, True)
        sb = sb.masked_fill(~keep.repeat_interleave(e // ng, 1), float("-inf"))
        idx = sb.topk(k, dim=-1).indices
    wt = s.gather(1, idx)
    if cfg["norm_topk_prob"]:
        wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
    return wt * cfg["routed_scaling_factor"], idx, s


def _doc_gate(w, p, cfg, h):
    """h [T, D] -> (weights [T, k], indices [T, k])."""
    logits = h @ w[p + "gate.weight"].T  # [T, E]
    e, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    if cfg["model_type"] == "deepseek_v3":
        wt, idx, _ = doc_v3_gate(logits, w[p + "gate.e_score_correction_bias"], cfg)
        return wt, idx
    s = logits.softmax(-1)
    sc = s
    if cfg["topk_method"] == "group_limited_greedy":
        gscore = s.view(-1, ng, e // ng).amax(-1)
        keep = torch.zeros_like(gscore, dtype=torch.bool)
        keep.scatter_(1, gscore.topk(tg, dim=-1).indices, True)
        sc = s.masked_fill(~keep.repeat_interleave(e // ng, 1), 0.0)
    else:
        assert cfg["topk_method"] == "greedy"
    wt, idx = sc.topk(k, dim=-1)
    return wt * cfg["routed_scaling_factor"], idx


@torch.no_grad()
def doc_forward(w, cfg, ids):
    """Float32 logits [T, vocab] for token ids, from dequantized checkpoint tensors `w`."""
    t_len, heads = len(ids), cfg["num_attention_heads"]
    nope, dr, dv, kvl = (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"],
                         cfg["kv_lora_rank"])
    eps = cfg["rms_norm_eps"]
    inv_freq, attn_factor, softmax_scale = doc_rope_params(cfg)
    ang = torch.arange(t_len, dtype=torch.float32)[:, None] * inv_freq[None]  # [T, dr/2]
    cos, sin = ang.cos() * attn_factor, ang.sin() * attn_factor

    def rope(v):  # [..., T, dr]
        return doc_rope(v, cos, sin)

    def mlp(p, v):
        g = v @ w[p + "gate_proj.weight"].T
        return (torch.nn.functional.silu(g) * (v @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    causal = torch.full((t_len, t_len), float("-inf")).triu(1)  # [T, T]
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]  # [T, D]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = doc_rms(x, w[p + "input_layernorm.weight"], eps)  # [T, D]
        a = p + "self_attn."
        if cfg["q_lora_rank"] is None:
            q = h @ w[a + "q_proj.weight"].T
        else:
            qa = doc_rms(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6)
            q = qa @ w[a + "q_b_proj.weight"].T
        q = q.view(t_len, heads, nope + dr).transpose(0, 1)  # [H, T, nope+dr]
        q_nope, q_pe = q[..., :nope], rope(q[..., nope:])
        kv = h @ w[a + "kv_a_proj_with_mqa.weight"].T  # [T, kvl+dr]
        c = doc_rms(kv[:, :kvl], w[a + "kv_a_layernorm.weight"], 1e-6)  # [T, kvl]
        k_pe = rope(kv[:, kvl:])  # [T, dr]
        kvb = (c @ w[a + "kv_b_proj.weight"].T).view(t_len, heads, nope + dv).transpose(0, 1)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]  # [H, T, nope], [H, T, dv]
        scores = (q_nope @ k_nope.transpose(1, 2) + q_pe @ k_pe.T) * softmax_scale  # [H, T, T]
        probs = (scores + causal).softmax(-1)
        o = (probs @ v).transpose(0, 1).reshape(t_len, heads * dv)  # [T, H*dv]
        x = x + o @ w[a + "o_proj.weight"].T
        h = doc_rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if i < cfg["first_k_dense_replace"]:
            x = x + mlp(p + "mlp.", h)
            continue
        wt, idx = _doc_gate(w, p + "mlp.", cfg, h)  # [T, k]
        y = mlp(p + "mlp.shared_experts.", h)
        for t in range(t_len):
            for kk in range(idx.shape[1]):
                e = int(idx[t, kk])
                y[t] += wt[t, kk] * mlp(p + f"mlp.experts.{e}.", h[t : t + 1])[0]
        x = x + y
    return doc_rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T  # [T, vocab]


@torch.no_grad()
def compare_with_doc(model, weights, cfg, ids):
    """Max |logprob difference| over all positions between transformers and doc_forward."""
    hf = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    ref = doc_forward(weights, cfg, ids)
    return float((hf.log_softmax(-1) - ref.log_softmax(-1)).abs().max())


# ---------------------------------------------------------------------------------------------
# The MTP module (docs/mtp.md), on transformers' own decoder layer: transformers builds no MTP
# module, so its DeepseekV3DecoderLayer (layer_idx = num_hidden_layers: an MoE layer) is given
# the module's layer weights, and the parts around it follow DeepSeek-V3's README_WEIGHTS.md and
# report section 2.2: row p takes the embedding of t_{p+1} (enorm) and the main model's final
# hidden row at p (hnorm; transformers' last_hidden_state is after model.norm), eh_proj of the
# two concatenated (the embedding first, as the released weights are used), the layer, then
# shared_head.norm and shared_head.head (checked equal to lm_head, which the module shares).


def hf_mtp_layer(model, cfg, weights):
    """transformers' decoder layer holding the MTP module's layer weights."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    n_layers = cfg["num_hidden_layers"]
    p = f"model.layers.{n_layers}."
    layer = DeepseekV3DecoderLayer(model.config, layer_idx=n_layers).float().eval()
    own = {k[len(p):]: v for k, v in weights.items() if k.startswith(p)}
    sd = {k: v for k, v in own.items()
          if not k.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens."))
          and ".experts." not in k}
    gate_up, down = [], []
    for j in range(cfg["n_routed_experts"]):
        e = f"mlp.experts.{j}."
        gate_up.append(torch.cat([own[e + "gate_proj.weight"], own[e + "up_proj.weight"]], 0))
        down.append(own[e + "down_proj.weight"])
    sd["mlp.experts.gate_up_proj"] = torch.stack(gate_up)
    sd["mlp.experts.down_proj"] = torch.stack(down)
    layer.load_state_dict(sd, strict=True)
    return layer, own


@torch.no_grad()
def hf_mtp_logits(model, cfg, weights, ids):
    """Draft logits [T - 1, vocab] over token ids (row p predicts t_{p+2}), with transformers'
    main model and decoder layer."""
    layer, own = hf_mtp_layer(model, cfg, weights)
    eps = cfg["rms_norm_eps"]
    hidden = model.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
    n = len(ids) - 1
    e = doc_rms(weights["model.embed_tokens.weight"][torch.tensor(ids[1:])], own["enorm.weight"], eps)
    h = doc_rms(hidden[:n], own["hnorm.weight"], eps)
    x = torch.cat([e, h], -1) @ own["eh_proj.weight"].T  # [n, D]
    pos = torch.arange(n)[None]
    cos_sin = model.model.rotary_emb(x[None], pos)
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    y = layer(x[None], attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
    y = (y[0] if isinstance(y, tuple) else y)[0]
    if "shared_head.head.weight" in own:
        assert torch.equal(own["shared_head.head.weight"], weights["lm_head.weight"])
        assert torch.equal(own["embed_tokens.weight"], weights["model.embed_tokens.weight"])
    return doc_rms(y, own["shared_head.norm.weight"], eps) @ weights["lm_head.weight"].T


def mtp_record(model, cfg, weights, rec):
    """The draft rows over a prompt and its greedy continuation from the last prompt position
    on (the rows that propose drafts while decoding): top-5 logprobs, and whether each draft's
    argmax is the greedy token it would be verified against."""
    ids = rec["prompt_ids"] + rec["tokens"]
    logp = hf_mtp_logits(model, cfg, weights, ids).log_softmax(-1)
    first = len(rec["prompt_ids"]) - 1
    rows, tops, hits = [], [], 0
    for p in range(first, len(ids) - 1):
        vals, idx = torch.topk(logp[p], 5)
        rows.append(p)
        tops.append([{"id": int(i), "logprob": float(f"{v:.7g}")}
                     for v, i in zip(vals.tolist(), idx.tolist())])
        if p + 2 < len(ids):
            hits += int(idx[0]) == ids[p + 2]
    return {"rows": rows, "top_logprobs": tops,
            "greedy_match": float(f"{hits / max(1, len(rows) - 1):.4f}")}


# ---------------------------------------------------------------------------------------------
# Greedy decoding, full recompute per step.


@torch.no_grad()
def greedy(model, prompt_ids, steps):
    ids = list(prompt_ids)
    tokens, tops, gaps = [], [], []
    for _ in range(steps):
        x = torch.tensor([ids], dtype=torch.long)
        logits = model(input_ids=x, use_cache=False).logits[0, -1].float()  # [vocab]
        logp = torch.log_softmax(logits, dim=-1)
        vals, idx = torch.topk(logp, 5)
        tok = int(torch.argmax(logits).item())
        assert tok == int(idx[0])
        tokens.append(tok)
        tops.append([{"id": int(i), "logprob": float(f"{v:.7g}")} for v, i in zip(vals.tolist(), idx.tolist())])
        gaps.append(float(vals[0] - vals[1]))
        ids.append(tok)
    return {"prompt_ids": list(prompt_ids), "tokens": tokens, "top_logprobs": tops}, gaps


def round_linear_inputs_to_bf16(model):
    """Turns a float32 model into a proxy of a BF16-activation engine: every linear layer (and
    the experts) sees its input rounded to bfloat16; weights and accumulation stay float32."""

    def pre(_module, args, kwargs):
        args = tuple(a.to(torch.bfloat16).float() if torch.is_tensor(a) and a.is_floating_point()
                     else a for a in args)
        return args, kwargs

    for m in model.modules():
        if isinstance(m, torch.nn.Linear) or type(m).__name__.endswith("Experts"):
            m.register_forward_pre_hook(pre, with_kwargs=True)
    return model


@torch.no_grad()
def proxy_deviation(model, proxy, rec):
    """Teacher-forced on prompt + greedy tokens: (max |logprob difference| over each step's
    recorded top-5 ids, whether the proxy's argmax equals the greedy token at every step)."""
    ids = rec["prompt_ids"] + rec["tokens"]
    n = len(rec["prompt_ids"])
    x = torch.tensor([ids])
    a = model(input_ids=x, use_cache=False).logits[0, n - 1 : -1].float().log_softmax(-1)
    b = proxy(input_ids=x, use_cache=False).logits[0, n - 1 : -1].float().log_softmax(-1)
    top = torch.tensor([[e["id"] for e in step] for step in rec["top_logprobs"]])  # [steps, 5]
    dev = float((a.gather(1, top) - b.gather(1, top)).abs().max())
    same = b.argmax(-1).tolist() == rec["tokens"]
    return dev, same


def pick_prompt(model, proxy, seed, n, vocab, steps):
    """First of a deterministic series of random prompts of length n whose greedy decode is well
    conditioned: no top-2 gap below MIN_GAP, and the BF16-input proxy picks the same tokens with
    top-5 logprobs within PROXY_TOL (routing near-ties make some prompts fragile)."""
    best = None
    for attempt in range(MAX_ATTEMPTS):
        gen = torch.Generator().manual_seed(100000 * seed + 1000 * n + attempt)
        prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
        rec, gaps = greedy(model, prompt, steps)
        if min(gaps) < MIN_GAP and best is not None:
            continue  # not a candidate; skip the proxy pass
        dev, same = proxy_deviation(model, proxy, rec)
        ok = min(gaps) >= MIN_GAP and same and dev <= PROXY_TOL
        key = (ok, min(gaps) >= MIN_GAP, same, -dev)
        if best is None or key > best[0]:
            best = (key, rec, gaps, dev, attempt)
        if ok:
            break
    return best[1:]


def source_string():
    import transformers

    return f"transformers {transformers.__version__}, torch {torch.__version__}, float32"


def dir_size(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def generate(out_root, names, steps):
    for name in names:
        spec = FIXTURES[name]
        cfg = spec["config"]
        out_dir = os.path.join(out_root, name)
        t0 = time.time()
        tensors = make_weights(cfg, spec["seed"])
        write_checkpoint(out_dir, cfg, tensors)
        t1 = time.time()
        model, _, weights = build_hf_model(out_dir)
        proxy = round_linear_inputs_to_bf16(build_hf_model(out_dir)[0])
        t2 = time.time()
        prompts, min_gaps, devs = [], [], []
        for n in spec["prompt_lens"]:
            rec, gaps, dev, attempt = pick_prompt(model, proxy, spec["seed"], n,
                                                  cfg["vocab_size"], steps)
            prompts.append(rec)
            min_gaps.append(min(gaps))
            devs.append(dev)
            near = [k for k, g in enumerate(gaps) if g < NEAR_TIE]
            print(f"  {name}: prompt len {n:3d} (attempt {attempt}): min top-2 gap "
                  f"{min(gaps):.4f}, bf16-input proxy max |dlogprob| {dev:.4f}"
                  f"{' NEAR-TIE at steps ' + str(near) if near else ''}")
        if cfg.get("num_nextn_predict_layers", 0) > 0:
            for rec in prompts:
                rec["mtp"] = mtp_record(model, cfg, weights, rec)
                print(f"  {name}: MTP draft argmax = the next greedy token on "
                      f"{rec['mtp']['greedy_match']:.3f} of rows (random weights)")
        t3 = time.time()
        full = prompts[-1]["prompt_ids"] + prompts[-1]["tokens"]
        diff = compare_with_doc(model, weights, cfg, full)
        print(f"  {name}: transformers vs docs/hf-reference.md formulas over {len(full)} "
              f"positions: max |dlogprob| {diff:.2e}")
        if diff > DOC_TOLERANCE:
            raise SystemExit(f"{name}: transformers disagrees with docs/hf-reference.md ({diff})")
        expected = {
            "model": name,
            "source": source_string(),
            "steps": steps,
            "note": "greedy, eos ignored, full recompute per step, top-5 of log_softmax(fp32 logits)",
            "min_top2_gap": [float(f"{g:.7g}") for g in min_gaps],
            "bf16_input_proxy_max_dlogprob": [float(f"{v:.4g}") for v in devs],
            "prompts": prompts,
        }
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
            f.write("\n")
        print(f"{name}: {len(tensors)} tensors, {dir_size(out_dir) / 1e6:.2f} MB; "
              f"write {t1 - t0:.1f}s, load {t2 - t1:.1f}s, decode {t3 - t2:.1f}s, "
              f"doc check {time.time() - t3:.1f}s")


TRAINED = {
    "tiny-py": {"prompt_lens": [12, 96, 320], "steps": 40},
    # tiny-py continued as DeepSeek-V3.2 (tools/train_tiny_v32.py): prompts past its top-k (64),
    # so that attention is sparse. docs/hf-reference.md's formulas and the MTP record are V3's.
    # transformers' deepseek_v32 recomputes every step in full (~24 s for a 96-token prompt's 40
    # steps on 2 Zen 4 cores) and few prompts have no near tie in 40 steps (58 tried: none), so
    # the best of 3 per length is kept; its tests teacher-force and skip near ties
    # (tests/model/dsa_trained_test.cpp).
    "tiny-py-v32": {"prompt_lens": [96, 320], "steps": 40, "v3_formulas": False, "attempts": 3,
                    "out": os.path.join("..", "dsa")},
}


def heldout_prompts(n):
    """Deterministic candidate prompts of n tokens from the held-out split of
    tools/train_tiny.py's corpus: the tokens ending right after a `def ...:` or `class ...:`
    line, in corpus order."""
    import train_tiny
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(train_tiny.TOKENIZER)
    for rel, held in train_tiny.corpus_files():
        if not held:
            continue
        with open(os.path.join(train_tiny.CORPUS_DIR, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        offset = 0
        for line in text.splitlines(keepends=True):
            offset += len(line)
            head = line.lstrip()
            if (head.startswith("def ") or head.startswith("class ")) and line.rstrip().endswith(":"):
                ids = [train_tiny.BOS] + tok.encode(text[:offset], add_special_tokens=False).ids
                if len(ids) >= n:
                    yield rel, ids[-n:]


@torch.no_grad()
def index_boundary_ties(model, ids, topk):
    """DeepSeek Sparse Attention's exact ties at the top-k boundary over prompt + tokens: the
    rows (of any indexer, at or past topk) whose topk-th and next index scores are equal (in
    practice both 0.0: positions where every head's ReLU is zero). torch.topk leaves the order of
    ties unspecified, so such a row's picks, and everything after them, may differ from another
    implementation's (docs/dsa.md). The scores are read where deepseek_v32's indexer hands them to
    topk: a square [1, S, S] tensor."""
    rows = []
    topk_fn = torch.Tensor.topk

    def capture(self, k, *args, **kwargs):
        if self.dim() == 3 and self.shape[-1] == self.shape[-2] and self.shape[-1] > topk:
            rows.append(self[0].detach().clone())
        return topk_fn(self, k, *args, **kwargs)

    torch.Tensor.topk = capture
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        torch.Tensor.topk = topk_fn
    ties = 0
    for scores in rows:
        for t in range(topk, scores.shape[0]):
            v = topk_fn(scores[t, : t + 1], topk + 1).values
            ties += int(v[topk - 1] == v[topk])
    return ties


def generate_trained(out_root, name, models_dir):
    """Fixture of a trained checkpoint (not rewritten here): prompts from held-out text whose
    greedy continuation has a clear top-2 gap at every step and that the BF16-input proxy
    follows (the best of spec["attempts"] when none does); for DeepSeek Sparse Attention, first
    of all one without an exact tie at the index top-k boundary."""
    spec = TRAINED[name]
    ckpt = os.path.join(models_dir, name)
    model, cfg, weights = build_hf_model(ckpt)
    proxy = round_linear_inputs_to_bf16(build_hf_model(ckpt)[0])
    prompts, min_gaps, devs, sources = [], [], [], []
    for n in spec["prompt_lens"]:
        best = None
        tried = 0
        for attempt, (rel, ids) in enumerate(heldout_prompts(n)):
            if attempt >= 4 * MAX_ATTEMPTS or tried >= spec.get("attempts", 4 * MAX_ATTEMPTS):
                break
            if rel in sources:
                continue
            tried += 1
            rec, gaps = greedy(model, ids, spec["steps"])
            dev, same = proxy_deviation(model, proxy, rec)
            if cfg.get("index_topk"):  # a prompt without exact ties at the top-k boundary first
                rec["index_boundary_ties"] = index_boundary_ties(
                    model, rec["prompt_ids"] + rec["tokens"], cfg["index_topk"])
            key = (rec.get("index_boundary_ties", 0) == 0, min(gaps) >= MIN_GAP and same,
                   -dev if same else -1e9, min(gaps))
            if best is None or key > best[0]:
                best = (key, rec, gaps, dev, rel)
            if key[0] and key[1]:
                break
        _, rec, gaps, dev, rel = best
        if "index_boundary_ties" in rec:
            print(f"  {name}: {rec['index_boundary_ties']} rows with an exact tie at the index "
                  f"top-k boundary")
        prompts.append(rec)
        min_gaps.append(min(gaps))
        devs.append(dev)
        sources.append(rel)
        print(f"  {name}: prompt len {n} from {rel}: min top-2 gap {min(gaps):.4f}, "
              f"bf16-input proxy max |dlogprob| {dev:.4f}")
    v3_formulas = spec.get("v3_formulas", True)
    if cfg.get("num_nextn_predict_layers", 0) > 0 and v3_formulas:
        for rec in prompts:
            rec["mtp"] = mtp_record(model, cfg, weights, rec)
            print(f"  {name}: MTP draft argmax = the next greedy token on "
                  f"{rec['mtp']['greedy_match']:.3f} of rows")
    full = prompts[0]["prompt_ids"] + prompts[0]["tokens"]
    if v3_formulas:
        diff = compare_with_doc(model, weights, cfg, full)
        print(f"  {name}: transformers vs docs/hf-reference.md formulas: max |dlogprob| {diff:.2e}")
        if diff > DOC_TOLERANCE:
            raise SystemExit(f"{name}: transformers disagrees with docs/hf-reference.md ({diff})")
    expected = {
        "model": name,
        "checkpoint": name,  # under the build's models/ (CMake lays out assets/models/<name>)
        "trained": True,
        "source": source_string(),
        "steps": spec["steps"],
        "note": "greedy, eos ignored, full recompute per step, top-5 of log_softmax(fp32 logits)",
        "prompt_sources": sources,
        "min_top2_gap": [float(f"{g:.7g}") for g in min_gaps],
        "bf16_input_proxy_max_dlogprob": [float(f"{v:.4g}") for v in devs],
        "prompts": prompts,
    }
    # (A fixture the HF suite's strict trained-model checks do not fit lives beside its own test.)
    out_dir = os.path.normpath(os.path.join(out_root, spec.get("out", ""), name))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


def check(ckpt_dir, prompt_strs, steps, doc):
    t0 = time.time()
    model, cfg, weights = build_hf_model(ckpt_dir)
    t1 = time.time()
    prompts = []
    for s in prompt_strs:
        ids = [int(v) for v in s.replace(" ", "").split(",") if v]
        if not ids or min(ids) < 0 or max(ids) >= cfg["vocab_size"]:
            raise SystemExit(f"bad --prompt-ids {s!r} (ids must be in [0, {cfg['vocab_size']}))")
        rec, gaps = greedy(model, ids, steps)
        rec["min_top2_gap"] = float(f"{min(gaps):.7g}")
        if doc:
            rec["doc_max_abs_dlogprob"] = compare_with_doc(model, weights, cfg, ids + rec["tokens"])
        prompts.append(rec)
    t2 = time.time()
    print(json.dumps({"model": ckpt_dir, "source": source_string(), "steps": steps,
                      "prompts": prompts}, indent=1))
    print(f"load {t1 - t0:.1f}s, decode {t2 - t1:.1f}s", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf"))
    ap.add_argument("--only", default=",".join(FIXTURES), help="comma-separated fixture names")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--check", metavar="DIR", help="run HF on this checkpoint directory instead")
    ap.add_argument("--prompt-ids", action="append", default=[], help="comma-separated token ids")
    ap.add_argument("--doc-compare", action="store_true",
                    help="with --check: also compare with the docs/hf-reference.md forward pass")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models-dir", default=os.path.join(os.path.dirname(__file__), "..", "build", "models"),
                    help="where trained fixtures' checkpoints are (the build lays them out)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    if args.check:
        if not args.prompt_ids:
            ap.error("--check needs at least one --prompt-ids")
        check(args.check, args.prompt_ids, args.steps, args.doc_compare)
        return
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in FIXTURES and n not in TRAINED:
            ap.error(f"unknown fixture {n}; known: {', '.join(list(FIXTURES) + list(TRAINED))}")
    generate(os.path.normpath(args.out), [n for n in names if n in FIXTURES], args.steps)
    for n in names:
        if n in TRAINED:
            generate_trained(os.path.normpath(args.out), n, args.models_dir)


if __name__ == "__main__":
    main()
