#!/usr/bin/env python3
"""DeepSeek-V4's chat encoding, rendered and parsed by DeepSeek's own encoder, as fixtures.

DeepSeek-V4 ships no Jinja chat template but a Python encoder, `encoding/encoding_dsv4.py` of
the model repository (with its tests, encoding/tests/test_input_*.json and test_output_*.txt).
Nothing of it is vendored here: give --encoder-dir, the repository's `encoding` directory (a
checkout of the model repository, or a copy of its three files); the script checks the
encoder's sha256 against the pinned one, checks that it reproduces its own four test outputs,
imports it (standard library only) and writes, for tests/tokenizer/chat_template_test.cpp and
tests/server/dsml_tool_calls_test.cpp, tests/data/tokenizer/chat_dsv4.jsonl, one row per case:

  {"kind": "render", "messages", "tools", "thinking": bool, "reasoning_effort": null | str,
   "expected": text or {"error": why}}
      encode_messages(messages, thinking_mode, reasoning_effort=...) after moeserve's
      preparation of a request (the same as for V3.2: null content -> "", an empty system
      message put first when the first is not one, the request's tools attached to that first
      message); the encoder itself merges tool results into user turns;
  {"kind": "parse", "text", "thinking": bool, "expected": {"content", "reasoning_content",
      "tool_calls": [{"name", "arguments"}]}}
      parse_message_from_completion_text of an assistant turn as the encoder writes it (without
      its <｜end▁of▁sentence｜>, which moeserve's detokenizer drops; added back for the parser).

The conversations are tools/gen_dsv32_chat_fixtures.py's (imported, same seed), then V4's own
cases (latest_reminder, merged and reordered tool results, reasoning_effort, ...) and the
encoder's four test inputs in the form an API request can carry them (test 3's tools moved from
its developer message to the request; test 4's `mask`, a training field, left out, its `task`
kept), and quick-instruction tasks (`task` on a message: its token after the message, an
action's after the assistant's opening; the answer without reasoning; unknown tasks refused).

Pinned source: huggingface.co/deepseek-ai/DeepSeek-V4-Pro (and -Flash), encoding/encoding_dsv4.py,
sha256 below; a public copy is github.com/Nicooo-Wang/DeepSeek-V4-Pro-code at commit
20746603cee2244bb42104dc0057b66bdaf656d2.
    python3 tools/gen_dsv4_chat_fixtures.py --encoder-dir DeepSeek-V4-Pro/encoding
Deterministic (seeded).
"""
import argparse
import copy
import hashlib
import importlib.util
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_dsv32_chat_fixtures as v32  # noqa: E402  (the conversations, not the encoder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "chat_dsv4.jsonl")
ENCODER_SHA256 = "bdbd57c132a1b3725042323d02b98b9d1df28e5f388f134399555d041f5055e0"
REFUSALS = (AssertionError, ValueError, NotImplementedError, TypeError, AttributeError,
            IndexError, KeyError)


def load_encoder(encoder_dir):
    path = os.path.join(encoder_dir, "encoding_dsv4.py")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != ENCODER_SHA256:
        sys.exit(f"{path}: sha256 {digest}, expected the pinned {ENCODER_SHA256}")
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def encoder_tests(enc, encoder_dir):
    """The encoder's own test cases: checked against their outputs, then as API requests."""
    tests = os.path.join(encoder_dir, "tests")
    out = []
    for i, mode in ((1, "thinking"), (2, "thinking"), (3, "thinking"), (4, "chat")):
        with open(os.path.join(tests, f"test_input_{i}.json"), encoding="utf-8") as f:
            data = json.load(f)
        with open(os.path.join(tests, f"test_output_{i}.txt"), encoding="utf-8") as f:
            gold = f.read()
        raw = copy.deepcopy(data["messages"] if isinstance(data, dict) else data)
        if isinstance(data, dict):
            raw[0]["tools"] = data["tools"]
        assert enc.encode_messages(copy.deepcopy(raw), thinking_mode=mode) == gold, i
        # As a request: the tools at the request's level, no internal fields.
        tools = data["tools"] if isinstance(data, dict) else []
        msgs = []
        for m in copy.deepcopy(data["messages"] if isinstance(data, dict) else data):
            tools = m.pop("tools", None) or tools
            m.pop("mask", None)
            msgs.append(m)
        out.append((msgs, tools, mode == "thinking", i))
    return out


