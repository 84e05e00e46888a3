#!/usr/bin/env bash
# moeserve serve on the tiny model, driven by the official openai client and a raw-HTTP fuzz run
# (tests/server/openai_client_test.py); then SIGTERM with a stream in flight: the stream
# completes and the server exits 0.
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

python3 -c "import openai" 2>/dev/null ||
  fail "python package 'openai' missing (scripts/install-deps.sh installs it: pip install openai)"
"$bin" make-model --preset tiny --out "$dir/m" 2>/dev/null || fail "make-model"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
key=test-key-123
"$bin" serve --model "$dir/m" --host 127.0.0.1 --port "$port" --api-key "$key" \
  --served-model-name tiny --max-model-len 512 --kv-cache-gb 0.25 --shutdown-timeout 60 \
  > "$dir/serve.log" 2>&1 &
pid=$!
healthy() {
  python3 -c 'import sys, urllib.request
try: sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception: sys.exit(1)' "http://127.0.0.1:$port/health"
}
for _ in $(seq 600); do
  healthy && break
  kill -0 "$pid" 2>/dev/null || fail "serve exited during start-up"
  sleep 0.2
done
healthy || fail "server not healthy"

# Bad flags: usage error, exit 2.
set +e
"$bin" serve --model "$dir/m" --port 0 > /dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "--port 0: rc=$rc"
"$bin" serve --model "$dir/nope" --port "$port" > /dev/null 2> "$dir/err"; rc=$?
[ $rc -eq 1 ] && grep -q "$dir/nope" "$dir/err" || fail "missing model: rc=$rc $(cat "$dir/err")"
set -e

python3 tests/server/openai_client_test.py --base-url "http://127.0.0.1:$port" --api-key "$key" \
  --model tiny --fuzz "${MOESERVE_FUZZ_N:-2000}" || fail "openai client test"

# SIGTERM while a stream is in flight: the stream ends normally, then the process exits 0.
python3 - "$port" "$key" "$pid" <<'PY' || fail "graceful shutdown"
import http.client, json, os, signal, sys
port, key, pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
conn.request("POST", "/v1/chat/completions", body=json.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 64,
     "ignore_eos": True}), headers={"Content-Type": "application/json",
                                    "Authorization": "Bearer " + key})
r = conn.getresponse()
assert r.status == 200, r.status
first = r.read1(64)
os.kill(pid, signal.SIGTERM)
body = (first + r.read()).decode()
assert body.rstrip().endswith("data: [DONE]"), body[-300:]
assert '"finish_reason":"length"' in body, body[-300:]
PY
set +e
wait "$pid"; rc=$?
set -e
pid=""
[ $rc -eq 0 ] || fail "serve exit status after SIGTERM: $rc"
grep -q "stopped" "$dir/serve.log" || fail "no shutdown message"
echo "server_openai.sh: ok"
