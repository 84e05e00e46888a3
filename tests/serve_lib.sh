# Shared by the shell tests that start `moeserve serve` (tests/cli/*.sh, tests/ep/mpi/*.sh;
# source it from the repository root):
# $dir, a temporary directory removed at exit, and $pid, a server process killed at exit when
# set (a test with several appends them to the array pids, all killed at exit); fail MESSAGE
# prints the tail of every $dir/*.log and exits 1; free_port prints a port nobody listens on
# now; wait_health PORT waits for /health, failing if $pid (when set) exits first; wait_units
# PORT N waits until the router on PORT has N units registered and active; with_template BASE
# NAME OUT makes OUT, the model BASE (its files linked) whose tokenizer_config.json carries the
# chat template tests/data/tokenizer/templates/NAME.jinja; pd_beside_one MODEL ARGS... starts a
# router with a prefill and a decode unit and, beside them, one co-located serve of MODEL (all
# on loopback with ARGS), waits for them and sets $rport and $cport; pd_equals_one PROMPTS...
# sends each prompt (comma-separated token ids) to both, greedy with top-5 logprobs, and fails
# unless the answers are equal.
dir=$(mktemp -d)
pid=""
pids=()
cleanup() {
  for p in "$pid" "${pids[@]}"; do
    if [ -n "$p" ]; then kill -9 "$p" 2>/dev/null || true; fi
  done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_health() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0
    if [ -n "$pid" ]; then kill -0 "$pid" 2>/dev/null || fail "serve exited during start-up"; fi
    sleep 0.2
  done
  fail "server on port $1 not healthy"
}
wait_units() {
  local n=0
  for _ in $(seq 600); do
    n=$(curl -sf "http://127.0.0.1:$1/admin/units" |
        python3 -c 'import json,sys; print(sum(u["state"]=="active" for u in json.load(sys.stdin)["units"]))' 2>/dev/null || echo 0)
    [[ $n -ge $2 ]] && return 0
    sleep 0.1
  done
  fail "$2 units did not register at the router on port $1 ($n did)"
}
with_template() {
  mkdir -p "$3"
  for f in "$1"/*; do ln -s "$f" "$3/"; done
  rm "$3/tokenizer_config.json"
  python3 - "$1/tokenizer_config.json" "tests/data/tokenizer/templates/$2.jinja" \
    "$3/tokenizer_config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1], encoding="utf-8"))
cfg["chat_template"] = open(sys.argv[2], encoding="utf-8").read()
json.dump(cfg, open(sys.argv[3], "w", encoding="utf-8"), ensure_ascii=False)
PY
}
pd_beside_one() {
  local model=$1
  shift
  rport=$(free_port) cport=$(free_port)
  local pport dport
  pport=$(free_port) dport=$(free_port)
  "$bin" router --model "$model" --host 127.0.0.1 --port "$rport" > "$dir/router.log" 2>&1 &
  pids+=($!)
  "$bin" serve --model "$model" "$@" --host 127.0.0.1 --port "$pport" --role prefill \
    --router "http://127.0.0.1:$rport" > "$dir/prefill.log" 2>&1 &
  pids+=($!)
  "$bin" serve --model "$model" "$@" --host 127.0.0.1 --port "$dport" --role decode \
    --router "http://127.0.0.1:$rport" > "$dir/decode.log" 2>&1 &
  pids+=($!)
  "$bin" serve --model "$model" "$@" --host 127.0.0.1 --port "$cport" > "$dir/colocated.log" 2>&1 &
  pids+=($!)
  wait_health "$rport"
  wait_health "$cport"
  wait_units "$rport" 2
}
pd_equals_one() {
  python3 - "$rport" "$cport" "$@" <<'PY' || fail "PD differs from one server"
import json, sys, urllib.request
rport, cport = sys.argv[1:3]
def ask(port, prompt):
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 5, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
    return r["text"], r["logprobs"]["token_logprobs"], r["logprobs"]["top_logprobs"]
for p in sys.argv[3:]:
    ids = [int(x) for x in p.split(",")]
    assert ask(rport, ids) == ask(cport, ids)
PY
}
