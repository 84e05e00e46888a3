#!/usr/bin/env python3
"""The agent-facing APIs of a running `moeserve serve`, driven by the official SDKs.

Usage: agent_clients_test.py --base-url http://127.0.0.1:PORT --api-key KEY --model NAME
       --family v3|v3.1|r1-0528

Written from the clients' side, for any model, random weights included: requests are greedy
(temperature 0) and runs are compared with each other; tool calls are checked only where the
server forces them (tool_choice required / named / any), where a grammar makes the arguments
JSON valid against the function's schema. Reasoning is checked on V3.1 with its thinking switch
on (its prompt opens <think>); R1-0528's prompt does not, and a random model never writes it. Each reply is also validated against the SDK's own pydantic
type (the fields the SDK declares required must be there, with their types).

A. OpenAI chat completions (openai): a forced tool call ("required" and a named function) with
   arguments valid against the schema, and its round trip (the assistant's tool_calls message and
   a "tool" message sent back); streamed text equal to the blocking greedy reply;
   response_format json_schema content that parses and meets the schema.
B. OpenAI Responses (openai `client.responses`): input as a string with `instructions`, as
   message items (system / developer / user / assistant, content as a string or input_text
   parts; an assistant message as an output item) - the same conversation gives the same
   input_tokens and text, equal to chat completions'; `max_output_tokens` (status "incomplete",
   incomplete_details.reason "max_output_tokens", output_tokens equal to it, or at most it where
   a grammar closed the output in the budget's last tokens); temperature/top_p;
   `text.format` json_schema; flat function `tools` with tool_choice "required" and named: a
   `function_call` item (call_id, name, arguments valid against the schema); round trips with
   `previous_response_id` + function_call_output (input_tokens grow) and with the earlier input
   and output items sent back explicitly (the same prompt and reply); `output_text`; usage
   (total = input + output, cached_tokens, reasoning_tokens); streaming via create(stream=True):
   event order (created, in_progress, output_item.added, content_part.added, deltas, *.done,
   output_item.done, completed/incomplete), sequence_number from 0 strictly increasing, item ids
   and indexes consistent, deltas equal to the .done texts and to the final response, the same as
   the blocking reply; function_call_arguments deltas; `client.responses.stream(...)` and its
   get_final_response(); reasoning (v3.1 with reasoning.effort): a `reasoning` item with
   reasoning_text content before the message, streamed as reasoning_text.delta/.done,
   reasoning_tokens, equal to chat completions' reasoning_content; retrieve / delete (then 404);
   an unknown previous_response_id (404 or 400 naming it); 400s for bad input; 401 for a bad key.
C. Anthropic Messages (anthropic `client.messages`): a message's shape (type, role, content
   blocks, stop_reason, usage: input_tokens + cache_read_input_tokens = the prompt, output_tokens
   = max_tokens when stop_reason is max_tokens); system as a string and as text blocks, user
   content as a string and as text blocks (same prompt, same reply), text equal to chat
   completions'; `stop_sequences` (a piece of the greedy text: stop_reason "stop_sequence",
   stop_sequence, the text before it); tools with tool_choice any / named tool: a `tool_use`
   block (id "toolu_...", input valid against the schema), stop_reason "tool_use"; round trips
   with tool_result content as a string, as text blocks, with is_error; streaming: the
   messages.stream() helper's text_stream and get_final_message() equal to the blocking reply,
   raw events (message_start first, message_stop last, content blocks with consistent indexes,
   message_delta with stop_reason and usage), a forced tool call's input_json_delta pieces that
   parse to the final input; thinking (v3.1 with thinking enabled): a `thinking` block
   (thinking text, signature a string) before the text, streamed as thinking_delta;
   count_tokens equal to a reply's prompt; errors in Anthropic's shape (400 for a missing
   max_tokens or temperature 2; 401 for a bad key; 404 for an unknown model).
D. Authentication: `Authorization: Bearer KEY` and `x-api-key: KEY` both accepted on
   /v1/responses and /v1/messages; neither: 401.

Prints one line per passed group; exits 1 with the failing group and the reason on the first
failure.
"""
import argparse
import http.client
import json
import os
import sys
import traceback
import urllib.parse

import anthropic
import openai
from openai.types import responses as R

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
WEATHER = "Get the current weather in a city."
CHAT_TOOLS = [{"type": "function",
               "function": {"name": "get_weather", "description": WEATHER, "parameters": CITY}}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": WEATHER,
               "parameters": CITY, "strict": True}]
ANT_TOOLS = [{"name": "get_weather", "description": WEATHER, "input_schema": CITY}]
SYSTEM = "You are a terse assistant."
USER = "What is the weather like in Paris today?"
GREEDY = {"temperature": 0}  # anthropic 2.x has no temperature argument: sent in the body


