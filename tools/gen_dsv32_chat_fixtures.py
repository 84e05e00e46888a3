#!/usr/bin/env python3
"""DeepSeek-V3.2's chat encoding, rendered and parsed by DeepSeek's own encoder, as fixtures.

DeepSeek-V3.2 and V3.2-Speciale ship no Jinja chat template but a Python encoder
(`encoding/encoding_dsv32.py` in the model repository). SGLang on PyPI vendors a copy
(sglang/srt/entrypoints/openai/encoding_dsv32.py, "Adapted from" the model repository's); this
script downloads the pinned SGLang wheel with pip (no dependencies, nothing installed), imports
that one file on its own (it needs only the standard library) and writes, for
tests/tokenizer/chat_template_test.cpp and tests/server/tool_call_parser_test.cpp,
tests/data/tokenizer/chat_dsv32.jsonl, one row per case:

  {"kind": "render", "messages", "tools", "thinking": bool, "expected": text or {"error": why}}
      encode_messages(messages, thinking_mode) after SGLang's serving_chat preparation of a
      request (null content -> "", an empty system message put first when the first is not
      one, the request's tools attached to that first message);
  {"kind": "parse", "text", "thinking": bool, "expected": {"content", "reasoning_content",
      "tool_calls": [{"name", "arguments"}]}}
      parse_message_from_completion_text of an assistant turn as the encoder writes it (the
      text holds no <｜end▁of▁sentence｜>: moeserve's detokenizer drops special tokens, so the
      parser never sees it; the script adds it back for the encoder's parser).

Deterministic (seeded). The wheel is ~40 MB; give --wheel to reuse a downloaded one.
    python3 tools/gen_dsv32_chat_fixtures.py [--wheel sglang-0.5.23-....whl]
"""
import argparse
import copy
import glob
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "chat_dsv32.jsonl")
SGLANG = "sglang==0.5.23"
MEMBER = "sglang/srt/entrypoints/openai/encoding_dsv32.py"
EOS = "<｜end▁of▁sentence｜>"

TEXTS = ["Hello!", "What is 2+2?", "北京今天天气怎么样？", "Привет, как дела?", "", " ",
         "\n\nfenced:\n```python\nprint('hi')\n```\n", "tabs\tand\r\nCRLF", "emoji 😀🎉",
         "quotes \"double\" and 'single'", "a <tag> and a </tag>", "back\\slash",
         "def f(x):\n    return x * 2\n", "Explain MLA in one line.", "line\n", "\u0001ctl"]
VALUES = ["Paris", "", "multi\nline \"quoted\"", "中文", 3, -7, 0, 2.5, 1e-07, 12345678901,
          True, False, None, [1, "two", 3.0], {"a": {"b": [True, None]}, "z": "y"}, [], {},
          " spaced ", "<x>", "tab\there"]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "description": "查询"}}}}},
    {"type": "function", "function": {"name": "run_python", "description": "Runs code.",
                                      "strict": True, "parameters": {}}},
]


def load_encoder(wheel):
    tmp = tempfile.mkdtemp()
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                        SGLANG], check=True)
        wheel = glob.glob(os.path.join(tmp, "sglang-*.whl"))[0]
    with zipfile.ZipFile(wheel) as z:
        path = z.extract(MEMBER, tmp)
    spec = importlib.util.spec_from_file_location("encoding_dsv32", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, os.path.basename(wheel)


def sglang_prepare(messages, tools):
    """serving_chat.py's preparation of a request for the dsv32 encoding."""
    msgs = copy.deepcopy(messages)
    for m in msgs:
        if m.get("content") is None:
            m["content"] = ""
    if not msgs or msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": ""})
    if tools:
        msgs[0]["tools"] = copy.deepcopy(tools)
    return msgs


def conversations(rng, n):
    def text():
        return rng.choice(TEXTS) + (" " + rng.choice(TEXTS) if rng.random() < 0.3 else "")

    def call():
        name = rng.choice(["get_weather", "search", "run_python"])
        keys = rng.sample(["city", "q", "days", "opts", "x", "名前"], rng.randint(0, 3))
        args = {k: rng.choice(VALUES) for k in keys}
        return {"type": "function", "id": f"call_{rng.randint(0, 99)}",
                "function": {"name": name,
                             "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5)}}

    out = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": text()})
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": rng.choice(["user"] * 9 + ["developer"]), "content": text()})
            r = rng.random()
            if r < 0.4:  # a tool round: calls, results, maybe more calls, an answer
                for _ in range(rng.randint(1, 2)):
                    a = {"role": "assistant", "content": rng.choice([None, "", text()]),
                         "tool_calls": [call() for _ in range(rng.randint(1, 3))]}
                    if rng.random() < 0.7:
                        a["reasoning_content"] = text()
                    msgs.append(a)
                    for c in a["tool_calls"][:rng.choice([len(a["tool_calls"])] * 5 + [0])]:
                        msgs.append({"role": "tool", "content": json.dumps({"r": text()}),
                                     "tool_call_id": c["id"]})
                if rng.random() < 0.7:
                    msgs.append({"role": "assistant", "content": text(),
                                 "reasoning_content": text()})
            elif r < 0.85:
                a = {"role": "assistant", "content": text()}
                if rng.random() < 0.6:
                    a["reasoning_content"] = text()
                msgs.append(a)
        if rng.random() < 0.3 and msgs[-1]["role"] == "assistant":
            msgs.pop()
        tools = rng.sample(TOOLS, rng.choice([0, 0, 1, 2, 3]))
        out.append((msgs, tools))
    return out


def edge_conversations():
    tc = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}
    return [
        ([{"role": "user", "content": "Hi"}], []),
        ([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], TOOLS),
        ([{"role": "user", "content": "weather?"},
          {"role": "assistant", "content": None, "tool_calls": [tc("get_weather", '{"city": "Paris"}')]},
          {"role": "tool", "content": "sunny"}], TOOLS[:1]),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "a", "tool_calls": [tc("f", "[1, 2]")]}], []),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "a", "tool_calls": [tc("f", "not json")]}], []),
        ([{"role": "tool", "content": "orphan tool output"}], []),
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "no call"}], []),
        ([{"role": "user", "content": "x"}, {"role": "developer", "content": ""}], []),
        ([{"role": "user", "content": "x"}, {"role": "developer", "content": "dev"}], TOOLS[1:]),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "no reasoning"}], []),
        ([{"role": "user", "content": "x"}, {"role": "critic", "content": "?"}], []),
        ([{"role": "assistant", "content": "first"}], []),
    ]


