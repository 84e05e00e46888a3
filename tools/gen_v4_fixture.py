#!/usr/bin/env python3
"""Reference fixture for the DeepSeek-V4 loader and forward pass, from Hugging Face transformers.

Writes a tiny random DeepSeek-V4 checkpoint in DeepSeek's official published format and
transformers' outputs on it, for the C++ loader and forward pass to be tested against
(the model is described in docs/deepseek-v4.md, with DeepSeek's tensor names):

  config.json        hub-style config (model_type deepseek_v4, compress_ratios with the MTP entry,
                     rope_scaling yarn, num_hash_layers, expert_dtype fp4, quantization_config fp8
                     e4m3 / ue8m0 / 128x128)
  model.safetensors  official names (embed.weight, layers.N.attn.wq_a.weight, ..., mtp.0.*) and
                     dtypes: F8_E4M3 projections + F8_E8M0 `<name>.scale` per 128x128 block; routed
                     experts FP4 e2m1 packed two per byte as I8 [out, in/2] (element 2j in the low
                     nibble) + F8_E8M0 `.scale` [out, in/32]; BF16 embed/head/norms/router/
                     compressors/indexer weights_proj; F32 hc_*, attn_sink, ape, gate.bias; I64
                     gate.tid2eid. The MTP layer (mtp.0.*) is complete although transformers
                     ignores it.
  expected.json      the arguments, the prompt ids, the top-5 log-probabilities (full-vocab
                     log_softmax of float32 logits) at EVERY prompt position of one full forward,
                     then 12 greedy steps decoded with transformers' cache (incremental), each
                     step's token and top-5; the indexer/router/greedy tie margins of the chosen
                     prompt; the cached-decode-vs-full-forward difference; self-checks.

transformers' DeepseekV4ForCausalLM runs in float32 (eager attention, eager experts) on the
weights read back from model.safetensors and dequantized (FP8 x 2^(scale-127), e2m1 LUT x
2^(scale-127), BF16 as is), loaded by mapping the official names to transformers' names.
Sizes: 6 layers (sliding, HCA 128, CSA 4, HCA 128, CSA 4, sliding; hash MoE on 0-2) + MTP; a
300-token prompt crosses the 16-token window many times, has 2 complete HCA groups and a partial
one, and 75 CSA groups with index_topk 8, so the indexer's selection matters. The prompt is the
first of a seeded series whose indexer top-k, MoE top-k and greedy choices have no near-ties
and whose greedy tokens are neither bos nor eos.

Self-checks (recorded in expected.json, failing the run if off): the checkpoint re-read with a
plain byte parser (no safetensors) dequantizes to the same tensors; a fresh model from a fresh
read gives the same logits; transformers' own from_pretrained on the official files (its name
mapping and FP8/FP4 dequantization) yields bit-identical tensors except the FP8 ones with a partial
block in a multi-block grid (transformers derives the block from the shapes); an independent FP32
re-implementation of DeepSeek's inference/model.py math (`ref_forward`, official names, byte
parser's tensors) agrees with transformers' recorded top-5 logprobs to 1e-4.

Usage:
  python3 tools/gen_v4_fixture.py [--out tests/data/v4/tiny] [--seed 0]
      [--prompt-len 300] [--steps 12] [--no-ref]

Needs torch, transformers (>= 5.25, DeepseekV4) and safetensors (>= 0.6, F8_E8M0); CI only reads
the committed files. Deterministic for a seed: every draw comes from a seeded torch.Generator.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

FP8_BLOCK = 128  # weight_block_size
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP4_BLOCK = 32  # routed-expert scale block along the input dim
FP4_MAX = 6.0  # largest e2m1
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
HEAD_GAIN = 3.0  # lm head ~N(0, (3/sqrt(D))^2): logits std ~3, greedy steps are rarely near-ties
EXPERT0_GAIN = 3.5  # expert 0's w1/w3: pre-activations ~N(0, 12), some swiglu clamps (limit 10) fire
TIE_TOL = 1e-6  # indexer |k-th - (k+1)-th| at or below this counts as a tie
MIN_INDEX_GAP = 3e-5  # wanted: indexer top-k boundary margin (its scores are O(0.1-1))
MIN_ROUTER_GAP = 3e-5  # wanted: MoE top-k boundary margin of sqrtsoftplus(logit) + bias
MIN_TOP2_GAP = 0.05  # wanted: greedy top-2 logprob gap at every decode step
MAX_ATTEMPTS = 30
REF_TOLERANCE = 1e-4  # max |logprob| difference allowed between transformers and ref_forward

# ---------------------------------------------------------------------------------------------
# The hub-style config (the keys of DeepSeek's V4-Flash config.json).

RATIOS = [0, 128, 4, 128, 4, 0]  # sliding, HCA, CSA, HCA, CSA, sliding
MTP_RATIO = 0

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": len(RATIOS),
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    # q_lora_rank 160 (not a multiple of 128): wq_a's scale grid is [2, 1] and wq_b's [1, 2] with a
    # partial last block, indexer.wq_b's [2, 2] (row stride 2, partial last column block).
    "q_lora_rank": 160,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 16,
    "compress_ratios": RATIOS + [MTP_RATIO],
    "compress_rope_theta": 160000.0,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    # index_head_dim 32 (not 16): a multiple of the FP4 block (32) and a power of two, as
    # DeepSeek's Hadamard + FP4 indexer simulation requires; IH*ID = 256 also gives
    # indexer.wq_b two 128-row FP8 blocks.
    "index_n_heads": 8,
    "index_head_dim": 32,
    "index_topk": 8,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "rms_norm_eps": 1e-06,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "topk_method": "noaux_tc",
    "num_hash_layers": 3,
    "swiglu_limit": 10.0,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "expert_dtype": "fp4",
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
    },
}

# ---------------------------------------------------------------------------------------------
# Quantization (ue8m0 power-of-two scales, stored as the biased exponent byte).


def _ceil_div(a, b):
    return (a + b - 1) // b


def ue8m0_exponent(x):
    """ceil(log2(x)) for positive float32 x, exactly (frexp: x = m * 2^e, m in [0.5, 1))."""
    m, e = torch.frexp(x)
    return torch.where(m == 0.5, e - 1, e).to(torch.int32)


def e8m0_tensor(exp):
    """Biased exponent bytes (value 2^(byte-127)) as a float8_e8m0fnu tensor."""
    assert int(exp.min()) >= -127 and int(exp.max()) <= 127
    return (exp + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_value(scale):
    return torch.exp2(scale.view(torch.uint8).to(torch.float32) - 127.0)


def quantize_fp8(w):
    """[out, in] float32 -> (float8_e4m3fn [out, in], e8m0 [ceil(out/128), ceil(in/128)]),
    scale = 2^ceil(log2(amax/448)) per block (partial last blocks where dims are not multiples).
    Blocks (r, c) with r + c odd are first scaled by 1/2, so that a multi-block tensor's blocks
    have different scales (a wrong block index shows)."""
    o, i = w.shape
    nr, nc = _ceil_div(o, FP8_BLOCK), _ceil_div(i, FP8_BLOCK)
    odd = (torch.arange(nr)[:, None] + torch.arange(nc)[None, :]) % 2
    gain = torch.pow(0.5, odd.float())
    w = w * gain.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:o, :i]
    pad = torch.zeros(nr * FP8_BLOCK, nc * FP8_BLOCK)
    pad[:o, :i] = w
    amax = pad.view(nr, FP8_BLOCK, nc, FP8_BLOCK).abs().amax(dim=(1, 3))
    exp = ue8m0_exponent(amax / FP8_MAX)
    assert nr * nc == 1 or len(set(exp.flatten().tolist())) > 1, "multi-block tensor with one scale"
    s = torch.exp2(exp.float()).repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:o, :i]
    q = (w / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, e8m0_tensor(exp)


def dequantize_fp8(q, scale):
    o, i = q.shape
    s = e8m0_value(scale).repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return q.float() * s[:o, :i]


def quantize_fp4(w):
    """[out, in] float32 -> (int8 [out, in/2] packed e2m1, element 2j in the low nibble,
    e8m0 [out, in/32]); scale = 2^ceil(log2(amax/6)) per 32 inputs, values rounded to the
    nearest e2m1 (ties to the smaller magnitude)."""
    o, i = w.shape
    assert i % FP4_BLOCK == 0
    blocks = w.view(o, i // FP4_BLOCK, FP4_BLOCK)
    exp = ue8m0_exponent(blocks.abs().amax(-1) / FP4_MAX)
    v = (blocks / torch.exp2(exp.float()).unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX).view(o, i)
    mags = torch.tensor(E2M1[:8])
    idx = (v.abs().unsqueeze(-1) - mags).abs().argmin(-1)  # first minimum: ties go down
    code = idx | ((v < 0) & (idx > 0)).long() * 8
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, e8m0_tensor(exp)


def dequantize_fp4(packed, scale):
    b = packed.view(torch.uint8).long()
    codes = torch.stack([b & 15, b >> 4], -1).flatten(-2)  # [out, in]
    vals = torch.tensor(E2M1)[codes]
    return vals * e8m0_value(scale).repeat_interleave(FP4_BLOCK, 1)


# ---------------------------------------------------------------------------------------------
# Weights: (official name, shape, storage, init) in checkpoint order.


def tensor_specs(c):
    D, V, H, Dh = c["hidden_size"], c["vocab_size"], c["num_attention_heads"], c["head_dim"]
    qr, G, R, I = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"], c["moe_intermediate_size"]
    E, k, hc = c["n_routed_experts"], c["num_experts_per_tok"], c["hc_mult"]
    IH, ID = c["index_n_heads"], c["index_head_dim"]
    mix = (2 + hc) * hc
    specs = [("embed.weight", (V, D), "bf16", "embed")]

    def block(p, ratio, hashed):
        out = [
            (p + "hc_attn_fn", (mix, hc * D), "f32", "linear"),
            (p + "hc_attn_base", (mix,), "f32", "hc_base"),
            (p + "hc_attn_scale", (3,), "f32", "hc_scale"),
            (p + "attn_norm.weight", (D,), "bf16", "norm"),
            (p + "attn.attn_sink", (H,), "f32", "sink"),
            (p + "attn.wq_a.weight", (qr, D), "fp8", "linear"),
            (p + "attn.q_norm.weight", (qr,), "bf16", "norm"),
            (p + "attn.wq_b.weight", (H * Dh, qr), "fp8", "linear"),
            (p + "attn.wkv.weight", (Dh, D), "fp8", "linear"),
            (p + "attn.kv_norm.weight", (Dh,), "bf16", "norm"),
            (p + "attn.wo_a.weight", (G * R, H * Dh // G), "fp8", "linear"),
            (p + "attn.wo_b.weight", (D, G * R), "fp8", "linear"),
        ]
        if ratio:
            cdim = (2 if ratio == 4 else 1) * Dh
            out += [
                (p + "attn.compressor.wkv.weight", (cdim, D), "bf16", "linear"),
                (p + "attn.compressor.wgate.weight", (cdim, D), "bf16", "linear"),
                (p + "attn.compressor.ape", (ratio, cdim), "f32", "ape"),
                (p + "attn.compressor.norm.weight", (Dh,), "bf16", "norm"),
            ]
        if ratio == 4:
            out += [
                (p + "attn.indexer.wq_b.weight", (IH * ID, qr), "fp8", "linear"),
                (p + "attn.indexer.weights_proj.weight", (IH, D), "bf16", "linear"),
                (p + "attn.indexer.compressor.wkv.weight", (2 * ID, D), "bf16", "linear"),
                (p + "attn.indexer.compressor.wgate.weight", (2 * ID, D), "bf16", "linear"),
                (p + "attn.indexer.compressor.ape", (4, 2 * ID), "f32", "ape"),
                (p + "attn.indexer.compressor.norm.weight", (ID,), "bf16", "norm"),
            ]
        out += [
            (p + "hc_ffn_fn", (mix, hc * D), "f32", "linear"),
            (p + "hc_ffn_base", (mix,), "f32", "hc_base"),
            (p + "hc_ffn_scale", (3,), "f32", "hc_scale"),
            (p + "ffn_norm.weight", (D,), "bf16", "norm"),
            (p + "ffn.gate.weight", (E, D), "bf16", "linear"),
        ]
        out.append((p + "ffn.gate.tid2eid", (V, k), "i64", "tid2eid") if hashed
                   else (p + "ffn.gate.bias", (E,), "f32", "gate_bias"))
        for e in range(E):
            gain = "expert0" if e == 0 else "linear"
            out += [
                (p + f"ffn.experts.{e}.w1.weight", (I, D), "fp4", gain),
                (p + f"ffn.experts.{e}.w2.weight", (D, I), "fp4", "linear"),
                (p + f"ffn.experts.{e}.w3.weight", (I, D), "fp4", gain),
            ]
        out += [
            (p + "ffn.shared_experts.w1.weight", (I, D), "fp8", "linear"),
            (p + "ffn.shared_experts.w2.weight", (D, I), "fp8", "linear"),
            (p + "ffn.shared_experts.w3.weight", (I, D), "fp8", "linear"),
        ]
        return out

    n = c["num_hidden_layers"]
    for L in range(n):
        specs += block(f"layers.{L}.", c["compress_ratios"][L], L < c["num_hash_layers"])
    specs += [
        ("norm.weight", (D,), "bf16", "norm"),
        ("head.weight", (V, D), "bf16", "head"),
        ("hc_head_fn", (hc, hc * D), "f32", "linear"),
        ("hc_head_base", (hc,), "f32", "hc_base"),
        ("hc_head_scale", (1,), "f32", "hc_scale"),
    ]
    for m in range(c["num_nextn_predict_layers"]):
        p = f"mtp.{m}."
        specs += block(p, c["compress_ratios"][n + m], False)
        specs += [
            (p + "e_proj.weight", (D, D), "fp8", "linear"),
            (p + "h_proj.weight", (D, D), "fp8", "linear"),
            (p + "enorm.weight", (D,), "bf16", "norm"),
            (p + "hnorm.weight", (D,), "bf16", "norm"),
            (p + "norm.weight", (D,), "bf16", "norm"),
            (p + "hc_head_fn", (hc, hc * D), "f32", "linear"),
            (p + "hc_head_base", (hc,), "f32", "hc_base"),
            (p + "hc_head_scale", (1,), "f32", "hc_scale"),
        ]
    return specs


def make_tensors(c, seed):
    """Checkpoint tensors {official name: stored tensor}; O(1) activations: linears
    ~N(0, 1/fan_in), norms 1 + 0.1 N, mHC base/scale, sinks, ape O(1) (as v4_tiny_hf.py)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, kind, init in tensor_specs(c):
        if init == "tid2eid":  # distinct experts per token id
            E, k = c["n_routed_experts"], shape[1]
            out[name] = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(shape[0])]).long()
            continue
        w = torch.randn(*shape, generator=g)
        if init == "linear":
            w = w / math.sqrt(shape[1])
        elif init == "expert0":
            w = w * (EXPERT0_GAIN / math.sqrt(shape[1]))
        elif init == "head":
            w = w * (HEAD_GAIN / math.sqrt(shape[1]))
        elif init == "norm":
            w = 1.0 + 0.1 * w
        elif init in ("hc_base", "ape"):
            w = 0.5 * w
        elif init == "hc_scale":
            w = 0.5 + torch.rand(*shape, generator=g)
        elif init == "gate_bias":
            w = 0.1 * w
        else:
            assert init in ("embed", "sink"), init
        if kind == "fp8":
            out[name], out[name[: -len(".weight")] + ".scale"] = quantize_fp8(w)
        elif kind == "fp4":
            out[name], out[name[: -len(".weight")] + ".scale"] = quantize_fp4(w)
        elif kind == "bf16":
            out[name] = w.to(torch.bfloat16)
        else:
            out[name] = w.float()
    return out