class Fail(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def short(x, n=300):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


# ---------------------------------------------------------------------------------------------
# Validation helpers


def sdk_valid(obj, where):
    """obj (an SDK model the client built without validation) validated as its own class: the
    fields the SDK declares required are present, with their types."""
    data = obj.to_dict(warnings=False) if hasattr(obj, "to_dict") else obj
    cls = type(obj)
    try:
        cls.model_validate(data)
    except Exception as e:  # pydantic.ValidationError
        raise Fail(f"{where}: not a valid {cls.__module__}.{cls.__name__}: {short(str(e), 1500)}\n"
                   f"  got {short(json.dumps(data, default=str), 1500)}")


def schema_ok(v, s, where, path="$"):
    """A hand validator for the small schemas used here."""
    if "enum" in s:
        check(v in s["enum"], f"{where}: {path} = {v!r} not in {s['enum']}")
    t = s.get("type")
    if t == "object":
        check(isinstance(v, dict), f"{where}: {path} is not an object: {v!r}")
        for k in s.get("required", []):
            check(k in v, f"{where}: {path} lacks required {k!r}: {v!r}")
        props = s.get("properties", {})
        if s.get("additionalProperties") is False:
            extra = [k for k in v if k not in props]
            check(not extra, f"{where}: {path} has properties not in the schema: {extra}")
        for k, sub in props.items():
            if k in v:
                schema_ok(v[k], sub, where, f"{path}.{k}")
    elif t == "string":
        check(isinstance(v, str), f"{where}: {path} is not a string: {v!r}")
    elif t == "integer":
        check(isinstance(v, int) and not isinstance(v, bool), f"{where}: {path} not an integer")
    elif t == "number":
        check(isinstance(v, (int, float)) and not isinstance(v, bool), f"{where}: {path} not a number")
    elif t == "boolean":
        check(isinstance(v, bool), f"{where}: {path} not a boolean")
    elif t == "array":
        check(isinstance(v, list), f"{where}: {path} not an array")
        for i, x in enumerate(v):
            schema_ok(x, s.get("items", {}), where, f"{path}[{i}]")


def json_args(text, schema, where):
    check(isinstance(text, str), f"{where}: arguments are not a string: {text!r}")
    try:
        v = json.loads(text)
    except ValueError as e:
        raise Fail(f"{where}: arguments are not JSON ({e}): {text!r}")
    schema_ok(v, schema, where)
    return v


def expect_error(fn, classes, where):
    try:
        fn()
    except classes as e:
        return e
    except Exception as e:  # noqa: BLE001 - report what came instead
        raise Fail(f"{where}: expected {[c.__name__ for c in classes]}, got "
                   f"{type(e).__name__}: {short(str(e))}")
    raise Fail(f"{where}: expected {[c.__name__ for c in classes]}, the request succeeded")


class Ctx:
    def __init__(self, a):
        self.base, self.key, self.model, self.family = a.base_url.rstrip("/"), a.api_key, a.model, a.family
        self.oa = openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0, timeout=120)
        self.an = anthropic.Anthropic(base_url=self.base, api_key=self.key, max_retries=0, timeout=120)
        # R1-0528's generation prompt does not open <think> (the real model writes it; this random
        # one never does), so its replies are plain and its forced calls prefilled as V3's;
        # V3.1 reasons when its thinking switch is on (the prompt opens <think>).
        self.forced = True
        self.always_reasons = False
        self.can_think = self.family == "v3.1"
        self.cache = {}

    def raw(self, method, path, body=None, headers=None):
        u = urllib.parse.urlparse(self.base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data


# ---------------------------------------------------------------------------------------------
# A. Chat completions


def chat(T, messages, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return T.oa.chat.completions.create(model=T.model, messages=messages, **kw)


def chat_reasoning(msg):
    return getattr(msg, "reasoning_content", None) or ""


def chat_base(T):
    """The greedy chat reply to SYSTEM + USER (max 16), shared by the cross-API checks."""
    if "chat" not in T.cache:
        T.cache["chat"] = chat(T, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
    return T.cache["chat"]


def chat_think(T):
    """v3.1's greedy thinking reply (max 24) to SYSTEM + USER."""
    if "chat_think" not in T.cache:
        T.cache["chat_think"] = chat(T, [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": USER}], max_tokens=24,
                                     extra_body={"chat_template_kwargs": {"thinking": True}})
    return T.cache["chat_think"]


def test_chat_tools(T):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    last = None
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        where = f"chat tool_choice={choice!r}"
        r = chat(T, msgs, tools=CHAT_TOOLS, tool_choice=choice, max_tokens=40)
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        if T.forced:
            check(len(calls) == 1, f"{where}: {len(calls)} tool calls: {ch.message}")
            check(ch.finish_reason in ("tool_calls", "length"), f"{where}: finish_reason {ch.finish_reason}")
        for c in calls:
            check(c.function.name == "get_weather", f"{where}: called {c.function.name!r}")
            json_args(c.function.arguments, CITY, where)
            check(isinstance(c.id, str) and c.id, f"{where}: call id {c.id!r}")
        if calls:
            last = (r, calls[0])
    if last is None:  # r1-0528 did not call: a made-up call goes back
        last = (r, None)
    r, c = last
    cid, args = (c.id, c.function.arguments) if c else ("call_made_up", '{"city": "Paris"}')
    msgs2 = msgs + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": cid, "content": "sunny"}]
    r2 = chat(T, msgs2, tools=CHAT_TOOLS, max_tokens=8)
    check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"chat round trip: {r2}")
    check(r2.usage.prompt_tokens > r.usage.prompt_tokens,
          f"chat round trip: prompt_tokens {r2.usage.prompt_tokens} <= {r.usage.prompt_tokens}")


def test_chat_stream(T):
    r = chat_base(T)
    text, reasoning, reason = "", "", None
    for chunk in chat(T, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
                      stream=True):
        if chunk.choices:
            d = chunk.choices[0].delta
            text += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            reason = chunk.choices[0].finish_reason or reason
    m = r.choices[0].message
    check(text == (m.content or ""), f"chat stream: {text!r} != {m.content!r}")
    check(reasoning == chat_reasoning(m), f"chat stream reasoning: {reasoning!r} != {chat_reasoning(m)!r}")
    check(reason == r.choices[0].finish_reason, f"chat stream: finish_reason {reason} != {r.choices[0].finish_reason}")


def test_chat_json(T):
    r = chat(T, [{"role": "user", "content": "The weather in Paris, as JSON."}], max_tokens=48,
             response_format={"type": "json_schema",
                              "json_schema": {"name": "city", "schema": CITY, "strict": True}})
    content = r.choices[0].message.content or ""
    if T.always_reasons and not content:
        return  # the budget went to reasoning
    json_args(content, CITY, "chat response_format")


# ---------------------------------------------------------------------------------------------
# B. Responses


def resp(T, **kw):
    kw.setdefault("max_output_tokens", 16)
    kw.setdefault("temperature", 0)
    return T.oa.responses.create(model=T.model, **kw)


def resp_parts(r):
    """(message text, reasoning text, function calls) of a Response's output."""
    text, reasoning, calls = "", "", []
    for o in r.output:
        if o.type == "message":
            text += "".join(c.text for c in o.content if c.type == "output_text")
        elif o.type == "reasoning":
            reasoning += "".join(c.text for c in (o.content or []))
        elif o.type == "function_call":
            calls.append(o)
    return text, reasoning, calls


def check_response(T, r, where, max_output_tokens=16, reasoning=None, constrained=False):
    """A Response's shape; reasoning: True (a reasoning item must lead), False (none), None.

    constrained: the output is under a grammar (text.format, a forced or strict call), which the
    server closes in the last tokens of the budget (docs/structured-outputs.md): such a response
    is "incomplete" with at most max_output_tokens, not exactly as many."""
    for o in r.output:
        sdk_valid(o, f"{where}: output item {getattr(o, 'type', '?')}")
    sdk_valid(r, where)
    check(r.object == "response", f"{where}: object {r.object!r}")
    check(isinstance(r.id, str) and r.id, f"{where}: id {r.id!r}")
    check(r.model == T.model, f"{where}: model {r.model!r}")
    check(r.status in ("completed", "incomplete"), f"{where}: status {r.status!r}")
    u = r.usage
    check(u is not None, f"{where}: no usage")
    check(u.input_tokens > 0 and u.output_tokens >= 0, f"{where}: usage {u}")
    check(u.total_tokens == u.input_tokens + u.output_tokens, f"{where}: total_tokens {u}")
    check(0 <= u.input_tokens_details.cached_tokens <= u.input_tokens, f"{where}: cached_tokens {u}")
    check(0 <= u.output_tokens_details.reasoning_tokens <= u.output_tokens, f"{where}: reasoning_tokens {u}")
    if r.status == "incomplete":
        check(r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens",
              f"{where}: incomplete_details {r.incomplete_details}")
        if constrained:
            check(u.output_tokens <= max_output_tokens,
                  f"{where}: incomplete with output_tokens {u.output_tokens} > max_output_tokens {max_output_tokens}")
        else:
            check(u.output_tokens == max_output_tokens,
                  f"{where}: incomplete with output_tokens {u.output_tokens} != max_output_tokens {max_output_tokens}")
    else:
        check(r.incomplete_details is None, f"{where}: completed with incomplete_details {r.incomplete_details}")
        check(u.output_tokens <= max_output_tokens, f"{where}: output_tokens {u.output_tokens} > {max_output_tokens}")
    types = [o.type for o in r.output]
    for o in r.output:
        check(o.type in ("message", "reasoning", "function_call"), f"{where}: output item type {o.type!r}")
        if o.type == "message":
            check(o.role == "assistant", f"{where}: message role {o.role!r}")
            check(o.status in ("completed", "incomplete"), f"{where}: message status {o.status!r}")
            for c in o.content:
                check(c.type == "output_text", f"{where}: message content {c.type!r}")
                check(isinstance(c.text, str) and isinstance(c.annotations, list), f"{where}: {c}")
        elif o.type == "reasoning":
            for c in o.content or []:
                check(c.type == "reasoning_text" and isinstance(c.text, str), f"{where}: reasoning content {c}")
        else:
            check(isinstance(o.call_id, str) and o.call_id, f"{where}: call_id {o.call_id!r}")
            check(isinstance(o.arguments, str), f"{where}: arguments {o.arguments!r}")
    check(len(set(getattr(o, "id", None) or id(o) for o in r.output)) == len(r.output),
          f"{where}: output item ids repeat: {[getattr(o, 'id', None) for o in r.output]}")
    text, rtext, calls = resp_parts(r)
    check(r.output_text == text, f"{where}: output_text {r.output_text!r} != the message text {text!r}")
    if reasoning is True:
        check("reasoning" in types, f"{where}: no reasoning item in {types}")
        check(types.index("reasoning") == 0, f"{where}: the reasoning item is not first: {types}")
    elif reasoning is False:
        check("reasoning" not in types, f"{where}: a reasoning item without reasoning: {types}")
    if "reasoning" in types and "message" in types:
        check(types.index("reasoning") < types.index("message"), f"{where}: reasoning after the message: {types}")
    if rtext:
        check(u.output_tokens_details.reasoning_tokens > 0, f"{where}: reasoning text but reasoning_tokens 0")
    if "reasoning" not in types:
        check(u.output_tokens_details.reasoning_tokens == 0, f"{where}: reasoning_tokens without reasoning")
    return text, rtext, calls


def resp_base(T):
    """The greedy Responses reply to instructions=SYSTEM, input=USER."""
    if "resp" not in T.cache:
        T.cache["resp"] = resp(T, instructions=SYSTEM, input=USER)
    return T.cache["resp"]


def test_resp_basic(T):
    r = resp_base(T)
    text, rtext, _ = check_response(T, r, "responses (string input)", reasoning=T.always_reasons)
    if r.instructions is not None:
        check(r.instructions == SYSTEM, f"responses: instructions echoed as {r.instructions!r}")
    c = chat_base(T)
    check(r.usage.input_tokens == c.usage.prompt_tokens,
          f"responses input_tokens {r.usage.input_tokens} != chat prompt_tokens {c.usage.prompt_tokens} "
          "for the same system + user conversation")
    check(text == (c.choices[0].message.content or ""),
          f"responses text {text!r} != chat's {c.choices[0].message.content!r} (greedy, same prompt)")
    check(rtext.strip() == chat_reasoning(c.choices[0].message).strip(),
          f"responses reasoning {rtext!r} != chat reasoning_content {chat_reasoning(c.choices[0].message)!r}")


def test_resp_inputs(T):
    base = resp_base(T)
    variants = {
        "message items": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        "input_text parts": [
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": SYSTEM}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": USER}]}],
    }
    for name, inp in variants.items():
        r = resp(T, input=inp)
        check_response(T, r, f"responses ({name})", reasoning=T.always_reasons)
        check(r.usage.input_tokens == base.usage.input_tokens,
              f"responses ({name}): input_tokens {r.usage.input_tokens} != {base.usage.input_tokens} "
              "with instructions + a string")
        check(r.output_text == base.output_text, f"responses ({name}): {r.output_text!r} != {base.output_text!r}")
    r = resp(T, input=[{"role": "developer", "content": SYSTEM}, {"role": "user", "content": USER}])
    check_response(T, r, "responses (developer message)", reasoning=T.always_reasons)
    # A multi-turn conversation: the assistant turn as an easy message and as an output item.
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": USER}]
    r1 = resp(T, input=turns)
    check_response(T, r1, "responses (assistant turn)", reasoning=T.always_reasons)
    item = {"type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}
    r2 = resp(T, input=[turns[0], item, turns[2]])
    check_response(T, r2, "responses (assistant output item)", reasoning=T.always_reasons)
    check(r1.usage.input_tokens == r2.usage.input_tokens and r1.output_text == r2.output_text,
          f"responses: an assistant output item ({r2.usage.input_tokens}, {r2.output_text!r}) differs "
          f"from the same turn as a message ({r1.usage.input_tokens}, {r1.output_text!r})")
    c = chat(T, turns)
    check(c.usage.prompt_tokens == r1.usage.input_tokens,
          f"responses input_tokens {r1.usage.input_tokens} != chat prompt_tokens {c.usage.prompt_tokens} "
          "for the same three turns")


def test_resp_limits(T):
    # (16 and up throughout: OpenAI's own minimum for max_output_tokens)
    r = resp(T, instructions=SYSTEM, input=USER, max_output_tokens=20)
    check_response(T, r, "responses max_output_tokens=20", max_output_tokens=20, reasoning=T.always_reasons)
    if r.max_output_tokens is not None:
        check(r.max_output_tokens == 20, f"responses: max_output_tokens echoed as {r.max_output_tokens}")
    r = resp(T, input=USER, temperature=0.7, top_p=0.9, max_output_tokens=16)
    check_response(T, r, "responses temperature/top_p", max_output_tokens=16, reasoning=T.always_reasons)
    if r.temperature is not None:
        check(abs(r.temperature - 0.7) < 1e-6, f"responses: temperature echoed as {r.temperature}")
    if r.top_p is not None:
        check(abs(r.top_p - 0.9) < 1e-6, f"responses: top_p echoed as {r.top_p}")


def test_resp_json(T):
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    r = resp(T, input="The weather in Paris, as JSON.", text=fmt, max_output_tokens=48)
    text, _, _ = check_response(T, r, "responses json_schema", max_output_tokens=48, reasoning=T.always_reasons,
                                constrained=True)
    if T.always_reasons and not text:
        return
    json_args(r.output_text, CITY, "responses json_schema output_text")


def resp_forced(T, choice, **kw):
    return resp(T, instructions=SYSTEM, input=USER, tools=RESP_TOOLS, tool_choice=choice,
                max_output_tokens=40, **kw)


def check_calls(T, calls, where):
    if T.forced:
        check(len(calls) == 1, f"{where}: {len(calls)} function_call items")
    for c in calls:
        check(c.name == "get_weather", f"{where}: called {c.name!r}")
        json_args(c.arguments, CITY, where)


def test_resp_tools(T):
    named = {"type": "function", "name": "get_weather"}
    got = None
    for choice in ("required", named):
        where = f"responses tool_choice={choice!r}"
        r = resp_forced(T, choice)
        _, _, calls = check_response(T, r, where, max_output_tokens=40, constrained=True,
                                     reasoning=T.always_reasons)
        check_calls(T, calls, where)
        if calls:
            got = (r, calls[0])
        elif got is None:
            got = (r, None)
    r, c = got
    # Round trip 1: previous_response_id + the function's output.
    if c is not None:
        nxt = [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"}]
    else:  # (r1-0528 did not call) a plain follow-up on the same thread
        nxt = [{"role": "user", "content": "And tomorrow?"}]
    r2 = resp(T, previous_response_id=r.id, instructions=SYSTEM, input=nxt, tools=RESP_TOOLS,
              max_output_tokens=16)
    check_response(T, r2, "responses previous_response_id", max_output_tokens=16)
    if r2.previous_response_id is not None:
        check(r2.previous_response_id == r.id, f"previous_response_id echoed as {r2.previous_response_id}")
    check(r2.usage.input_tokens > r.usage.input_tokens,
          f"responses previous_response_id: input_tokens {r2.usage.input_tokens} <= the first turn's "
          f"{r.usage.input_tokens} (the earlier turn is not in the prompt)")
    # Round trip 2: the same conversation sent explicitly (the first turn's output items back).
    items = [{"role": "user", "content": USER}] + [o.to_dict() for o in r.output] + nxt
    r3 = resp(T, instructions=SYSTEM, input=items, tools=RESP_TOOLS, max_output_tokens=16)
    check_response(T, r3, "responses explicit round trip", max_output_tokens=16)
    check(r3.usage.input_tokens == r2.usage.input_tokens and r3.output_text == r2.output_text,
          f"responses: previous_response_id gave ({r2.usage.input_tokens} tokens, {r2.output_text!r}), "
          f"the same items sent explicitly ({r3.usage.input_tokens}, {r3.output_text!r})")
    # A made-up call and its output, sent explicitly.
    items = [{"role": "user", "content": USER},
             {"type": "function_call", "call_id": "call_made_up", "name": "get_weather",
              "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_made_up", "output": "sunny"}]
    r4 = resp(T, input=items, tools=RESP_TOOLS, max_output_tokens=16)
    check_response(T, r4, "responses function_call_output", max_output_tokens=16)


RESP_LIFECYCLE = {"response.created", "response.in_progress", "response.completed",
                  "response.incomplete", "response.failed", "response.queued"}


def check_resp_events(evs, where):
    """The raw Responses stream events: returns (final Response, its items, message text)."""
    check(evs, f"{where}: no events")
    for e in evs:
        sdk_valid(e, f"{where}: event {getattr(e, 'type', '?')}")
    types = [e.type for e in evs]
    seqs = [e.sequence_number for e in evs]
    check(seqs[0] == 0, f"{where}: first sequence_number {seqs[0]}")
    check(all(b > a for a, b in zip(seqs, seqs[1:])), f"{where}: sequence_numbers not increasing: {seqs}")
    check(types[:2] == ["response.created", "response.in_progress"], f"{where}: begins {types[:3]}")
    check(types[-1] in ("response.completed", "response.incomplete"), f"{where}: ends {types[-1]}")
    mid = [t for t in types[2:-1] if t in RESP_LIFECYCLE]
    check(not mid, f"{where}: lifecycle events between the items: {mid}")
    rid = evs[0].response.id
    check(evs[0].response.status in ("queued", "in_progress"), f"{where}: created with status {evs[0].response.status}")
    for e in (evs[1], evs[-1]):
        check(e.response.id == rid, f"{where}: {e.type} response id {e.response.id} != {rid}")
    final = evs[-1].response
    want_status = "completed" if types[-1] == "response.completed" else "incomplete"
    check(final.status == want_status, f"{where}: {types[-1]} with status {final.status}")
    items, cur = [], None
    for e in evs[2:-1]:
        t = e.type
        if t == "response.output_item.added":
            check(cur is None, f"{where}: output_item.added {e.output_index} while item {cur and cur['index']} is open")
            check(e.output_index == len(items), f"{where}: output_item.added index {e.output_index}, expected {len(items)}")
            it = e.item
            check(it.type in ("message", "reasoning", "function_call"), f"{where}: item type {it.type}")
            if it.type == "message":
                check(list(it.content or []) == [], f"{where}: message added with content {it.content}")
                check(it.role == "assistant", f"{where}: role {it.role}")
            if it.type == "function_call":
                check(it.arguments == "", f"{where}: function_call added with arguments {it.arguments!r} "
                      "(the SDK appends the deltas to it)")
                check(it.name and it.call_id, f"{where}: function_call added without name/call_id: {it}")
            cur = {"index": e.output_index, "item": it, "parts": [], "args": "", "args_done": None}
            continue
        if t not in ("response.content_part.added", "response.content_part.done", "response.output_text.delta",
                     "response.output_text.done", "response.reasoning_text.delta", "response.reasoning_text.done",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done"):
            continue  # an event this test does not know: the SDK passes it through
        check(cur is not None, f"{where}: {t} outside an output item")
        check(e.output_index == cur["index"], f"{where}: {t} output_index {e.output_index} in item {cur['index']}")
        it, parts = cur["item"], cur["parts"]
        if t != "response.output_item.done":
            check(e.item_id == it.id, f"{where}: {t} item_id {e.item_id} != {it.id}")
        if t == "response.content_part.added":
            want = "output_text" if it.type == "message" else "reasoning_text"
            check(it.type in ("message", "reasoning"), f"{where}: content part in a {it.type}")
            check(e.content_index == len(parts), f"{where}: content_part.added index {e.content_index}")
            check(e.part.type == want and e.part.text == "", f"{where}: content_part.added part {e.part}")
            parts.append({"type": want, "text": "", "text_done": False, "done": False})
        elif t in ("response.output_text.delta", "response.reasoning_text.delta"):
            kind = "message" if t == "response.output_text.delta" else "reasoning"
            check(it.type == kind, f"{where}: {t} in a {it.type} item")
            if kind == "reasoning" and e.content_index == len(parts):  # content_part.added optional
                parts.append({"type": "reasoning_text", "text": "", "text_done": False, "done": False})
            check(e.content_index == len(parts) - 1 and not parts[-1]["text_done"],
                  f"{where}: {t} content_index {e.content_index} with parts {parts}")
            parts[-1]["text"] += e.delta
        elif t in ("response.output_text.done", "response.reasoning_text.done"):
            kind = "message" if t == "response.output_text.done" else "reasoning"
            check(it.type == kind, f"{where}: {t} in a {it.type} item")
            if kind == "reasoning" and e.content_index == len(parts):  # reasoning with no delta
                parts.append({"type": "reasoning_text", "text": "", "text_done": False, "done": False})
            check(e.content_index == len(parts) - 1 and not parts[-1]["text_done"],
                  f"{where}: {t} content_index {e.content_index} with parts {parts}")
            check(e.text == parts[-1]["text"], f"{where}: {t} text {e.text!r} != the deltas {parts[-1]['text']!r}")
            parts[-1]["text_done"] = True
        elif t == "response.content_part.done":
            check(e.content_index < len(parts), f"{where}: content_part.done index {e.content_index}")
            p = parts[e.content_index]
            check(p["text_done"], f"{where}: content_part.done before the text's .done event")
            check(e.part.text == p["text"], f"{where}: content_part.done text {e.part.text!r} != {p['text']!r}")
            p["done"] = True
        elif t == "response.function_call_arguments.delta":
            check(it.type == "function_call" and cur["args_done"] is None, f"{where}: stray {t}")
            cur["args"] += e.delta
        elif t == "response.function_call_arguments.done":
            check(it.type == "function_call" and cur["args_done"] is None, f"{where}: stray {t}")
            check(e.arguments == cur["args"], f"{where}: arguments.done {e.arguments!r} != the deltas {cur['args']!r}")
            cur["args_done"] = e.arguments
        else:  # output_item.done
            d = e.item
            check(d.type == it.type, f"{where}: item {cur['index']} added as {it.type}, done as {d.type}")
            check(getattr(d, "id", None) == getattr(it, "id", None), f"{where}: item id {it.id} done as {d.id}")
            if it.type == "message":
                check(parts and all(p["done"] for p in parts), f"{where}: message done with parts {parts}")
                check([c.text for c in d.content] == [p["text"] for p in parts],
                      f"{where}: message done with {d.content}, streamed {parts}")
                check(d.status in ("completed", "incomplete"), f"{where}: message done with status {d.status}")
            elif it.type == "reasoning":
                got = "".join(c.text for c in (d.content or []))
                check(got == "".join(p["text"] for p in parts), f"{where}: reasoning done with {got!r}, streamed {parts}")
                check(all(p["text_done"] for p in parts), f"{where}: reasoning done before reasoning_text.done")
                check(not got or parts, f"{where}: reasoning text {got!r} never streamed")
            else:
                check(d.call_id == it.call_id and d.name == it.name, f"{where}: call changed: {it} -> {d}")
                check(cur["args_done"] is not None, f"{where}: no function_call_arguments.done")
                check(d.arguments == cur["args"], f"{where}: item arguments {d.arguments!r} != the deltas {cur['args']!r}")
            items.append(d)
            cur = None
    check(cur is None, f"{where}: the stream ended with item {cur and cur['index']} open")
    check([o.type for o in final.output] == [o.type for o in items],
          f"{where}: final output {[o.type for o in final.output]} != streamed {[o.type for o in items]}")
    for a, b in zip(final.output, items):
        check(getattr(a, "id", None) == getattr(b, "id", None), f"{where}: final item id {a.id} != {b.id}")
    text, _, _ = resp_parts(final)
    streamed = "".join("".join(c.text for c in o.content) for o in items if o.type == "message")
    check(text == streamed, f"{where}: final text {text!r} != streamed {streamed!r}")
    return final, items, streamed


def same_reply(a, b, where):
    ta, ra, ca = resp_parts(a)
    tb, rb, cb = resp_parts(b)
    check(ta == tb, f"{where}: text {ta!r} != {tb!r}")
    check(ra == rb, f"{where}: reasoning {ra!r} != {rb!r}")
    check([(c.name, c.arguments) for c in ca] == [(c.name, c.arguments) for c in cb],
          f"{where}: calls {[(c.name, c.arguments) for c in ca]} != {[(c.name, c.arguments) for c in cb]}")
    check(a.status == b.status, f"{where}: status {a.status} != {b.status}")
    check(a.usage.output_tokens == b.usage.output_tokens and a.usage.input_tokens == b.usage.input_tokens,
          f"{where}: usage {a.usage} != {b.usage}")


def test_resp_stream(T):
    base = resp_base(T)
    evs = list(resp(T, instructions=SYSTEM, input=USER, stream=True))
    final, _, streamed = check_resp_events(evs, "responses stream")
    check_response(T, final, "responses stream (final)", reasoning=T.always_reasons)
    check(streamed == base.output_text, f"responses stream: {streamed!r} != blocking {base.output_text!r}")
    same_reply(final, base, "responses stream vs blocking")
    # A forced call, streamed.
    named = {"type": "function", "name": "get_weather"}
    r = resp_forced(T, named)
    evs = list(resp_forced(T, named, stream=True))
    final, items, _ = check_resp_events(evs, "responses stream (function call)")
    _, _, calls = check_response(T, final, "responses stream (function call, final)", max_output_tokens=40,
                                 constrained=True)
    check_calls(T, calls, "responses stream (function call)")
    if T.forced:
        check("response.function_call_arguments.delta" in [e.type for e in evs],
              "responses stream: no function_call_arguments.delta")
    same_reply(final, r, "responses streamed call vs blocking")
    # The SDK's helper: a JSON answer (short: likely to complete) and the forced call.
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}
    for name, kw in (("json", dict(instructions=SYSTEM, input="Is it sunny? Answer as JSON.", text=fmt)),
                     ("call", dict(instructions=SYSTEM, input=USER, tools=RESP_TOOLS, tool_choice=named))):
        where = f"responses.stream() helper ({name})"
        blocking = resp(T, max_output_tokens=40, **kw)
        deltas, last = "", None
        with T.oa.responses.stream(model=T.model, temperature=0, max_output_tokens=40, **kw) as s:
            for ev in s:
                if ev.type == "response.output_text.delta":
                    deltas += ev.delta
                last = ev
            if last.type == "response.completed":
                got = s.get_final_response()
            else:
                check(last.type == "response.incomplete", f"{where}: ended with {last.type}")
                got = last.response
        same_reply(got, blocking, where)
        check(deltas == got.output_text, f"{where}: deltas {deltas!r} != output_text {got.output_text!r}")
        if name == "json" and got.output_text:
            json_args(got.output_text, ANSWER, where)
        if name == "call" and last.type == "response.completed":
            for o in got.output:
                if o.type == "function_call":
                    check(o.parsed_arguments == json.loads(o.arguments), f"{where}: parsed_arguments {o.parsed_arguments}")


def test_resp_reasoning(T):
    if not T.can_think:
        return "skipped: the template does not reason"
    kw = {} if T.always_reasons else {"reasoning": {"effort": "medium"}}
    r = resp(T, instructions=SYSTEM, input=USER, max_output_tokens=24, **kw)
    _, rtext, _ = check_response(T, r, "responses reasoning", max_output_tokens=24, reasoning=True)
    evs = list(resp(T, instructions=SYSTEM, input=USER, max_output_tokens=24, stream=True, **kw))
    final, _, _ = check_resp_events(evs, "responses reasoning stream")
    same_reply(final, r, "responses reasoning streamed vs blocking")
    types = [e.type for e in evs]
    if rtext:
        check("response.reasoning_text.delta" in types and "response.reasoning_text.done" in types,
              f"responses reasoning stream: no reasoning_text events in {sorted(set(types))}")
    c = chat_think(T) if not T.always_reasons else chat(
        T, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], max_tokens=24)
    check(rtext.strip() == chat_reasoning(c.choices[0].message).strip(),
          f"responses reasoning {rtext!r} != chat reasoning_content {chat_reasoning(c.choices[0].message)!r}")
    check(r.output_text == (c.choices[0].message.content or ""),
          f"responses reasoning reply {r.output_text!r} != chat's {c.choices[0].message.content!r}")
    if not T.always_reasons:  # and without it, none
        check_response(T, resp_base(T), "responses without reasoning", reasoning=False)


def test_resp_store(T):
    r = resp(T, instructions=SYSTEM, input=USER, max_output_tokens=16)
    check_response(T, r, "responses (to store)", max_output_tokens=16)
    g = T.oa.responses.retrieve(r.id)
    check_response(T, g, "responses.retrieve", max_output_tokens=16)
    check(g.id == r.id and g.status == r.status, f"retrieve: {g.id} {g.status} != {r.id} {r.status}")
    check([getattr(o, "id", None) for o in g.output] == [getattr(o, "id", None) for o in r.output],
          "retrieve: output item ids differ")
    same_reply(g, r, "retrieve")
    T.oa.responses.delete(r.id)
    e = expect_error(lambda: T.oa.responses.retrieve(r.id), (openai.NotFoundError,), "retrieve after delete")
    bogus = "resp_doesnotexist0123456789"
    e = expect_error(lambda: resp(T, previous_response_id=bogus, input="hi", max_output_tokens=16),
                     (openai.NotFoundError, openai.BadRequestError), "unknown previous_response_id")
    check(bogus in str(e) or bogus in json.dumps(e.body, default=str),
          f"unknown previous_response_id: the error does not name it: {e}")


def test_resp_errors(T):
    bad = {
        "temperature 5": dict(input="hi", temperature=5),
        "input of wrong type": dict(extra_body={"input": 42}),
        "unknown role": dict(input=[{"role": "wizard", "content": "hi"}]),
        "tool_choice naming no tool": dict(input="hi", tools=RESP_TOOLS,
                                           tool_choice={"type": "function", "name": "nope"}),
    }
    for name, kw in bad.items():
        kw.setdefault("max_output_tokens", 16)
        e = expect_error(lambda: T.oa.responses.create(model=T.model, **kw), (openai.BadRequestError,),
                         f"responses {name}")
        check(isinstance(e.message, str) and e.message, f"responses {name}: no message")
    bad_key = openai.OpenAI(base_url=T.base + "/v1", api_key="wrong-key", max_retries=0)
    expect_error(lambda: bad_key.responses.create(model=T.model, input="hi", max_output_tokens=16),
                 (openai.AuthenticationError,), "responses with a wrong key")


# ---------------------------------------------------------------------------------------------
# C. Anthropic Messages


def ant(T, **kw):
    kw.setdefault("max_tokens", 16)
    eb = dict(GREEDY)
    eb.update(kw.pop("extra_body", {}))
    return T.an.messages.create(model=T.model, extra_body=eb, **kw)


def prompt_tokens(u):
    return u.input_tokens + (u.cache_read_input_tokens or 0)


def msg_parts(m):
    text = "".join(b.text for b in m.content if b.type == "text")
    thinking = "".join(b.thinking for b in m.content if b.type == "thinking")
    tools = [b for b in m.content if b.type == "tool_use"]
    return text, thinking, tools


def check_message(T, m, where, max_tokens=16, thinking=None, constrained=False):
    """A Message's shape; constrained: under a grammar (a forced call, output_config), closed in
    the last tokens of the budget, so max_tokens may stop it short of max_tokens tokens."""
    for b in m.content:
        sdk_valid(b, f"{where}: content block {getattr(b, 'type', '?')}")
    sdk_valid(m, where)
    check(m.type == "message" and m.role == "assistant", f"{where}: type {m.type!r} role {m.role!r}")
    check(isinstance(m.id, str) and m.id, f"{where}: id {m.id!r}")
    check(m.model == T.model, f"{where}: model {m.model!r}")
    check(m.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), f"{where}: stop_reason {m.stop_reason!r}")
    u = m.usage
    check(u.input_tokens >= 0 and prompt_tokens(u) > 0 and u.output_tokens >= 0, f"{where}: usage {u}")
    if m.stop_reason == "max_tokens":
        if constrained:
            check(u.output_tokens <= max_tokens, f"{where}: max_tokens with output_tokens {u.output_tokens} > {max_tokens}")
        else:
            check(u.output_tokens == max_tokens, f"{where}: max_tokens with output_tokens {u.output_tokens} != {max_tokens}")
    else:
        check(u.output_tokens <= max_tokens, f"{where}: output_tokens {u.output_tokens} > {max_tokens}")
    if m.stop_reason != "stop_sequence":
        check(m.stop_sequence is None, f"{where}: stop_sequence {m.stop_sequence!r} with {m.stop_reason}")
    types = [b.type for b in m.content]
    for b in m.content:
        check(b.type in ("text", "thinking", "tool_use"), f"{where}: block type {b.type}")
        if b.type == "thinking":
            check(isinstance(b.thinking, str) and isinstance(b.signature, str), f"{where}: thinking block {b}")
        if b.type == "tool_use":
            check(b.id.startswith("toolu_"), f"{where}: tool_use id {b.id!r} (not toolu_...)")
            check(isinstance(b.input, dict), f"{where}: tool_use input {b.input!r}")
    if "thinking" in types:
        check(types.index("thinking") == 0 and types.count("thinking") == 1, f"{where}: thinking block not first: {types}")
    if thinking is True:
        check("thinking" in types, f"{where}: no thinking block in {types}")
    elif thinking is False:
        check("thinking" not in types, f"{where}: a thinking block without thinking: {types}")
    if m.stop_reason == "tool_use":
        check("tool_use" in types, f"{where}: stop_reason tool_use without a tool_use block")
    if "tool_use" in types:
        check(m.stop_reason in ("tool_use", "max_tokens"), f"{where}: tool_use block with stop_reason {m.stop_reason}")
    return msg_parts(m)


