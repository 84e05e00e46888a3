#!/usr/bin/env bash
# Prefill/decode disaggregation on three "hosts" (docs/pd.md): network namespaces for the
# router, a prefill unit and a decode unit, joined by veth pairs to a bridge in a fourth, over
# TCP only (UCX_TLS=tcp: no shared memory between the units). A co-located `serve` in the
# router's namespace is the reference. For the BF16 and the FP8 KV cache:
#   - the official openai client against the router: greedy and seeded sampled chat and
#     completions, streamed and not, concurrent, get exactly the co-located tokens and logprobs
#     (and a Responses API and a streamed Anthropic Messages call, their replies);
#   - bad input at the boundaries (a unit of another KV format registering, a decode of an
#     unknown hand-off, malformed unit requests) gets a clear error and loses no request;
#   - /admin/units and /metrics show the units and the hand-offs; SIGTERM drains a unit, and
#     so does the router's POST /admin/drain, mid-stream, losing and changing no request.
# Needs root (network namespaces); without the privilege it says so and is skipped (exit 77).
set -euo pipefail
bin=$(readlink -f "$1")
tag=pd$$
nsR=${tag}r nsP=${tag}p nsD=${tag}d nsS=${tag}s
net=10.$((150 + $$ % 100)).$(($$ % 200))
ipR=$net.1 ipP=$net.2 ipD=$net.3
dir=$(mktemp -d)
cleanup() {
  for ns in "$nsR" "$nsP" "$nsD" "$nsS"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
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
i=0
for pair in "$nsR:$ipR" "$nsP:$ipP" "$nsD:$ipD"; do
  ns=${pair%%:*} ip=${pair#*:}
  ip netns add "$ns"
  ip link add "${tag}h$i" type veth peer name "${tag}s$i"
  ip link set "${tag}h$i" netns "$ns"
  ip link set "${tag}s$i" netns "$nsS"
  ip -n "$nsS" link set "${tag}s$i" master br0 up
  ip -n "$ns" addr add "$ip/24" dev "${tag}h$i"
  ip -n "$ns" link set "${tag}h$i" up
  ip -n "$ns" link set lo up
  i=$((i + 1))
done
in_ns_check() { ip netns exec "$nsP" python3 -c "import socket,sys; s=socket.socket(); s.settimeout(2); s.connect_ex((sys.argv[1], 9)); print(1)" "$ipD" > /dev/null; }
in_ns_check || fail "the namespaces do not reach each other"

model=build/models/tiny-py
[[ -f $model/config.json ]] || fail "the embedded model is not built ($model)"
export UCX_TLS=tcp  # between "hosts": TCP, as across machines
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }  # (not for background jobs: $! would be a subshell)
wait_health() {  # NS HOST PORT LOG
  for _ in $(seq 300); do
    in_ns "$1" curl -sf "http://$2:$3/health" > /dev/null && return 0
    sleep 0.2
  done
  fail "no /health on $2:$3 ($4)"
}
wait_units() {  # N: units registered and active at the router
  for _ in $(seq 150); do
    n=$(in_ns "$nsR" curl -sf "http://$ipR:8000/admin/units" |
        python3 -c 'import json,sys; print(sum(u["state"]=="active" for u in json.load(sys.stdin)["units"]))' 2>/dev/null || echo 0)
    [[ $n -ge $1 ]] && return 0
    sleep 0.2
  done
  fail "$1 units did not register"
}

for kv in bf16 fp8; do
  echo "== KV cache $kv"
  common=(--model "$model" --threads 1 --kv-cache-gb 0.2 --kv-cache-dtype "$kv" --max-model-len 4096)
  ip netns exec "$nsR" "$bin" router --model "$model" --host "$ipR" --port 8000 --unit-timeout-ms 1500 --max-model-len 4096 \
    > "$dir/router-$kv.log" 2>&1 &
  router=$!
  ip netns exec "$nsR" "$bin" serve "${common[@]}" --host "$ipR" --port 8100 > "$dir/colocated-$kv.log" 2>&1 &
  colocated=$!
  ip netns exec "$nsP" "$bin" serve "${common[@]}" --host "$ipP" --port 8001 --role prefill \
    --router "http://$ipR:8000" > "$dir/prefill-$kv.log" 2>&1 &
  prefill=$!
  ip netns exec "$nsD" "$bin" serve "${common[@]}" --host "$ipD" --port 8002 --role decode \
    --router "http://$ipR:8000" > "$dir/decode-$kv.log" 2>&1 &
  decode=$!
  wait_health "$nsR" "$ipR" 8000 router
  wait_health "$nsR" "$ipR" 8100 colocated
  wait_units 2

  in_ns "$nsR" python3 - "$ipR" <<'PY' || fail "router output differs from co-located serving ($kv)"
import concurrent.futures as cf, json, sys, urllib.request
import openai
host = sys.argv[1]
pd = openai.OpenAI(base_url=f"http://{host}:8000/v1", api_key="none", max_retries=0)
co = openai.OpenAI(base_url=f"http://{host}:8100/v1", api_key="none", max_retries=0)
long_prompt = "def f(x):\n    return x * 2\n" * 12   # > 64 tokens: several KV blocks
cases = [
    dict(kind="chat", messages=[{"role": "user", "content": "Write a loop in Python."}],
         max_tokens=24, temperature=0, logprobs=True, top_logprobs=3),
    dict(kind="chat", messages=[{"role": "user", "content": long_prompt}], max_tokens=20,
         temperature=0.8, seed=7, logprobs=True, top_logprobs=2),
    dict(kind="completion", prompt=long_prompt, max_tokens=16, temperature=0, logprobs=2),
    dict(kind="completion", prompt="import", max_tokens=1, temperature=0, logprobs=1),  # ends at prefill
    dict(kind="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
         temperature=0.9, seed=3, stream=True),
    # The logit adjustments reach the decode unit (kernels/sampling.h).
    dict(kind="chat", messages=[{"role": "user", "content": long_prompt}], max_tokens=16,
         temperature=0.7, seed=5, presence_penalty=0.6, frequency_penalty=0.4,
         logit_bias={"16": 3, "90": -2}, logprobs=True, top_logprobs=2,
         extra_body={"repetition_penalty": 1.2, "min_p": 0.05}),
    # The Responses and Anthropic Messages APIs (docs/server.md) on the router as on serve.
    dict(kind="responses", input=long_prompt, instructions="Be brief.", max_output_tokens=12,
         temperature=0),
    dict(kind="messages", body={"model": "tiny-py", "max_tokens": 12, "temperature": 0,
                                "system": "Be brief.", "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}),
]
def run(client, case):
    c = dict(case)
    kind = c.pop("kind")
    stream = c.get("stream", False)
    if kind == "responses":
        r = client.responses.create(model="tiny-py", **c)
        return r.output_text, r.status, r.usage.input_tokens, r.usage.output_tokens
    if kind == "messages":  # (the events as sent, minus the message id)
        req = urllib.request.Request(str(client.base_url).rstrip("/") + "/messages",
                                     data=json.dumps(c["body"]).encode(),
                                     headers={"Content-Type": "application/json"})
        body = urllib.request.urlopen(req).read().decode()
        return [l for l in body.splitlines() if '"message_start"' not in l]
    if kind == "chat":
        r = client.chat.completions.create(model="tiny-py", **c)
        if stream:
            return "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
        ch = r.choices[0]
        lp = [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs])
              for t in ch.logprobs.content]
        return ch.message.content, ch.finish_reason, lp, r.usage.prompt_tokens
    r = client.completions.create(model="tiny-py", **c)
    ch = r.choices[0]
    return ch.text, ch.finish_reason, ch.logprobs.token_logprobs, ch.logprobs.top_logprobs
want = [run(co, c) for c in cases]
for i, c in enumerate(cases):
    got = run(pd, c)
    assert got == want[i], f"case {i}: router {got!r}\n co-located {want[i]!r}"
# Concurrent: every request still gets exactly its co-located result.
with cf.ThreadPoolExecutor(6) as ex:
    futs = [ex.submit(run, pd, cases[i % len(cases)]) for i in range(12)]
    for i, f in enumerate(futs):
        assert f.result() == want[i % len(cases)], f"concurrent request {i} differs"
units = json.load(urllib.request.urlopen(f"http://{host}:8000/admin/units"))["units"]
roles = sorted(u["role"] for u in units)
assert roles == ["decode", "prefill"], roles
metrics = urllib.request.urlopen(f"http://{host}:8000/metrics").read().decode()
handoffs = [l for l in metrics.splitlines() if l.startswith("moeserve_router_handoffs_total")]
# Every request but case 3's (it ends at prefill) is handed off: once each, then in the 12 concurrent.
want_handoffs = (len(cases) - 1) + (12 - sum(1 for i in range(12) if i % len(cases) == 3))
assert handoffs and float(handoffs[0].split()[1]) == want_handoffs, (handoffs, want_handoffs)
print(f"{len(cases)} cases and 12 concurrent requests through the router equal co-located serving")
PY

  # Bad input at the boundaries; nothing else is lost.
  in_ns "$nsR" python3 - "$ipR" "$ipP" "$ipD" <<'PY' || fail "bad input at the unit boundaries ($kv)"
import json, sys, urllib.error, urllib.request
r, p, d = sys.argv[1:4]
def post(url, body, raw=False):
    req = urllib.request.Request(url, data=body if raw else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
units = json.load(urllib.request.urlopen(f"http://{r}:8000/admin/units"))["units"]
unit = next(u for u in units if u["role"] == "decode")
other = dict(name="impostor:1", url="http://10.0.0.9:1", role="decode", transfer="",
             fingerprint="%016x" % (int(unit["fingerprint"], 16) ^ 1), ranks=1)
st, body = post(f"http://{r}:8000/pd/v1/register", other)
assert st == 400 and "fingerprint" in body, (st, body)
st, body = post(f"http://{r}:8000/pd/v1/register", b"{not json", raw=True)
assert st == 400, (st, body)
st, body = post(f"http://{r}:8000/pd/v1/heartbeat", {"name": "nobody", "running": 0, "waiting": 0,
                                                     "kv_blocks_used": 0, "kv_blocks_total": 1})
assert st == 404, (st, body)
req = dict(id="x1", prompt=[1, 2, 3], max_tokens=4, temperature=0, top_p=1, top_k=0,
           ignore_eos=True, stop_token_ids=[], logprobs=True, top_logprobs=0)
st, body = post(f"http://{p}:8001/pd/v1/prefill", {"id": "x"})
assert st == 400 and "missing field" in body, (st, body)
st, body = post(f"http://{p}:8001/pd/v1/prefill", dict(req, prompt=[10**7]))
assert st == 400 and "vocabulary" in body, (st, body)
st, body = post(f"http://{d}:8002/pd/v1/decode", dict(req, transfer=f"{p}:1", handle=""))
assert st == 400 and "handle" in body, (st, body)
# A decode of a hand-off the prefill unit never made: its transfer server says so.
prefill_unit = next(u for u in units if u["role"] == "prefill")
st, body = post(f"http://{d}:8002/pd/v1/decode", dict(req, transfer=prefill_unit["transfer"], handle="nope"))
line = json.loads(body.splitlines()[0])
assert st == 200 and line["finish_reason"] == "error" and "'nope'" in line["error"], (st, body)
# And a good request after all that.
st, body = post(f"http://{r}:8000/v1/completions", {"model": "tiny-py", "prompt": "x = ", "max_tokens": 5})
assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == 5, (st, body)
print("bad input refused with clear errors; requests after it served")
PY

  if [[ $kv == bf16 ]]; then
    # Both units leave through the router's POST /admin/drain while 6 streams run: every stream
    # ends whole and equal to co-located serving, both units deregister and exit 0.
    in_ns "$nsR" python3 - "$ipR" <<'PY' || fail "a drain during load lost or changed a request"
import concurrent.futures as cf, json, sys, threading, time, urllib.error, urllib.request
import openai
host = sys.argv[1]
pd = openai.OpenAI(base_url=f"http://{host}:8000/v1", api_key="none", max_retries=0)
co = openai.OpenAI(base_url=f"http://{host}:8100/v1", api_key="none", max_retries=0)
prompts = [f"def f{i}(x):\n    return x + {i}\n" for i in range(6)]
args = dict(model="tiny-py", max_tokens=48, temperature=0, extra_body={"ignore_eos": True})
started = [threading.Event() for _ in prompts]
def streamed(i):
    text, n = "", 0
    for ch in pd.completions.create(prompt=prompts[i], stream=True, **args):
        if ch.choices:
            text += ch.choices[0].text
            n += 1
            started[i].set()
    return text
def admin(path, body=None):
    req = urllib.request.Request(f"http://{host}:8000{path}", json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
want = [co.completions.create(prompt=p, **args).choices[0].text for p in prompts]
units = {u["role"]: u["name"] for u in admin("/admin/units")[1]["units"]}
st, body = admin("/admin/drain", {"unit": "nobody:1"})
assert st == 404 and "not registered" in body["error"]["message"], (st, body)
st, body = admin("/admin/drain", {"units": 1})
assert st == 400, (st, body)
with cf.ThreadPoolExecutor(len(prompts)) as ex:
    futs = [ex.submit(streamed, i) for i in range(len(prompts))]
    for e in started:
        assert e.wait(60), "a stream did not start"
    for role in ("prefill", "decode"):  # mid-stream: every request is past its prefill
        st, body = admin("/admin/drain", {"unit": units[role]})
        assert st == 200 and body["state"] == "draining", (role, st, body)
    got = [f.result(timeout=120) for f in futs]
assert got == want, f"streams after the drain differ:\n{got}\n{want}"
for _ in range(100):  # both deregister
    if not admin("/admin/units")[1]["units"]:
        break
    time.sleep(0.1)
assert not admin("/admin/units")[1]["units"], admin("/admin/units")
try:
    pd.completions.create(prompt="x", max_tokens=2, model="tiny-py")
    raise AssertionError("a request without units succeeded")
except openai.APIStatusError as e:
    assert e.status_code == 503 and "no prefill unit" in str(e), e
print("both units drained mid-stream through /admin/drain: 6 of 6 streams whole and exact")
PY
    for pid in "$prefill" "$decode"; do
      set +e; wait "$pid"; rc=$?; set -e
      [[ $rc -eq 0 ]] || fail "a unit drained by the router exited with $rc"
    done
    grep -q "the router asked this unit to drain" "$dir/prefill-$kv.log" ||
      fail "the prefill unit did not say why it left"
    kill -TERM "$router" "$colocated"
    wait "$router" "$colocated" || true
    continue
  fi
  # SIGTERM on the decode unit: it deregisters and exits 0.
  kill -TERM "$decode"
  set +e; wait "$decode"; rc=$?; set -e
  [[ $rc -eq 0 ]] || fail "decode unit exit code $rc after SIGTERM"
  grep -q "deregistered" "$dir/router-$kv.log" || fail "the decode unit did not deregister"
  kill -TERM "$prefill" "$router" "$colocated"
  wait "$prefill" "$router" "$colocated" || true
done
# The whole OpenAI client suite and a fuzz run against the router, with an API key (the units
# present it to the router and the router to them).
echo "== OpenAI client suite through the router"
key=pd-key-1
common=(--model "$model" --threads 1 --kv-cache-gb 0.2 --max-model-len 512 --api-key "$key")
ip netns exec "$nsR" "$bin" router --model "$model" --host "$ipR" --port 8000 --max-model-len 512 \
  --served-model-name tiny --api-key "$key" > "$dir/router-suite.log" 2>&1 &
ip netns exec "$nsP" "$bin" serve "${common[@]}" --host "$ipP" --port 8001 --role prefill \
  --router "http://$ipR:8000" > "$dir/prefill-suite.log" 2>&1 &
ip netns exec "$nsD" "$bin" serve "${common[@]}" --host "$ipD" --port 8002 --role decode \
  --router "http://$ipR:8000" > "$dir/decode-suite.log" 2>&1 &
wait_health "$nsR" "$ipR" 8000 router
for _ in $(seq 150); do
  n=$(in_ns "$nsR" curl -sf -H "Authorization: Bearer $key" "http://$ipR:8000/admin/units" |
      python3 -c 'import json,sys; print(sum(u["state"]=="active" for u in json.load(sys.stdin)["units"]))' 2>/dev/null || echo 0)
  [[ $n -ge 2 ]] && break
  sleep 0.2
done
[[ $n -ge 2 ]] || fail "units did not register with an API key"
in_ns "$nsR" python3 tests/server/openai_client_test.py --base-url "http://$ipR:8000" --api-key "$key" \
  --model tiny --fuzz "${MOESERVE_FUZZ_N:-300}" || fail "openai client suite through the router"

echo "PASS: disaggregated serving over three namespaces equals co-located serving (BF16, FP8 KV)"
