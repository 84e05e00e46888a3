#!/usr/bin/env python3
"""A streamed chat completion that survives the death of the router carrying it, with the
official `openai` client (docs/fault-tolerance.md, "A stream outlives its router").

Send the request with an `Idempotency-Key` header; remember the `id:` of the last event you got;
when the stream breaks, send the same request to another router (or the same one, restarted)
with the same key and `Last-Event-ID`: the events after that one come, nothing twice, nothing
missing. (The SDK's stream iterator does not show event ids, so this reads the raw stream.)

Usage: resume_stream.py --url http://router-a:8000/v1 --url http://router-b:8000/v1
       [--model NAME] [--prompt TEXT] [--max-tokens N] [--cut-after K]
--cut-after K drops the connection after K events, to try resuming without killing anything.
"""
import argparse
import json
import uuid

import openai


def stream_events(client, headers, **request):
    """(event id, chunk) for each event of a streamed chat completion."""
    with client.chat.completions.with_streaming_response.create(
            stream=True, extra_headers=headers, **request) as response:
        event_id = None
        for line in response.iter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: ") and line != "data: [DONE]":
                yield event_id, json.loads(line[6:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", action="append", required=True, help="a router's /v1 URL (repeat)")
    ap.add_argument("--model", default="tiny-py")
    ap.add_argument("--prompt", default="Write a function that reads a config file.")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cut-after", type=int, default=0)
    a = ap.parse_args()
    clients = [openai.OpenAI(base_url=u, api_key="none", max_retries=0) for u in a.url]
    request = dict(model=a.model, max_tokens=a.max_tokens,
                   messages=[{"role": "user", "content": a.prompt}])
    key = str(uuid.uuid4())  # one per logical request, kept across its retries
    last_id, text, attempt, events = None, "", 0, 0
    while True:
        headers = {"Idempotency-Key": key}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        client = clients[attempt % len(clients)]
        try:
            for event_id, chunk in stream_events(client, headers, **request):
                last_id = event_id
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    text += piece
                    print(piece, end="", flush=True)
                events += 1
                if a.cut_after and events == a.cut_after and attempt == 0:
                    raise ConnectionError("dropped on purpose (--cut-after)")
            break
        except (openai.APIConnectionError, ConnectionError) as e:
            attempt += 1
            print(f"\n[stream broke after event {last_id}: {e}; resuming]", flush=True)
            if attempt > 3:
                raise
    print(f"\n[{len(text)} characters, {attempt} resumption(s)]")


if __name__ == "__main__":
    main()