# ---------------------------------------------------------------------------------------------
# Reading back: safetensors, and a plain byte parser (what a C++ loader does).


def dequantize_all(raw):
    """Stored tensors -> float32 (FP8/FP4 times their scales); I64 stays I64."""
    out = {}
    for name, t in raw.items():
        if name.endswith(".scale"):
            assert name[: -len("scale")] + "weight" in raw, f"orphan scale {name}"
            continue
        scale = raw.get(name[: -len("weight")] + "scale") if name.endswith(".weight") else None
        if t.dtype == torch.float8_e4m3fn:
            out[name] = dequantize_fp8(t, scale)
        elif t.dtype == torch.int8:
            out[name] = dequantize_fp4(t, scale)
        elif t.dtype == torch.int64:
            out[name] = t
        else:
            assert scale is None, name
            out[name] = t.float()
    return out


def parse_safetensors_bytes(path):
    """Independent reader: header JSON + raw little-endian bytes decoded by hand to float32
    (F8_E4M3 via torch's e4m3 decode of the bytes; the rest from the bit patterns)."""
    import numpy as np

    data = open(path, "rb").read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hlen])
    header.pop("__metadata__", None)
    body = memoryview(data)[8 + hlen :]
    raw, dtypes = {}, {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        buf, shape, dt = bytes(body[a:b]), h["shape"], h["dtype"]
        dtypes[name] = dt
        if dt == "F32":
            raw[name] = np.frombuffer(buf, "<f4").reshape(shape).astype(np.float64)
        elif dt == "BF16":
            raw[name] = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        elif dt == "I64":
            raw[name] = np.frombuffer(buf, "<i8").reshape(shape)
        elif dt == "F8_E8M0":
            raw[name] = np.ldexp(1.0, np.frombuffer(buf, np.uint8).astype(np.int32) - 127).reshape(shape)
        elif dt == "F8_E4M3":
            u = np.frombuffer(buf, np.uint8).astype(np.int32)
            sign = np.where(u >> 7, -1.0, 1.0)
            e, m = (u >> 3) & 15, u & 7
            val = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1 + m / 8.0, e - 7))
            assert not np.any((e == 15) & (m == 7)), f"NaN in {name}"
            raw[name] = (sign * val).reshape(shape)
        elif dt == "I8":
            u = np.frombuffer(buf, np.uint8).reshape(shape)
            lut = np.array(E2M1)
            raw[name] = np.stack([lut[u & 15], lut[u >> 4]], -1).reshape(shape[0], shape[1] * 2)
        else:
            raise SystemExit(f"{name}: unexpected dtype {dt}")
    out = {}
    for name, v in raw.items():
        if name.endswith(".scale"):
            continue
        s = raw.get(name[: -len("weight")] + "scale") if name.endswith(".weight") else None
        if s is not None:
            rb = v.shape[0] // s.shape[0] if dtypes[name] == "I8" else FP8_BLOCK
            cb = FP4_BLOCK if dtypes[name] == "I8" else FP8_BLOCK
            v = v * np.repeat(np.repeat(s, rb, 0), cb, 1)[: v.shape[0], : v.shape[1]]
        out[name] = torch.from_numpy(np.array(v))
    return out, dtypes


