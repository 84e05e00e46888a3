#!/usr/bin/env bash
# --speculative mtp on the trained default model (build/models/tiny-py): `generate` prints the
# same greedy text with K = 1..3 drafts as without, and reports acceptance in --json (and so
# does the trained tiny V4, whose module accepts a fair share of its drafts); through
# the disk tier too (the module's layer is part of each block on disk); `serve`
# with drafts answers the official openai client with the same text, streamed and not, with
# the "speculative" usage extension, and /metrics counts drafts per position.
set -euo pipefail
bin=$(realpath "$1")
model=build/models/tiny-py
. tests/serve_lib.sh
[ -f "$model/config.json" ] || fail "$model missing (CMake lays it out from assets/models/tiny-py)"
prompt=$'class Queue:\n    def put(self, item):\n'

text() { python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["text"])'; }
"$bin" generate --model "$model" --prompt "$prompt" --max-tokens 48 --ignore-eos --json \
  2> /dev/null | text > "$dir/off.txt" || fail "generate without drafts"
for k in 1 2 3; do
  "$bin" generate --model "$model" --prompt "$prompt" --max-tokens 48 --ignore-eos --json \
    --speculative mtp --num-draft-tokens "$k" --speculative-max-rows 0 > "$dir/on$k.json" 2> /dev/null ||
    fail "generate --num-draft-tokens $k"
  head -1 "$dir/on$k.json" | text > "$dir/on$k.txt"
  cmp -s "$dir/off.txt" "$dir/on$k.txt" || fail "K=$k changed the text: $(cat "$dir/on$k.txt")"
  python3 - "$dir/on$k.json" "$k" <<'PY' || fail "generate --json speculative fields, K=$k"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
k = int(sys.argv[2])
spec = lines[-1]["speculative"]
assert spec["num_draft_tokens"] == k and len(spec["verified"]) == k, spec
assert 0 < spec["accepted"][0] <= spec["verified"][0], spec
assert lines[0]["accepted_draft_tokens"] == sum(spec["accepted"]), (lines[0], spec)
PY
done

# The disk tier holds the module's layer in every block: a second run reads the prompt's blocks
# from disk (with their module rows) and prints the same text.
long=$(python3 -c 'import sys; print(open("/usr/lib/python3.11/bz2.py").read()[:2500])')
for run in 1 2; do
  "$bin" generate --model "$model" --prompt "$long" --max-tokens 24 --ignore-eos --json \
    --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0 --kv-disk "$dir/disk" \
    2> "$dir/disk$run.log" | head -1 | text > "$dir/disk$run.txt" || fail "--kv-disk run $run"
done
cmp -s "$dir/disk1.txt" "$dir/disk2.txt" || fail "the disk tier changed the text"
grep -qE "kv-disk: [1-9][0-9]* hits" "$dir/disk2.log" || fail "no disk hits: $(grep kv-disk "$dir/disk2.log")"
"$bin" generate --model "$model" --prompt "$long" --max-tokens 24 --ignore-eos --json 2> /dev/null |
  text > "$dir/disk_off.txt"
cmp -s "$dir/disk1.txt" "$dir/disk_off.txt" || fail "drafts with the disk tier changed the text"

# The trained tiny V4's module (build/models/tiny-v4, tools/train_tiny_v4_mtp.py): the same
# greedy text with K = 1..3, and its drafts mean something: on the Queue prompt K = 1 accepts 20
# of 26 on Zen 4 (a random or mis-wired module accepts next to none).
v4=build/models/tiny-v4
[ -f "$v4/mtp.safetensors" ] || fail "$v4 has no MTP module (CMake extracts assets/models/tiny-v4/mtp.tar.xz)"
"$bin" generate --model "$v4" --prompt "$prompt" --max-tokens 48 --ignore-eos --json 2> /dev/null |
  text > "$dir/v4off.txt" || fail "tiny-v4 without drafts"
for k in 1 2 3; do
  "$bin" generate --model "$v4" --prompt "$prompt" --max-tokens 48 --ignore-eos --json \
    --speculative mtp --num-draft-tokens "$k" --speculative-max-rows 0 > "$dir/v4on$k.json" \
    2> /dev/null || fail "tiny-v4 --num-draft-tokens $k"
  head -1 "$dir/v4on$k.json" | text | cmp -s - "$dir/v4off.txt" || fail "tiny-v4 K=$k changed the text"
