#!/usr/bin/env bash
# The DeepSeek Sparse Attention fixture (docs/dsa.md): a V3.2 checkpoint made by
# `moeserve make-model --preset v32-tiny` (2 layers, 16 indexer heads, top-k 16, a 2000-token
# vocabulary), and transformers' DeepseekV32ForCausalLM's greedy tokens and top-5 logprobs on it
# (tools/gen_hf_fixtures.py --check) for prompts longer than the top-k, so that attention is
# sparse. Writes tests/data/dsa/v32/expected.json with the make-model arguments and the sha256
# of every file it wrote (the test remakes the checkpoint and checks them first).
#
#   tools/gen_dsa_fixture.sh BIN PYTHON   # PYTHON: one with torch and transformers >= 5.11
set -euo pipefail
bin=$(readlink -f "$1")
py=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/tests/data/dsa/v32
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--preset v32-tiny --set vocab_size=2000 --set num_hidden_layers=2 --seed 11)
"$bin" make-model "${args[@]}" --out "$tmp/m" > /dev/null 2>&1
p1=$(python3 -c 'print(",".join(str((i * 37 + 11) % 1900) for i in range(40)))')
p2=$(python3 -c 'print(",".join(str((i * 53 + 7) % 1990) for i in range(70)))')
"$py" "$root/tools/gen_hf_fixtures.py" --check "$tmp/m" --prompt-ids "$p1" --prompt-ids "$p2" \
  --steps 12 > "$tmp/hf.json"
mkdir -p "$out"
python3 - "$tmp" "$out/expected.json" "${args[@]}" <<'PY'
import hashlib, json, os, sys
tmp, dest, args = sys.argv[1], sys.argv[2], sys.argv[3:]
hf = json.load(open(os.path.join(tmp, "hf.json")))
files = sorted(os.listdir(os.path.join(tmp, "m")))
hf["make_model"] = args
hf["sha256"] = {f: hashlib.sha256(open(os.path.join(tmp, "m", f), "rb").read()).hexdigest()
                for f in files}
hf.pop("model", None)
json.dump(hf, open(dest, "w"), indent=1)
print(f"wrote {dest}")
PY
