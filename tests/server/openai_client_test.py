#!/usr/bin/env python3
"""Drives a running `moeserve serve` with the official `openai` client, then fuzzes it.

Usage: openai_client_test.py --base-url http://127.0.0.1:PORT --api-key KEY --model NAME
       [--fuzz N] [--seed S]

Checks chat (plain, streaming, n, logprobs, usage, stop, tools), completions (text and token-id
prompts, logprobs), models, error replies through the client's exception types, a client
disconnect (the request is cancelled and its KV blocks freed), and a fuzz run of random and
mutated bodies (0 connection failures, 0 replies >= 500). Exits non-zero on the first failure.
"""
import argparse
import concurrent.futures
import http.client
import json
import random
import sys
import time
import urllib.parse

import openai


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


class Raw:
    """Raw HTTP against the server (http.client), for what the openai client cannot send."""

    def __init__(self, base_url, api_key):
        u = urllib.parse.urlparse(base_url)
        self.host, self.port = u.hostname, u.port
        self.api_key = api_key

    def request(self, method, path, body=None, headers=None, auth=True, timeout=120):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if auth:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(headers or {})
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def metrics(self):
        status, data = self.request("GET", "/metrics", auth=False)
        check(status == 200, f"/metrics: {status}")
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values


def test_models(client, model):
    models = client.models.list()
    check([m.id for m in models.data] == [model], f"models: {models}")


def chat(client, model, **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": kw.pop("prompt", "Tell me a story.")}],
        **kw)