done
python3 - "$dir/v4on1.json" <<'PY' || fail "tiny-v4's module: too few drafts accepted"
import json, sys
spec = json.loads(open(sys.argv[1]).read().splitlines()[-1])["speculative"]
rate = spec["accepted"][0] / spec["verified"][0]
print(f"tiny-v4's MTP module: {spec['accepted'][0]} of {spec['verified'][0]} first drafts accepted")
assert rate >= 0.5, spec
PY

# Usage errors: exit 2; a checkpoint without an MTP module: exit 1 naming the field.
set +e
"$bin" generate --model "$model" --prompt x --speculative eagle > /dev/null 2>&1
[ $? -eq 2 ] || fail "--speculative eagle accepted"
"$bin" generate --model "$model" --prompt x --speculative mtp --num-draft-tokens 4 > /dev/null 2>&1
[ $? -eq 2 ] || fail "--num-draft-tokens 4 accepted"
"$bin" make-model --preset tiny --out "$dir/nomtp" --set vocab_size=2000 --set num_hidden_layers=2 \
  --set num_nextn_predict_layers=0 > /dev/null 2>&1 || fail "make-model"
"$bin" generate --model "$dir/nomtp" --prompt-ids 1,2,3 --speculative mtp > /dev/null 2> "$dir/err"
rc=$?
set -e
[ $rc -eq 1 ] && grep -q num_nextn_predict_layers "$dir/err" || fail "no MTP module: rc=$rc $(cat "$dir/err")"

python3 -c "import openai" 2>/dev/null || fail "python package 'openai' missing"
port=$(free_port)
"$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --served-model-name tiny-py \
  --kv-cache-gb 0.25 --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0 \
  > "$dir/serve.log" 2>&1 &
pid=$!
wait_health "$port"
python3 - "$port" "$dir/off.txt" "$prompt" <<'PY' || fail "openai client against --speculative"
import sys, urllib.request
import openai
port, want, prompt = int(sys.argv[1]), open(sys.argv[2]).read().rstrip("\n"), sys.argv[3]
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
r = c.completions.create(model="tiny-py", prompt=prompt, max_tokens=48, temperature=0,
                         extra_body={"ignore_eos": True})
assert r.choices[0].text == want, (r.choices[0].text, want)
spec = r.usage.model_extra["speculative"]
assert 0 < spec["accepted_draft_tokens"] <= spec["draft_tokens"], spec
parts = c.completions.create(model="tiny-py", prompt=prompt, max_tokens=48, temperature=0,
                             stream=True, stream_options={"include_usage": True},
                             extra_body={"ignore_eos": True})
chunks = list(parts)
streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
assert streamed == want, (streamed, want)
assert chunks[-1].usage.model_extra["speculative"]["draft_tokens"] > 0
# A stop string inside a step's several tokens ends the reply where it would without drafts
# (the text up to it); n = 2 choices decode side by side.
lines = want.split("\n")
stop = lines[1][-3:] if len(lines) > 1 and len(lines[1]) >= 3 else "\n"
cut = c.completions.create(model="tiny-py", prompt=prompt, max_tokens=48, temperature=0,
                           stop=[stop], extra_body={"ignore_eos": True})
assert cut.choices[0].text == want[:want.index(stop)], (cut.choices[0].text, stop)
assert cut.choices[0].finish_reason == "stop"
two = c.completions.create(model="tiny-py", prompt=prompt, max_tokens=48, temperature=0, n=2,
                           extra_body={"ignore_eos": True})
assert [ch.text for ch in two.choices] == [want, want], [ch.text for ch in two.choices]
# Sampled requests run too (their distribution is the target's: tests/kernels/sampling_test.cpp).
s = c.completions.create(model="tiny-py", prompt=prompt, max_tokens=32, temperature=0.8, seed=3)
assert s.usage.completion_tokens > 0
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
for name in ("moeserve_spec_decode_draft_tokens_total{position=\"1\"}",
             "moeserve_spec_decode_accepted_tokens_total{position=\"0\"}",
             "moeserve_spec_decode_mean_accepted_length"):
    line = [l for l in m.splitlines() if l.startswith(name)]
    assert line and float(line[0].split()[-1]) > 0, (name, line)
PY
kill -TERM "$pid"
wait "$pid" || fail "serve exit status"
pid=""
echo PASS