# ---------------------------------------------------------------------------------------------
# transformers' model over the official tensors.

_HF_SUB = [  # (official suffix, transformers suffix) inside layers.N. / model.layers.N.
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn.attn_sink", "self_attn.sinks"),
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"),
    ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"),
    ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"),
    ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"),
    ("attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
    ("attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    ("attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("ffn.gate.weight", "mlp.gate.weight"),
    ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
    ("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"),
]
_HF_TOP = [
    ("embed.weight", "model.embed_tokens.weight"),
    ("head.weight", "lm_head.weight"),
    ("norm.weight", "model.norm.weight"),
    ("hc_head_fn", "model.hc_head.hc_fn"),
    ("hc_head_base", "model.hc_head.hc_base"),
    ("hc_head_scale", "model.hc_head.hc_scale"),
]


def official_to_hf(W, c):
    """Dequantized official tensors -> transformers' state dict (mtp.* dropped: not modelled)."""
    sd, used = {}, set()
    for a, b in _HF_TOP:
        sd[b] = W[a]
        used.add(a)
    E = c["n_routed_experts"]
    for L in range(c["num_hidden_layers"]):
        p, q = f"layers.{L}.", f"model.layers.{L}."
        for a, b in _HF_SUB:
            if p + a in W:
                sd[q + b] = W[p + a]
                used.add(p + a)
        w = {n: [W[f"{p}ffn.experts.{e}.{n}.weight"] for e in range(E)] for n in ("w1", "w2", "w3")}
        used.update(f"{p}ffn.experts.{e}.{n}.weight" for e in range(E) for n in ("w1", "w2", "w3"))
        sd[q + "mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([a, b], 0) for a, b in zip(w["w1"], w["w3"])])  # [E, 2I, D]
        sd[q + "mlp.experts.down_proj"] = torch.stack(w["w2"])  # [E, D, I]
    left = {n for n in W if n not in used and not n.startswith("mtp.")}
    assert not left, f"unmapped official tensors: {sorted(left)}"
    return sd


def build_hf_model(c, W):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    hf = {k: v for k, v in c.items() if k not in ("quantization_config", "expert_dtype")}
    cfg = DeepseekV4Config(**hf)  # reads the hub keys (compress_ratios, rope_scaling, ...)
    want = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    assert cfg.layer_types == [want[r] for r in c["compress_ratios"][: c["num_hidden_layers"]]]
    assert cfg.mlp_layer_types == ["hash_moe"] * c["num_hash_layers"] + ["moe"] * (
        c["num_hidden_layers"] - c["num_hash_layers"])
    assert cfg.qk_rope_head_dim == c["qk_rope_head_dim"]
    comp = cfg.rope_parameters["compress"]
    assert comp["rope_type"] == "yarn" and comp["attention_factor"] == 1.0
    assert comp["rope_theta"] == c["compress_rope_theta"] and comp["factor"] == c["rope_scaling"]["factor"]
    assert cfg.rope_parameters["main"]["rope_type"] == "default"
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)  # every value is overwritten below; deterministic anyway
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    model.set_experts_implementation("eager")
    sd = official_to_hf(W, c)
    sd = {k: (v if v.dtype == torch.int64 else v.float()) for k, v in sd.items()}
    missing, unexpected = set(model.state_dict()) - set(sd), set(sd) - set(model.state_dict())
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={sorted(missing)} unexpected={sorted(unexpected)}")
    model.load_state_dict(sd, strict=True)
    for name, t in model.state_dict().items():
        assert t.dtype in (torch.float32, torch.int64), f"{name} is {t.dtype}"
    return model, cfg


# ---------------------------------------------------------------------------------------------
# Running transformers: full forward with tie margins, cached greedy decode.


def top5(logits):
    logp = torch.log_softmax(logits.float(), -1)
    vals, idx = torch.topk(logp, 5)
    return [{"id": int(i), "logprob": float(f"{v:.7g}")} for v, i in zip(vals.tolist(), idx.tolist())]


class Margins:
    """Forward hooks on the indexer scorers and the top-k routers: the smallest gap between the
    k-th and (k+1)-th best valid indexer score (and how many are <= TIE_TOL: exact ties, whose
    order is implementation-defined), and between the k-th and (k+1)-th expert by
    sqrtsoftplus(logit) + bias, over every query position of the calls made while attached.
    Set `pos0` to the absolute position of a call's first token before the call."""

    def __init__(self, model, cfg):
        self.model, self.cfg, self.pos0, self.hooks = model, cfg, 0, []
        self.idx_gap, self.ties, self.router_gap = math.inf, 0, math.inf
        for layer in model.model.layers:
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                self.hooks.append(comp.indexer.scorer.register_forward_hook(self._index))
            if not layer.mlp.is_hash:
                self.hooks.append(layer.mlp.gate.register_forward_hook(self._router))

    def _index(self, mod, inp, out):
        k, r = self.cfg.index_topk, self.cfg.compress_rates["compressed_sparse_attention"]
        sc = out[0]  # [S, entries]
        for j in range(sc.shape[0]):
            n = (self.pos0 + j + 1) // r
            if n > k:
                v = sc[j, :n].sort(descending=True).values
                gap = float(v[k - 1] - v[k])
                self.idx_gap = min(self.idx_gap, gap)
                self.ties += int(gap <= TIE_TOL)

    def _router(self, mod, inp, out):
        k = self.cfg.num_experts_per_tok
        v = (F.softplus(out[0]).sqrt() + mod.e_score_correction_bias).sort(-1, descending=True).values
        self.router_gap = min(self.router_gap, float((v[:, k - 1] - v[:, k]).min()))

    def detach(self):
        for h in self.hooks:
            h.remove()


@torch.no_grad()
def cached_greedy(model, cfg, prompt, steps):
    """Prefill the prompt with a cache, then one token per call. Returns the tokens, the logits
    [steps, V] each step chose from, and the margins seen on the way."""
    from transformers import DynamicCache

    cache = DynamicCache(config=cfg)
    m = Margins(model, cfg)
    try:
        out = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        tokens, rows = [], []
        for s in range(steps):
            row = out.logits[0, -1].float()
            rows.append(row)
            tokens.append(int(row.argmax()))
            if s + 1 < steps:
                m.pos0 = len(prompt) + s
                out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
    finally:
        m.detach()
    return tokens, torch.stack(rows), m


def try_prompt(model, cfg, prompt, steps):
    tokens, dec, m = cached_greedy(model, cfg, prompt, steps)
    lp = dec.log_softmax(-1).sort(-1, descending=True).values
    top2 = float((lp[:, 0] - lp[:, 1]).min())
    return {"tokens": tokens, "decode_logits": dec, "idx_gap": m.idx_gap, "ties": m.ties,
            "router_gap": m.router_gap, "top2": top2}


@torch.no_grad()
def full_forward(model, cfg, ids):
    """Logits [S, V] of one full forward (no cache) and its margins."""
    m = Margins(model, cfg)
    try:
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    finally:
        m.detach()
    return logits, m


# ---------------------------------------------------------------------------------------------
# Independent reference: DeepSeek's inference/model.py math,
# prefill from position 0, FP32, without the FP8/FP4 activation simulation and the Hadamard
# rotation (orthogonal, cancels in q.k without quantization). Official names, hub config.


def ref_forward(W, oc, ids):
    D, H, Dh, rd = oc["hidden_size"], oc["num_attention_heads"], oc["head_dim"], oc["qk_rope_head_dim"]
    eps, hc, win = oc["rms_norm_eps"], oc["hc_mult"], oc["sliding_window"]
    S = ids.shape[0]
    ys = oc["rope_scaling"]

    def rms(x, w=None):
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        return y * w if w is not None else y

    def angles(base, yarn):
        freqs = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
        if yarn:
            orig, fac, bf, bs = ys["original_max_position_embeddings"], ys["factor"], ys["beta_fast"], ys["beta_slow"]
            cdim = lambda nr: rd * math.log(orig / (nr * 2 * math.pi)) / (2 * math.log(base))
            lo, hi = max(math.floor(cdim(bf)), 0), min(math.ceil(cdim(bs)), rd - 1)
            if lo == hi:
                hi += 0.001
            ramp = ((torch.arange(rd // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
            smooth = 1 - ramp
            freqs = freqs / fac * (1 - smooth) + freqs * smooth
        return torch.outer(torch.arange(S, dtype=torch.float32), freqs)  # [S, rd/2]

    def rope(x, ang, inverse=False):  # rotate the trailing rd dims, interleaved pairs (2i, 2i+1)
        x = x.clone()
        r = x[..., -rd:].unflatten(-1, (-1, 2))
        c, s = ang.cos(), ang.sin()
        if inverse:
            s = -s
        a, b = r[..., 0], r[..., 1]
        x[..., -rd:] = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
        return x

    def compressor(x, P, ratio, d, overlap, ang):
        kv, sc = x @ W[P + "wkv.weight"].T, x @ W[P + "wgate.weight"].T
        n = S // ratio
        kv = kv[: n * ratio].view(n, ratio, -1)
        sc = sc[: n * ratio].view(n, ratio, -1) + W[P + "ape"]
        if overlap:
            nk = kv.new_zeros(n, 2 * ratio, d)
            ns = sc.new_full((n, 2 * ratio, d), float("-inf"))
            nk[:, ratio:], ns[:, ratio:] = kv[..., d:], sc[..., d:]
            nk[1:, :ratio], ns[1:, :ratio] = kv[:-1, :, :d], sc[:-1, :, :d]
            kv, sc = nk, ns
        out = (kv * sc.softmax(dim=1)).sum(1)
        out = rms(out, W[P + "norm.weight"])
        return rope(out, ang[0 : n * ratio : ratio])

    def hc_pre(x, p):
        xf = x.flatten(-2)
        mixes = (xf @ W[p + "_fn"].T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        sc, base = W[p + "_scale"], W[p + "_base"]
        pre = torch.sigmoid(mixes[:, :hc] * sc[0] + base[:hc]) + oc["hc_eps"]
        post = 2 * torch.sigmoid(mixes[:, hc : 2 * hc] * sc[1] + base[hc : 2 * hc])
        comb = mixes[:, 2 * hc :].view(-1, hc, hc) * sc[2] + base[2 * hc :].view(hc, hc)
        comb = comb.softmax(-1) + oc["hc_eps"]
        comb = comb / (comb.sum(-2, keepdim=True) + oc["hc_eps"])
        for _ in range(oc["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + oc["hc_eps"])
            comb = comb / (comb.sum(-2, keepdim=True) + oc["hc_eps"])
        return (pre.unsqueeze(-1) * x).sum(1), post, comb

    def hc_post(f, res, post, comb):  # out[k] = post[k] f + sum_j comb[j,k] res[j]
        return post.unsqueeze(-1) * f.unsqueeze(1) + torch.einsum("sjk,sjd->skd", comb, res)

    def expert(x, P, lim):
        g = (x @ W[P + "w1.weight"].T).clamp(max=lim)
        u = (x @ W[P + "w3.weight"].T).clamp(-lim, lim)
        return F.silu(g) * u, W[P + "w2.weight"]

    t_idx = torch.arange(S)
    h = W["embed.weight"][ids].unsqueeze(1).repeat(1, hc, 1)
    for L in range(oc["num_hidden_layers"]):
        p = f"layers.{L}."
        ratio = oc["compress_ratios"][L]
        ang = angles(oc["compress_rope_theta"], True) if ratio else angles(oc["rope_theta"], False)
        res = h
        x, post, comb = hc_pre(h, p + "hc_attn")
        x = rms(x, W[p + "attn_norm.weight"])
        A = p + "attn."
        qr = rms(x @ W[A + "wq_a.weight"].T, W[A + "q_norm.weight"])
        q = rope(rms((qr @ W[A + "wq_b.weight"].T).view(S, H, Dh)), ang[:, None])
        kv = rope(rms(x @ W[A + "wkv.weight"].T, W[A + "kv_norm.weight"]), ang)
        keys = [kv]
        allow = [(t_idx[None, :] <= t_idx[:, None]) & (t_idx[None, :] > t_idx[:, None] - win)]
        if ratio:
            ck = compressor(x, A + "compressor.", ratio, Dh, ratio == 4, ang)
            n = ck.shape[0]
            causal = torch.arange(n)[None, :] < ((t_idx + 1) // ratio)[:, None]  # [S, n]
            if ratio == 4:
                I = A + "indexer."
                ih, idim = oc["index_n_heads"], oc["index_head_dim"]
                iq = rope((qr @ W[I + "wq_b.weight"].T).view(S, ih, idim), ang[:, None])
                ik = compressor(x, I + "compressor.", ratio, idim, True, ang)
                wts = (x @ W[I + "weights_proj.weight"].T) * (idim ** -0.5 * ih ** -0.5)
                score = (torch.einsum("shd,td->sht", iq, ik).relu() * wts.unsqueeze(-1)).sum(1)
                score = score.masked_fill(~causal, float("-inf"))
                k = min(oc["index_topk"], n)
                top = score.topk(k, dim=-1).indices
                sel = torch.zeros(S, n, dtype=torch.bool)
                sel.scatter_(1, top, True)
                causal = causal & sel
            keys.append(ck)
            allow.append(causal)
        K = torch.cat(keys, 0)
        M = torch.cat(allow, 1)
        logits = torch.einsum("shd,nd->shn", q, K) * Dh ** -0.5
        logits = logits.masked_fill(~M[:, None, :], float("-inf"))
        sink = W[A + "attn_sink"].view(1, H, 1)
        mx = logits.amax(-1, keepdim=True)
        e = torch.exp(logits - mx)
        pr = e / (e.sum(-1, keepdim=True) + torch.exp(sink - mx))
        o = rope(torch.einsum("shn,nd->shd", pr, K), ang[:, None], inverse=True)
        G, R = oc["o_groups"], oc["o_lora_rank"]
        o = torch.einsum("sgd,grd->sgr", o.reshape(S, G, -1), W[A + "wo_a.weight"].view(G, R, -1))
        f = o.flatten(1) @ W[A + "wo_b.weight"].T
        h = hc_post(f, res, post, comb)
        res = h
        x, post, comb = hc_pre(h, p + "hc_ffn")
        x = rms(x, W[p + "ffn_norm.weight"])
        scores = F.softplus(x @ W[p + "ffn.gate.weight"].T).sqrt()
        if L < oc["num_hash_layers"]:
            idx = W[p + "ffn.gate.tid2eid"][ids].long()
        else:
            idx = (scores + W[p + "ffn.gate.bias"]).topk(oc["num_experts_per_tok"], -1).indices
        wgt = scores.gather(1, idx)
        wgt = wgt / wgt.sum(-1, keepdim=True) * oc["routed_scaling_factor"]
        y = torch.zeros_like(x)
        for s in range(S):
            for j in range(idx.shape[1]):
                a, w2 = expert(x[s], f"{p}ffn.experts.{int(idx[s, j])}.", oc["swiglu_limit"])
                y[s] += (wgt[s, j] * a) @ w2.T
        a, w2 = expert(x, p + "ffn.shared_experts.", oc["swiglu_limit"])
        y = y + a @ w2.T
        h = hc_post(y, res, post, comb)
    xf = h.flatten(-2)
    mixes = (xf @ W["hc_head_fn"].T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    pre = torch.sigmoid(mixes * W["hc_head_scale"] + W["hc_head_base"]) + oc["hc_eps"]
    x = rms((pre.unsqueeze(-1) * h).sum(1), W["norm.weight"])
    return x @ W["head.weight"].T


@torch.no_grad()
def hf_from_pretrained_check(out_dir, c, W, raw):
    """transformers' own loader on the official files (its deepseek_v4 conversion mapping and
    FP8/FP4 `.scale` dequantization, which it applies on CPU) against this script's state dict:
    (names of the HF tensors that are bit-identical, names that differ). transformers derives an
    FP8 block from the shapes (rows / scale rows), which is 128 only where the dims are multiples
    of 128 or below 128, so tensors with a partial block in a multi-block grid are expected to
    differ (and only those). The FP8 quantizer only asks for accelerate before dequantizing."""
    import transformers.quantizers.quantizer_finegrained_fp8 as fp8q
    from transformers import DeepseekV4ForCausalLM

    fp8q.is_accelerate_available = lambda: True
    model, info = DeepseekV4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "mismatched_keys", "error_msgs")), info
    ours = official_to_hf(W, c)
    theirs = model.state_dict()
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))
    same = sorted(n for n in ours if torch.equal(ours[n].to(theirs[n].dtype), theirs[n]))
    return same, sorted(set(ours) - set(same))


def fp8_partial_multiblock(raw):
    """HF names of the FP8 tensors (main model) with > 1 block along a dim that is not a multiple
    of 128."""
    out = []
    for n, t in raw.items():
        if t.dtype == torch.float8_e4m3fn and n.startswith("layers.") and any(
                d > FP8_BLOCK and d % FP8_BLOCK for d in t.shape):
            L, rest = n.split(".", 2)[1:]
            out.append(f"model.layers.{L}." + dict(_HF_SUB)[rest])
    return sorted(out)


def max_top5_dev(logits, tops):
    """Max |logprob difference| on the recorded top-5 ids (rows of logits vs recorded lists)."""
    lp = logits.float().log_softmax(-1)
    ids = torch.tensor([[e["id"] for e in row] for row in tops])
    rec = torch.tensor([[e["logprob"] for e in row] for row in tops])
    return float((lp.gather(1, ids) - rec).abs().max())


# ---------------------------------------------------------------------------------------------


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "v4", "tiny"))
    ap.add_argument("--seed", type=int, default=0, help="weights and prompt series")
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--steps", type=int, default=12, help="greedy decode steps (cached)")
    ap.add_argument("--no-ref", action="store_true", help="skip the independent reference check")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    import safetensors
    import transformers
    from safetensors.torch import load_file, save_file

    c = json.loads(json.dumps(CONFIG))
    os.makedirs(args.out, exist_ok=True)
    cfg_path, st_path = os.path.join(args.out, "config.json"), os.path.join(args.out, "model.safetensors")
    with open(cfg_path, "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    tensors = make_tensors(c, args.seed)
    save_file(tensors, st_path, metadata={"format": "pt"})
    os.chmod(st_path, 0o644)  # safetensors creates it 0600

    # ---- read back (safetensors), dequantize, and cross-check against a plain byte parser
    raw = load_file(st_path)
    assert set(raw) == set(tensors)
    bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t
    for n, t in tensors.items():
        assert raw[n].dtype == t.dtype and torch.equal(bits(raw[n]), bits(t)), n
    W = dequantize_all(raw)
    W2, dtypes = parse_safetensors_bytes(st_path)
    assert set(W2) == set(W), sorted(set(W2) ^ set(W))
    parser_dev = max(float((W2[n].double() - W[n].double()).abs().max()) for n in W)
    assert parser_dev == 0.0, f"byte parser disagrees: {parser_dev}"
    dtype_counts = {}
    for dt in dtypes.values():
        dtype_counts[dt] = dtype_counts.get(dt, 0) + 1

    model, cfg = build_hf_model(c, W)
    print(f"checkpoint {os.path.getsize(st_path)} bytes, {len(raw)} tensors {dtype_counts}; "
          f"HF model built ({time.time() - t0:.1f}s)")

    # ---- pick the prompt: first of a seeded series without near-ties (indexer, router, greedy)
    V, best = c["vocab_size"], None
    for attempt in range(MAX_ATTEMPTS):
        gen = torch.Generator().manual_seed(1000003 * (args.seed + 1) + attempt)
        prompt = torch.randint(2, V, (args.prompt_len,), generator=gen).tolist()
        r = try_prompt(model, cfg, prompt, args.steps)
        ok = (r["ties"] == 0 and r["idx_gap"] >= MIN_INDEX_GAP and r["router_gap"] >= MIN_ROUTER_GAP
              and r["top2"] >= MIN_TOP2_GAP
              and not {c["bos_token_id"], c["eos_token_id"]} & set(r["tokens"]))  # engines stop at eos
        print(f"  prompt attempt {attempt}: indexer gap {r['idx_gap']:.2e} (ties {r['ties']}), "
              f"router gap {r['router_gap']:.2e}, greedy top-2 gap {r['top2']:.3f}, tokens {r['tokens']}"
              f"{'  <- ok' if ok else ''}")
        key = (ok, r["ties"] == 0, min(r["idx_gap"] / MIN_INDEX_GAP, r["router_gap"] / MIN_ROUTER_GAP,
                                        r["top2"] / MIN_TOP2_GAP, 1.0))
        if best is None or key > best[0]:
            best = (key, attempt, prompt, r)
        if ok:
            break
    _, attempt, prompt, r = best
    if not best[0][0]:
        print("warning: no prompt met every margin; keeping the best", file=sys.stderr)

    # ---- the recorded outputs: full forward over the prompt, cached greedy decode; the full
    # forward over prompt + tokens gives the decode-vs-full difference and the final margins.
    logits, _ = full_forward(model, cfg, prompt)
    P, steps = len(prompt), args.steps
    full_seq, m = full_forward(model, cfg, prompt + r["tokens"])
    assert torch.equal(full_seq[:P].argmax(-1), logits.argmax(-1))
    dec_vs_full = float((full_seq[P - 1 : P - 1 + steps].log_softmax(-1)
                         - r["decode_logits"].log_softmax(-1)).abs().max())
    r.update(idx_gap=min(r["idx_gap"], m.idx_gap), router_gap=min(r["router_gap"], m.router_gap),
             ties=r["ties"] + m.ties)
    prompt_tops = [top5(row) for row in logits]
    step_tops = [top5(row) for row in r["decode_logits"]]
    assert [s[0]["id"] for s in step_tops] == r["tokens"]

    checks = {"byte_parser_vs_safetensors_max_abs": parser_dev}
    # The reloaded file gives the recorded numbers again (fresh model from a fresh read).
    model2, _ = build_hf_model(json.load(open(cfg_path)), dequantize_all(load_file(st_path)))
    with torch.no_grad():
        l2 = model2(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float()
    checks["reloaded_hf_logits_max_abs"] = float((l2 - logits).abs().max())
    checks["reloaded_hf_top5_max_dlogprob"] = max_top5_dev(l2, prompt_tops)
    assert checks["reloaded_hf_logits_max_abs"] == 0.0, checks
    try:
        same, differ = hf_from_pretrained_check(args.out, c, W, raw)
        checks["hf_from_pretrained_identical_tensors"] = len(same)
        checks["hf_from_pretrained_differing_tensors"] = differ
        assert differ == fp8_partial_multiblock(raw), (differ, fp8_partial_multiblock(raw))
    except ImportError as e:  # informative: depends on transformers' quantizer internals
        print(f"warning: transformers could not load the official files itself: {e!r}", file=sys.stderr)
        checks["hf_from_pretrained_identical_tensors"] = None
    if not args.no_ref:
        with torch.no_grad():
            seq = prompt + r["tokens"]
            Wref = {n: (v if v.dtype == torch.int64 else v.float()) for n, v in W2.items()}
            ref = ref_forward(Wref, c, torch.tensor(seq))
        P = len(prompt)
        checks["ref_vs_hf_prompt_top5_max_dlogprob"] = max_top5_dev(ref[:P], prompt_tops)
        checks["ref_vs_hf_decode_top5_max_dlogprob"] = max_top5_dev(ref[P - 1 : P - 1 + args.steps], step_tops)
        checks["ref_vs_hf_logits_max_abs"] = float((ref[:P] - logits).abs().max())
        checks["ref_greedy_tokens_match"] = ref[P - 1 : P - 1 + args.steps].argmax(-1).tolist() == r["tokens"]
        bad = max(checks["ref_vs_hf_prompt_top5_max_dlogprob"], checks["ref_vs_hf_decode_top5_max_dlogprob"])
        if bad > REF_TOLERANCE or not checks["ref_greedy_tokens_match"]:
            raise SystemExit(f"reference disagrees with transformers: {checks}")

    expected = {
        "model": "v4-tiny",
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                  f"safetensors {safetensors.__version__}, float32, eager attention, eager experts",
        "generator": "tools/gen_v4_fixture.py",
        "args": {"seed": args.seed, "prompt_len": args.prompt_len, "steps": args.steps},
        "note": "prompt_top_logprobs[t]: top-5 of log_softmax(fp32 logits) at prompt position t "
                "(predicting token t+1) from one full forward of the prompt, no cache; tokens / "
                "top_logprobs: greedy decode with transformers' cache (prefill the prompt, then one "
                "token per call); no greedy token is bos or eos. Weights = the checkpoint dequantized to float32.",
        "prompt_attempt": attempt,
        "indexer_boundary_ties": r["ties"],
        "indexer_min_boundary_gap": float(f"{r['idx_gap']:.4g}"),
        "router_min_boundary_gap": float(f"{r['router_gap']:.4g}"),
        "min_top2_gap": float(f"{r['top2']:.4g}"),
        "decode_vs_full_max_abs_dlogprob": float(f"{dec_vs_full:.4g}"),
        "checks": {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in checks.items()},
        "sha256": {f: sha256(os.path.join(args.out, f)) for f in ("config.json", "model.safetensors")},
        "prompts": [{
            "prompt_ids": prompt,
            "tokens": r["tokens"],
            "top_logprobs": step_tops,
            "prompt_top_logprobs": prompt_tops,
        }],
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    summary = {k: v for k, v in expected.items() if k not in ("prompts", "sha256")}
    summary["tokens"] = r["tokens"]
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}: " + ", ".join(f"{f} {os.path.getsize(os.path.join(args.out, f))} B"
                                           for f in sorted(os.listdir(args.out)))
          + f" ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