def ant_base(T):
    if "ant" not in T.cache:
        T.cache["ant"] = ant(T, system=SYSTEM, messages=[{"role": "user", "content": USER}])
    return T.cache["ant"]


def test_ant_basic(T):
    m = ant_base(T)
    text, thinking, _ = check_message(T, m, "messages", thinking=T.always_reasons)
    c = chat_base(T)
    check(prompt_tokens(m.usage) == c.usage.prompt_tokens,
          f"messages prompt {prompt_tokens(m.usage)} != chat prompt_tokens {c.usage.prompt_tokens} (same conversation)")
    check(text == (c.choices[0].message.content or ""), f"messages text {text!r} != chat's {c.choices[0].message.content!r}")
    check(thinking.strip() == chat_reasoning(c.choices[0].message).strip(),
          f"messages thinking {thinking!r} != chat reasoning_content {chat_reasoning(c.choices[0].message)!r}")
    variants = {
        "system blocks": dict(system=[{"type": "text", "text": SYSTEM}], messages=[{"role": "user", "content": USER}]),
        "user blocks": dict(system=SYSTEM, messages=[{"role": "user", "content": [{"type": "text", "text": USER}]}]),
    }
    for name, kw in variants.items():
        v = ant(T, **kw)
        vt, vth, _ = check_message(T, v, f"messages ({name})", thinking=T.always_reasons)
        check(prompt_tokens(v.usage) == prompt_tokens(m.usage) and vt == text and vth == thinking,
              f"messages ({name}): ({prompt_tokens(v.usage)}, {vt!r}) != ({prompt_tokens(m.usage)}, {text!r})")
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": USER}]
    a = ant(T, messages=turns)
    check_message(T, a, "messages (three turns)", thinking=T.always_reasons)
    blocks = [turns[0], {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}, turns[2]]
    b = ant(T, messages=blocks)
    check_message(T, b, "messages (assistant blocks)", thinking=T.always_reasons)
    check(prompt_tokens(a.usage) == prompt_tokens(b.usage) and msg_parts(a)[0] == msg_parts(b)[0],
          "messages: the assistant turn as blocks differs from the same turn as a string")
    c = chat(T, turns)
    check(prompt_tokens(a.usage) == c.usage.prompt_tokens,
          f"messages prompt {prompt_tokens(a.usage)} != chat prompt_tokens {c.usage.prompt_tokens} (three turns)")


