#!/usr/bin/env bash
# The later DeepSeek chat templates (tests/data/tokenizer/templates: V3-0324, R1-0528, V3.1) as
# `serve` uses them: a model directory whose tokenizer_config.json carries the template; for
# each conversation, the prompt the server counts (usage.prompt_tokens) is the token count of
# jinja2's rendering of the same conversation (V3.1 with chat_template_kwargs.thinking off and
# on); `render-chat` writes jinja2's text byte for byte; with `tools`, the prompt is jinja2's
# rendering with the tool description of tools/gen_tokenizer_fixtures.py inserted (V3.1: its
# model card's); R1-0528 and V3.1 thinking replies carry reasoning_content.
set -euo pipefail
bin=$(realpath "$1")
. tests/serve_lib.sh

python3 -c "import openai, jinja2" 2>/dev/null ||
  fail "python packages 'openai' and 'jinja2' missing (scripts/install-deps.sh installs them)"
"$bin" make-model --preset tiny --out "$dir/base" 2>/dev/null || fail "make-model"
for name in v3-0324 r1-0528 v3.1; do
  m="$dir/$name"
  with_template "$dir/base" "$name" "$m"
  port=$(free_port)
  "$bin" serve --model "$m" --host 127.0.0.1 --port "$port" --served-model-name m \
    --max-model-len 1024 --kv-cache-gb 0.1 > "$dir/serve.log" 2>&1 &
  pid=$!
  wait_health "$port"
  python3 - "$bin" "$m" "$port" "$name" "$dir" <<'PY' || fail "$name"
import json, subprocess, sys
import jinja2, jinja2.sandbox, openai
sys.path.insert(0, "tools")
from gen_tokenizer_fixtures import TOOLS_BLOCK, V3_1_TOOLS_BLOCK, with_tools_block
bin, m, port, name, tmp = sys.argv[1:]
cfg = json.load(open(m + "/tokenizer_config.json", encoding="utf-8"))
env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)  # Hugging Face's
tmpl = env.from_string(cfg["chat_template"])
tools_tmpl = env.from_string(with_tools_block(
    cfg["chat_template"], V3_1_TOOLS_BLOCK if name == "v3.1" else TOOLS_BLOCK))
bos = cfg["bos_token"]["content"] if isinstance(cfg["bos_token"], dict) else cfg["bos_token"]
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
tc = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
convs = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}, {"role": "user", "content": "3+3?"}],
    [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [tc]},
     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
]
checked = 0
for i, msgs in enumerate(convs):
    for thinking in ([False, True] if name == "v3.1" else [False]):
        kw = {"thinking": True} if thinking else {}
        text = tmpl.render(messages=msgs, add_generation_prompt=True, bos_token=bos, **kw)
        ids = json.loads(subprocess.run([bin, "tokenize", "--tokenizer", m], input=text.encode(),
                                        capture_output=True, check=True).stdout)
        extra = {"chat_template_kwargs": {"thinking": True}} if thinking else {}
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=3, extra_body=extra)
        assert r.usage.prompt_tokens == len(ids), (name, i, thinking, r.usage.prompt_tokens, len(ids))
        if thinking or name == "r1-0528":
            assert hasattr(r.choices[0].message, "reasoning_content"), r.choices[0].message
        # render-chat writes jinja2's text exactly.
        path = f"{tmp}/msgs.json"
        json.dump(msgs, open(path, "w"))
        args = [bin, "render-chat", "--tokenizer", m, "--messages", path, "--add-generation-prompt"]
        out = subprocess.run(args + (["--thinking"] if thinking else []), capture_output=True,
                             check=True).stdout.decode()
        assert out == text, (name, i, thinking, out, text)
        checked += 1
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather, 天气.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "now"}}]
for i, msgs in enumerate(convs):
    text = tools_tmpl.render(messages=msgs, add_generation_prompt=True, bos_token=bos, tools=tools)
    assert "## Tools" in text if name == "v3.1" else "# Tools" in text
    ids = json.loads(subprocess.run([bin, "tokenize", "--tokenizer", m], input=text.encode(),
                                    capture_output=True, check=True).stdout)
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=3, tools=tools)
    assert r.usage.prompt_tokens == len(ids), (name, "tools", i, r.usage.prompt_tokens, len(ids))
    checked += 1
# A forced call opens in the template's syntax and is constrained to its arguments' schema:
# even this random model's calls parse (tools/ a named function, `required`), the same
# streamed as not. With ignore_eos (no end to constrain towards) the arguments run as written.
named = {"type": "function", "function": {"name": "get_weather"}}
for choice in ("required", named):
    r = c.chat.completions.create(model="m", messages=convs[0], tools=tools, tool_choice=choice,
                                  max_tokens=40, temperature=0)
    calls = r.choices[0].message.tool_calls
    # ("length": the budget's last tokens closed the JSON: whole, but cut short.)
    assert r.choices[0].finish_reason in ("tool_calls", "length") and len(calls) == 1, r
    assert calls[0].function.name in ("get_weather", "now"), calls
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args, dict), args
    if calls[0].function.name == "get_weather" and "city" in args:
        assert isinstance(args["city"], str), args
kw = dict(model="m", messages=convs[0], tools=tools, tool_choice=named, max_tokens=8,
          temperature=0, extra_body={"ignore_eos": True})
r = c.chat.completions.create(**kw)
calls = r.choices[0].message.tool_calls
assert r.choices[0].finish_reason == "length" and len(calls) == 1, r
assert calls[0].function.name == "get_weather", calls
sname, sargs = None, ""
for chunk in c.chat.completions.create(stream=True, **kw):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        sname = d.function.name if d.id else sname
        sargs += d.function.arguments or ""
assert (sname, sargs) == ("get_weather", calls[0].function.arguments), (sname, sargs, calls)
print(f"{name}: {checked} prompts equal to jinja2's; named tool_choice parsed")
PY
  kill "$pid"
  wait "$pid" || true
  pid=""
done
echo "chat_templates.sh: ok"
