#!/usr/bin/env python3
"""How many tool calls parse and validate: forced and strict calls across seeds and families.

Usage: python3 tools/tool_call_validity.py [--bin build/moeserve] [--seeds 8] [--max-tokens 200]

Makes the tiny random-weight models (`make-model`: the V3 preset with its own template and with
DeepSeek-V3.1's, and the V3.2 preset, whose encoder writes DSML calls), serves each, and sends
chat requests with two tools (one `strict`, with an enum and a bounded integer; one without
parameters) under every tool_choice, with parallel calls on and off, in thinking mode where the
family has it, at temperature 1 over `--seeds` seeds, through the official openai client. Each
call's arguments are checked with json.loads and the jsonschema package against the tool's
parameters. Prints one markdown row per case: requests, requests whose calls all validate
(forced cases must call), calls, calls that validate, finish reasons. docs/server.md has the
figures.
"""
import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import jsonschema
import openai

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 14}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                            "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now."}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": {"type": "object"}}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_models(bin_, tmp):
    base = os.path.join(tmp, "v3")
    subprocess.run([bin_, "make-model", "--preset", "tiny", "--out", base], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    v31 = os.path.join(tmp, "v3.1")
    os.makedirs(v31)
    for f in os.listdir(base):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(base, f), os.path.join(v31, f))
    cfg = json.load(open(os.path.join(base, "tokenizer_config.json"), encoding="utf-8"))
    here = os.path.dirname(os.path.abspath(__file__))
    cfg["chat_template"] = open(os.path.join(here, "..", "tests", "data", "tokenizer", "templates",
                                             "v3.1.jinja"), encoding="utf-8").read()
    json.dump(cfg, open(os.path.join(v31, "tokenizer_config.json"), "w", encoding="utf-8"))
    v32 = os.path.join(tmp, "v3.2")
    subprocess.run([bin_, "make-model", "--preset", "v32-tiny", "--out", v32], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [("V3", base, False), ("V3.1", v31, True), ("V3.2 (DSML)", v32, True)]


def serve(bin_, model):
    port = free_port()
    p = subprocess.Popen([bin_, "serve", "--model", model, "--host", "127.0.0.1", "--port",
                          str(port), "--served-model-name", "m", "--max-model-len", "2048",
                          "--kv-cache-gb", "0.1"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return p, port
        except Exception:
            time.sleep(0.2)
    p.kill()
    sys.exit(f"{model}: server not healthy")


def valid(call):
    try:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        return True
    except Exception:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/moeserve")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    a = ap.parse_args()
    named = {"type": "function", "function": {"name": "get_weather"}}
    print("| family | tool_choice | parallel | thinking | requests | all calls valid | calls | "
          "valid calls | finish |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for family, model, thinks in make_models(a.bin, tmp):
            proc, port = serve(a.bin, model)
            try:
                c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                                  max_retries=0, timeout=300)
                for thinking in ([False, True] if thinks else [False]):
                    for choice, label in (("required", "required"), (named, "named"),
                                          ("auto", "auto (strict)")):
                        for parallel in (True, False):
                            if choice is named and not parallel:
                                continue  # (a named call is one call either way)
                            ok = calls = good = 0
                            finish = collections.Counter()
                            for seed in range(a.seeds):
                                r = c.chat.completions.create(
                                    model="m", messages=[{"role": "user", "content": "Weather?"}],
                                    tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                                    max_tokens=a.max_tokens, temperature=1, seed=seed,
                                    extra_body={"chat_template_kwargs": {"thinking": thinking}})
                                ch = r.choices[0]
                                tcs = ch.message.tool_calls or []
                                finish[ch.finish_reason] += 1
                                calls += len(tcs)
                                v = sum(valid(t) for t in tcs)
                                good += v
                                if choice is named:
                                    v -= sum(t.function.name != "get_weather" for t in tcs)
                                forced = choice != "auto"
                                ok += (v == len(tcs)) and (len(tcs) > 0 or not forced)
                            print(f"| {family} | {label} | {'yes' if parallel else 'no'} | "
                                  f"{'on' if thinking else 'off'} | {a.seeds} | {ok} | {calls} | "
                                  f"{good} | {dict(finish)} |", flush=True)
            finally:
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    main()