def test_ant_stop_sequences(T):
    m = ant_base(T)
    text, thinking, _ = msg_parts(m)
    pick = None
    for k in sorted(range(1, max(len(text) - 3, 1)), key=lambda k: abs(k - len(text) // 2)):
        sub = text[k:k + 3]
        if len(sub) == 3 and sub.strip() and sub.isprintable() and "\ufffd" not in sub and text.find(sub) == k \
                and sub not in thinking:
            pick = (k, sub)
            break
    if pick is None:
        return f"skipped: no usable piece in the greedy text {text!r}"
    k, sub = pick
    s = ant(T, system=SYSTEM, messages=[{"role": "user", "content": USER}], stop_sequences=[sub])
    st, _, _ = check_message(T, s, "messages stop_sequences", thinking=T.always_reasons)
    check(s.stop_reason == "stop_sequence" and s.stop_sequence == sub,
          f"messages stop_sequences={[sub]!r} in {text!r}: stop_reason {s.stop_reason} stop_sequence {s.stop_sequence!r}")
    check(st == text[:k], f"messages stop_sequences: text {st!r}, expected {text[:k]!r}")


def ant_forced(T, choice, **kw):
    return ant(T, system=SYSTEM, messages=[{"role": "user", "content": USER}], tools=ANT_TOOLS,
               tool_choice=choice, max_tokens=40, **kw)


def check_tool_uses(T, m, tools, where):
    if T.forced:
        check(len(tools) == 1, f"{where}: {len(tools)} tool_use blocks: {m.content}")
        # (max_tokens: the grammar closed the call in the budget's last tokens; the call is whole)
        check(m.stop_reason in ("tool_use", "max_tokens"), f"{where}: stop_reason {m.stop_reason}")
    for t in tools:
        check(t.name == "get_weather", f"{where}: tool {t.name!r}")
        schema_ok(t.input, CITY, where)


def test_ant_tools(T):
    got = None
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        where = f"messages tool_choice={choice}"
        m = ant_forced(T, choice)
        _, _, tools = check_message(T, m, where, max_tokens=40, thinking=T.always_reasons, constrained=True)
        check_tool_uses(T, m, tools, where)
        if tools or got is None:
            got = (m, tools)
    m, tools = got
    if tools:
        assistant = [b.to_dict() for b in m.content]
        tid = tools[0].id
    else:  # r1-0528 did not call: a made-up call
        tid = "toolu_made_up_1"
        assistant = [{"type": "tool_use", "id": tid, "name": "get_weather", "input": {"city": "Paris"}}]
    results = {
        "string": {"type": "tool_result", "tool_use_id": tid, "content": "sunny"},
        "text blocks": {"type": "tool_result", "tool_use_id": tid, "content": [{"type": "text", "text": "sunny"}]},
        "is_error": {"type": "tool_result", "tool_use_id": tid, "content": "unknown city", "is_error": True},
    }
    for name, res in results.items():
        msgs = [{"role": "user", "content": USER}, {"role": "assistant", "content": assistant},
                {"role": "user", "content": [res]}]
        r = ant(T, system=SYSTEM, messages=msgs, tools=ANT_TOOLS, max_tokens=8)
        check_message(T, r, f"messages tool_result ({name})", max_tokens=8)
        check(prompt_tokens(r.usage) > prompt_tokens(m.usage),
              f"messages tool_result ({name}): prompt {prompt_tokens(r.usage)} <= the call's {prompt_tokens(m.usage)}")


def check_ant_events(evs, where):
    """Raw Messages stream events: returns a dict describing the streamed message."""
    check(evs, f"{where}: no events (the SDK drops SSE events that have no `event:` line)")
    for e in evs:
        sdk_valid(e, f"{where}: event {getattr(e, 'type', '?')}")
        if e.type == "content_block_start":
            sdk_valid(e.content_block, f"{where}: content_block_start block")
        if e.type == "content_block_delta":
            sdk_valid(e.delta, f"{where}: content_block_delta delta")
    types = [e.type for e in evs]
    check(types[0] == "message_start" and types[-1] == "message_stop", f"{where}: events {types}")
    check(types.count("message_start") == 1 and types.count("message_stop") == 1, f"{where}: events {types}")
    st = evs[0].message
    check(st.type == "message" and st.role == "assistant", f"{where}: message_start {st}")
    check(list(st.content) == [] and st.stop_reason is None, f"{where}: message_start with content/stop_reason: {st}")
    blocks, open_, delta = [], None, None
    for e in evs[1:-1]:
        if e.type == "content_block_start":
            check(delta is None and open_ is None, f"{where}: content_block_start {e.index} out of order ({types})")
            check(e.index == len(blocks), f"{where}: content_block_start index {e.index}, expected {len(blocks)}")
            b = e.content_block
            d = {"type": b.type}
            if b.type == "text":
                check(b.text == "", f"{where}: text block starts with {b.text!r}")
                d["text"] = ""
            elif b.type == "thinking":
                check(b.thinking == "", f"{where}: thinking block starts with {b.thinking!r}")
                d["thinking"], d["signature"] = "", b.signature
            elif b.type == "tool_use":
                check(b.input == {}, f"{where}: tool_use starts with input {b.input!r}")
                check(b.id.startswith("toolu_") and b.name, f"{where}: tool_use start {b}")
                d["id"], d["name"], d["json"] = b.id, b.name, ""
            else:
                raise Fail(f"{where}: block type {b.type}")
            blocks.append(d)
            open_ = e.index
        elif e.type == "content_block_delta":
            check(open_ == e.index, f"{where}: content_block_delta for {e.index}, open {open_}")
            d, dt = blocks[e.index], e.delta.type
            if dt == "text_delta" and d["type"] == "text":
                d["text"] += e.delta.text
            elif dt == "thinking_delta" and d["type"] == "thinking":
                d["thinking"] += e.delta.thinking
            elif dt == "signature_delta" and d["type"] == "thinking":
                d["signature"] = e.delta.signature
            elif dt == "input_json_delta" and d["type"] == "tool_use":
                d["json"] += e.delta.partial_json
            else:
                raise Fail(f"{where}: {dt} in a {d['type']} block")
        elif e.type == "content_block_stop":
            check(open_ == e.index, f"{where}: content_block_stop for {e.index}, open {open_}")
            open_ = None
        elif e.type == "message_delta":
            check(open_ is None and delta is None, f"{where}: message_delta out of order: {types}")
            delta = e
        else:
            raise Fail(f"{where}: unexpected event {e.type}")
    check(delta is not None, f"{where}: no message_delta")
    check(isinstance(delta.usage.output_tokens, int), f"{where}: message_delta usage {delta.usage}")
    for d in blocks:
        if d["type"] == "thinking":
            check(isinstance(d["signature"], str), f"{where}: thinking block without a signature")
        if d["type"] == "tool_use":
            try:
                d["input"] = json.loads(d["json"]) if d["json"] else {}
            except ValueError as e:
                raise Fail(f"{where}: input_json_delta pieces {d['json']!r} are not JSON: {e}")
    return {"blocks": blocks, "stop_reason": delta.delta.stop_reason, "stop_sequence": delta.delta.stop_sequence,
            "output_tokens": delta.usage.output_tokens, "start": st}


def same_message(info, m, where):
    """A streamed message (check_ant_events' dict) against the blocking one."""
    got = [b["type"] for b in info["blocks"]]
    want = [b.type for b in m.content]
    check(got == want, f"{where}: blocks {got} != blocking {want}")
    for d, b in zip(info["blocks"], m.content):
        if b.type == "text":
            check(d["text"] == b.text, f"{where}: text {d['text']!r} != {b.text!r}")
        elif b.type == "thinking":
            check(d["thinking"] == b.thinking, f"{where}: thinking {d['thinking']!r} != {b.thinking!r}")
        else:
            check(d["input"] == b.input and d["name"] == b.name, f"{where}: tool input {d['input']} != {b.input}")
    check(info["stop_reason"] == m.stop_reason and info["stop_sequence"] == m.stop_sequence,
          f"{where}: stop {info['stop_reason']} {info['stop_sequence']!r} != {m.stop_reason} {m.stop_sequence!r}")
    check(info["output_tokens"] == m.usage.output_tokens, f"{where}: output_tokens {info['output_tokens']} != {m.usage.output_tokens}")
    check(prompt_tokens(info["start"].usage) == prompt_tokens(m.usage),
          f"{where}: message_start prompt {prompt_tokens(info['start'].usage)} != {prompt_tokens(m.usage)}")


def helper_stream(T, m, where, **kw):
    """client.messages.stream(): text_stream and get_final_message() against the blocking m."""
    eb = dict(GREEDY)
    try:
        with T.an.messages.stream(model=T.model, extra_body=eb, **kw) as s:
            text = "".join(s.text_stream)
            f = s.get_final_message()
    except AssertionError as e:  # the SDK's own asserts: no message_start reached it
        if isinstance(e, Fail):
            raise
        raise Fail(f"{where}: the SDK's MessageStream assembled no message (no message_start event; "
                   f"the SDK drops SSE events that have no `event:` line)")
    ft, fth, ftools = msg_parts(f)
    mt, mth, mtools = msg_parts(m)
    check(text == ft == mt, f"{where}: text_stream {text!r}, final {ft!r}, blocking {mt!r}")
    check(fth == mth, f"{where}: thinking {fth!r} != blocking {mth!r}")
    check([(t.name, t.input) for t in ftools] == [(t.name, t.input) for t in mtools],
          f"{where}: tool_use {[(t.name, t.input) for t in ftools]} != {[(t.name, t.input) for t in mtools]}")
    check(f.stop_reason == m.stop_reason and f.usage.output_tokens == m.usage.output_tokens,
          f"{where}: stop_reason/output_tokens {f.stop_reason} {f.usage.output_tokens} != "
          f"{m.stop_reason} {m.usage.output_tokens}")
    for b in f.content:
        if b.type == "thinking":
            check(isinstance(b.signature, str), f"{where}: final thinking block signature {b.signature!r}")


def test_ant_stream(T):
    m = ant_base(T)
    kw = dict(max_tokens=16, system=SYSTEM, messages=[{"role": "user", "content": USER}])
    info = check_ant_events(list(ant(T, stream=True, **kw)), "messages stream")
    same_message(info, m, "messages stream vs blocking")
    helper_stream(T, m, "messages.stream()", **kw)
    choice = {"type": "tool", "name": "get_weather"}
    f = ant_forced(T, choice)
    evs = list(ant_forced(T, choice, stream=True))
    info = check_ant_events(evs, "messages stream (tool_use)")
    same_message(info, f, "messages streamed tool_use vs blocking")
    if T.forced:
        check(any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in evs),
              "messages stream (tool_use): no input_json_delta")
    helper_stream(T, f, "messages.stream() (tool_use)", max_tokens=40, system=SYSTEM,
                  messages=[{"role": "user", "content": USER}], tools=ANT_TOOLS, tool_choice=choice)


def test_ant_thinking(T):
    if not T.can_think:
        return "skipped: the template does not reason"
    kw = dict(max_tokens=24, system=SYSTEM, messages=[{"role": "user", "content": USER}])
    if not T.always_reasons:
        kw["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    m = ant(T, **kw)
    text, thinking, _ = check_message(T, m, "messages thinking", max_tokens=24, thinking=True)
    evs = list(ant(T, stream=True, **kw))
    info = check_ant_events(evs, "messages thinking stream")
    same_message(info, m, "messages thinking streamed vs blocking")
    if thinking:
        check(any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in evs),
              "messages thinking stream: no thinking_delta")
    helper_stream(T, m, "messages.stream() (thinking)", **kw)
    c = chat_think(T) if not T.always_reasons else chat(
        T, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], max_tokens=24)
    check(thinking.strip() == chat_reasoning(c.choices[0].message).strip(),
          f"messages thinking {thinking!r} != chat reasoning_content {chat_reasoning(c.choices[0].message)!r}")
    check(text == (c.choices[0].message.content or ""), f"messages thinking text {text!r} != chat's")
    if not T.always_reasons:
        check_message(T, ant_base(T), "messages without thinking", thinking=False)


