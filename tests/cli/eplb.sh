#!/usr/bin/env bash
# `moeserve eplb`: the README example of DeepSeek's EPLB through the command line, both input
# formats, and the exit codes of bad input. Usage: eplb.sh path/to/moeserve
set -euo pipefail
bin=${1:?usage: eplb.sh path/to/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo '[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]' \
  > "$tmp/matrix.json"
cat > "$tmp/stats.json" <<'JSON'
{"format": "moeserve.expert_stats", "version": 1, "num_layers": 2, "num_experts": 12,
 "window_steps": 100, "steps": 100,
 "tokens": [[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]}
JSON

for input in matrix stats; do
  "$bin" eplb --loads "$tmp/$input.json" --replicas 16 --groups 4 --nodes 2 --gpus 8 --json \
    > "$tmp/$input.out"
  python3 - "$tmp/$input.out" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["policy"] == "hierarchical", plan["policy"]
assert plan["phy2log"] == [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                           [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]], plan["phy2log"]
assert plan["logcnt"] == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1],
                          [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]], plan["logcnt"]
l2p = plan["log2phy"]
assert len(l2p) == 2 and all(len(layer) == 12 and all(len(r) == 2 for r in layer) for layer in l2p)
for l in range(2):
    for e in range(12):
        slots = [s for s in l2p[l][e] if s != -1]
        assert len(slots) == plan["logcnt"][l][e]
        assert all(plan["phy2log"][l][s] == e for s in slots)
assert len(plan["gpu_load"]) == 2
for layer in plan["gpu_load"]:
    b, a = layer["before"], layer["after"]
    assert abs(b["mean"] - a["mean"]) < 1e-9, layer
    assert a["max"] < b["max"], layer
    assert abs(a["max_over_mean"] - a["max"] / a["mean"]) < 1e-12, layer
PY
done
cmp "$tmp/matrix.out" "$tmp/stats.out"

# Text output names the policy.
"$bin" eplb --loads "$tmp/matrix.json" --replicas 16 --groups 4 --nodes 2 --gpus 8 \
  | grep -q "policy hierarchical"

expect_exit() {  # expect_exit CODE MESSAGE-FRAGMENT ARGS...
  local want=$1 says=$2 rc=0
  shift 2
  "$bin" eplb "$@" > /dev/null 2> "$tmp/err" || rc=$?
  if [[ $rc != "$want" ]] || ! grep -q -- "$says" "$tmp/err"; then
    echo "FAIL: moeserve eplb $* exited $rc (want $want), stderr:"; cat "$tmp/err"; exit 1
  fi
}
expect_exit 2 "do not divide evenly over 8 GPUs" \
  --loads "$tmp/matrix.json" --replicas 12 --groups 4 --nodes 2 --gpus 8
expect_exit 1 "cannot open" --loads "$tmp/none.json" --replicas 16 --groups 4 --nodes 2 --gpus 8
echo '[[1, 2], [3]]' > "$tmp/ragged.json"
expect_exit 1 "layer 1 has 1 experts" \
  --loads "$tmp/ragged.json" --replicas 2 --groups 1 --nodes 1 --gpus 1
echo "eplb.sh: ok"
