#!/usr/bin/env bash
# EPLB through `moeserve generate` under mpirun (docs/eplb.md "Runtime"):
#   - `--expert-stats-out` writes the group's loads in the stats format, which `moeserve eplb
#     --loads` reads;
#   - `--eplb-init FILE --redundant-experts N` places experts by that plan (per MoE layer, with
#     redundant copies) and gives exactly the tokens and logprobs of the contiguous placement, at
#     R = 1 (--ep), 2 and 4, and the same expert loads;
#   - `--eplb-interval` migrates experts while generating and changes no output byte;
#   - bad combinations fail with a clear message.
set -euo pipefail
bin=$1
mpirun="${2:-mpirun} --allow-run-as-root --oversubscribe"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin" make-model --preset tiny --out "$dir/m" --set vocab_size=2000 --set num_hidden_layers=3 2>/dev/null
args=(generate --model "$dir/m" --prompt-ids 0,5,9,33,2,17,4 --prompt-ids 7,8 --prompt-ids 11,12
      --max-tokens 6 --logprobs 3 --json --ignore-eos --threads 1)
for np in 1 2 4; do
  run() { if [ $np -eq 1 ]; then "$bin" "$@" --ep; else $mpirun -np $np "$bin" "$@"; fi; }
  run "${args[@]}" --expert-stats-out "$dir/stats$np.json" > "$dir/off$np.jsonl" 2> "$dir/err" \
    || { cat "$dir/err" >&2; fail "R=$np stats"; }
  grep -q "eplb: 6 steps" "$dir/err" || fail "R=$np: no balance line: $(cat "$dir/err")"
  "$bin" eplb --loads "$dir/stats$np.json" --replicas 24 --groups 4 --nodes 1 --gpus 4 --json > /dev/null \
    || fail "moeserve eplb cannot read the stats file of R=$np"
  run "${args[@]}" --eplb-init "$dir/stats$np.json" --redundant-experts 8 \
    --expert-stats-out "$dir/stats${np}b.json" > "$dir/on$np.jsonl" 2> "$dir/err" \
    || { cat "$dir/err" >&2; fail "R=$np eplb-init"; }
  grep -q "24 slots per MoE layer on $np ranks" "$dir/err" || fail "R=$np: $(cat "$dir/err")"
  cmp -s "$dir/off$np.jsonl" "$dir/on$np.jsonl" || fail "R=$np: tokens or logprobs differ with EPLB"
done

python3 - "$dir" <<'PY' || fail "stats files"
import json, sys
d = sys.argv[1]
for np in (1, 2, 4):
    s = json.load(open(f"{d}/stats{np}.json"))
    assert s["format"] == "moeserve.expert_stats" and s["version"] == 1, s
    assert s["num_layers"] == 2 and s["num_experts"] == 16 and s["steps"] == 6, s
    # Every rank runs the same 3 prompts: tokens x top-4 x ranks per layer.
    tokens = (7 + 2 + 2 + 3 * 5) * 4 * np
    assert all(sum(row) == tokens for row in s["tokens"]), (np, [sum(r) for r in s["tokens"]])
    b = json.load(open(f"{d}/stats{np}b.json"))
    assert b["tokens"] == s["tokens"], "routing must not depend on the placement"
print("eplb_generate.sh: stats files consistent")
PY

# Online rebalancing: re-plan every 2 steps, weights moved between ranks 256 KiB per step; the
# output is byte-identical to the run without EPLB (F32 dispatch) and the placement changed.
$mpirun -np 4 "$bin" "${args[@]}" --dispatch-dtype f32 > "$dir/f32off.jsonl" 2> "$dir/err" \
  || { cat "$dir/err" >&2; fail "R=4 f32"; }
$mpirun -np 4 "$bin" "${args[@]}" --dispatch-dtype f32 --eplb-interval 2 --redundant-experts 8 \
  --eplb-migrate-mb 0.25 > "$dir/f32on.jsonl" 2> "$dir/err" || { cat "$dir/err" >&2; fail "R=4 online"; }
grep -q "eplb: new placement after step" "$dir/err" || fail "no migration: $(cat "$dir/err")"
cmp -s "$dir/f32off.jsonl" "$dir/f32on.jsonl" || fail "tokens or logprobs differ with online EPLB"

set +e
$mpirun -np 4 "$bin" "${args[@]}" --eplb-init "$dir/stats4.json" --redundant-experts 3 > /dev/null 2> "$dir/err"; rc=$?
set -e
[ $rc -ne 0 ] && grep -q "19 slots per layer cannot be split evenly over 4 ranks" "$dir/err" \
  || fail "uneven slots: rc=$rc $(cat "$dir/err")"
set +e
"$bin" "${args[@]}" --expert-stats-out "$dir/x.json" > /dev/null 2> "$dir/err"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "need expert parallelism" "$dir/err" || fail "stats without EP: rc=$rc"
echo "eplb_generate.sh: ok"