def test_ant_count_tokens(T):
    m = ant_base(T)
    n = T.an.messages.count_tokens(model=T.model, system=SYSTEM, messages=[{"role": "user", "content": USER}])
    sdk_valid(n, "count_tokens")
    check(n.input_tokens == prompt_tokens(m.usage),
          f"count_tokens {n.input_tokens} != the reply's input_tokens + cache_read_input_tokens {prompt_tokens(m.usage)}")
    n2 = T.an.messages.count_tokens(model=T.model, system=[{"type": "text", "text": SYSTEM}],
                                    messages=[{"role": "user", "content": [{"type": "text", "text": USER}]}])
    check(n2.input_tokens == n.input_tokens, f"count_tokens with blocks {n2.input_tokens} != {n.input_tokens}")
    t = ant(T, system=SYSTEM, messages=[{"role": "user", "content": USER}], tools=ANT_TOOLS, max_tokens=4)
    nt = T.an.messages.count_tokens(model=T.model, system=SYSTEM, messages=[{"role": "user", "content": USER}],
                                    tools=ANT_TOOLS)
    check(nt.input_tokens == prompt_tokens(t.usage) and nt.input_tokens > n.input_tokens,
          f"count_tokens with tools {nt.input_tokens}, the reply's prompt {prompt_tokens(t.usage)}, without {n.input_tokens}")


