#!/usr/bin/env bash
# MTP speculative decoding under expert parallelism (docs/mtp.md): the module's MoE layer is
# dispatched like every other (as the last MoE layer), and each chained draft pass is
# collective. On the trained default model (build/models/tiny-py), with the BF16 dispatch
# (the single process's rounding):
#   - `generate` at R = 1 (--ep) and R = 2 with K = 2 drafts prints the single process's
#     tokens and logprobs without drafts;
#   - `serve` at R = 2 (DP attention: requests on both ranks, each accepting its own drafts)
#     answers 6 concurrent greedy completions with the single process's text, and /metrics
#     counts both ranks' accepted drafts.
set -euo pipefail
bin=$1
mpiexec=${2:-mpirun}
mpirun="$mpiexec --allow-run-as-root --oversubscribe"
model=build/models/tiny-py
. tests/serve_lib.sh
[ -f "$model/config.json" ] || fail "$model missing"

prompts=($'def read(self, n):\n' $'class Stack:\n    def __init__(self):\n' $'import os\n\ndef main():\n'
         $'    def close(self):\n' $'def parse_args(argv):\n' $'class Error(Exception):\n')
args=(generate --model "$model" --max-tokens 24 --logprobs 2 --json --ignore-eos --threads 1)
for p in "${prompts[@]}"; do args+=(--prompt "$p"); done
"$bin" "${args[@]}" 2> /dev/null > "$dir/single.jsonl" || fail "single process"
"$bin" "${args[@]}" --ep --dispatch-dtype bf16 --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0 \
  2> "$dir/r1.log" | grep -v '"speculative"' > "$dir/r1.jsonl" || fail "R=1"
$mpirun -np 2 "$bin" "${args[@]}" --dispatch-dtype bf16 --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0 \
  2> "$dir/r2.log" > "$dir/r2_all.jsonl" || fail "R=2"
grep -v '"speculative"' "$dir/r2_all.jsonl" > "$dir/r2.jsonl"
grep -q '"speculative"' "$dir/r2_all.jsonl" || fail "R=2: no speculative summary"
python3 - "$dir/single.jsonl" "$dir/r1.jsonl" "$dir/r2.jsonl" <<'PY' || fail "EP + MTP output differs"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
for path in sys.argv[2:]:
    got = [json.loads(l) for l in open(path)]
    assert len(got) == len(ref), (path, len(got))
    for a, b in zip(ref, got):
        assert a["tokens"] == b["tokens"], (path, a["tokens"], b["tokens"])
        d = max(abs(x["logprob"] - y["logprob"])
                for s, t in zip(a["top_logprobs"], b["top_logprobs"]) for x, y in zip(s, t))
        assert d <= 1e-4, (path, d)
        assert b["accepted_draft_tokens"] > 0, b
PY

port=$(free_port)
$mpirun -np 2 "$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --threads 1 \
  --kv-cache-gb 0.1 --dispatch-dtype bf16 --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0 \
  > "$dir/serve.log" 2>&1 &
pid=$!
wait_health "$port"
python3 - "$port" "$dir/single.jsonl" "${prompts[@]}" <<'PY' || fail "serve R=2 with drafts"
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
port, ref, prompts = int(sys.argv[1]), [json.loads(l) for l in open(sys.argv[2])], sys.argv[3:]
def complete(p):
    body = json.dumps({"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())
with ThreadPoolExecutor(len(prompts)) as ex:
    outs = list(ex.map(complete, prompts))
for r, o in zip(ref, outs):
    assert o["choices"][0]["text"] == r["text"], (o["choices"][0]["text"], r["text"])
accepted = sum(o["usage"]["speculative"]["accepted_draft_tokens"] for o in outs)
assert accepted > 0
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
total = sum(float(l.split()[-1]) for l in m.splitlines()
            if l.startswith("moeserve_spec_decode_accepted_tokens_total{"))
assert total == accepted, ("/metrics sums every rank's accepted drafts", total, accepted)
PY
# mpirun forwards SIGTERM to every rank; its own exit code after a signal is not the ranks'.
kill -TERM "$pid"
wait "$pid" || true
pid=""
[ "$(grep -c 'stopped$' "$dir/serve.log")" = 2 ] || fail "not every rank stopped cleanly"
echo PASS
