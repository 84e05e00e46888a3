#!/usr/bin/env bash
# End to end on an AMX machine: the AMX level (the default there) against the AVX-512 BF16 level
# (MOESERVE_ISA=avx512bf16), alternated ROUNDS times in one run (DRAM and the VM's share of the
# core drift by the minute: only ratios within a run mean anything). Cases, as in issue 22 and
# docs/kernels-amx.md: a 512-token prompt (`generate --max-tokens 1`: prompt tokens/s), 32
# streams x 16 tokens from 4-token prompts (output tokens/s), batch-1 decode (`moeserve-bench
# e2e`, tokens/s). Prints one line per run and a JSON object with the medians and ratios.
#   bash bench/kernels/amx_e2e.sh [MODEL_DIR] [ROUNDS]     (default /tmp/benchmodel, 2)
# Extra flags for every run (say --gemm-int8 --lm-head-int8) go in EXTRA="...".
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-/tmp/benchmodel}
rounds=${2:-2}
bin=./build/moeserve
[ -d "$model" ] || "$bin" make-model --preset bench --out "$model" > /dev/null
grep -q amx_bf16 /proc/cpuinfo || { echo "skipped: no AMX on this CPU" >&2; exit 0; }
read -r -a extra <<< "${EXTRA:-}"
long=$(python3 -c "print(','.join(str((t * 37 + 11) % 5000 + 3) for t in range(512)))")
streams=()
for i in $(seq 0 31); do
  streams+=(--prompt-ids "$(python3 -c "print(','.join(str((t * 31 + $i * 173 + 7) % 1997 + 3) for t in range(4)))")")
done
# "generate: ... N tokens in T s ..." -> T
gen_seconds() { sed -n 's/.* tokens in \([0-9.]*\) s .*/\1/p' | tail -1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for isa in avx512bf16 amx; do
    t=$(MOESERVE_ISA=$isa "$bin" generate --model "$model" --prompt-ids "$long" --max-tokens 1 \
        "${extra[@]}" 2>&1 >/dev/null | gen_seconds)
    s=$(MOESERVE_ISA=$isa "$bin" generate --model "$model" "${streams[@]}" --max-tokens 16 \
        "${extra[@]}" 2>&1 >/dev/null | gen_seconds)
    d=$(MOESERVE_ISA=$isa ./build/moeserve-bench e2e --model "$model" --decode-tokens 32 \
        "${extra[@]}" 2>&1 | sed -n 's/^e2e batch 1: \([0-9.]*\) tokens\/s.*/\1/p')
    echo "round $r $isa: prompt $t s, 32 streams $s s, batch-1 decode $d tok/s" >&2
    echo "$isa $t $s $d" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def med(isa, i): return statistics.median(float(r[i]) for r in rows if r[0] == isa)
res = {}
for isa in ("avx512bf16", "amx"):
    res[isa] = {"prompt_tok_s": round(512 / med(isa, 1), 1),
                "streams32_tok_s": round(32 * 16 / med(isa, 2), 1),
                "decode_tok_s": round(med(isa, 3), 2)}
res["prefill_ratio"] = round(res["amx"]["prompt_tok_s"] / res["avx512bf16"]["prompt_tok_s"], 2)
res["streams32_ratio"] = round(res["amx"]["streams32_tok_s"] / res["avx512bf16"]["streams32_tok_s"], 2)
res["decode_ratio"] = round(res["amx"]["decode_tok_s"] / res["avx512bf16"]["decode_tok_s"], 2)
print(json.dumps(res))
PY
