#!/usr/bin/env bash
# Decode TPOT of 8 running streams while 2,000-token prompts keep arriving: disaggregated
# (router, prefill unit on core 0, decode unit on core 1, one thread each) against co-located
# serving on both cores (docs/pd.md "Bench"). Usage:
#   bash bench/pd/tpot_isolation.sh [MODEL_DIR]   (default /tmp/benchmodel, the bench preset:
#                                                  ./build/moeserve make-model --preset bench --out /tmp/benchmodel)
# Then the KV transfer figures: pd-bench transfer at the model's block size and at V3's.
# Prints one JSON line per configuration. Takes ~6 minutes (BUSY_S=150: ~11); not in CI.
set -euo pipefail
bin=$(readlink -f build/moeserve)
model=${1:-/tmp/benchmodel}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
wait_up() { for _ in $(seq 900); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; echo "port $1 not up" >&2; exit 1; }
common=(--model "$model" --kv-cache-gb 2 --max-model-len 16384)
args=(--streams 8 --prompt-len "${PROMPT_LEN:-2000}" --quiet-s "${QUIET_S:-20}" --busy-s "${BUSY_S:-60}")

# Co-located: one server, both cores (SKIP_COLOCATED=1 skips it).
if [[ -z ${SKIP_COLOCATED:-} ]]; then
"$bin" serve "${common[@]}" --port 18500 --threads 2 > "$dir/colocated.log" 2>&1 & pids+=($!)
wait_up 18500
python3 bench/pd/tpot_isolation.py --url http://127.0.0.1:18500 --label colocated "${args[@]}"
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
fi

# Disaggregated: the router (light; on a host of its own in a deployment) beside the prefill unit
# on core 0, the decode unit on core 1. (Unpinned at nice -10 the router did no better: p99
# ratio 1.76-1.89 against 1.44-1.62 pinned.)
taskset -c 0 "$bin" router --model "$model" --port 18600 > "$dir/router.log" 2>&1 & pids+=($!)
taskset -c 0 "$bin" serve "${common[@]}" --port 18601 --threads 1 --role prefill \
  --router http://127.0.0.1:18600 > "$dir/prefill.log" 2>&1 & pids+=($!)
taskset -c 1 "$bin" serve "${common[@]}" --port 18602 --threads 1 --role decode \
  --router http://127.0.0.1:18600 > "$dir/decode.log" 2>&1 & pids+=($!)
wait_up 18601; wait_up 18602; wait_up 18600; sleep 2
python3 bench/pd/tpot_isolation.py --url http://127.0.0.1:18600 --label disaggregated "${args[@]}"
# Transfer time against prefill time, from the units' own counters.
python3 - <<'PY'
import json, urllib.request
def metric(port, name):
    for l in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode().splitlines():
        if l.startswith(name + " "):
            return float(l.split()[1])
pulls = metric(18602, "moeserve_pd_pulls_total")
us = metric(18602, "moeserve_pd_pull_microseconds_total")
b = metric(18602, "moeserve_pd_pull_bytes_total")
print(json.dumps({"label": "disaggregated transfers", "pulls": pulls,
                  "pull_ms_mean": us / pulls / 1e3 if pulls else None,
                  "pull_mb_mean": b / pulls / 1e6 if pulls else None,
                  "pull_gb_s": b / (us * 1e3) if us else None}))
PY

# Control (SKIP_CONTROL=1 skips it): the same decode unit on core 1 and its 8 streams through the
# router, while the 2,000-token prompts go to an unrelated `serve` on core 0: the same compute
# beside the decode core, but no hand-off, pull or router work for the prompts. If its p99 ratio
# is PD's, what is left of PD's tail is the machine shared by the two cores (DRAM, L3), not the
# disaggregation.
if [[ -z ${SKIP_CONTROL:-} ]]; then
taskset -c 0 "$bin" serve "${common[@]}" --port 18603 --threads 1 > "$dir/control.log" 2>&1 & pids+=($!)
wait_up 18603
python3 bench/pd/tpot_isolation.py --url http://127.0.0.1:18600 --busy-url http://127.0.0.1:18603 \
  --label "control: PD streams, prompts to a standalone serve on core 0" "${args[@]}"
fi
