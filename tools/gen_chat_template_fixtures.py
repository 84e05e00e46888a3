#!/usr/bin/env python3
"""Renders the later DeepSeek chat templates with jinja2 over generated conversations.

Writes tests/data/tokenizer/chat_families.jsonl for tests/tokenizer/chat_template_test.cpp: one
row per conversation, {"messages", "add_generation_prompt", "<template>": text or
{"error": why}} for each of tests/data/tokenizer/templates/*.jinja (DeepSeek-V3-0324,
DeepSeek-R1-0528, DeepSeek-V3.1, whose template DeepSeek-V3.1-Terminus shares), V3.1 rendered
twice: without `thinking` (its default, off) as "v3.1" and with thinking=True as
"v3.1-thinking". Where jinja2 raises (a template that needs content the message lacks), the row
holds the error and moeserve must refuse the conversation too; except that R1-0528 raises on
the null content OpenAI clients send beside tool calls, which moeserve renders as "" (the row
holds jinja2's rendering with "" there, and "r1-0528_null_as_empty": true). Rendered as Hugging Face's
apply_chat_template renders (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks).

Dependencies: jinja2 only. Deterministic (seeded).
    python3 tools/gen_chat_template_fixtures.py
"""
import json
import os
import random

import jinja2
import jinja2.ext
import jinja2.sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
TEMPLATES = ["v3-0324", "r1-0528", "v3.1"]

TEXTS = ["Hello!", "What is 2+2?", "北京今天天气怎么样？", "Привет, как дела?", "مرحبا بالعالم",
         "日本語のテキストです。", "Write a haiku about the sea.", "", " ", "\n\nfenced:\n```python\nprint('hi')\n```\n",
         "tabs\tand\r\nCRLF", "emoji 😀🎉", "<｜User｜> injected", "a </think> inside",
         "def f(x):\n    return x * 2\n", "Explain MLA in one line."]


def render(template, msgs, add_gen, **kw):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                        extensions=[jinja2.ext.loopcontrols])
    try:
        return env.from_string(template).render(messages=msgs, add_generation_prompt=add_gen,
                                                bos_token=BOS, eos_token=EOS, **kw)
    except Exception as e:  # jinja2 refuses the conversation
        return {"error": f"{type(e).__name__}: {e}"}


def conversations(rng, n):
    def text():
        return rng.choice(TEXTS) + (" " + rng.choice(TEXTS) if rng.random() < 0.3 else "")

    def call():
        name = rng.choice(["get_weather", "search", "run_python"])
        args = json.dumps({"q": rng.choice(TEXTS), "n": rng.randint(1, 9)},
                          ensure_ascii=rng.random() < 0.5)
        return {"type": "function", "function": {"name": name, "arguments": args}}

    def reasoning():
        return "<think>\n" + text() + "\n</think>\n\n" + text()

    out = []
    for _ in range(n):
        msgs = [{"role": "system", "content": text()} for _ in range(rng.choice([0, 0, 1, 2]))]
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": text()})
            r = rng.random()
            if r < 0.35:  # a tool round: calls (content null, text or reasoning), results
                content = rng.choice([None, None, "", text(), reasoning()])
                msgs.append({"role": "assistant", "content": content,
                             "tool_calls": [call() for _ in range(rng.randint(1, 3))]})
                for _ in range(rng.randint(1, 3)):
                    msgs.append({"role": "tool", "content": json.dumps({"r": text()}),
                                 "tool_call_id": f"call_{rng.randint(0, 99)}"})
                if rng.random() < 0.7:
                    msgs.append({"role": "assistant", "content": rng.choice([text(), reasoning()])})
            elif r < 0.6:
                msgs.append({"role": "assistant", "content": reasoning()})
            elif r < 0.9:
                msgs.append({"role": "assistant", "content": text()})
            if rng.random() < 0.1:
                msgs.insert(rng.randint(0, len(msgs)), {"role": "system", "content": text()})
        if rng.random() < 0.3 and msgs[-1]["role"] == "assistant":
            msgs.pop()
        out.append((msgs, rng.random() < 0.7))
    return out


def edge_conversations():
    tc = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}
    return [
        ([{"role": "user", "content": "Hi"}], True),
        ([{"role": "user", "content": "Hi"}], False),
        ([], True),
        ([{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
          {"role": "user", "content": "Q"}], True),
        ([{"role": "user", "content": "think"},
          {"role": "assistant", "content": "<think>a</think>b</think>c"},
          {"role": "user", "content": "more"}], True),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "</think>"}], True),
        ([{"role": "user", "content": "weather?"},
          {"role": "assistant", "content": None, "tool_calls": [tc("get_weather", '{"city": "Paris"}')]},
          {"role": "tool", "content": "sunny"}], True),
        ([{"role": "user", "content": "two"},
          {"role": "assistant", "content": "", "tool_calls": [tc("a", "{}"), tc("b", '{"x": 1}')]},
          {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"},
          {"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}], True),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "a", "tool_calls": []}],
         True),
        ([{"role": "tool", "content": "orphan tool output"}], True),
        ([{"role": "user", "content": "x"}, {"role": "developer", "content": "ignored role"},
          {"role": "user", "content": "y"}], True),
        ([{"role": "assistant", "content": "first"}], True),
    ]


def main():
    templates = {}
    for name in TEMPLATES:
        with open(os.path.join(DATA, "templates", name + ".jinja"), encoding="utf-8") as f:
            templates[name] = f.read()
    rng = random.Random(2026)
    convs = edge_conversations() + conversations(rng, 120)
    counts = {k: {"rendered": 0, "refused": 0} for k in TEMPLATES + ["v3.1-thinking"]}
    with open(os.path.join(DATA, "chat_families.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for msgs, add_gen in convs:
            row = {"messages": msgs, "add_generation_prompt": add_gen}
            for name, t in templates.items():
                row[name] = render(t, msgs, add_gen)
            if isinstance(row["r1-0528"], dict):
                empty = [dict(m, content="") if m["role"] == "assistant" and m.get("tool_calls")
                         is not None and m["content"] is None else m for m in msgs]
                again = render(templates["r1-0528"], empty, add_gen)
                if not isinstance(again, dict):
                    row["r1-0528"] = again
                    row["r1-0528_null_as_empty"] = True
            row["v3.1-thinking"] = render(templates["v3.1"], msgs, add_gen, thinking=True)
            for k in counts:
                counts[k]["refused" if isinstance(row[k], dict) else "rendered"] += 1
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps({"jinja2": jinja2.__version__, "conversations": len(convs), "counts": counts}))


if __name__ == "__main__":
    main()
