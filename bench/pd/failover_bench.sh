#!/usr/bin/env bash
# A load run of a few minutes with a unit killed and another joined in the middle, against
# co-located serving whose process is killed at the same moment (docs/fault-tolerance.md
# "Bench"). On one machine over loopback (no root needed):
#   co-located:    one `serve` (both cores) under scripts/supervise.sh; at --kill-at its
#                  process gets kill -9 and the supervisor starts it again (after 1 s);
#   disaggregated: a router, one prefill unit and two decode units (one thread each); at
#                  --kill-at decode unit d1 gets kill -9, at --join-at a new decode unit d3 joins.
# The same clients, prompts and timeline in both (bench/pd/failover_bench.py); the first run's
# undisturbed outputs are the reference for "changed". Usage:
#   bash bench/pd/failover_bench.sh [MODEL_DIR]   (default build/models/tiny-py)
# DURATION (150 s), KILL_AT (50), JOIN_AT (65), CONCURRENCY (6) override the timeline. Prints
# one JSON line per configuration. Takes ~6 minutes; not in CI.
set -euo pipefail
root=$(dirname "$(readlink -f "$0")")/../..
bin=$(readlink -f "$root/build/moeserve")
model=$(readlink -f "${1:-$root/build/models/tiny-py}")
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do pkill -9 -P "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
wait_up() {
  for _ in $(seq 900); do curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0; sleep 0.2; done
  echo "port $1 not up (logs in $dir)" >&2
  exit 1
}
common=(--model "$model" --kv-cache-gb 0.5 --max-model-len 4096)
name=$(basename "$model")
args=(--model "$name" --refs "$dir/refs.json" --duration "${DURATION:-150}" --kill-at "${KILL_AT:-50}"
      --join-at "${JOIN_AT:-65}" --concurrency "${CONCURRENCY:-6}")

# Co-located: the supervisor's child is the server; kill -9 it, the supervisor restarts it.
bash "$root/scripts/supervise.sh" "$bin" serve "${common[@]}" --port 18700 --threads 2 \
  > "$dir/colocated.log" 2>&1 &
sup=$!
pids+=("$sup")
wait_up 18700
python3 "$root/bench/pd/failover_bench.py" --url http://127.0.0.1:18700/v1 \
  --ref http://127.0.0.1:18700/v1 --label "co-located, process kill -9 (supervised restart)" \
  "${args[@]}" --kill "pkill -9 -P $sup -x moeserve"
kill -TERM "$sup"
wait "$sup" 2>/dev/null || true

# Disaggregated.
"$bin" router --model "$model" --port 18710 > "$dir/router.log" 2>&1 &
pids+=($!)
unit() {  # ROLE PORT
  "$bin" serve "${common[@]}" --port "$2" --threads 1 --role "$1" \
    --router http://127.0.0.1:18710 >> "$dir/unit$2.log" 2>&1 &
  pids+=($!)
}
unit prefill 18711
unit decode 18712
d1=${pids[-1]}
unit decode 18713
wait_up 18710
wait_up 18711
wait_up 18712
wait_up 18713
sleep 1.5  # a heartbeat from each
python3 "$root/bench/pd/failover_bench.py" --url http://127.0.0.1:18710/v1 \
  --label "disaggregated, decode unit kill -9 + a decode unit joins" "${args[@]}" \
  --kill "kill -9 $d1" \
  --join "$bin serve ${common[*]} --port 18714 --threads 1 --role decode --router http://127.0.0.1:18710 >> $dir/unit18714.log 2>&1 & echo \$! > $dir/d3.pid"
[[ -f $dir/d3.pid ]] && pids+=("$(cat "$dir/d3.pid")")
curl -sf http://127.0.0.1:18710/metrics |
  awk '/^moeserve_router_(rebinds|reprefills|prefill_retries|failed)_total/ {print}' | tr '\n' ' '
echo