def ant_error_body(e, where, etype=None):
    b = e.body
    check(isinstance(b, dict) and b.get("type") == "error" and isinstance(b.get("error"), dict),
          f"{where}: error body {b!r} is not {{'type': 'error', 'error': {{...}}}}")
    check(isinstance(b["error"].get("message"), str) and b["error"]["message"], f"{where}: no error.message: {b}")
    check(isinstance(b["error"].get("type"), str), f"{where}: no error.type: {b}")
    if etype:
        check(b["error"]["type"] == etype, f"{where}: error.type {b['error']['type']!r}, expected {etype!r}")


def test_ant_errors(T):
    msgs = [{"role": "user", "content": "hi"}]
    e = expect_error(lambda: T.an.post("/v1/messages", cast_to=anthropic.types.Message,
                                       body={"model": T.model, "messages": msgs}),
                     (anthropic.BadRequestError,), "messages without max_tokens")
    ant_error_body(e, "messages without max_tokens", "invalid_request_error")
    e = expect_error(lambda: T.an.messages.create(model=T.model, max_tokens=4, messages=msgs,
                                                  extra_body={"temperature": 2}),
                     (anthropic.BadRequestError,), "messages temperature 2")
    ant_error_body(e, "messages temperature 2", "invalid_request_error")
    bad = anthropic.Anthropic(base_url=T.base, api_key="wrong-key", max_retries=0)
    e = expect_error(lambda: bad.messages.create(model=T.model, max_tokens=4, messages=msgs),
                     (anthropic.AuthenticationError,), "messages with a wrong key")
    ant_error_body(e, "messages with a wrong key")
    e = expect_error(lambda: T.an.messages.create(model="no-such-model", max_tokens=4, messages=msgs),
                     (anthropic.NotFoundError,), "messages with an unknown model")
    ant_error_body(e, "messages with an unknown model")


