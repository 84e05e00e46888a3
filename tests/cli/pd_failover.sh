#!/usr/bin/env bash
# Units that die under load (docs/fault-tolerance.md), on five "hosts": network namespaces for
# the router, two prefill units and two decode units, joined by veth pairs to a bridge, over TCP
# (UCX_TLS=tcp). A co-located `serve` in the router's namespace is the reference. Each step runs
# streamed greedy and seeded sampled completions through the router (tests/cli/pd_load.py) and
# prints requests lost, requests changed, the longest stall and the recovery time:
#   1. kill -9 of a decode unit mid-stream: its requests go on at the other, nothing lost or
#      changed;
#   2. the killed decode unit started again while streams run (a join under load);
#   3. SIGSTOP of a decode unit mid-stream (it stops answering without dying): the same; then
#      SIGCONT and SIGTERM: it exits 0;
#   4. kill -9 of a prefill unit while prompts are being prefilled and handed off;
#   5. kill -9 of router A mid-stream, with a second router B in front of the same units (every
#      unit registers with both; /admin/units agrees): every stream resumes through B with its
#      Idempotency-Key and Last-Event-ID, read from the decode units that went on with them,
#      nothing lost or changed; a non-streamed request cut by the kill, sent again to B with its
#      key (twice), is the same completion, read from the decode unit, not generated again; a
#      stream nobody resumes is cancelled after the unit's grace; when the decode unit that
#      B reads a stream from dies too, B generates it again and sends only what the client lacks;
#      a restarted router A has its units back by themselves and serves equal output.
# Needs root (network namespaces); without the privilege it says so and is skipped (exit 77).
set -euo pipefail
bin=$(readlink -f "$1")
load=$(dirname "$(readlink -f "$0")")/pd_load.py
tag=pf$$
net=10.$((50 + $$ % 100)).$(($$ % 200))
hosts=(r p1 p2 d1 d2 r2)
declare -A ip
for i in "${!hosts[@]}"; do ip[${hosts[$i]}]=$net.$((i + 1)); done
nsS=${tag}s
dir=$(mktemp -d)
cleanup() {
  for h in "${hosts[@]}" s; do
    ip netns pids "$tag$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$tag$h" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/*.log; do [[ -f $f ]] && { echo "== $f" >&2; tail -25 "$f" >&2; }; done
  exit 1
}
python3 -c "import openai" 2>/dev/null || fail "python package 'openai' missing (scripts/install-deps.sh)"
if ! ip netns add "$nsS" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and CAP_SYS_ADMIN)"
  exit 77
fi
ip -n "$nsS" link add br0 type bridge
ip -n "$nsS" link set br0 up
for i in "${!hosts[@]}"; do
  h=${hosts[$i]} ns=$tag${hosts[$i]}
  ip netns add "$ns"
  ip link add "${tag}h$i" type veth peer name "${tag}v$i"
  ip link set "${tag}h$i" netns "$ns"
  ip link set "${tag}v$i" netns "$nsS"
  ip -n "$nsS" link set "${tag}v$i" master br0 up
  ip -n "$ns" addr add "${ip[$h]}/24" dev "${tag}h$i"
  ip -n "$ns" link set "${tag}h$i" up
  ip -n "$ns" link set lo up
done

model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"
export UCX_TLS=tcp
R=${ip[r]}
router_url=http://$R:8000
R2=${ip[r2]}
router2_url=http://$R2:8000
in_r() { ip netns exec "${tag}r" "$@"; }
wait_health() {  # HOST PORT
  for _ in $(seq 300); do
    in_r curl -sf "http://$1:$2/health" > /dev/null && return 0
    sleep 0.2
  done
  fail "no /health on $1:$2"
}
active_units() {
  in_r curl -sf "$router_url/admin/units" 2>/dev/null |
    python3 -c 'import json,sys; print(sum(u["state"]=="active" for u in json.load(sys.stdin)["units"]))' 2>/dev/null || echo 0
}
wait_units() {  # N
  for _ in $(seq 150); do
    [[ $(active_units) -ge $1 ]] && return 0
    sleep 0.1
  done
  fail "$1 units did not register"
}
start_router() {
  ip netns exec "${tag}r" "$bin" router --model "$model" --host "$R" --port 8000 \
    --unit-timeout-ms 1500 --max-model-len 4096 >> "$dir/router.log" 2>&1 &
  router=$!
}
ip netns exec "${tag}r2" "$bin" router --model "$model" --host "$R2" --port 8000 \
  --unit-timeout-ms 1500 --max-model-len 4096 >> "$dir/router2.log" 2>&1 &
common=(--model "$model" --threads 1 --kv-cache-gb 0.2 --max-model-len 4096 --resume-grace 3)
declare -A unit_pid
start_unit() {  # HOST ROLE PORT
  ip netns exec "$tag$1" "$bin" serve "${common[@]}" --host "${ip[$1]}" --port "$3" --role "$2" \
    --router "$router_url" --router "$router2_url" >> "$dir/$1.log" 2>&1 &
  unit_pid[$1]=$!
}
start_router
in_r "$bin" serve "${common[@]}" --host "$R" --port 8100 > "$dir/colocated.log" 2>&1 &
colocated=$!
start_unit p1 prefill 8001
start_unit p2 prefill 8001
start_unit d1 decode 8002
start_unit d2 decode 8002
wait_health "$R" 8000
wait_health "$R" 8100
wait_units 4
run_load() {  # LABEL [pd_load.py args...]
  local label=$1
  shift
  in_r python3 "$load" --url "$router_url/v1" --ref "http://$R:8100/v1" --label "$label" "$@" \
    | tee -a "$dir/results.jsonl" || fail "$label: requests lost or changed"
}

echo "== 1. kill -9 of decode unit d1 mid-stream"
run_load "decode unit kill -9" --n 6 --max-tokens 80 --at 10 --then "kill -9 ${unit_pid[d1]}"
wait "${unit_pid[d1]}" 2>/dev/null || true
grep -q "re-bound" "$dir/router.log" || fail "the router logged no re-bound request"

echo "== 2. d1 joins again while streams run"
# (the command the load runs starts d1 in its namespace; its pid lands in a file)
run_load "decode unit join" --n 6 --max-tokens 60 --at 5 \
  --then "ip netns exec ${tag}d1 $bin serve ${common[*]} --host ${ip[d1]} --port 8002 --role decode --router $router_url --router $router2_url >> $dir/d1.log 2>&1 & echo \$! > $dir/d1.pid"
unit_pid[d1]=$(cat "$dir/d1.pid")
wait_units 4

echo "== 3. SIGSTOP of decode unit d2 mid-stream"
run_load "decode unit SIGSTOP" --n 6 --max-tokens 80 --at 10 --then "kill -STOP ${unit_pid[d2]}"
kill -CONT "${unit_pid[d2]}"
sleep 1
kill -TERM "${unit_pid[d2]}"
set +e; wait "${unit_pid[d2]}"; rc=$?; set -e
[[ $rc -eq 0 ]] || fail "decode unit d2 exit code $rc after SIGSTOP, SIGCONT, SIGTERM"
start_unit d2 decode 8002
wait_units 4

echo "== 4. kill -9 of prefill unit p1 while prompts prefill"
run_load "prefill unit kill -9" --n 8 --max-tokens 24 --prompt-repeat 60 --at 0 \
  --then "sleep 0.3; kill -9 ${unit_pid[p1]}"
wait "${unit_pid[p1]}" 2>/dev/null || true
# The kill hit work in flight: prefills tried again elsewhere, or hand-offs prefilled again.
moved=$(in_r curl -sf "$router_url/metrics" | awk '/^moeserve_router_(prefill_retries|reprefills)_total/ {s += $2} END {print s + 0}')
echo "prefill retries + re-prefills after the prefill unit's kill: $moved"
[[ $moved -gt 0 ]] || fail "the prefill unit's kill moved no request (the test missed its moment)"

echo "== 5. kill -9 of router A mid-stream; the streams resume through router B"
wait_health "$R2" 8000
# Both routers know the same units, in the same states (within a few heartbeats).
in_r python3 - "$router_url" "$router2_url" <<'PY' || fail "the routers disagree on the units"
import json, sys, time, urllib.request
def units(url):
    try:
        us = json.load(urllib.request.urlopen(url + "/admin/units", timeout=2))["units"]
        return sorted((u["name"], u["role"], u["state"]) for u in us)
    except Exception as e:  # noqa: BLE001 (polled again)
        return str(e)
for _ in range(100):
    a, b = units(sys.argv[1]), units(sys.argv[2])
    if a == b:
        print(f"both routers list the same {len(a)} units")
        sys.exit(0)
    time.sleep(0.1)
sys.exit(f"router A: {a}\nrouter B: {b}")
PY
run_load "router kill -9, resumed through router B" --n 4 --max-tokens 80 --at 10 \
  --then "kill -9 $router" --resume-url "$router2_url/v1"
wait "$router" 2>/dev/null || true
# The decode units went on with the streams of the dead router, and B read them from there.
attached() { in_r curl -sf "$router2_url/metrics" | awk '/^moeserve_router_attached_total/ {print $2 + 0}'; }
[[ $(attached) -ge 4 ]] || fail "router B attached to $(attached) of the 4 kept streams"
# A non-streamed request cut by the kill of its router, sent again to B with the same key: the
# same completion (id and text) as B gives that key every time, and the co-located text.
start_router
wait_health "$R" 8000
wait_units 3
in_r python3 - "$router_url" "$router2_url" "http://$R:8100" "$router" <<'PY' || fail "a retried non-streamed request"
import json, os, signal, sys, threading, time
import openai
a, b, ref = (openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=120)
             for u in sys.argv[1:4])
params = dict(model="tiny-py", prompt="def main():\n" * 20, max_tokens=1500, temperature=0.8, seed=5)
key = {"Idempotency-Key": f"retry-{time.time_ns()}"}
cut = []
def first():
    try:
        a.completions.create(extra_headers=key, **params)
    except Exception as e:  # noqa: BLE001 (the kill)
        cut.append(e)
t = threading.Thread(target=first)
t.start()
time.sleep(0.5)
os.kill(int(sys.argv[4]), signal.SIGKILL)
t.join()
assert cut, "the router's kill did not cut the request (it ended first)"
r1 = b.completions.create(extra_headers=key, **params)
r2 = b.completions.create(extra_headers=key, **params)
want = ref.completions.create(**params)
assert (r1.id, r1.choices[0].text) == (r2.id, r2.choices[0].text), (r1, r2)
assert r1.choices[0].text == want.choices[0].text, (r1.choices[0].text, want.choices[0].text)
print(f"non-streamed retry through router B: the same completion ({r1.id})")
PY
[[ $(attached) -ge 6 ]] || fail "router B generated the retried request again ($(attached) attached)"
wait "$router" 2>/dev/null || true
# A stream whose client never comes back after its router died: the decode unit goes on for the
# grace (--resume-grace 3 here), then cancels it. (A keyed stream whose client leaves while its
# router lives is cancelled at once: the router tells the unit.)
start_router
wait_health "$R" 8000
wait_units 3
running() {  # the decode units' running requests
  local n=0
  for h in d1 d2; do
    n=$((n + $(in_r curl -sf "http://${ip[$h]}:8002/metrics" | awk '/^moeserve_num_requests_running / {print int($2)}')))
  done
  echo $n
}
in_r python3 - "$router_url" <<'PY' || fail "a keyed stream its client left"
import sys, time
import openai
a = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=60)
s = a.completions.create(model="tiny-py", prompt="y = 2\n" * 10, max_tokens=3000, stream=True,
                         temperature=0, extra_headers={"Idempotency-Key": f"left-{time.time_ns()}"})
for i, _ in enumerate(s):
    if i == 5:
        s.close()  # (the client goes away; the router lives)
        break
PY
for _ in $(seq 15); do [[ $(running) -eq 0 ]] && break; sleep 0.1; done
[[ $(running) -eq 0 ]] || fail "a keyed stream its client left still runs at the decode unit"
in_r python3 - "$router_url" "$router" <<'PY' || fail "a stream nobody resumed"
import os, signal, sys, time
import openai
a = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=60)
s = a.completions.create(model="tiny-py", prompt="x = 1\n" * 10, max_tokens=3000, stream=True,
                         temperature=0, extra_headers={"Idempotency-Key": f"gone-{time.time_ns()}"})
for i, _ in enumerate(s):
    if i == 5:
        os.kill(int(sys.argv[2]), signal.SIGKILL)
        break
PY
[[ $(running) -ge 1 ]] || fail "the decode unit did not go on with the stream of the dead router"
sleep 4.5
[[ $(running) -eq 0 ]] || fail "the decode unit still runs a stream nobody resumed after the grace"
echo "a stream nobody resumed: going on after the router's kill, cancelled after the 3-s grace"
wait "$router" 2>/dev/null || true
# Router A dies, the streams resume through B from the decode units, and then decode unit d1
# dies too: B generates its streams again, sending only the tokens after those the client has.
start_router
wait_health "$R" 8000
wait_units 3
run_load "router kill -9, then decode unit kill -9 under router B" --n 4 --max-tokens 300 --at 10 \
  --then "kill -9 $router; sleep 0.3; kill -9 ${unit_pid[d1]}" --resume-url "$router2_url/v1"
wait "$router" 2>/dev/null || true
wait "${unit_pid[d1]}" 2>/dev/null || true
grep -q "generated again after its kept stream's unit went away" "$dir/router2.log" ||
  fail "router B generated no stream again after the decode unit it read from died"
start_unit d1 decode 8002
t0=$(date +%s.%N)
start_router
wait_health "$R" 8000
wait_units 3  # p2, d1, d2 register again by themselves (d1 anew)
t1=$(date +%s.%N)
echo "units back at the restarted router after $(python3 -c "print(round($t1 - $t0, 2))") s"
run_load "after the router restart" --n 2 --max-tokens 24 --at 0

echo "PASS (results: $(wc -l < "$dir/results.jsonl") runs)"