def v4_conversations():
    tc = lambda name, args, id_=None: dict(
        {"type": "function", "function": {"name": name, "arguments": args}},
        **({"id": id_} if id_ else {}))
    T = v32.TOOLS
    tasks = [
        # each task after a user turn and answered; an action as the generation prompt
        ([{"role": "user", "content": "热海大滚锅", "task": t}, {"role": "assistant", "content": "A"}], [])
        for t in ("query", "authority", "domain", "title", "read_url", "action")
    ] + [
        ([{"role": "system", "content": "S"}, {"role": "user", "content": "Q", "task": "action"}], []),
        ([{"role": "user", "content": "Q", "task": "title"}], []),
        # the answer to a task has no reasoning; later turns do
        ([{"role": "user", "content": "a", "task": "query"},
          {"role": "assistant", "content": "b", "reasoning_content": "r"},
          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d",
                                             "reasoning_content": "e"},
          {"role": "user", "content": "f"}], []),
        # a user message after a task's turn starts a turn of its own; one joining a turn loses
        # its task
        ([{"role": "user", "content": "a", "task": "domain"}, {"role": "user", "content": "b"},
          {"role": "assistant", "content": "c"}], []),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b", "task": "domain"},
          {"role": "assistant", "content": "c"}], []),
        # tool results join a task's turn; tasks on system, latest_reminder and assistant turns
        ([{"role": "user", "content": "a", "task": "query"}, {"role": "tool", "content": "r",
                                                             "tool_call_id": "x"},
          {"role": "assistant", "content": "c"}], []),
        ([{"role": "system", "content": "S", "task": "authority"}, {"role": "assistant", "content": "c"}], []),
        ([{"role": "latest_reminder", "content": "R", "task": "title"},
          {"role": "assistant", "content": "c"}], []),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "task": "query"}], []),
        # a task followed by a user turn renders no token; an unknown one is refused where it
        # would be rendered
        ([{"role": "user", "content": "a", "task": "nope"}, {"role": "user", "content": "b"}], []),
        ([{"role": "user", "content": "a", "task": "nope"}], []),
        ([{"role": "user", "content": "a", "task": "nope"}, {"role": "assistant", "content": "b"}], []),
    ]
    return [
        # latest_reminder before a user turn, and between turns
        ([{"role": "system", "content": "S"}, {"role": "latest_reminder", "content": "2026-02-21,App"},
          {"role": "user", "content": "Q"}], []),
        ([{"role": "user", "content": "a"}, {"role": "latest_reminder", "content": "r"},
          {"role": "assistant", "content": "b", "reasoning_content": "t"},
          {"role": "user", "content": "c"}], []),
        ([{"role": "latest_reminder", "content": "first"}, {"role": "user", "content": "u"}], T[:1]),
        # consecutive user turns merge; a tool output right after a user turn joins it
        ([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], []),
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "out", "tool_call_id": "c"}], []),
        ([{"role": "tool", "content": "orphan"}, {"role": "user", "content": "then"}], []),
        # tool outputs out of call order are sorted by the calls' ids; unknown ids sort first
        ([{"role": "user", "content": "w"},
          {"role": "assistant", "content": None, "reasoning_content": "r",
           "tool_calls": [tc("get_weather", '{"city": "A"}', "c1"), tc("search", '{"q": "B"}', "c2"),
                          tc("run_python", "{}", "c3")]},
          {"role": "tool", "content": "third", "tool_call_id": "c3"},
          {"role": "tool", "content": "first", "tool_call_id": "c1"},
          {"role": "tool", "content": "second", "tool_call_id": "c2"},
          {"role": "user", "content": "more"},
          {"role": "assistant", "content": "done", "reasoning_content": "rr"}], T),
        ([{"role": "user", "content": "w"},
          {"role": "assistant", "content": "", "tool_calls": [tc("a", "{}", "k1"), tc("b", "{}", "k2")]},
          {"role": "tool", "content": "B", "tool_call_id": "k2"},
          {"role": "tool", "content": "?", "tool_call_id": "zz"},
          {"role": "tool", "content": "A", "tool_call_id": "k1"}], []),
        # arguments that are not JSON are wrapped; JSON that is not an object is refused
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "a", "tool_calls": [tc("f", "not json")]}], []),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "a", "tool_calls": [tc("f", "[1, 2]")]}], []),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "a", "tool_calls": [tc("f", "null")]}], []),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "a", "tool_calls": [tc("f", "")]}], []),
        # developer turns: last, before the last user turn, empty
        ([{"role": "developer", "content": "dev"}], T[1:]),
        ([{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}], []),
        ([{"role": "developer", "content": ""}, {"role": "user", "content": "u"}], []),
        ([{"role": "user", "content": "u"}, {"role": "critic", "content": "?"},
          {"role": "user", "content": "v"}], []),
        ([{"role": "user", "content": "u"}, {"role": "direct_search_results", "content": "?"},
          {"role": "user", "content": "v"}], []),
        # a system turn later on; an assistant turn without reasoning after the last user turn
        ([{"role": "user", "content": "u"}, {"role": "system", "content": "late"},
          {"role": "user", "content": "v"}], []),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "no reasoning"}], T[:1]),
        ([], []),
    ] + tasks


