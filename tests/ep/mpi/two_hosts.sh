#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair, one rank in each,
# talking over Open MPI's TCP transport only (btl tcp,self: no shared memory between them).
# mpirun starts in the first namespace and reaches the second through an rsh agent that runs
# `ip netns exec`. Checks:
#   - generate with the lossless F32 dispatch gives the single-process tokens, logprobs within
#     1e-4;
#   - serve: rank 0 (first namespace) answers a completion whose tokens equal the single-process
#     server's, and SIGTERM stops both ranks.
# Needs root (network namespaces); without the privilege it says so and is skipped (exit 77).
set -euo pipefail
bin=$(readlink -f "$1")
mpiexec=${2:-mpirun}
tag=ms$$
nsA=${tag}a nsB=${tag}b
net=10.$((100 + $$ % 100)).$(($$ % 200)).0
ipA=${net%.0}.1 ipB=${net%.0}.2
dir=$(mktemp -d)
launcher=""
cleanup() {
  [[ -n "$launcher" ]] && kill -9 "$launcher" 2>/dev/null || true
  ip netns pids "$nsA" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$nsB" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$nsA" 2>/dev/null || true
  ip netns del "$nsB" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$dir"/*.log; do [[ -f $f ]] && { echo "== $f" >&2; cat "$f" >&2; }; done; exit 1; }

if ! ip netns add "$nsA" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and CAP_SYS_ADMIN)"
  exit 77
fi
ip netns add "$nsB"
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$nsA"
ip link set "${tag}vb" netns "$nsB"
ip -n "$nsA" addr add "$ipA/24" dev "${tag}va"
ip -n "$nsB" addr add "$ipB/24" dev "${tag}vb"
for ns in "$nsA" "$nsB"; do
  ip -n "$ns" link set lo up
done
ip -n "$nsA" link set "${tag}va" up
ip -n "$nsB" link set "${tag}vb" up

cat > "$dir/agent.sh" <<EOF
#!/bin/bash
# mpirun's remote launcher: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
host=\$1; shift
case \$host in $ipA) ns=$nsA;; $ipB) ns=$nsB;; *) echo "unknown host \$host" >&2; exit 1;; esac
exec ip netns exec \$ns /bin/sh -c "\$*"
EOF
chmod +x "$dir/agent.sh"
mpirun=(ip netns exec "$nsA" "$mpiexec" --allow-run-as-root --oversubscribe --host "$ipA,$ipB" -np 2
        --mca plm_rsh_agent "$dir/agent.sh" --mca btl tcp,self
        --mca btl_tcp_if_include "$net/24" --mca oob_tcp_if_include "$net/24")

"$bin" make-model --preset tiny --out "$dir/m" --set vocab_size=2000 --set num_hidden_layers=3 2>/dev/null
args=(generate --model "$dir/m" --prompt-ids 0,5,9,33,2 --prompt-ids 7 --prompt-ids 11,12
      --max-tokens 6 --logprobs 3 --json --ignore-eos --threads 1)
"$bin" "${args[@]}" > "$dir/single.jsonl" 2> "$dir/single.log"
timeout 120 "${mpirun[@]}" "$bin" "${args[@]}" --dispatch-dtype f32 > "$dir/two.jsonl" 2> "$dir/two.log" \
  || fail "generate across the namespaces"
python3 - "$dir/single.jsonl" "$dir/two.jsonl" <<'PY' || fail "two hosts differ from one process"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"], (x["tokens"], y["tokens"])
    for sx, sy in zip(x["top_logprobs"], y["top_logprobs"]):
        dx = {t["id"]: t["logprob"] for t in sx}
        dy = {t["id"]: t["logprob"] for t in sy}
        worst = max([worst] + [abs(dx[i] - dy[i]) for i in dx if i in dy])
print(f"generate over TCP between two namespaces: tokens equal, max |dlogprob| {worst:.2e}")
assert worst <= 1e-4
PY

# serve: rank 0 in the first namespace hosts HTTP; ask it from there.
body='{"prompt":[4,8,15,16,23,42],"max_tokens":8,"temperature":0,"ignore_eos":true}'
port=18080  # inside the first namespace, which only this test uses
"${mpirun[@]}" "$bin" serve --model "$dir/m" --tokenizer assets/tokenizer/deepseek-v3 --threads 1 \
  --kv-cache-gb 0.1 --port $port --dispatch-dtype f32 > "$dir/serve.log" 2>&1 &
launcher=$!
up=0
for _ in $(seq 1 300); do
  if ip netns exec "$nsA" curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1; then up=1; break; fi
  sleep 0.1
done
[[ $up == 1 ]] || fail "server across the namespaces did not come up"
ip netns exec "$nsA" curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
  -d "$body" > "$dir/two_serve.json" || fail "completion across the namespaces"
ip netns exec "$nsA" curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
  -d "$body" > /dev/null || fail "second completion across the namespaces"
kill -TERM "$launcher"
wait "$launcher" || true
launcher=""
stopped=$(grep -c -E "^serve( \(rank [0-9]+\))?: stopped$" "$dir/serve.log" || true)
[[ "$stopped" == 2 ]] || fail "$stopped of 2 ranks stopped cleanly"
# The same request on one process (root namespace, where other tests' servers run too).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --model "$dir/m" --tokenizer assets/tokenizer/deepseek-v3 --threads 1 --kv-cache-gb 0.1 \
  --port $port > "$dir/one_serve.log" 2>&1 &
launcher=$!
up=0
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1; then up=1; break; fi
  sleep 0.1
done
[[ $up == 1 ]] || fail "single-process server did not come up"
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' -d "$body" \
  > "$dir/one_serve.json" || fail "single-process completion"
kill -TERM "$launcher"; wait "$launcher" || true; launcher=""
python3 - "$dir/two_serve.json" "$dir/one_serve.json" <<'PY' || fail "served text differs"
import json, sys
two = json.load(open(sys.argv[1]))
one = json.load(open(sys.argv[2]))
assert two["usage"]["completion_tokens"] == 8, two
assert two["choices"][0]["text"] == one["choices"][0]["text"], (two, one)
print("serve over TCP between two namespaces: same completion as one process; both ranks stopped")
PY
echo "two_hosts: OK"
