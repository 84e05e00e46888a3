#!/usr/bin/env bash
# The forward-pass golden (docs/engine.md, "Behaviour frozen"): greedy tokens and top-5
# logprobs of every way a model is brought up and run, recorded once and held bit for bit.
#
#   bash tests/golden/golden.sh BIN            compare with tests/golden/forward.jsonl
#   bash tests/golden/golden.sh BIN --record   (re)write it
#
# Cases: the tiny, bench-shaped (the bench preset's attention widths at 2 layers, 16 experts,
# a 4096-token vocabulary) and V2-Lite-shaped presets and the embedded tiny-py, each on the
# reference and the fast path with a BF16 and an FP8 latent cache; tiny and tiny-py again as
# an EP group of 2 ranks (mpirun), through the disk tier (a second process whose prompt blocks
# come from disk), with MTP drafts, and tiny-py through a router with a prefill and a decode
# unit (PD, on loopback).
#
# Bits depend on the kernels' ISA level and the thread count, so every case runs at
# MOESERVE_ISA=avx512bf16 (Zen 4 and the AMX Xeons both have it: the same code runs on both)
# with fixed threads; a CPU without AVX-512 BF16 skips the test (77).
set -euo pipefail
bin=$(readlink -f "$1")
mode=${2:-check}
root=$(cd "$(dirname "$0")/../.." && pwd)
golden=$root/tests/golden/forward.jsonl
source "$root/tests/serve_lib.sh"
grep -q avx512_bf16 /proc/cpuinfo || { echo "SKIP: no AVX-512 BF16 on this CPU"; exit 77; }
export MOESERVE_ISA=avx512bf16
mpirun="mpirun --allow-run-as-root --oversubscribe"
tinypy=$root/build/models/tiny-py
[[ -f $tinypy/config.json ]] || fail "the embedded model is not built ($tinypy)"

"$bin" make-model --preset tiny --out "$dir/tiny" --set vocab_size=2000 --set num_hidden_layers=3 2>/dev/null
"$bin" make-model --preset bench --out "$dir/bench" --set num_hidden_layers=2 --set vocab_size=4096 \
  --set n_routed_experts=16 --set n_group=4 --set topk_group=2 2>/dev/null
"$bin" make-model --preset v2-lite-tiny --out "$dir/v2lite" --set vocab_size=2000 --set num_hidden_layers=3 2>/dev/null

out=$dir/golden.jsonl
: > "$out"
short=(--prompt-ids 0,5,9,33,2 --prompt-ids 7,11,12,13)
# 150 tokens: two whole 64-token KV blocks, for the disk tier and PD.
long=$(python3 -c 'print(",".join(str((i * 37 + 11) % 1900) for i in range(150)))')
# case NAME ARGS...: one generate run; every JSON line it prints, under NAME.
case_() {
  local name=$1
  shift
  "$@" --json --logprobs 5 --ignore-eos > "$dir/case.jsonl" 2> "$dir/case.log" ||
    { cat "$dir/case.log" >&2; fail "case $name: $*"; }
  python3 - "$name" "$dir/case.jsonl" >> "$out" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[2])]
for l in lines:
    l.get("speculative", {}).pop("tokens_per_s", None)  # (a timing)
print(json.dumps({"case": sys.argv[1], "out": lines}, sort_keys=True))
PY
}

for m in tiny bench v2lite tinypy; do
  model=$dir/$m
  [[ $m == tinypy ]] && model=$tinypy
  for compute in reference fast; do
    for kv in bf16 fp8; do
      case_ "$m/$compute/$kv" "$bin" generate --model "$model" "${short[@]}" --max-tokens 8 \
        --threads 2 --compute $compute --kv-cache-dtype $kv
    done
  done
done
for m in tiny tinypy; do
  model=$dir/$m
  [[ $m == tinypy ]] && model=$tinypy
  for kv in bf16 fp8; do
    case_ "$m/ep2/$kv" $mpirun -np 2 "$bin" generate --model "$model" "${short[@]}" --max-tokens 8 \
      --threads 1 --kv-cache-dtype $kv
  done
done
for run in first second; do  # the second process reads the prompt's two blocks from disk
  case_ "tinypy/kv-disk/$run" "$bin" generate --model "$tinypy" --prompt-ids "$long" --max-tokens 8 \
    --threads 2 --kv-disk "$dir/kvdisk"
done
case_ "tinypy/mtp2" "$bin" generate --model "$tinypy" "${short[@]}" --prompt-ids "$long" \
  --max-tokens 12 --threads 2 --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0
case_ "tiny/mtp1/fp8" "$bin" generate --model "$dir/tiny" "${short[@]}" --max-tokens 8 --threads 2 \
  --speculative mtp --num-draft-tokens 1 --kv-cache-dtype fp8 --speculative-max-rows 0

# PD: a router, a prefill unit and a decode unit on loopback; greedy completions of token-id
# prompts with top-5 logprobs.
rport=$(free_port) pport=$(free_port) dport=$(free_port)
common=(--model "$tinypy" --threads 1 --kv-cache-gb 0.1 --max-model-len 1024)
"$bin" router --model "$tinypy" --host 127.0.0.1 --port "$rport" --max-model-len 1024 > "$dir/router.log" 2>&1 &
pids+=($!)
disown
"$bin" serve "${common[@]}" --host 127.0.0.1 --port "$pport" --role prefill \
  --router "http://127.0.0.1:$rport" > "$dir/prefill.log" 2>&1 &
pids+=($!)
disown
"$bin" serve "${common[@]}" --host 127.0.0.1 --port "$dport" --role decode \
  --router "http://127.0.0.1:$rport" > "$dir/decode.log" 2>&1 &
pids+=($!)
disown
wait_health "$rport"
wait_units "$rport" 2
python3 - "$rport" "$long" >> "$out" <<'PY' || fail "PD case"
import json, sys, urllib.request
port, long = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
outs = []
for prompt in ([0, 5, 9, 33, 2], [7, 11, 12, 13], long):
    body = {"model": "tiny-py", "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "logprobs": 5, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=120))
    lp = r["choices"][0]["logprobs"]
    outs.append({"text": r["choices"][0]["text"], "token_logprobs": lp["token_logprobs"],
                 "top_logprobs": lp["top_logprobs"]})
print(json.dumps({"case": "tinypy/pd", "out": outs}, sort_keys=True))
PY

if [[ $mode == --record ]]; then
  cp "$out" "$golden"
  echo "recorded $(wc -l < "$golden") cases, $(wc -c < "$golden") bytes in $golden"
  exit 0
fi
[[ -f $golden ]] || fail "no golden at $golden (run with --record)"
python3 - "$golden" "$out" <<'PY' || fail "the forward pass changed"
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
assert [w["case"] for w in want] == [g["case"] for g in got], "the cases differ"
bad = [w["case"] for w, g in zip(want, got) if w != g]
for w, g in zip(want, got):
    if w != g:
        print(f"{w['case']}:\n  golden {json.dumps(w['out'])[:400]}\n  now    {json.dumps(g['out'])[:400]}")
assert not bad, f"{len(bad)} of {len(want)} cases differ: {bad}"
print(f"golden: {len(want)} cases bit-identical")
PY
