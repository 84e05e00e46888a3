#!/usr/bin/env bash
# The agent-facing APIs through the official SDKs (tests/server/agent_clients_test.py): OpenAI chat
# completions (forced tool calls and a round trip, streaming, json_schema), the OpenAI Responses
# API (/v1/responses: input forms, tools and previous_response_id round trips, streaming events
# and the SDK's stream helper, reasoning items, retrieve/delete, errors) and Anthropic's Messages
# API (/v1/messages: tools, stop_sequences, streaming, thinking, count_tokens, errors), with
# --api-key (Bearer and x-api-key). On the tiny random model with its own (V3) template and with
# the V3.1 and R1-0528 templates (tests/data/tokenizer/templates), greedy throughout (~30 s).
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

python3 -c "import openai, anthropic" 2>/dev/null ||
  fail "python packages 'openai' and 'anthropic' missing (pip install openai anthropic)"
"$bin" make-model --preset tiny --out "$dir/base" 2>/dev/null || fail "make-model"
for name in v3.1 r1-0528; do
  m="$dir/$name"
  with_template "$dir/base" "$name" "$m"
done
key=agent-key-42
for family in v3 v3.1 r1-0528; do
  m="$dir/$family"
  [ "$family" = v3 ] && m="$dir/base"
  port=$(free_port)
  "$bin" serve --model "$m" --host 127.0.0.1 --port "$port" --api-key "$key" \
    --served-model-name m --max-model-len 1024 --kv-cache-gb 0.1 > "$dir/serve.log" 2>&1 &
  pid=$!
  wait_health "$port"
  PYTHONDONTWRITEBYTECODE=1 python3 tests/server/agent_clients_test.py \
    --base-url "http://127.0.0.1:$port" --api-key "$key" --model m --family "$family" ||
    fail "agent clients ($family)"
  kill "$pid"
  wait "$pid" || true
  pid=""
done
echo "agent_apis.sh: ok"
