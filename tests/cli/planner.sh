#!/usr/bin/env bash
# The planner in the router (docs/planner.md), on loopback: a router with --planner-interval 1
# and one prefill and one decode unit of tiny-py. With no load it holds the minimum; under a load
# whose output tokens per second are several times the decode capacity it was given, it scales
# decode up at once (the log line explains it, /metrics shows the targets, the hook gets them,
# once per change); when the load stops the target comes back down. (The hook here only records
# the targets, so the units running stay one of each; the pace of scaling down, one unit after
# --planner-down-after intervals below the running count, is tests/router/planner_test.cpp's.)
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"
python3 -c "import openai" 2>/dev/null || fail "python package 'openai' missing"
rport=$(free_port)
"$bin" router --model "$model" --host 127.0.0.1 --port "$rport" --max-model-len 1024 \
  --planner-interval 1 --planner-prefill-capacity 100000 --planner-decode-capacity 20 \
  --planner-max-decode 6 --planner-down-after 2 \
  --planner-hook "echo >> $dir/hook.txt" > "$dir/router.log" 2>&1 &
pids+=($!)
wait_health "$rport"
for role in prefill decode; do
  port=$(free_port)
  "$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --role "$role" --threads 1 \
    --kv-cache-gb 0.1 --max-model-len 1024 --router "http://127.0.0.1:$rport" \
    > "$dir/$role.log" 2>&1 &
  pids+=($!)
done
wait_units "$rport" 2
sleep 1.5
grep -q "planner: .*1 -> 1 decode (hold)" "$dir/router.log" || fail "no planner decision in the log"
# Load: 4 concurrent streams of 120 tokens for about 3 s (far above 20 output tokens/s a unit).
python3 - "$rport" <<'PY' || fail "the load"
import concurrent.futures as cf, sys, time
import openai
c = openai.OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="x", max_retries=0)
def one(i):
    end = time.time() + 3
    while time.time() < end:
        c.completions.create(model="tiny-py", prompt=f"def f{i}():", max_tokens=120,
                             temperature=0, extra_body={"ignore_eos": True})
list(cf.ThreadPoolExecutor(4).map(one, range(4)))
PY
sleep 1.2
metrics=$(curl -sf "http://127.0.0.1:$rport/metrics")
up=$(echo "$metrics" | awk '/^moeserve_planner_target_decode_units / {print int($2)}')
[[ $up -ge 2 ]] || fail "the planner did not scale decode up under load (target $up)"
grep -qx "1 [2-6]" "$dir/hook.txt" ||
  fail "the hook did not get a scale-up target: $(tr '\n' ';' < "$dir/hook.txt")"
grep -q "planner: .*scale up" "$dir/router.log" || fail "no scale-up in the log"
# No load: down one unit after 2 intervals below, not at once.
sleep 3.5
down=$(curl -sf "http://127.0.0.1:$rport/metrics" | awk '/^moeserve_planner_target_decode_units / {print int($2)}')
echo "decode target: $up under load, $down 3.5 s after it"
# (The units running stay 1 + 1 here: the hook only records the targets, so the planner keeps
# asking for the same scale-up while the load lasts, and the hook is called once per change.)
[[ $(grep -cx "1 [2-6]" "$dir/hook.txt") -eq 1 ]] ||
  fail "the hook was called for an unchanged target: $(tr '\n' ';' < "$dir/hook.txt")"
echo "hook calls: $(tr '\n' ';' < "$dir/hook.txt")"
echo "planner.sh: ok"
