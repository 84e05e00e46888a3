#!/usr/bin/env python3
"""Load generator for `moeserve serve` (or any OpenAI-compatible server).

Dependencies: none beyond the Python 3.8+ standard library (asyncio streams speak HTTP/1.1 and
Server-Sent Events directly, so the client adds no latency of its own and needs no pip install).

Each of --concurrency streams runs its requests one after the other, so the server sees
`--concurrency` requests in flight at all times. Every request is a streaming chat completion
with `ignore_eos: true` (vLLM's extension) and `stream_options.include_usage`, so output lengths
are exactly the requested ones and token counts come from the server's own `usage`.

Modes:
  single      (default) independent requests; prompt and output lengths drawn log-uniformly
              from --prompt-len and --output-len (seeded: the same seed gives the same load).
  multi-turn  each stream is one conversation of --turns turns; every turn appends the
              previous answer and a new user message (--turn-len tokens), so successive
              requests share a growing prefix that the prefix cache can serve.

  --request-rate R  (with either mode's lengths, as `single`) open-loop arrivals instead of
              streams: --num-requests requests sent at Poisson times of rate R per second (the
              gaps drawn from the seed), each on its own whatever the server's backlog, so the
              latencies are those of a server under that offered load (vLLM's `bench serve
              --request-rate` in the same sense).

Reports input and output tokens/s over the whole run, TTFT (send to first generated text) and
TPOT ((end - first token) / (output tokens - 1)) percentiles p50/p90/p99, requests, errors, and
the prefix-cache hit rate from the delta of /metrics counters
(moeserve_prefix_cache_hits_total / moeserve_prefix_cache_queries_total) before and after.
Prompt lengths are approximate (one common English word is about one token); the figures use
the exact counts from `usage`.
"""

import argparse
import asyncio
import json
import math
import random
import sys
import time
import urllib.parse
import urllib.request

# Common English words; in DeepSeek-V3's tokenizer " word" is one token for each of them.
WORDS = """the of and to in is was for on that with as by at from his it an were are which this
be or has had not also have but first one their its after new who they two her she been other
when time during there into school more may years over only city would some later world about
than most where between many these team made state three while both under all national then
season year game well what people back being known found him through part family people such
can out each since high will number four before life film group same day name early work home
area based five could small great should want city water house music power light story place
system order point money night world river market public question right report model data
class paper table window garden letter summer winter morning evening student teacher doctor
country village island forest mountain bridge street office church station village kitchen
""".split()


def log_uniform(rng, lo, hi):
    """An integer in [lo, hi], log-uniform: short lengths are common, long ones rarer."""
    if lo >= hi:
        return lo
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def make_text(rng, n_tokens):
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))


def parse_range(s):
    parts = s.split(",") if "," in s else s.split("-")
    if len(parts) == 1:
        v = int(parts[0])
        return v, v
    lo, hi = int(parts[0]), int(parts[1])
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"bad range {s!r}: want LO,HI with 1 <= LO <= HI")
    return lo, hi


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


# ---------------------------------------------------------------------------------------------
# HTTP


class HttpError(Exception):
    pass


