#!/usr/bin/env bash
# tools/export_gguf.py (the F32 GGUF bench/peers gives llama.cpp) against the checkpoint: every
# FP8 weight of the `tiny` preset read back with gguf.GGUFReader equals its bytes decoded by
# ml_dtypes' float8_e4m3fn times the scale of its 128x128 block (the preset's q_a_proj has 192
# rows and kv_a_proj_with_mqa 144: partial last blocks), kv_b_proj as llama.cpp's attn_k_b
# (transposed per head) and attn_v_b, the experts stacked in order; BF16/F32 tensors exact; a
# scale tensor of the wrong shape is refused with its name. Usage: export_gguf.sh BIN
set -euo pipefail
bin=${1:?usage: export_gguf.sh path/to/moeserve}
fail() { echo "export_gguf.sh: $*" >&2; exit 1; }
python3 -c "import gguf, ml_dtypes" 2>/dev/null ||
  fail "python packages 'gguf' and 'ml_dtypes' missing (scripts/install-deps.sh installs them)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" make-model --preset tiny --out "$dir/m" > /dev/null 2>&1 || fail "make-model"
python3 tools/export_gguf.py "$dir/m" "$dir/m.gguf" > /dev/null || fail "export failed"

python3 - "$dir/m" "$dir/m.gguf" <<'PY'
import json, os, re, struct, sys
import gguf, ml_dtypes, numpy as np

model, path = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(model, "config.json")))
tensors = {}  # checkpoint name -> (dtype, shape, bytes)
for f in sorted(os.listdir(model)):
    if not f.endswith(".safetensors"):
        continue
    raw = open(os.path.join(model, f), "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    for name, t in json.loads(raw[8:8 + n]).items():
        if name != "__metadata__":
            b, e = t["data_offsets"]
            tensors[name] = (t["dtype"], t["shape"], raw[8 + n + b:8 + n + e])

def decoded(name):
    """The checkpoint tensor in F32, element by element from its definition."""
    dtype, shape, data = tensors[name]
    if dtype == "F8_E4M3":
        w = np.frombuffer(data, dtype=ml_dtypes.float8_e4m3fn).reshape(shape).astype(np.float32)
        s = decoded(name.replace(".weight", ".weight_scale_inv"))
        rows, cols = np.indices(shape)
        return w * s[rows // 128, cols // 128]
    if dtype == "BF16":
        return np.frombuffer(data, dtype=ml_dtypes.bfloat16).reshape(shape).astype(np.float32)
    assert dtype == "F32", (name, dtype)
    return np.frombuffer(data, dtype=np.float32).reshape(shape)

got = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(sys.argv[2]).tensors}
L, E = cfg["num_hidden_layers"], cfg["n_routed_experts"]
H, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
plain = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
         "model.norm.weight": "output_norm.weight"}
per_layer = {"self_attn.q_a_proj": "attn_q_a", "self_attn.q_b_proj": "attn_q_b",
             "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.o_proj": "attn_output",
             "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "mlp.gate": "ffn_gate_inp", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
             "mlp.shared_experts.up_proj": "ffn_up_shexp",
             "mlp.shared_experts.down_proj": "ffn_down_shexp"}
checked = 0
def same(gname, want):
    global checked
    if gname not in got:
        sys.exit(f"export_gguf.sh: {gname} missing from the GGUF file")
    have = got[gname].reshape(want.shape)
    if not np.array_equal(have, want):
        bad = np.argwhere(have != want)[0]
        sys.exit(f"export_gguf.sh: {gname}{list(bad)}: {have[tuple(bad)]} != {want[tuple(bad)]}")
    checked += 1

for src, dst in plain.items():
    same(dst, decoded(src))
for l in range(L):
    for src, dst in per_layer.items():
        if f"model.layers.{l}.{src}.weight" in tensors:
            same(f"blk.{l}.{dst}.weight", decoded(f"model.layers.{l}.{src}.weight"))
    kvb = decoded(f"model.layers.{l}.self_attn.kv_b_proj.weight").reshape(H, nope + v, -1)
    same(f"blk.{l}.attn_k_b.weight", kvb[:, :nope, :].transpose(0, 2, 1).copy())
    same(f"blk.{l}.attn_v_b.weight", kvb[:, nope:, :].copy())
    if l >= cfg["first_k_dense_replace"]:
        same(f"blk.{l}.exp_probs_b.bias",
             decoded(f"model.layers.{l}.mlp.gate.e_score_correction_bias"))
        for proj in ("gate", "up", "down"):
            same(f"blk.{l}.ffn_{proj}_exps.weight", np.stack(
                [decoded(f"model.layers.{l}.mlp.experts.{e}.{proj}_proj.weight") for e in range(E)]))
partial = [n for n, (d, s, _) in tensors.items() if d == "F8_E4M3" and (s[0] % 128 or s[1] % 128)]
if not partial:
    sys.exit("export_gguf.sh: the preset has no FP8 tensor with a partial block (nothing tested)")
print(f"export_gguf.sh: {checked} tensors equal the checkpoint ({len(partial)} FP8 with partial blocks)")
PY

# A scale tensor whose shape does not match 128x128 blocks: refused, naming the tensor.
python3 - "$dir/m" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if not f.endswith(".safetensors"):
        continue
    p = os.path.join(d, f)
    raw = bytearray(open(p, "rb").read())
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    name = "model.layers.0.self_attn.q_a_proj.weight_scale_inv"
    if name in h:
        rows, cols = h[name]["shape"]
        h[name]["shape"] = [rows * cols, 1]  # same bytes, wrong block grid
        text = json.dumps(h, separators=(",", ":")).encode()
        text += b" " * (n - len(text))
        assert len(text) == n
        open(p, "wb").write(raw[:8] + text + raw[8 + n:])
PY
if python3 tools/export_gguf.py "$dir/m" "$dir/bad.gguf" > "$dir/err" 2>&1; then
  fail "a scale tensor with the wrong shape was accepted"
fi
grep -q "model.layers.0.self_attn.q_a_proj.weight_scale_inv" "$dir/err" ||
  fail "the error does not name the scale tensor: $(cat "$dir/err")"
echo "export_gguf.sh: ok"