# ---------------------------------------------------------------------------------------------
# D. Authentication headers


def test_auth(T):
    rbody = {"model": T.model, "input": "hi", "max_output_tokens": 16}
    mbody = {"model": T.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (("/v1/responses", rbody), ("/v1/messages", mbody)):
        for name, h in (("Bearer", {"Authorization": "Bearer " + T.key}), ("x-api-key", {"x-api-key": T.key})):
            status, data = T.raw("POST", path, body, h)
            check(status == 200, f"{path} with {name}: {status} {short(data.decode(errors='replace'))}")
        status, data = T.raw("POST", path, body)
        check(status == 401, f"{path} without a key: {status}")
    tok = anthropic.Anthropic(base_url=T.base, auth_token=T.key, api_key=None, max_retries=0)
    m = tok.messages.create(model=T.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    check(m.type == "message", f"anthropic with auth_token (Bearer): {m}")


GROUPS = [
    ("chat completions: forced tool calls and a tool round trip", test_chat_tools),
    ("chat completions: stream equals blocking", test_chat_stream),
    ("chat completions: response_format json_schema", test_chat_json),
    ("responses: string input, usage, output_text, equal to chat", test_resp_basic),
    ("responses: message items (system/developer/user/assistant, input_text)", test_resp_inputs),
    ("responses: max_output_tokens, temperature/top_p", test_resp_limits),
    ("responses: text.format json_schema", test_resp_json),
    ("responses: function tools, previous_response_id and explicit round trips", test_resp_tools),
    ("responses: streaming events, stream() helper", test_resp_stream),
    ("responses: reasoning items", test_resp_reasoning),
    ("responses: retrieve, delete, unknown previous_response_id", test_resp_store),
    ("responses: 400s and 401", test_resp_errors),
    ("messages: shape, system/user blocks, equal to chat", test_ant_basic),
    ("messages: stop_sequences", test_ant_stop_sequences),
    ("messages: tool_use and tool_result round trips", test_ant_tools),
    ("messages: streaming (helper and raw events)", test_ant_stream),
    ("messages: thinking", test_ant_thinking),
    ("messages: count_tokens", test_ant_count_tokens),
    ("messages: errors", test_ant_errors),
    ("auth: Bearer and x-api-key", test_auth),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--model", default="m")
    ap.add_argument("--family", required=True, choices=["v3", "v3.1", "r1-0528"])
    ap.add_argument("--only", default="", help="run only the groups whose title contains this")
    a = ap.parse_args()
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        os.environ.pop(var, None)
    T = Ctx(a)
    for title, fn in GROUPS:
        if a.only and a.only not in title:
            continue
        try:
            note = fn(T)
        except Exception as e:  # noqa: BLE001 - Fail, or an SDK error the server caused
            tb = traceback.extract_tb(e.__traceback__)
            here = next((f"line {f.lineno} in {f.name}" for f in reversed(tb)
                         if f.filename == __file__ and f.name not in ("check", "sdk_valid", "schema_ok")), "")
            kind = "" if isinstance(e, Fail) else f"{type(e).__name__}: "
            print(f"FAIL [{a.family}] {title} ({here}): {kind}{e}", file=sys.stderr)
            return 1
        print(f"ok [{a.family}] {title}" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