def http_get(base, path, headers, timeout=30):
    req = urllib.request.Request(base + path, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def read_metrics(base, headers):
    """Sums of the prefix-cache counters in the Prometheus text, or None if unavailable."""
    try:
        text = http_get(base, "/metrics", headers)
    except Exception:
        return None
    out = {"queries": 0.0, "hits": 0.0, "generation_tokens": 0.0, "prompt_tokens": 0.0,
           "preemptions": 0.0}
    names = {"moeserve_prefix_cache_queries_total": "queries",
             "moeserve_prefix_cache_hits_total": "hits",
             "moeserve_generation_tokens_total": "generation_tokens",
             "moeserve_prompt_tokens_total": "prompt_tokens",
             "moeserve_preemptions_total": "preemptions"}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[names[name]] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


async def _read_headers(reader):
    status_line = await reader.readline()
    if not status_line:
        raise HttpError("connection closed before the status line")
    parts = status_line.decode("latin-1").split(" ", 2)
    status = int(parts[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def _body_chunks(reader, headers):
    """Yields the body as it arrives, undoing chunked transfer encoding."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise HttpError("connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def stream_chat(url, headers, body, timeout):
    """POSTs a streaming chat (or completions: `text` deltas) request. Returns (ttft_s, e2e_s, text, usage, finish_reason)."""
    u = urllib.parse.urlsplit(url)
    payload = json.dumps(body).encode()
    head = [f"POST {u.path or '/'} HTTP/1.1", f"Host: {u.netloc}",
            "Content-Type: application/json", "Accept: text/event-stream",
            f"Content-Length: {len(payload)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    t0 = time.perf_counter()
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(u.hostname, u.port or 80), timeout)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status, resp_headers = await asyncio.wait_for(_read_headers(reader), timeout)
        if status != 200:
            body_bytes = b"".join([c async for c in _body_chunks(reader, resp_headers)])
            raise HttpError(f"HTTP {status}: {body_bytes[:300].decode('utf-8', 'replace')}")
        ttft = None
        text_parts = []
        usage = None
        finish = None
        done = False
        buf = b""
        chunks = _body_chunks(reader, resp_headers)
        while True:
            try:
                data = await asyncio.wait_for(chunks.__anext__(), timeout)
            except StopAsyncIteration:
                break
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data_str = line[5:].strip()
                    if data_str == b"[DONE]":
                        done = True
                        continue
                    chunk = json.loads(data_str)
                    if "error" in chunk:
                        raise HttpError(f"error event: {chunk['error']}")
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for ch in chunk.get("choices") or []:
                        delta = ch.get("delta") or {}
                        piece = (delta.get("content") or "") + (
                            delta.get("reasoning_content") or "") + (ch.get("text") or "")
                        if piece:
                            if ttft is None:
                                ttft = time.perf_counter() - t0
                            text_parts.append((delta.get("content") or "") + (ch.get("text") or ""))
                        if ch.get("finish_reason"):
                            finish = ch["finish_reason"]
        e2e = time.perf_counter() - t0
        if not done:
            raise HttpError("stream ended without data: [DONE]")
        if usage is None:
            raise HttpError("no usage chunk (stream_options.include_usage ignored?)")
        return ttft, e2e, "".join(text_parts), usage, finish
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# Load


class Results:
    def __init__(self):
        self.records = []  # dicts: prompt, cached, output, ttft, tpot, e2e, requested
        self.errors = []
        self.short_outputs = 0


async def run_stream(sid, args, url, headers, rng, results, system):
    messages = [{"role": "system", "content": system}] if system else []
    n_requests = args.turns if args.mode == "multi-turn" else args.requests_per_stream
    for i in range(n_requests):
        if args.mode == "multi-turn" and i > 0:
            user_len = log_uniform(rng, *args.turn_len)
        else:
            user_len = log_uniform(rng, *args.prompt_len)
        out_len = log_uniform(rng, *args.output_len)
        user = make_text(rng, user_len)
        if args.mode == "multi-turn":
            messages.append({"role": "user", "content": user})
            req_messages = list(messages)
        else:
            req_messages = messages + [{"role": "user", "content": user}]
        body = {"model": args.model, "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": out_len,
                "ignore_eos": True, "temperature": args.temperature}
        if args.api == "completions":  # the text alone: no chat template, no output parser
            body["prompt"] = "\n\n".join(m["content"] for m in req_messages)
        else:
            body["messages"] = req_messages
        if args.temperature > 0:
            body["seed"] = rng.randrange(1 << 31)
        try:
            ttft, e2e, text, usage, _ = await stream_chat(url, headers, body, args.timeout)
        except Exception as e:  # noqa: BLE001 -- every failure is counted, the run goes on
            results.errors.append(f"stream {sid} request {i}: {type(e).__name__}: {e}")
            if args.mode == "multi-turn":
                return  # the conversation cannot continue without the answer
            continue
        n_out = usage.get("completion_tokens", 0)
        if n_out < out_len:
            results.short_outputs += 1
        details = usage.get("prompt_tokens_details") or {}
        tpot = (e2e - ttft) / (n_out - 1) if ttft is not None and n_out > 1 else None
        results.records.append({"prompt": usage.get("prompt_tokens", 0),
                                "cached": details.get("cached_tokens", 0) or 0,
                                "output": n_out, "ttft": ttft, "tpot": tpot, "e2e": e2e,
                                "requested": out_len})
        if args.mode == "multi-turn":
            messages.append({"role": "assistant", "content": text})


def summarize(args, results, wall, m0, m1, client_cpu=None):
    recs = results.records
    ttfts = [r["ttft"] for r in recs if r["ttft"] is not None]
    tpots = [r["tpot"] for r in recs if r["tpot"] is not None]
    e2es = [r["e2e"] for r in recs]
    n_in = sum(r["prompt"] for r in recs)
    n_out = sum(r["output"] for r in recs)
    n_cached = sum(r["cached"] for r in recs)

    def pcts(v, scale=1.0):
        return {f"p{q}": (None if not v else round(percentile(v, q) * scale, 2))
                for q in (50, 90, 99)}

    out = {"mode": "poisson" if args.request_rate > 0 else args.mode,
           "concurrency": args.concurrency, "request_rate": args.request_rate or None,
           "requests": len(recs), "errors": len(results.errors),
           "short_outputs": results.short_outputs, "duration_s": round(wall, 2),
           "input_tokens": n_in, "output_tokens": n_out,
           "input_tok_s": round(n_in / wall, 2) if wall > 0 else None,
           "output_tok_s": round(n_out / wall, 2) if wall > 0 else None,
           "ttft_ms": pcts(ttfts, 1e3), "tpot_ms": pcts(tpots, 1e3),
           "e2e_s": pcts(e2es), "cached_prompt_tokens": n_cached,
           "usage_cache_hit_rate": round(n_cached / n_in, 4) if n_in else None,
           "client_cpu_s": None if client_cpu is None else round(client_cpu, 2),
           "seed": args.seed}
    if m0 is not None and m1 is not None:
        q = m1["queries"] - m0["queries"]
        h = m1["hits"] - m0["hits"]
        out["prefix_cache"] = {"queries": q, "hits": h,
                               "hit_rate": round(h / q, 4) if q > 0 else None,
                               "preemptions": m1["preemptions"] - m0["preemptions"]}
    else:
        out["prefix_cache"] = None
    if results.errors:
        out["first_errors"] = results.errors[:5]
    return out


def print_human(s):
    def fmt(p):
        return " ".join(f"{k}={'-' if v is None else v}" for k, v in p.items())

    print(f"mode {s['mode']}, {s['concurrency']} streams, seed {s['seed']}")
    print(f"requests {s['requests']}  errors {s['errors']}  short outputs {s['short_outputs']}"
          f"  duration {s['duration_s']} s")
    print(f"input  {s['input_tokens']} tokens  {s['input_tok_s']} tok/s")
    print(f"output {s['output_tokens']} tokens  {s['output_tok_s']} tok/s")
    print(f"TTFT ms  {fmt(s['ttft_ms'])}")
    print(f"TPOT ms  {fmt(s['tpot_ms'])}")
    print(f"E2E s    {fmt(s['e2e_s'])}")
    pc = s["prefix_cache"]
    if pc:
        print(f"prefix cache (/metrics): {pc['hits']:.0f} / {pc['queries']:.0f} prompt tokens hit"
              f" = {pc['hit_rate']}; preemptions {pc['preemptions']:.0f}")
    print(f"prefix cache (usage.cached_tokens): {s['cached_prompt_tokens']} / "
          f"{s['input_tokens']} = {s['usage_cache_hit_rate']}")
    if s.get("client_cpu_s") is not None:
        print(f"load generator CPU {s['client_cpu_s']} s "
              f"({100 * s['client_cpu_s'] / max(s['duration_s'], 1e-9):.1f}% of one core)")
    for e in s.get("first_errors", []):
        print(f"error: {e}")


async def run_poisson(args, url, headers, rng, results, system):
    """--num-requests single requests at Poisson arrival times of --request-rate per second."""
    one = argparse.Namespace(**vars(args))
    one.mode, one.requests_per_stream = "single", 1
    tasks = []
    t_next = time.perf_counter()
    for i in range(args.num_requests):
        t_next += rng.expovariate(args.request_rate)
        sub = random.Random(rng.randrange(1 << 62))
        delay = t_next - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(run_stream(i, one, url, headers, sub, results, system)))
    await asyncio.gather(*tasks)


async def main_async(args):
    base = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if not args.model:
        models = json.loads(http_get(base, "/v1/models", headers))
        args.model = models["data"][0]["id"]
    if args.api == "completions" and args.mode == "multi-turn":
        sys.exit("loadgen: --api completions takes single requests (--mode single)")
    url = base + ("/v1/completions" if args.api == "completions" else "/v1/chat/completions")
    rng = random.Random(args.seed)
    system = make_text(rng, args.system_len) if args.system_len > 0 else ""

    if args.warmup > 0:  # first touches of the weights; not counted, before the /metrics read
        w = Results()
        wargs = argparse.Namespace(**vars(args))
        wargs.mode, wargs.requests_per_stream = "single", args.warmup
        wargs.prompt_len, wargs.output_len = (16, 16), (4, 4)
        await run_stream(-1, wargs, url, headers, random.Random(args.seed + 1), w, "")
        if w.errors:
            print(f"warmup failed: {w.errors[0]}", file=sys.stderr)
            return None

    m0 = read_metrics(base, headers)
    results = Results()
    # One generator per stream, seeded from the run's seed: the load does not depend on timing.
    rngs = [random.Random(rng.randrange(1 << 62)) for _ in range(args.concurrency)]
    t0 = time.perf_counter()
    cpu0 = time.process_time()  # the generator's own CPU: it may share the server's cores
    if args.request_rate > 0:
        await run_poisson(args, url, headers, random.Random(rng.randrange(1 << 62)), results,
                          system)
    else:
        await asyncio.gather(*(run_stream(i, args, url, headers, rngs[i], results, system)
                               for i in range(args.concurrency)))
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    m1 = read_metrics(base, headers)
    return summarize(args, results, wall, m0, m1, client_cpu)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", default="", help="model name (default: the first /v1/models)")
    p.add_argument("--api-key", default="", help="sent as Authorization: Bearer")
    p.add_argument("--mode", choices=["single", "multi-turn"], default="single")
    p.add_argument("--api", choices=["chat", "completions"], default="chat",
                   help="/v1/chat/completions, or /v1/completions with the same text as the "
                        "prompt (no chat template or output parsing on the server)")
    p.add_argument("-c", "--concurrency", type=int, default=1, help="concurrent streams")
    p.add_argument("-r", "--requests-per-stream", type=int, default=2,
                   help="requests each stream sends one after the other (single mode)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (multi-turn)")
    p.add_argument("--prompt-len", type=parse_range, default=(32, 512),
                   help="LO,HI tokens of a request's user message (first turn in multi-turn)")
    p.add_argument("--turn-len", type=parse_range, default=(16, 64),
                   help="LO,HI tokens of each later user message (multi-turn)")
    p.add_argument("--output-len", type=parse_range, default=(16, 64),
                   help="LO,HI output tokens (max_tokens with ignore_eos)")
    p.add_argument("--system-len", type=int, default=0,
                   help="tokens of a system prompt shared by every request (0: none)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="untimed requests before the run")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for connect, headers or any next stream chunk")
    p.add_argument("--request-rate", type=float, default=0.0,
                   help="open-loop Poisson arrivals per second (0: --concurrency streams)")
    p.add_argument("--num-requests", type=int, default=32,
                   help="requests sent at --request-rate")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    if args.concurrency < 1 or args.requests_per_stream < 1 or args.turns < 1:
        p.error("--concurrency, --requests-per-stream and --turns must be >= 1")
    if args.request_rate < 0 or args.num_requests < 1:
        p.error("--request-rate must be >= 0 and --num-requests >= 1")

    try:
        summary = asyncio.run(main_async(args))
    except (OSError, urllib.error.URLError) as e:
        print(f"loadgen: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    if summary is None:
        return 1
    if args.json:
        print(json.dumps(summary))
    else:
        print_human(summary)
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