def test_chat(client, model):
    a = chat(client, model, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    check(a.object == "chat.completion" and len(a.choices) == 1, a)
    c = a.choices[0]
    check(c.message.role == "assistant" and isinstance(c.message.content, str), c)
    check(c.finish_reason == "length", c)
    u = a.usage
    check(u.completion_tokens == 12 and u.prompt_tokens > 0 and
          u.total_tokens == u.prompt_tokens + u.completion_tokens, u)
    # Greedy is deterministic.
    b = chat(client, model, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    check(b.choices[0].message.content == c.message.content, (a, b))
    return c.message.content


def test_chat_stream(client, model, greedy_text):
    stream = chat(client, model, max_tokens=12, temperature=0, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, finish, usage, roles = "", None, None, 0
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", chunk)
        if chunk.usage is not None:
            usage = chunk.usage
            check(chunk.choices == [], chunk)
            continue
        for ch in chunk.choices:
            if ch.delta.role:
                roles += 1
            text += ch.delta.content or ""
            if ch.finish_reason:
                finish = ch.finish_reason
    check(roles == 1, f"role chunks: {roles}")
    check(text == greedy_text, f"stream {text!r} != non-stream {greedy_text!r}")
    check(finish == "length", finish)
    check(usage is not None and usage.completion_tokens == 12, usage)


def test_chat_logprobs(client, model):
    r = chat(client, model, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
             extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    check(len(content) == 5, content)
    for e in content:
        check(e.logprob <= 0 and len(e.top_logprobs) == 3, e)
        lps = [t.logprob for t in e.top_logprobs]
        check(lps == sorted(lps, reverse=True), lps)
        # Greedy: the chosen token is the most likely one.
        check(e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4, e)


def test_n_and_seed(client, model):
    r = chat(client, model, max_tokens=6, temperature=1.0, seed=1234, n=3,
             extra_body={"ignore_eos": True})
    check([c.index for c in r.choices] == [0, 1, 2], r)
    check(r.usage.completion_tokens == 18, r.usage)
    again = chat(client, model, max_tokens=6, temperature=1.0, seed=1234, n=3,
                 extra_body={"ignore_eos": True})
    check([c.message.content for c in r.choices] == [c.message.content for c in again.choices],
          "same seed, different samples")


def test_stop(client, model, greedy_text):
    # A stop string from the middle of the greedy text: the reply ends just before its first
    # occurrence, whatever tokens it straddles.
    mid = len(greedy_text) // 2
    stop = greedy_text[mid:mid + 2]
    expected = greedy_text[:greedy_text.find(stop)]
    for stream in (False, True):
        r = chat(client, model, max_tokens=12, temperature=0, stop=[stop], stream=stream,
                 extra_body={"ignore_eos": True})
        if stream:
            text, finish = "", None
            for chunk in r:
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    finish = ch.finish_reason or finish
        else:
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        check(text == expected and finish == "stop",
              f"stop {stop!r}: got {text!r} ({finish}), expected {expected!r}")


def test_completions(client, model):
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=6,
                                  temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    c = r.choices[0]
    check(r.object == "text_completion" and isinstance(c.text, str), r)
    check(len(c.logprobs.tokens) == 6 and len(c.logprobs.top_logprobs) == 6, c.logprobs)
    check(r.usage.completion_tokens == 6, r.usage)
    ids = client.completions.create(model=model, prompt=[0, 1000, 2000, 3000], max_tokens=4,
                                    temperature=0, extra_body={"ignore_eos": True})
    check(ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens == 4, ids.usage)
    stream = client.completions.create(model=model, prompt=[0, 1000, 2000, 3000], max_tokens=4,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    text = "".join(ch.text for chunk in stream for ch in chunk.choices)
    check(text == ids.choices[0].text, (text, ids.choices[0].text))
    # echo: the prompt's text, then the same completion.
    prompt = "The capital of France is"
    echoed = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                       echo=True, extra_body={"ignore_eos": True})
    check(echoed.choices[0].text == prompt + c.text, (echoed.choices[0].text, c.text))


def test_concurrent_equals_alone(client, model, greedy_text):
    def one(_):
        return chat(client, model, max_tokens=12, temperature=0,
                    extra_body={"ignore_eos": True}).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    check(all(o == greedy_text for o in outs), f"batched outputs differ: {outs}")


def test_errors(client, base_url, model):
    def expect(exc, fn):
        try:
            fn()
        except exc:
            return
        raise AssertionError(f"expected {exc.__name__}")
    expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, messages=[{"role": "wizard", "content": "x"}]))
    expect(openai.BadRequestError, lambda: client.chat.completions.create(model=model, messages=[]))
    expect(openai.BadRequestError, lambda: chat(client, model, max_tokens=10**6))
    expect(openai.BadRequestError, lambda: chat(client, model, n=10**3))
    expect(openai.NotFoundError, lambda: chat(client, "no-such-model", max_tokens=1))
    expect(openai.BadRequestError, lambda: chat(client, model, max_tokens=1, tools=[WEATHER_TOOL],
                                                tool_choice={"type": "function",
                                                             "function": {"name": "nope"}}))
    expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model, max_tokens=1, messages=[{"role": "tool", "content": "orphan"}]))
    bad = openai.OpenAI(base_url=base_url + "/v1", api_key="wrong-key", max_retries=0)
    expect(openai.AuthenticationError, lambda: bad.models.list())


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def test_tools(client, model):
    """Tools through the client: accepted, tool results in the conversation, and the parse path.
    The tiny model's text is random, so a forced tool_choice (the prompt opens that call) is what
    makes it call; with ignore_eos its arguments are whatever it writes until max_tokens, without
    it they are constrained to the function's schema."""
    tools = [WEATHER_TOOL, {"type": "function", "function": {"name": "get_time"}}]
    r = chat(client, model, tools=tools, tool_choice="auto", max_tokens=8, temperature=0)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r)
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    r = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=4)
    check(r.choices[0].message.role == "assistant" and r.usage.prompt_tokens > 0, r)
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(tools=tools, tool_choice=named, max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    r = chat(client, model, **kw)
    c = r.choices[0]
    calls = c.message.tool_calls
    check(c.finish_reason == "length" and calls and len(calls) == 1, c)
    check(calls[0].type == "function" and calls[0].function.name == "get_weather", calls)
    check(calls[0].id.startswith("call_") and isinstance(calls[0].function.arguments, str), calls)
    # Streaming gives the same call: name and id on the first delta, then argument fragments.
    content, name, args, ids, finish = "", None, "", set(), None
    for chunk in chat(client, model, stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            check(tc.index == 0, tc)
            if tc.id:
                check(name is None, f"second first delta: {tc}")
                ids.add(tc.id)
                name = tc.function.name
            args += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    check(name == "get_weather" and len(ids) == 1 and finish == "length", (name, ids, finish))
    check(args == calls[0].function.arguments, f"stream {args!r} != {calls[0].function.arguments!r}")
    check(content == (c.message.content or ""), (content, c.message.content))
    # Without ignore_eos a forced call is constrained (docs/server.md): its arguments parse and
    # meet the function's schema, even from this random model; streamed the same.
    for choice in ("required", named):
        kw = dict(tools=tools, tool_choice=choice, max_tokens=40, temperature=0)
        c = chat(client, model, **kw).choices[0]
        calls = c.message.tool_calls
        check(c.finish_reason in ("tool_calls", "length") and calls and len(calls) == 1, c)
        parsed = json.loads(calls[0].function.arguments)
        check(isinstance(parsed, dict), parsed)
        if calls[0].function.name == "get_weather":
            check(isinstance(parsed.get("city"), str), parsed)
        else:
            check(calls[0].function.name == "get_time", calls)
        streamed = ""
        for chunk in chat(client, model, stream=True, **kw):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                streamed += tc.function.arguments or ""
        check(streamed == calls[0].function.arguments, (streamed, calls[0].function.arguments))
    # tool_choice "none": no call is parsed.
    r = chat(client, model, tools=tools, tool_choice="none", max_tokens=6, temperature=0)
    check(not r.choices[0].message.tool_calls, r)


def test_disconnect(raw, model):
    """A client that goes away mid-stream: the request is cancelled, its KV blocks freed."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "go"}],
                       "stream": True, "max_tokens": 400, "ignore_eos": True})
    before = raw.metrics().get('moeserve_request_finished_total{finish_reason="abort"}', 0)
    conn = http.client.HTTPConnection(raw.host, raw.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json",
                          "Authorization": "Bearer " + raw.api_key})
    resp = conn.getresponse()
    check(resp.status == 200, resp.status)
    resp.read1(256)
    resp.read1(256)
    conn.sock.close()
    conn.close()
    deadline = time.time() + 60
    while True:
        m = raw.metrics()
        done = (m.get('moeserve_request_finished_total{finish_reason="abort"}', 0) > before and
                m["moeserve_num_requests_running"] == 0 and m["moeserve_kv_blocks_used"] == 0)
        if done:
            break
        check(time.time() < deadline, f"request not cancelled after disconnect: {m}")
        time.sleep(0.05)
    check(m["moeserve_generation_tokens_total"] > 0, m)


def fuzz(raw, model, n, seed):
    rng = random.Random(seed)
    base_chat = {"model": model, "messages": [{"role": "system", "content": "s"},
                                              {"role": "user", "content": "hi"}],
                 "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "seed": 1, "n": 1,
                 "stop": ["x"], "logprobs": True, "top_logprobs": 2, "stream": False,
                 "ignore_eos": True}
    base_cmpl = {"model": model, "prompt": "hello", "max_tokens": 2, "logprobs": 1,
                 "stream": False, "echo": False}
    weird = [None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 2**64, 1e308, -1e308, 0.5, "",
             "x", "\u0000", "\ud7ff\ue000", "🎉" * 50, [], [1], [[1]], {}, {"a": 1}, [None],
             "a" * 5000, list(range(50)), [{"role": "user"}], [{"type": "text", "text": 1}]]

    def mutate_json(obj):
        obj = json.loads(json.dumps(obj))
        for _ in range(rng.randint(1, 4)):
            keys = list(obj.keys())
            op = rng.random()
            if op < 0.4 and keys:
                obj[rng.choice(keys)] = rng.choice(weird)
            elif op < 0.55 and keys:
                del obj[rng.choice(keys)]
            elif op < 0.7:
                obj[rng.choice(["n", "stop", "stream_options", "max_completion_tokens", "top_k",
                                "best_of", "tools", "response_format", "logit_bias", "suffix",
                                "stop_token_ids", "presence_penalty", "prompt", "messages"])] = \
                    rng.choice(weird)
            elif "messages" in obj and isinstance(obj["messages"], list) and obj["messages"]:
                m = obj["messages"][rng.randrange(len(obj["messages"]))]
                if isinstance(m, dict):
                    m[rng.choice(["role", "content", "tool_calls", "name"])] = rng.choice(
                        weird + ["user", "assistant", "tool", "system", "developer"])
        # Bound the generation time: most chat cases cap their output (the cap is itself
        # validated, so a mutated max_tokens still reaches the parser).
        if "messages" in obj and "max_completion_tokens" not in obj and rng.random() < 0.95:
            obj["max_completion_tokens"] = 2
        if obj.get("stream") is True and rng.random() < 0.5:
            obj["stream_options"] = {"include_usage": rng.choice([True, False, 1, None])}
        return obj

    def mutate_bytes(b):
        b = bytearray(b)
        for _ in range(rng.randint(1, 5)):
            op = rng.random()
            if op < 0.3 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op < 0.5 and b:
                i = rng.randrange(len(b))
                del b[i:i + rng.randint(1, 20)]
            elif op < 0.7:
                b.insert(rng.randrange(len(b) + 1), rng.choice(b'{}[]",:\\0123456789 \xff\xc3'))
            else:
                b = b[:rng.randrange(len(b) + 1)]
        return bytes(b)

    cases = []
    paths = ["/v1/chat/completions", "/v1/completions"]
    for i in range(n):
        path = rng.choice(paths)
        base = base_chat if path.endswith("chat/completions") else base_cmpl
        r = rng.random()
        headers = {}
        if r < 0.45:
            body = json.dumps(mutate_json(base)).encode()
        elif r < 0.8:
            body = mutate_bytes(json.dumps(base).encode())
        elif r < 0.85:
            body = ("[" * rng.randint(1, 100000)).encode()
        elif r < 0.9:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        elif r < 0.95:
            body = json.dumps(base).encode()
            headers = {"Content-Type": rng.choice(["text/plain", "application/x-www-form-urlencoded",
                                                   ""])}
        else:
            path = rng.choice(["/v1/models", "/v1/nothing", "/health", "/metrics", "/",
                               "/v1/chat/completions/x", "/v1/models/" + model])
            body = None
        method = "GET" if body is None else rng.choice(["POST"] * 9 + ["PUT"])
        cases.append((i, method, path, body, headers))

    def run(case):
        i, method, path, body, headers = case
        where = f"fuzz case {i}: {method} {path} body {(body or b'')[:300]!r}"
        try:
            status, data = raw.request(method, path, body=body, headers=headers)
        except Exception as e:  # a dropped connection counts as a failure
            raise AssertionError(f"{where}: {type(e).__name__}: {e}")
        check(status < 500, f"{where} -> {status} {data[:300]!r}")
        if status == 200 and data.startswith((b"data: ", b"id: ")):  # a stream must not fail midway
            check(b'data: {"error"' not in data and data.rstrip().endswith(b"data: [DONE]"),
                  f"{where} -> stream {data[-300:]!r}")
        if status >= 400:
            err = json.loads(data)["error"]
            check(isinstance(err["message"], str) and "type" in err, data)
        return status

    counts = {}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # concurrent, as real clients are
        for status in pool.map(run, cases):
            counts[status] = counts.get(status, 0) + 1
    status, _ = raw.request("GET", "/health", auth=False)
    check(status == 200, f"health after fuzz: {status}")
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--fuzz", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fuzz-only", action="store_true")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url + "/v1", api_key=a.api_key, max_retries=0,
                           timeout=120)
    raw = Raw(a.base_url, a.api_key)
    t0 = time.time()
    if a.fuzz_only:
        print(fuzz(raw, a.model, a.fuzz, a.seed))
        return
    test_models(client, a.model)
    greedy = test_chat(client, a.model)
    test_chat_stream(client, a.model, greedy)
    test_chat_logprobs(client, a.model)
    test_n_and_seed(client, a.model)
    test_stop(client, a.model, greedy)
    test_completions(client, a.model)
    test_concurrent_equals_alone(client, a.model, greedy)
    test_tools(client, a.model)
    test_errors(client, a.base_url, a.model)
    test_disconnect(raw, a.model)
    print(f"openai client checks: ok ({time.time() - t0:.1f} s)")
    t1 = time.time()
    counts = fuzz(raw, a.model, a.fuzz, a.seed)
    print(f"fuzz: {a.fuzz} requests, 0 crashes, 0 5xx; statuses "
          f"{dict(sorted(counts.items()))} ({time.time() - t1:.1f} s)")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
