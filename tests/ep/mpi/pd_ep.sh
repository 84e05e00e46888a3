#!/usr/bin/env bash
# Prefill/decode disaggregation with EP units of two ranks on both sides (docs/pd.md): a router,
# `mpirun -np 2 moeserve serve --role prefill` and `mpirun -np 2 ... --role decode`. Every rank
# has its own KV transfer: a hand-off is offered by the rank that prefilled it and pulled by the
# rank that decodes it. Eight concurrent requests (both ranks of each unit get some), greedy and
# seeded sampled, get exactly the tokens and logprobs of co-located `mpirun -np 2 serve`, with the
# BF16 and the FP8 KV cache.
set -euo pipefail
bin=$(readlink -f "$1")
mpiexec=${2:-mpirun}
mpirun="$mpiexec --allow-run-as-root --oversubscribe"
. tests/serve_lib.sh
model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"

query() {  # port out
  python3 - "$1" "$2" <<'PY'
import json, sys, threading, urllib.request
port, out = sys.argv[1], sys.argv[2]
results = [None] * 8
def one(i):
    body = {"model": "tiny-py", "prompt": "def f%d(x):\n" % i + "    x = x + 1\n" * (2 + 9 * i),
            "max_tokens": 10, "ignore_eos": True, "logprobs": 2}
    body.update({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": i})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        c = json.load(r)["choices"][0]
    results[i] = {"tokens": c["logprobs"]["tokens"], "lp": c["logprobs"]["token_logprobs"],
                  "top": c["logprobs"]["top_logprobs"]}
ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
assert all(r is not None for r in results), "a request failed"
with open(out, "w") as f:
    for r in results: f.write(json.dumps(r) + "\n")
PY
}

for kv in bf16 fp8; do
  args=(serve --model "$model" --threads 1 --kv-cache-gb 0.2 --kv-cache-dtype "$kv" --max-model-len 2048)
  colo=$(free_port)
  $mpirun -np 2 "$bin" "${args[@]}" --port "$colo" > "$dir/colocated-$kv.log" 2>&1 &
  pids+=($!)
  wait_health "$colo" || fail "co-located R=2 server did not come up"
  query "$colo" "$dir/colocated-$kv.jsonl" || fail "queries to the co-located server"
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || true

  router=$(free_port)
  "$bin" router --model "$model" --port "$router" --max-model-len 2048 > "$dir/router-$kv.log" 2>&1 &
  pids+=($!)
  pport=$(free_port) dport=$(free_port)
  $mpirun -np 2 "$bin" "${args[@]}" --port "$pport" --role prefill \
    --router "http://127.0.0.1:$router" > "$dir/prefill-$kv.log" 2>&1 &
  pids+=($!)
  $mpirun -np 2 "$bin" "${args[@]}" --port "$dport" --role decode \
    --router "http://127.0.0.1:$router" > "$dir/decode-$kv.log" 2>&1 &
  pids+=($!)
  wait_health "$router" || fail "router did not come up"
  wait_units "$router" 2
  query "$router" "$dir/pd-$kv.jsonl" || fail "queries through the router ($kv)"
  python3 - "$dir/colocated-$kv.jsonl" "$dir/pd-$kv.jsonl" "$kv" <<'PY' || fail "R=2 units differ from co-located R=2 serving ($kv)"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 8
for i, (x, y) in enumerate(zip(a, b)):
    assert x == y, f"request {i}:\n co-located {x}\n PD         {y}"
print(f"KV {sys.argv[3]}: 8 requests through R=2 prefill and decode units equal co-located R=2 serving")
PY
  handoffs=$(curl -sf "http://127.0.0.1:$router/metrics" | awk '/^moeserve_router_handoffs_total/ {print $2}')
  [[ ${handoffs%.*} -eq 8 ]] || fail "expected 8 hand-offs, the router counted $handoffs"
  # Rank 0's own transfer counters (a unit's /metrics shows rank 0's): some of the 8 hand-offs
  # were offered and pulled by rank 1.
  offered=$(curl -sf "http://127.0.0.1:$pport/metrics" | awk '/^moeserve_pd_handoffs_offered_total/ {print $2}')
  pulled=$(curl -sf "http://127.0.0.1:$dport/metrics" | awk '/^moeserve_pd_pulls_total/ {print $2}')
  [[ $offered -ge 1 && $offered -le 7 && $pulled -ge 1 && $pulled -le 7 ]] ||
    fail "both ranks should offer and pull: rank 0 offered $offered, pulled $pulled of 8"
  echo "rank 0 offered $offered and pulled $pulled of the 8 hand-offs; rank 1 the rest"
  for i in 1 2 3; do kill -TERM "${pids[-$i]}" 2>/dev/null || true; done
  wait "${pids[-1]}" "${pids[-2]}" "${pids[-3]}" 2>/dev/null || true
done
echo "PASS: R=2 prefill and decode units equal co-located R=2 serving (BF16, FP8 KV)"
