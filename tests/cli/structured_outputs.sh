#!/usr/bin/env bash
# response_format json_object / json_schema through the official openai client
# (tests/server/structured_outputs_test.py: every reply parses and meets its schema under the
# jsonschema validator), on a random-weight preset and on the trained default model; the
# server's grammar counters move.
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

python3 -c "import openai, jsonschema" 2>/dev/null ||
  fail "python packages 'openai' and 'jsonschema' missing (scripts/install-deps.sh installs them)"
"$bin" make-model --preset tiny --out "$dir/random" 2>/dev/null || fail "make-model"
for model in "$dir/random" build/models/tiny-py; do
  port=$(free_port)
  "$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --served-model-name m \
    --max-model-len 1024 --kv-cache-gb 0.25 > "$dir/serve.log" 2>&1 &
  pid=$!
  wait_health "$port"
  python3 tests/server/structured_outputs_test.py --base-url "http://127.0.0.1:$port" --model m \
    --seeds "${MOESERVE_GRAMMAR_SEEDS:-4}" --max-tokens 160 || fail "structured outputs on $model"
  tokens=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '$1 == "moeserve_grammar_tokens_total" {print $2}')
  [ "${tokens:-0}" -gt 0 ] || fail "no grammar tokens counted on $model"
  kill "$pid"
  wait "$pid" || true
  pid=""
done
echo "structured outputs: OK"
