#!/usr/bin/env bash
# `mpirun -np R moeserve serve` (DP attention, EP experts, rank 0 serving HTTP) on a small random
# checkpoint:
#   - with the lossless F32 dispatch, 8 concurrent greedy completions give the single-process
#     server's tokens, logprobs within 1e-4, at R = 2 and 4; /metrics counts every rank's tokens;
#   - FP8 dispatch serves the same requests without error (its numbers differ by rounding);
#   - --no-overlap (no dual micro-batches) gives the same tokens and logprobs at R = 2;
#   - --kv-disk on every rank: a restarted group reads the blocks the first one wrote, same output;
#   - SIGTERM to mpirun stops every rank with exit code 0, --expert-stats-out writes the group's
#     expert loads (read back by `moeserve eplb`), and --trace writes one Chrome trace per
#     rank with a compute and a communication track (dispatch/combine per layer);
#   - a rank killed mid-service: rank 0 answers 503 (health and new requests) within the EP
#     timeout, naming the silent rank, instead of hanging.
set -euo pipefail
bin=$1
mpiexec=${2:-mpirun}
mpirun="$mpiexec --allow-run-as-root --oversubscribe"
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$dir"/*.log; do echo "== $f" >&2; cat "$f" >&2; done; exit 1; }

"$bin" make-model --preset tiny --out "$dir/m" --set vocab_size=2000 --set num_hidden_layers=3 2>/dev/null
tok=assets/tokenizer/deepseek-v3
# A port nobody listens on now (the kernel's pick; other tests run servers concurrently).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_health() {  # port
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# Sends the same 8 completions concurrently; writes one JSON line per request (tokens, logprobs).
query() {  # port out [tokens added to every prompt]
  python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys, threading, urllib.request
port, out, extra = sys.argv[1], sys.argv[2], int(sys.argv[3])
results = [None] * 8
def one(i):
    body = {"model": "m", "prompt": [(i * 37 + j * 11) % 2000 for j in range(3 + 9 * i + extra)],
            "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        c = json.load(r)["choices"][0]
    results[i] = {"tokens": c["logprobs"]["tokens"], "lp": c["logprobs"]["token_logprobs"]}
ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
assert all(r is not None for r in results), "a request failed"
with open(out, "w") as f:
    for r in results: f.write(json.dumps(r) + "\n")
PY
}

compare() {  # a b tolerance
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(a) == len(b) == 8
worst = 0.0
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"], (x["tokens"], y["tokens"])
    worst = max([worst] + [abs(p - q) for p, q in zip(x["lp"], y["lp"])])
print(f"max |dlogprob| {worst:.2e}")
assert worst <= tol, worst
PY
}

serve_args=(serve --model "$dir/m" --tokenizer "$tok" --threads 1 --kv-cache-gb 0.2)

# The single-process reference.
port=$(free_port)
"$bin" "${serve_args[@]}" --port $port > "$dir/single.log" 2>&1 &
pids+=($!)
wait_health $port || fail "single-process server did not come up"
query $port "$dir/single.jsonl" || fail "queries to the single-process server"
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || fail "single-process server exit code"

for np in 2 4; do
  port=$(free_port)
  $mpirun -np $np "$bin" "${serve_args[@]}" --port $port --dispatch-dtype f32 \
    --trace "$dir/trace$np.json" --expert-stats-out "$dir/stats$np.json" > "$dir/ep$np.log" 2>&1 &
  pids+=($!)
  wait_health $port || fail "R=$np server did not come up"
  query $port "$dir/ep$np.jsonl" || fail "R=$np queries"
  echo -n "R=$np f32 dispatch vs single process: "
  compare "$dir/single.jsonl" "$dir/ep$np.jsonl" 1e-4 || fail "R=$np differs from the single process"
  gen=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '/^moeserve_generation_tokens_total/ {print $2}')
  [[ "${gen%.*}" == 80 ]] || fail "R=$np /metrics generated tokens '$gen', expected 80 (every rank's)"
  # mpirun forwards SIGTERM to every rank; its own exit code after a signal is not the ranks'
  # (Open MPI returns 1), so each rank's clean stop is read from its last words.
  kill -TERM "${pids[-1]}"
  wait "${pids[-1]}" || true
  stopped=$(grep -c -E "^serve( \(rank [0-9]+\))?: stopped$" "$dir/ep$np.log" || true)
  [[ "$stopped" == "$np" ]] || fail "R=$np: $stopped of $np ranks stopped cleanly after SIGTERM"
  # --expert-stats-out: the group's loads, in the file `moeserve eplb --loads` plans from.
  grep -q "^eplb: .* steps" "$dir/ep$np.log" || fail "R=$np: no expert-load summary at exit"
  "$bin" eplb --loads "$dir/stats$np.json" --replicas 16 --groups 1 --nodes 1 --gpus $np --json \
    > "$dir/plan$np.json" || fail "R=$np: eplb cannot read the stats the server wrote"
  for r in $(seq 0 $((np - 1))); do
    python3 - "$dir/trace$np.json.rank$r.json" <<'PY' || fail "R=$np rank $r trace"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in ev if e.get("ph") == "X"]
