#!/usr/bin/env bash
# Dual micro-batch overlap on vs off (docs/ep-overlap.md): `mpirun -np R moeserve generate`
# with and without --no-overlap, alternated PAIRS times (other load on the machine drifts, so
# the two modes take turns), printing tokens/s per run and, from each run's Chrome traces, the
# communication time hidden behind compute (tools/ep_overlap_report.py).
# usage: bench/ep/overlap.sh BIN MODEL_DIR [R=2] [PAIRS=3] [THREADS=1]
#   MODEL_DIR is made with `BIN make-model --preset bench --out MODEL_DIR` when missing.
set -euo pipefail
bin=$1 model=$2 np=${3:-2} pairs=${4:-3} threads=${5:-1}
here=$(cd "$(dirname "$0")/../.." && pwd)
[[ -f $model/config.json ]] || "$bin" make-model --preset bench --out "$model"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# 16 prompts of 24-64 tokens (fixed seed), 8 new tokens each.
prompts=$(python3 -c "
import random
random.seed(1)
print(' '.join('--prompt-ids ' + ','.join(str(random.randint(2, 1000)) for _ in range(random.randint(24, 64)))
               for _ in range(16)))")
for i in $(seq 1 "$pairs"); do
  for mode in off on; do
    flag=()
    [[ $mode == off ]] && flag=(--no-overlap)
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe -np "$np" "$bin" generate --model "$model" \
      $prompts --max-tokens 8 --threads "$threads" --ignore-eos "${flag[@]}" \
      --trace "$dir/$mode$i" > /dev/null 2> "$dir/$mode$i.err"
    echo "$mode $i: $(grep -o '[0-9.]* tokens/s' "$dir/$mode$i.err")  (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
python3 "$here/tools/ep_overlap_report.py" "$dir"/*.rank*.json