def completions(rng, enc, n):
    """Assistant turns as the encoder writes them after the last user message."""
    out = []
    plain = [t for t in TEXTS if t.strip() and "\n\n" not in t]
    for _ in range(n):
        thinking = rng.random() < 0.5
        a = {"role": "assistant", "content": rng.choice(["", rng.choice(plain)]),
             "reasoning_content": rng.choice(plain)}
        if rng.random() < 0.7:
            calls = []
            for _ in range(rng.randint(1, 3)):
                keys = rng.sample(["city", "q", "days", "opts", "x", "名前"], rng.randint(0, 3))
                args = {k: rng.choice(VALUES) for k in keys}
                calls.append({"type": "function", "function": {
                    "name": rng.choice(["get_weather", "search", "run_python"]),
                    "arguments": json.dumps(args, ensure_ascii=False)}})
            a["tool_calls"] = calls
        msgs = [{"role": "user", "content": "q"}, a]
        text = enc.render_message(1, msgs, thinking_mode="thinking" if thinking else "chat")
        try:
            parsed = enc.parse_message_from_completion_text(text, "thinking" if thinking else "chat")
        except enc.DS32EncodingError:
            continue  # text the encoder's own parser refuses (e.g. a value that holds a tag)
        out.append(parse_row(text, thinking, parsed))
    return out


def parse_row(text, thinking, parsed):
    """A "parse" fixture row: an assistant turn as the encoder writes it (its EOS dropped, as
    moeserve's detokenizer drops it) and what the encoder's own parser reads from it."""
    assert text.endswith(EOS)
    return {"kind": "parse", "text": text[:-len(EOS)], "thinking": thinking,
            "expected": {"content": parsed["content"],
                         "reasoning_content": parsed["reasoning_content"],
                         "tool_calls": [{"name": c["function"]["name"],
                                         "arguments": c["function"]["arguments"]}
                                        for c in parsed["tool_calls"]]}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", help="a downloaded " + SGLANG + " wheel")
    args = ap.parse_args()
    enc, wheel = load_encoder(args.wheel)
    rng = random.Random(2032)
    rows = []
    counts = {"rendered": 0, "refused": 0, "parsed": 0}
    for msgs, tools in edge_conversations() + conversations(rng, 100):
        for thinking in (False, True):
            try:
                expected = enc.encode_messages(sglang_prepare(msgs, tools),
                                               thinking_mode="thinking" if thinking else "chat")
                counts["rendered"] += 1
            except (enc.DS32EncodingError, ValueError, NotImplementedError, IndexError,
                    json.JSONDecodeError) as e:
                expected = {"error": f"{type(e).__name__}: {e}"}
                counts["refused"] += 1
            rows.append({"kind": "render", "messages": msgs, "tools": tools,
                         "thinking": thinking, "expected": expected})
    parses = completions(rng, enc, 120)
    counts["parsed"] = len(parses)
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        for row in rows + parses:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps({"encoder": wheel + ":" + MEMBER, "counts": counts}))


if __name__ == "__main__":
    main()
