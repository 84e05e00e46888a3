#!/usr/bin/env bash
# DeepSeek-V3.2's chat encoding as `serve` uses it: a V3.2 checkpoint (make-model's v32-tiny,
# whose tokenizer_config.json has no chat template, as DeepSeek-V3.2's has none) served; for
# conversations of tests/data/tokenizer/chat_dsv32.jsonl (DeepSeek's encoding_dsv32.py's text,
# tools/gen_dsv32_chat_fixtures.py), sent with the official `openai` client, the prompt the
# server counts is the token count of the encoder's text and `render-chat` writes that text byte
# for byte; thinking replies carry reasoning_content. Then the same checkpoint under a
# directory named as V3.2-Speciale: reasoning-only (every request thinks, tools are a 400).
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

python3 -c "import openai" 2>/dev/null ||
  fail "python package 'openai' missing (scripts/install-deps.sh installs it)"
m="$dir/DeepSeek-V3.2-tiny"
"$bin" make-model --preset v32-tiny --out "$m" > /dev/null 2>&1 || fail "make-model"
port=$(free_port)
"$bin" serve --model "$m" --host 127.0.0.1 --port "$port" --served-model-name m \
  --max-model-len 4096 --kv-cache-gb 0.2 > "$dir/serve.log" 2>&1 &
pid=$!
wait_health "$port"
python3 - "$bin" "$m" "$port" "$dir" <<'PY' || fail "V3.2 chat"
import json, subprocess, sys
import openai
bin, m, port, tmp = sys.argv[1:]
assert "chat_template" not in json.load(open(m + "/tokenizer_config.json", encoding="utf-8"))
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
rows = [json.loads(l) for l in open("tests/data/tokenizer/chat_dsv32.jsonl", encoding="utf-8")]
# Rendered rows whose messages the API passes as they are (it takes `developer` as `system`)
# and whose tool outputs name their calls.
rows = [r for r in rows if r["kind"] == "render" and isinstance(r["expected"], str)
        and all(x["role"] != "developer" for x in r["messages"])
        and all(x["role"] != "tool" or "tool_call_id" in x for x in r["messages"])]
picked = [r for r in rows if r["tools"] and r["thinking"]][:4] + \
         [r for r in rows if r["tools"] and not r["thinking"]][:4] + \
         [r for r in rows if not r["tools"]][:4]
assert len(picked) == 12, len(picked)
for i, r in enumerate(picked):
    ids = json.loads(subprocess.run([bin, "tokenize", "--tokenizer", m], input=r["expected"].encode(),
                                    capture_output=True, check=True).stdout)
    kw = {"tools": r["tools"]} if r["tools"] else {}
    extra = {"chat_template_kwargs": {"thinking": True}} if r["thinking"] else {}
    resp = c.chat.completions.create(model="m", messages=r["messages"], max_tokens=2,
                                     extra_body=extra, **kw)
    assert resp.usage.prompt_tokens == len(ids), (i, resp.usage.prompt_tokens, len(ids))
    if r["thinking"]:
        assert hasattr(resp.choices[0].message, "reasoning_content"), resp.choices[0].message
    path = f"{tmp}/msgs.json"
    json.dump({"messages": r["messages"], "tools": r["tools"]}, open(path, "w"), ensure_ascii=False)
    args = [bin, "render-chat", "--tokenizer", m, "--messages", path]
    out = subprocess.run(args + (["--thinking"] if r["thinking"] else []), capture_output=True,
                         check=True).stdout.decode()
    assert out == r["expected"], (i, out, r["expected"])
# What the encoder refuses is a 400 naming the messages.
try:
    c.chat.completions.create(model="m", max_tokens=2, messages=[
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "no reasoning"}],
        extra_body={"chat_template_kwargs": {"thinking": True}})
    raise AssertionError("accepted an assistant turn the encoder refuses")
except openai.BadRequestError as e:
    assert e.body["param"] == "messages", e.body
print(f"V3.2: {len(picked)} prompts equal to encoding_dsv32.py's text")
PY
kill "$pid"
wait "$pid" || true
pid=""

# The same checkpoint named as V3.2-Speciale: reasoning only.
s="$dir/DeepSeek-V3.2-Speciale-tiny"
mkdir -p "$s"
for f in "$m"/*; do ln -s "$f" "$s/"; done
port=$(free_port)
"$bin" serve --model "$s" --host 127.0.0.1 --port "$port" --served-model-name m \
  --max-model-len 1024 --kv-cache-gb 0.1 > "$dir/speciale.log" 2>&1 &
pid=$!
wait_health "$port"
grep -q "reasoning-only model" "$dir/speciale.log" || fail "Speciale not announced as reasoning-only"
python3 - "$port" <<'PY' || fail "V3.2-Speciale"
import sys
import openai
c = openai.OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="x", max_retries=0)
r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2?"}], max_tokens=2)
assert hasattr(r.choices[0].message, "reasoning_content"), r.choices[0].message
tools = [{"type": "function", "function": {"name": "f"}}]
try:
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=tools,
                              max_tokens=2)
    raise AssertionError("tools accepted by a reasoning-only model")
except openai.BadRequestError as e:
    assert e.body["param"] == "tools", e.body
print("V3.2-Speciale: thinks always, tools refused")
PY
echo "chat_v32.sh: ok"