comm = {e["name"].split()[0] for e in x if e["tid"] == 1}
comp = {e["name"].split()[0] for e in x if e["tid"] == 0}
assert {"dispatch", "combine"} <= comm, comm
assert "attention" in comp and "experts" in comp, comp
PY
  done
done

# FP8 dispatch (the default) serves too.
port=$(free_port)
$mpirun -np 2 "$bin" "${serve_args[@]}" --port $port > "$dir/fp8.log" 2>&1 &
pids+=($!)
wait_health $port || fail "FP8 server did not come up"
query $port "$dir/fp8.jsonl" || fail "FP8 queries"
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || true

# The KV disk tier under DP attention: every rank opens one directory. A restarted group finds
# the 18 full prompt blocks the first one wrote (whichever rank wrote or now reads each) and
# serves the same tokens.
for run in 1 2; do
  port=$(free_port)
  $mpirun -np 2 "$bin" "${serve_args[@]}" --port $port --dispatch-dtype f32 --kv-disk "$dir/kv" \
    > "$dir/disk$run.log" 2>&1 &
  pids+=($!)
  wait_health $port || fail "--kv-disk server $run did not come up"
  query $port "$dir/disk$run.jsonl" 140 || fail "--kv-disk queries $run"
  hits=$(curl -sf "http://127.0.0.1:$port/metrics" |
    awk '/^moeserve_prefix_cache_disk_hits_total/ {print $2}')
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || true
  [[ "$hits" == $(( run == 1 ? 0 : 18 * 64 )) ]] || fail "--kv-disk run $run: $hits disk hit tokens"
done
echo -n "R=2 --kv-disk after a restart vs before: "
compare "$dir/disk1.jsonl" "$dir/disk2.jsonl" 1e-4 || fail "disk hits changed the output"

# --no-overlap (one batch per step, no micro-batches) serves the same tokens.
port=$(free_port)
$mpirun -np 2 "$bin" "${serve_args[@]}" --port $port --dispatch-dtype f32 --no-overlap \
  > "$dir/no_overlap.log" 2>&1 &
pids+=($!)
wait_health $port || fail "--no-overlap server did not come up"
query $port "$dir/no_overlap.jsonl" || fail "--no-overlap queries"
echo -n "R=2 f32 dispatch --no-overlap vs single process: "
compare "$dir/single.jsonl" "$dir/no_overlap.jsonl" 1e-4 || fail "--no-overlap differs"
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || true

# A rank dies: rank 0 answers 503 and names it within the EP timeout, then exits (Open MPI would
# otherwise abort the whole job at once, also a fast failure; recovery mode keeps rank 0 up to
# say why).
port=$(free_port)
$mpirun --mca orte_abort_on_non_zero_status 0 --mca orte_enable_recovery 1 -np 2 "$bin" \
  "${serve_args[@]}" --port $port --ep-timeout 2 > "$dir/dead.log" 2>&1 &
pids+=($!)
wait_health $port || fail "dead-peer server did not come up"
victim=""
for p in $(pgrep -f -- "--port $port"); do
  if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$'; then victim=$p; fi
done
[[ -n "$victim" ]] || fail "rank 1 not found"
kill -9 "$victim"
start=$(date +%s)
code=""
for _ in $(seq 1 100); do
  code=$(curl -s -o "$dir/health.json" -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
  [[ "$code" != 200 ]] && break
  sleep 0.1
done
elapsed=$(( $(date +%s) - start ))
[[ "$code" == 503 ]] || fail "rank 0 says '$code' ${elapsed}s after rank 1 died, expected 503"
grep -q "rank 1" "$dir/health.json" || fail "503 does not name rank 1: $(cat "$dir/health.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
  -H 'content-type: application/json' -d '{"model":"m","prompt":[1,2],"max_tokens":2}')
[[ "$code" == 503 ]] || fail "a request after the peer died got $code, expected 503"
echo "dead peer: rank 0 answered 503 naming rank 1 after ${elapsed}s"
(( elapsed <= 8 )) || fail "took ${elapsed}s to notice the dead peer"
# ... and then exits by itself (with code 1; in recovery mode mpirun does not pass the ranks'
# codes on), so a supervisor restarts it.
timeout 30 tail --pid="${pids[-1]}" -f /dev/null || fail "rank 0 did not exit after its peer died"
wait "${pids[-1]}" || true
grep -q "no answer from rank 1 .*answering 503 for .* then exiting" "$dir/dead.log" ||
  fail "rank 0 did not say why it exits"
echo "serve_ep: OK"
