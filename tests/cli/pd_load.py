"""Streams of a disaggregated deployment under a failure (tests/cli/pd_failover.sh).

Runs --n streamed completions (greedy and seeded sampled, logprobs on) against --url at once;
when every stream has --at tokens (0: at once), runs --then (a shell command: the kill) and
notes the time. Every stream is compared with the same request, unstreamed, on --ref (a
co-located serve): text, finish reason and every token's logprob. Prints one JSON line:
requests lost (ended in an error), changed (whole but different), the longest gap between two
tokens of a stream (or before its first), and the recovery time (from the kill to the end of
the longest gap after it, the latest over the streams). Exits 1 when a request was lost or changed, unless
--expect-errors, where every request must instead have ended (no hang) within --end-within s.

--resume-url: every stream is sent with an Idempotency-Key, and one that breaks (its router died)
is resumed there with the same key and Last-Event-ID (the id of the last event it got), as
docs/fault-tolerance.md tells clients to; the resumed events continue the stream. The line also
counts the resumed streams.
"""
import argparse
import concurrent.futures as cf
import json
import subprocess
import sys
import threading
import time

import openai

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--ref", required=True)
ap.add_argument("--n", type=int, default=6)
ap.add_argument("--max-tokens", type=int, default=80)
ap.add_argument("--prompt-repeat", type=int, default=3)
ap.add_argument("--at", type=int, default=8)
ap.add_argument("--then", default="")
ap.add_argument("--expect-errors", action="store_true")
ap.add_argument("--end-within", type=float, default=20.0)
ap.add_argument("--label", default="")
ap.add_argument("--resume-url", default="")
a = ap.parse_args()

pd = openai.OpenAI(base_url=a.url, api_key="none", max_retries=0, timeout=120)
resume = openai.OpenAI(base_url=a.resume_url, api_key="none", max_retries=0, timeout=120) \
    if a.resume_url else None
run_tag = f"{a.label}-{time.time_ns()}"
ref = openai.OpenAI(base_url=a.ref, api_key="none", max_retries=0, timeout=120)


def params(i):
    body = f"def handler_{i}(request, x={i}):\n    total = 0\n" * a.prompt_repeat
    p = dict(model="tiny-py", prompt=body, max_tokens=a.max_tokens, logprobs=1)
    if i % 2:
        p.update(temperature=0.8, seed=100 + i)
    else:
        p.update(temperature=0)
    return p


def reference(i):
    r = ref.completions.create(**params(i)).choices[0]
    return r.text, r.finish_reason, r.logprobs.token_logprobs


want = list(cf.ThreadPoolExecutor(a.n).map(reference, range(a.n)))

counts = [0] * a.n
times = [[] for _ in range(a.n)]
lock = threading.Lock()
kill_at = [None]


def events(client, i, headers):
    """(id, chunk) of each SSE event of a streamed completion (the raw stream: the SDK's iterator
    does not show the events' ids)."""
    with client.completions.with_streaming_response.create(
            stream=True, extra_headers=headers, **params(i)) as r:
        event_id = None
        for line in r.iter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: ") and line != "data: [DONE]":
                yield event_id, json.loads(line[6:])


def stream(i):
    start = time.monotonic()
    text, lps, reason = "", [], None
    key = f"{run_tag}-{i}"
    last_id, resumed = None, 0
    while True:
        headers = {"Idempotency-Key": key} if resume else {}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        try:
            for event_id, ch in events(pd if resumed == 0 else resume, i, headers):
                last_id = event_id
                if "error" in ch:
                    raise RuntimeError(f"error event: {ch['error']}")
                if not ch["choices"]:
                    continue
                c = ch["choices"][0]
                now = time.monotonic()
                tl = (c.get("logprobs") or {}).get("token_logprobs") or []
                text += c.get("text") or ""
                lps += tl
                with lock:
                    counts[i] += len(tl)
                    times[i] += [now] * len(tl)
                reason = c.get("finish_reason") or reason
            break
        except Exception as e:  # noqa: BLE001 (a lost request, counted, unless it resumes)
            if resume is None or resumed >= 3:
                return dict(error=f"{type(e).__name__}: {e}", start=start, end=time.monotonic())
            resumed += 1
    return dict(got=(text, reason, lps), start=start, end=time.monotonic(), resumed=resumed)


def trigger():
    if not a.then:
        return
    while True:
        with lock:
            if all(c >= a.at for c in counts) or a.at == 0:
                break
        time.sleep(0.01)
    kill_at[0] = time.monotonic()
    subprocess.run(a.then, shell=True, check=False)


with cf.ThreadPoolExecutor(a.n + 1) as ex:
    t = ex.submit(trigger)
    futs = [ex.submit(stream, i) for i in range(a.n)]
    if a.at == 0:
        time.sleep(0.0)
    results = [f.result() for f in futs]
    t.result()

lost = [i for i, r in enumerate(results) if "error" in r]
changed = [i for i, r in enumerate(results) if "got" in r and r["got"] != want[i]]
gap = 0.0
for i, r in enumerate(results):
    ts = [r["start"]] + times[i]
    gap = max([gap] + [b - x for x, b in zip(ts, ts[1:])])
recovery = None
if kill_at[0] is not None:
    # Per stream, the end of its longest gap among those ending after the kill (a stream of the
    # failed unit: when its tokens came again; the others: soon after the kill).
    after = []
    for i, r in enumerate(results):
        ts = [r["start"]] + times[i]
        gaps = [(b - x, b) for x, b in zip(ts, ts[1:]) if b > kill_at[0]]
        if gaps:
            after.append(max(gaps)[1] - kill_at[0])
    recovery = max(after) if after else None
ended = max(r["end"] for r in results) - (kill_at[0] or 0) if kill_at[0] else None
out = dict(label=a.label, requests=a.n, lost=len(lost), changed=len(changed),
           longest_stall_s=round(gap, 3),
           recovery_s=None if recovery is None else round(recovery, 3),
           last_end_after_kill_s=None if ended is None else round(ended, 3),
           resumed=sum(1 for r in results if r.get("resumed")),
           errors=sorted({results[i]["error"][:200] for i in lost}))
print(json.dumps(out), flush=True)
for i in changed:
    print(f"request {i} changed:\n got  {results[i]['got']!r}\n want {want[i]!r}", file=sys.stderr)
if a.expect_errors:
    sys.exit(0 if ended is not None and ended <= a.end_within else 1)
sys.exit(1 if lost or changed else 0)
