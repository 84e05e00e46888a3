#!/usr/bin/env bash
# A request that comes to a router before any unit is alive (a fleet scaling up from none, or
# every unit's heartbeat late) waits --unit-wait-ms for one instead of failing at once: sent
# before the units start, it is served once they register; with no unit for longer than the
# wait it fails with a 503 that says why (docs/planner.md).
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"
rport=$(free_port)
"$bin" router --model "$model" --host 127.0.0.1 --port "$rport" --max-model-len 1024 \
  --unit-wait-ms 20000 > "$dir/router.log" 2>&1 &
pids+=($!)
wait_health "$rport"
body='{"model": "tiny-py", "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}'
start=$(date +%s.%N)
curl -s -o "$dir/reply.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" \
  "http://127.0.0.1:$rport/v1/completions" > "$dir/code.txt" &
req=$!
sleep 1.5  # no unit yet: the request waits
kill -0 "$req" 2>/dev/null || fail "the request ended before any unit existed: $(cat "$dir/code.txt") $(cat "$dir/reply.json")"
for role in prefill decode; do
  "$bin" serve --model "$model" --host 127.0.0.1 --port "$(free_port)" --threads 1 \
    --kv-cache-gb 0.1 --max-model-len 1024 --role "$role" \
    --router "http://127.0.0.1:$rport" > "$dir/$role.log" 2>&1 &
  pids+=($!)
done
wait "$req" || fail "curl failed"
[[ $(cat "$dir/code.txt") == 200 ]] || fail "HTTP $(cat "$dir/code.txt"): $(cat "$dir/reply.json")"
python3 - "$dir/reply.json" "$start" <<'PY' || fail "the waiting request's reply"
import json, sys, time
r = json.load(open(sys.argv[1]))
assert r["usage"]["completion_tokens"] == 8, r
assert time.time() - float(sys.argv[2]) > 1.5
PY
# A router whose wait runs out: 503, naming what is missing.
rport2=$(free_port)
"$bin" router --model "$model" --host 127.0.0.1 --port "$rport2" --max-model-len 1024 \
  --unit-wait-ms 300 > "$dir/router2.log" 2>&1 &
pids+=($!)
wait_health "$rport2"
code=$(curl -s -o "$dir/reply2.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d "$body" "http://127.0.0.1:$rport2/v1/completions")
[[ $code == 503 ]] || fail "want 503 with no unit, got $code: $(cat "$dir/reply2.json")"
grep -q "no prefill unit is registered and alive" "$dir/reply2.json" ||
  fail "the 503 does not say why: $(cat "$dir/reply2.json")"
echo "router_unit_wait.sh: ok"