def completions(rng, enc, n):
    """Assistant turns as the encoder writes them after the last user message."""
    out = []
    plain = [t for t in v32.TEXTS if t.strip() and "\n\n" not in t]
    for _ in range(n):
        thinking = rng.random() < 0.5
        a = {"role": "assistant", "content": rng.choice(["", rng.choice(plain)]),
             "reasoning_content": rng.choice(plain)}
        if rng.random() < 0.7:
            calls = []
            for _ in range(rng.randint(1, 3)):
                keys = rng.sample(["city", "q", "days", "opts", "x", "名前"], rng.randint(0, 3))
                args = {k: rng.choice(v32.VALUES) for k in keys}
                calls.append({"type": "function", "function": {
                    "name": rng.choice(["get_weather", "search", "run_python"]),
                    "arguments": json.dumps(args, ensure_ascii=False)}})
            a["tool_calls"] = calls
        mode = "thinking" if thinking else "chat"
        text = enc.render_message(1, [{"role": "user", "content": "q"}, a], thinking_mode=mode)
        try:
            parsed = enc.parse_message_from_completion_text(text, mode)
        except (ValueError, AssertionError):
            continue  # text the encoder's own parser refuses (e.g. a value that holds a tag)
        out.append(v32.parse_row(text, thinking, parsed))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder-dir", required=True,
                    help="the model repository's encoding/ directory (encoding_dsv4.py, tests/)")
    args = ap.parse_args()
    enc = load_encoder(args.encoder_dir)
    rows = []
    counts = {"rendered": 0, "refused": 0, "parsed": 0}

    def render(msgs, tools, thinking, effort, source):
        try:
            expected = enc.encode_messages(v32.sglang_prepare(msgs, tools),
                                           thinking_mode="thinking" if thinking else "chat",
                                           reasoning_effort=effort)
            counts["rendered"] += 1
        except REFUSALS as e:
            expected = {"error": f"{type(e).__name__}: {e}"}
            counts["refused"] += 1
        rows.append({"kind": "render", "source": source, "messages": msgs, "tools": tools,
                     "thinking": thinking, "reasoning_effort": effort, "expected": expected})

    for msgs, tools, thinking, i in encoder_tests(enc, args.encoder_dir):
        render(msgs, tools, thinking, None, f"encoder test {i}")
    rng = random.Random(2032)  # the V3.2 fixtures' conversations, in the same order
    generated = v32.edge_conversations() + v32.conversations(rng, 100)
    for k, (msgs, tools) in enumerate(generated + v4_conversations()):
        source = "v3.2 fixtures" if k < len(generated) else "v4"
        for thinking in (False, True):
            render(msgs, tools, thinking, None, source)
        if k % 8 == 0:  # reasoning efforts: "max" writes its prefix (thinking only), "high" not
            for effort in ("max", "high"):
                for thinking in (False, True):
                    render(msgs, tools, thinking, effort, source)
    render([{"role": "user", "content": "x"}], [], True, "low", "v4")
    render([{"role": "user", "content": "x"}], [], False, "medium", "v4")
    parses = completions(random.Random(2004), enc, 120)
    counts["parsed"] = len(parses)
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        for row in rows + parses:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps({"encoder": "encoding_dsv4.py sha256:" + ENCODER_SHA256, "counts": counts}))


if __name__ == "__main__":
    main()
