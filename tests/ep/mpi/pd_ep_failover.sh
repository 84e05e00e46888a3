#!/usr/bin/env bash
# A rank of an EP unit killed mid-stream (docs/fault-tolerance.md): a router, and units of two
# ranks (`mpirun -np 2`): a prefill unit, a decode unit under scripts/supervise.sh and a second
# decode unit. kill -9 of the supervised unit's rank 1 while streams run: the unit fails fast
# (Open MPI ends the job), its streams are re-bound to the other decode unit with nothing lost or
# changed against co-located `mpirun -np 2 serve` (the same EP layout everywhere: FP8 dispatch
# makes a 2-rank unit's logprobs differ from a 1-rank one's), and the supervisor's restart of
# the unit registers again with the router.
set -euo pipefail
bin=$(readlink -f "$1")
mpiexec=${2:-mpirun}
. tests/serve_lib.sh
load=$(readlink -f tests/cli/pd_load.py)
model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"
python3 -c "import openai" 2>/dev/null || fail "python package 'openai' missing (scripts/install-deps.sh)"
export UCX_TLS=tcp,self
args=(serve --model "$model" --threads 1 --kv-cache-gb 0.2 --max-model-len 2048)
router=$(free_port) colo=$(free_port) pport=$(free_port) dport=$(free_port) d1port=$(free_port)
"$bin" router --model "$model" --port "$router" --max-model-len 2048 --unit-timeout-ms 1500 \
  > "$dir/router.log" 2>&1 &
pids+=($!)
mpirun=("$mpiexec" --allow-run-as-root --oversubscribe -np 2)
"${mpirun[@]}" "$bin" "${args[@]}" --port "$colo" > "$dir/colocated.log" 2>&1 &
pids+=($!)
"${mpirun[@]}" "$bin" "${args[@]}" --port "$pport" --role prefill \
  --router "http://127.0.0.1:$router" > "$dir/prefill.log" 2>&1 &
pids+=($!)
"${mpirun[@]}" "$bin" "${args[@]}" --port "$d1port" --role decode \
  --router "http://127.0.0.1:$router" > "$dir/decode1.log" 2>&1 &
pids+=($!)
bash scripts/supervise.sh "${mpirun[@]}" "$bin" "${args[@]}" \
  --port "$dport" --role decode --router "http://127.0.0.1:$router" > "$dir/decode-ep.log" 2>&1 &
supervisor=$!
pids+=($supervisor)
wait_health "$router"
wait_health "$colo"
active() {
  curl -sf "http://127.0.0.1:$router/admin/units" |
    python3 -c 'import json,sys; print(sum(u["state"]=="active" for u in json.load(sys.stdin)["units"]))' 2>/dev/null || echo 0
}
wait_active() {
  for _ in $(seq 600); do [[ $(active) -ge 3 ]] && return 0; sleep 0.1; done
  fail "3 units not active at the router"
}
wait_active
# Rank 1 of the EP decode unit, found by its MPI rank.
rank1() {
  for p in $(pgrep -f -- "--port $dport --role decode" || true); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" &&
       [[ $(readlink "/proc/$p/exe") == "$bin" ]]; then
      echo "$p"
      return
    fi
  done
}
victim=$(rank1)
[[ -n $victim ]] || fail "rank 1 of the EP decode unit not found"
(while :; do echo "$(date +%s.%N) $(active)"; sleep 0.1; done) > "$dir/active.txt" &
poller=$!
pids+=($poller)
python3 "$load" --url "http://127.0.0.1:$router/v1" --ref "http://127.0.0.1:$colo/v1" \
  --label "EP decode unit: kill -9 of rank 1" --n 6 --max-tokens 60 --at 8 \
  --then "date +%s.%N > $dir/kill_at; kill -9 $victim" || fail "requests lost or changed when an EP rank died"
grep -q "re-bound" "$dir/router.log" || fail "no request was re-bound"
for _ in $(seq 600); do
  grep -q "starting it again" "$dir/decode-ep.log" && break
  sleep 0.1
done
grep -q "starting it again" "$dir/decode-ep.log" || fail "the supervisor did not restart the unit"
wait_active
sleep 0.3
kill "$poller"
# From the kill to the unit active again: the first time after the kill that all 3 units are
# active once one was not.
python3 - "$(cat "$dir/kill_at")" "$dir/active.txt" <<'PY' || fail "the EP unit did not come back"
import sys
kill = float(sys.argv[1])
rows = [l.split() for l in open(sys.argv[2]) if len(l.split()) == 2]
rows = [(float(t), int(n)) for t, n in rows if float(t) >= kill]
down = next(i for i, (t, n) in enumerate(rows) if n < 3)
back = next(t for t, n in rows[down:] if n >= 3)
print(f"the EP unit was out of the choice {rows[down][0] - kill:.2f} s after its rank died "
      f"and active again after {back - kill:.2f} s (supervisor restart and start-up included)")
PY
kill -TERM "$supervisor"
wait "$supervisor" || true
echo "pd_ep_failover.sh: ok"
