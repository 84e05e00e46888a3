#!/usr/bin/env bash
# The planner in the router (docs/planner.md), acting through scripts/scale_units.sh as its
# --planner-hook, on loopback. Its first decision (at rest: hold the minimum) brings up one prefill
# and one decode unit; a load far above one decode unit's capacity makes it scale decode up at
# once (the log line explains each decision, /metrics shows the targets) and brings up decode
# units to the maximum (3), with no request failing; when the load stops, the decode units above
# the minimum are retired through the router's drain (each exits 0) after the planner's
# stabilization window (2 intervals below).
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"
python3 -c "import openai" 2>/dev/null || fail "python package 'openai' missing"
rport=$(free_port)
router="http://127.0.0.1:$rport"
trap 'pkill -9 -f -- "--router $router" 2>/dev/null || true; cleanup' EXIT
"$bin" router --model "$model" --host 127.0.0.1 --port "$rport" --max-model-len 1024 \
  --planner-interval 1 --planner-prefill-capacity 100000 --planner-decode-capacity 20 \
  --planner-max-decode 3 --planner-down-after 2 \
  --planner-hook "scripts/scale_units.sh --state $dir/units --router $router --model $model --bin $bin --serve-flags '--threads 1 --kv-cache-gb 0.1 --max-model-len 1024'" \
  > "$dir/router.log" 2>&1 &
pid=$!
wait_health "$rport"
wait_units "$rport" 2  # started by the planner's first decision
count() {
  curl -sf "$router/admin/units" |
    python3 -c 'import json,sys; print(sum(u["state"]=="active" and u["role"]=="decode" for u in json.load(sys.stdin)["units"]))'
}
# Load until three decode units serve (at most 60 s), every request whole.
python3 - "$router" <<'PY' || fail "the load under scaling"
import concurrent.futures as cf, json, sys, time, urllib.request
import openai
router = sys.argv[1]
c = openai.OpenAI(base_url=router + "/v1", api_key="x", max_retries=0, timeout=120)
def decode_units():
    us = json.load(urllib.request.urlopen(router + "/admin/units"))["units"]
    return sum(u["state"] == "active" and u["role"] == "decode" for u in us)
done = [False]
def one(i):
    n = 0
    while not done[0]:
        r = c.completions.create(model="tiny-py", prompt=f"def f{i}():", max_tokens=60,
                                 temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 60, r
        n += 1
    return n
with cf.ThreadPoolExecutor(4) as ex:
    futs = [ex.submit(one, i) for i in range(4)]
    end = time.time() + 60
    while decode_units() < 3 and time.time() < end:
        time.sleep(0.2)
    reached = decode_units()
    time.sleep(1)  # (requests on the new units too)
    done[0] = True
    served = sum(f.result() for f in futs)
assert reached == 3, f"{reached} decode units under load"
print(f"3 decode units under load; {served} requests, none failed")
PY
grep -q "planner: .*1 -> 1 decode (hold)" "$dir/router.log" || fail "no decision at rest in the log"
grep -q "planner: .*decode (scale up)" "$dir/router.log" || fail "no scale-up in the log"
curl -sf "$router/metrics" > "$dir/metrics.txt"
grep -q "^moeserve_planner_target_decode_units " "$dir/metrics.txt" ||
  fail "no planner targets in /metrics"
# No load: after 2 intervals below, back to one decode unit.
for _ in $(seq 100); do [[ $(count) -le 1 ]] && break; sleep 0.2; done
[[ $(count) -eq 1 ]] || fail "decode units not retired: $(count) active"
grep -q "scale down" "$dir/router.log" || fail "no scale-down decision in the log"
downs=$(grep -c "retiring the decode unit" "$dir/router.log" || true)
[[ $downs -eq 2 ]] || fail "$downs decode units retired (want 2)"
for _ in $(seq 50); do
  [[ $(grep -l "stopped" "$dir"/units/decode-*.log 2>/dev/null | wc -l) -ge 2 ]] && break
  sleep 0.2
done
[[ $(grep -l "stopped" "$dir"/units/decode-*.log 2>/dev/null | wc -l) -ge 2 ]] ||
  fail "the retired units did not stop cleanly"
echo "planner.sh: ok"
