#!/usr/bin/env python3
"""Writes a moeserve checkpoint (DeepSeek-V3/V2 in the official FP8 format) as a GGUF file.

For bench/peers/ (docs/peers.md): llama.cpp runs the same model as moeserve. The FP8 projections
are dequantized exactly (e4m3 value x its 128x128 block's scale_inv, in F32); the BF16 tensors
are widened to F32. The file is F32 throughout, so llama.cpp's own `llama-quantize` makes every
smaller type (Q8_0, Q4_K_M) from the exact weights, as a user quantizing the official release
would.

GGUF layout (llama.cpp's `deepseek2` architecture, as its converter writes it):
- MLA as MQA: head_count_kv 1, key_length kv_lora_rank + qk_rope_head_dim, value_length
  kv_lora_rank; the per-head widths go in key_length_mla / value_length_mla.
- kv_b_proj [n_heads * (nope + v), kv_lora] split per head into attn_k_b [n_heads, kv_lora,
  nope] (K's part, transposed for the absorbed product) and attn_v_b [n_heads, v, kv_lora].
- The routed experts of a layer stacked: ffn_{gate,up,down}_exps [n_experts, out, in].
- e_score_correction_bias as exp_probs_b.bias.
- The MTP module (layers >= num_hidden_layers) is left out: llama.cpp does not run it.
- The DeepSeek-V3 tokenizer (tokenizer.json beside the weights, or --tokenizer) as a GPT-2 BPE
  vocabulary with llama.cpp's `deepseek-v3` pre-tokenizer; ids the tokenizer lacks up to
  vocab_size become unused [PAD<id>] tokens; the chat template of tokenizer_config.json.

Tensors are streamed to the file one at a time (the bench preset is ~13 GB in F32).

Usage: python3 tools/export_gguf.py MODEL_DIR OUT.gguf [--tokenizer DIR]
Needs: numpy, gguf (PyPI).
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

import gguf


# ---- safetensors, read in place (the numpy API of `safetensors` has no FP8 or BF16) ----

class Shards:
    """Every tensor of a checkpoint directory, mapped from its shard."""

    DTYPES = {"F32": np.float32, "BF16": np.uint16, "F8_E4M3": np.uint8, "F16": np.float16,
              "I64": np.int64, "I32": np.int32, "U8": np.uint8}

    def __init__(self, model_dir, block=(128, 128)):
        self.block = tuple(block)  # FP8 scale block (rows, cols): quantization_config
        self.where = {}  # name -> (path, dtype, shape, begin, end)
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        if not files:
            sys.exit(f"export_gguf: no .safetensors files in {model_dir}")
        for f in files:
            path = os.path.join(model_dir, f)
            with open(path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                b, e = t["data_offsets"]
                self.where[name] = (path, t["dtype"], t["shape"], 8 + n + b, 8 + n + e)

    def names(self):
        return self.where.keys()

    def raw(self, name):
        path, dtype, shape, b, e = self.where[name]
        if dtype not in self.DTYPES:
            sys.exit(f"export_gguf: {path}: tensor {name} has unsupported dtype {dtype}")
        count = int(np.prod(shape)) if shape else 1
        arr = np.memmap(path, dtype=self.DTYPES[dtype], mode="r", offset=b, shape=(count,))
        return dtype, arr.reshape(shape)


def e4m3_table():
    """The F32 value of each FP8 e4m3fn byte (no infinities; 0x7f/0xff are NaN)."""
    t = np.zeros(256, dtype=np.float32)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> 3) & 15
        man = byte & 7
        if exp == 15 and man == 7:
            t[byte] = np.nan
        elif exp == 0:
            t[byte] = sign * man / 8.0 * 2.0 ** -6
        else:
            t[byte] = sign * (1 + man / 8.0) * 2.0 ** (exp - 7)
    return t


E4M3 = e4m3_table()


def f32_of(shards, name):
    """The tensor `name` in F32: FP8 dequantized with its weight_scale_inv blocks."""
    dtype, a = shards.raw(name)
    if dtype == "F32":
        return np.asarray(a, dtype=np.float32)
    if dtype == "BF16":
        return (np.asarray(a, dtype=np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return np.asarray(a, dtype=np.float32)
    if dtype == "F8_E4M3":
        scale_name = name[: -len(".weight")] + ".weight_scale_inv"
        if scale_name not in shards.where:
            sys.exit(f"export_gguf: FP8 tensor {name} has no {scale_name}")
        rows, cols = a.shape
        br, bc = shards.block  # the last block of a row or column may be partial
        s = f32_of(shards, scale_name)  # [ceil(rows/br), ceil(cols/bc)]
        if s.shape != (-(-rows // br), -(-cols // bc)):
            sys.exit(f"export_gguf: {scale_name} has shape {list(s.shape)}, expected "
                     f"{[-(-rows // br), -(-cols // bc)]} for {br}x{bc} blocks of {[rows, cols]}")
        scale = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:rows, :cols]
        return E4M3[np.asarray(a)] * scale
    sys.exit(f"export_gguf: tensor {name}: cannot widen {dtype} to F32")


# ---- the GGUF file ----

def add_metadata(w, cfg, n_layers):
    n_heads = cfg["num_attention_heads"]
    kv_lora = cfg["kv_lora_rank"]
    rope = cfg["qk_rope_head_dim"]
    w.add_name(cfg.get("_name", "moeserve export"))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_heads)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_rope_dimension_count(rope)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    w.add_expert_group_count(cfg.get("n_group", 1))
    w.add_expert_group_used_count(cfg.get("topk_group", 1))
    w.add_expert_weights_scale(float(cfg.get("routed_scaling_factor", 1.0)))
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    if cfg.get("scoring_func", "softmax") == "sigmoid":
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    else:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("type", rs.get("rope_type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rs["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rs["original_max_position_embeddings"]))
        w.add_rope_scaling_yarn_beta_fast(float(rs.get("beta_fast", 32)))
        w.add_rope_scaling_yarn_beta_slow(float(rs.get("beta_slow", 1)))
        # llama.cpp's deepseek2 takes 0.1 x mscale_all_dim here (its converter does the same).
        w.add_rope_scaling_yarn_log_mul(0.1 * float(rs.get("mscale_all_dim", 0)))


def add_tokenizer(w, tok_dir, cfg):
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    if tj["model"]["type"] != "BPE":
        sys.exit(f"export_gguf: {tok_dir}/tokenizer.json is not a BPE tokenizer")
    vocab = dict(tj["model"]["vocab"])
    special = set()
    for t in tj["added_tokens"]:
        vocab[t["content"]] = t["id"]
        if t.get("special"):
            special.add(t["id"])
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("deepseek-v3")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.get("bos_token_id", 0))
    w.add_eos_token_id(cfg.get("eos_token_id", 1))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    cfg_path = os.path.join(tok_dir, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        template = json.load(open(cfg_path, encoding="utf-8")).get("chat_template")
        if template:
            w.add_chat_template(template)  # llama-server renders chat requests with it


def tensor_plan(shards, cfg):
    """(gguf name, shape, producer of the F32 array) for every tensor llama.cpp needs, in file
    order."""
    n_layers = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, n_layers)
    n_heads = cfg["num_attention_heads"]
    nope, v_dim, kv_lora = cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    def shape_of(name):
        return tuple(shards.where[name][2])

    plan = []
    experts = {}  # (layer, proj) -> count seen
    for name in sorted(shards.names()):
        if name.endswith(".weight_scale_inv"):
            continue
        m = re.match(r"model\.layers\.(\d+)\.", name)
        layer = int(m.group(1)) if m else None
        if layer is not None and layer >= n_layers:
            continue  # the MTP module
        if name.endswith("e_score_correction_bias"):
            plan.append((f"blk.{layer}.exp_probs_b.bias", shape_of(name),
                         lambda n=name: f32_of(shards, n)))
            continue
        e = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight$", name)
        if e:
            key = (layer, e.group(3))
            experts[key] = experts.get(key, 0) + 1
            if experts[key] == cfg["n_routed_experts"]:
                merged = f"model.layers.{layer}.mlp.experts.{e.group(3)}.weight"
                srcs = [f"model.layers.{layer}.mlp.experts.{x}.{e.group(3)}.weight"
                        for x in range(cfg["n_routed_experts"])]
                plan.append((names.get_name(merged, try_suffixes=(".weight",)),
                             (len(srcs), *shape_of(name)),
                             lambda s=srcs: np.stack([f32_of(shards, n) for n in s])))
            continue
        if name.endswith("kv_b_proj.weight"):
            def kv_b(n=name):  # [n_heads * (nope + v), kv_lora]
                return f32_of(shards, n).reshape(n_heads, nope + v_dim, kv_lora)
            base = name.replace("kv_b_proj", "{}")
            plan.append((names.get_name(base.format("k_b_proj"), try_suffixes=(".weight",)),
                         (n_heads, kv_lora, nope),
                         lambda f=kv_b: np.ascontiguousarray(f()[:, :nope, :].transpose(0, 2, 1))))
            plan.append((names.get_name(base.format("v_b_proj"), try_suffixes=(".weight",)),
                         (n_heads, v_dim, kv_lora),
                         lambda f=kv_b: np.ascontiguousarray(f()[:, nope:, :])))
            continue
        out = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if out is None:
            sys.exit(f"export_gguf: no GGUF name for tensor {name}")
        plan.append((out, shape_of(name), lambda n=name: f32_of(shards, n)))
    missing = [k for k, c in experts.items() if c != cfg["n_routed_experts"]]
    if missing:
        sys.exit(f"export_gguf: layers with missing experts: {missing}")
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", help="directory with tokenizer.json (default: the model's)")
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    if cfg.get("model_type") not in ("deepseek_v3", "deepseek_v2"):
        sys.exit(f"export_gguf: {args.model_dir}: model_type {cfg.get('model_type')!r} "
                 "is not deepseek_v3 or deepseek_v2")
    cfg["_name"] = os.path.basename(os.path.normpath(args.model_dir))
    tok_dir = args.tokenizer or args.model_dir
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        sys.exit(f"export_gguf: no tokenizer.json in {tok_dir} (give --tokenizer DIR)")
    block = cfg.get("quantization_config", {}).get("weight_block_size", [128, 128])
    shards = Shards(args.model_dir, block)
    plan = tensor_plan(shards, cfg)

    w = gguf.GGUFWriter(args.out, "deepseek2")
    add_metadata(w, cfg, cfg["num_hidden_layers"])
    add_tokenizer(w, tok_dir, cfg)
    # Shapes first (the header lists every tensor), then the data one tensor at a time.
    for gname, shape, _ in plan:
        w.add_tensor_info(gname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for gname, shape, make in plan:
        a = np.ascontiguousarray(make(), dtype=np.float32)
        if tuple(a.shape) != tuple(shape):
            sys.exit(f"export_gguf: {gname}: shape {a.shape}, planned {shape}")
        w.write_tensor_data(a)
        total += a.nbytes
    w.close()
    print(f"wrote {args.out}: {len(plan)} tensors, {total / 1e9:.2f} GB of F32")


if __name__ == "__main__":
    main()
