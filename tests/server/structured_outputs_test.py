#!/usr/bin/env python3
"""response_format through the official openai client (docs/structured-outputs.md).

Against a running `moeserve serve` on any model, random weights included: every reply parses
as JSON and validates against its schema (jsonschema, a validator no one here wrote), blocking
and streamed, greedy and sampled, for n choices; a schema the grammar cannot use, a JSON format
with tools or with ignore_eos are 400s that name the field. Prints the counts.
"""
import argparse
import json
import sys

import jsonschema
import openai

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "email": {"type": ["string", "null"]},
            "languages": {"type": "array", "items": {"enum": ["python", "c", "rust", "go"]},
                          "maxItems": 4},
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
            "paid": {"type": "boolean"},
            "total": {"type": "number", "minimum": 0},
            "items": {
                "type": "array", "minItems": 1, "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "maxLength": 8},
                                   "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["sku", "qty"], "additionalProperties": False,
                },
            },
            "status": {"enum": ["new", "shipped", "lost"]},
        },
        "required": ["id", "paid", "items", "status"],
        "additionalProperties": False,
    },
    "choice": {
        "anyOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"},
                                              "r": {"type": "number"}},
             "required": ["kind", "r"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "square"},
                                              "side": {"type": "integer"}},
             "required": ["kind", "side"], "additionalProperties": False},
        ],
    },
}

PROMPTS = ["Describe a person as JSON.", "Write an order record.", "def f(x):\n    return ",
           "Reply in JSON only."]


def fmt_for(name):
    if name == "object":
        return {"type": "json_object"}
    return {"type": "json_schema",
            "json_schema": {"name": name, "strict": True, "schema": SCHEMAS[name]}}


def check(name, text, where):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise AssertionError(f"{where}: not JSON ({e}): {text!r}")
    if name == "object":
        assert isinstance(value, dict), f"{where}: not an object: {text!r}"
    else:
        jsonschema.validate(value, SCHEMAS[name])
    return value


def expect_400(client, model, param, **kw):
    try:
        client.chat.completions.create(model=model, **kw)
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        got = body.get("param") if "param" in body else body.get("error", {}).get("param")
        assert got == param, f"400 names {got!r}, not {param!r}: {e}"
        return
    raise AssertionError(f"no 400 for {param}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=160)
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url + "/v1", api_key=a.api_key, max_retries=0,
                           timeout=300)
    counts = {"replies": 0, "stop": 0, "length": 0}

    for name in ["object"] + list(SCHEMAS):
        for seed in range(a.seeds):
            prompt = PROMPTS[seed % len(PROMPTS)]
            kw = dict(model=a.model, messages=[{"role": "user", "content": prompt}],
                      response_format=fmt_for(name), max_tokens=a.max_tokens)
            if seed == 0:  # greedy, blocking and streamed: the same text
                r = client.chat.completions.create(temperature=0, **kw)
                text = r.choices[0].message.content
                check(name, text, f"{name} greedy")
                chunks = client.chat.completions.create(temperature=0, stream=True, **kw)
                streamed, reason = "", None
                for c in chunks:
                    if c.choices and c.choices[0].delta.content:
                        streamed += c.choices[0].delta.content
                    if c.choices and c.choices[0].finish_reason:
                        reason = c.choices[0].finish_reason
                assert streamed == text, f"{name}: streamed {streamed!r} != {text!r}"
                assert reason == r.choices[0].finish_reason
                choices = r.choices
            else:  # sampled, two choices
                r = client.chat.completions.create(temperature=1.0, seed=seed, n=2, **kw)
                choices = r.choices
            for c in choices:
                check(name, c.message.content, f"{name} seed {seed}")
                assert c.finish_reason in ("stop", "length"), c.finish_reason
                counts["replies"] += 1
                counts[c.finish_reason] += 1

    # Errors: each a 400 naming the field; the server goes on.
    msgs = [{"role": "user", "content": "x"}]
    expect_400(client, a.model, "response_format", messages=msgs, response_format={
        "type": "json_schema",
        "json_schema": {"name": "bad", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}})
    expect_400(client, a.model, "response_format.type", messages=msgs,
               response_format={"type": "yaml"})
    expect_400(client, a.model, "response_format", messages=msgs,
               response_format={"type": "json_object"},
               tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    expect_400(client, a.model, "ignore_eos", messages=msgs,
               response_format={"type": "json_object"}, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(model=a.model, messages=msgs, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    print(json.dumps({"structured_outputs": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
