#!/usr/bin/env bash
# The KV disk tier from the command line (real files, real processes): a second process gets
# disk hits and the same tokens and logprobs as a cold run; a corrupted object is a counted miss
# with the same output; a restarted server reports the cached prompt tokens of its first request.
set -euo pipefail
bin=$1
dir=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin" make-model --preset tiny --out "$dir/m" --set vocab_size=2000 --set num_hidden_layers=2 2>/dev/null
p1=$(seq -s, 1 3 300)   # 100 tokens: one full block
p2=$(seq -s, 7 11 1500)  # 136 tokens: two
gen() {
  "$bin" generate --model "$dir/m" --prompt-ids "$p1" --prompt-ids "$p2" --max-tokens 8 \
    --logprobs 3 --json --ignore-eos "$@"
}
gen > "$dir/cold.jsonl" 2>/dev/null
gen --kv-disk "$dir/kv" > "$dir/first.jsonl" 2> "$dir/first.err"
grep -q "kv-disk: 0 hits, .* 3 written" "$dir/first.err" || fail "first run: $(cat "$dir/first.err")"
gen --kv-disk "$dir/kv" > "$dir/second.jsonl" 2> "$dir/second.err"
grep -q "kv-disk: 3 hits, 0 misses, rejected: none" "$dir/second.err" ||
  fail "second run: $(grep kv-disk "$dir/second.err")"
cmp -s "$dir/cold.jsonl" "$dir/first.jsonl" || fail "the tier changed a cold run's output"
cmp -s "$dir/cold.jsonl" "$dir/second.jsonl" || fail "disk hits changed the output"

# The FP8 cache (FlashMLA's format: 0.57x the bytes) through the tier: its own objects (another
# fingerprint: the BF16 ones are never looked up), disk hits with the FP8 cold output.
gen --kv-cache-dtype fp8 > "$dir/fp8-cold.jsonl" 2>/dev/null
gen --kv-cache-dtype fp8 --kv-disk "$dir/kv" > /dev/null 2> "$dir/fp8-first.err"
grep -q "kv-disk: 0 hits, 2 misses, rejected: none, 3 written" "$dir/fp8-first.err" ||
  fail "fp8 first run: $(grep kv-disk "$dir/fp8-first.err")"
gen --kv-cache-dtype fp8 --kv-disk "$dir/kv" > "$dir/fp8-second.jsonl" 2> "$dir/fp8-second.err"
grep -q "kv-disk: 3 hits, 0 misses, rejected: none, 0 written" "$dir/fp8-second.err" ||
  fail "fp8 second run: $(grep kv-disk "$dir/fp8-second.err")"
cmp -s "$dir/fp8-cold.jsonl" "$dir/fp8-second.jsonl" || fail "fp8 disk hits changed the output"
find "$dir/kv" -name '*.kv' -newer "$dir/fp8-cold.jsonl" -delete  # back to the BF16 objects

# Flip one payload byte of every object. A lookup stops at its prompt's first bad block: run 3
# rejects the two first blocks, recomputes and rewrites them; run 4 reaches the third, rejects
# and rewrites it; run 5 hits everything. Every run's output is the cold one.
for f in $(find "$dir/kv" -name '*.kv'); do
  python3 - "$f" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[-7] ^= 0x40; open(p, "wb").write(bytes(b))
PY
done
gen --kv-disk "$dir/kv" > "$dir/third.jsonl" 2> "$dir/third.err"
grep -q "kv-disk: 0 hits, 0 misses, rejected: checksum 2, 2 written" "$dir/third.err" ||
  fail "corrupted run: $(grep kv-disk "$dir/third.err")"
gen --kv-disk "$dir/kv" > "$dir/fourth.jsonl" 2> "$dir/fourth.err"
grep -q "kv-disk: 2 hits, 0 misses, rejected: checksum 1, 1 written" "$dir/fourth.err" ||
  fail "run 4: $(grep kv-disk "$dir/fourth.err")"
gen --kv-disk "$dir/kv" > "$dir/fifth.jsonl" 2> "$dir/fifth.err"
grep -q "kv-disk: 3 hits, 0 misses, rejected: none, 0 written" "$dir/fifth.err" ||
  fail "run 5: $(grep kv-disk "$dir/fifth.err")"
for r in third fourth fifth; do
  cmp -s "$dir/cold.jsonl" "$dir/$r.jsonl" || fail "corrupt objects changed the output ($r)"
done

# Every other way an object goes bad, at the process level: each case spoils every object of a
# copy of the good directory; both prompts' first lookups are rejected for the case's reason,
# the output is the cold one, and the spoiled objects that were looked up are rewritten.
"$bin" make-model --preset tiny --out "$dir/m2" --set vocab_size=2000 --set num_hidden_layers=2 \
  --seed 1 2>/dev/null  # another model, same architecture: identical headers, other weights
"$bin" generate --model "$dir/m2" --prompt-ids "$p1" --prompt-ids "$p2" --max-tokens 8 \
  --ignore-eos --kv-disk "$dir/kv-m2" > /dev/null 2>&1
mkdir -p "$dir/kv-good"
gen --kv-disk "$dir/kv-good" > /dev/null 2>&1
for case in truncated:short zero-length:short old-version:version other-model:fingerprint \
  renamed:identity; do
  name=${case%%:*} why=${case##*:}
  rm -rf "$dir/kv-case" && cp -r "$dir/kv-good" "$dir/kv-case"
  python3 - "$name" "$dir/kv-case" "$dir/kv-m2" <<'PY'
import glob, os, shutil, sys
name, case, other = sys.argv[1:]
objs = sorted(glob.glob(case + "/*/*.kv"))
foreign = sorted(glob.glob(other + "/*/*.kv"))
assert len(objs) == 3 and len(foreign) == 3, (objs, foreign)
blobs = [open(p, "rb").read() for p in objs]
for i, p in enumerate(objs):
    b = bytearray(blobs[i])
    if name == "truncated": b = b[:-100]
    elif name == "zero-length": b = b""
    elif name == "old-version": b[4] = 0
    elif name == "other-model": b = open(foreign[i], "rb").read()  # its header, this name
    elif name == "renamed": b = blobs[(i + 1) % len(objs)]  # a valid object, another's name
    open(p, "wb").write(bytes(b))
PY
  gen --kv-disk "$dir/kv-case" > "$dir/case-$name.jsonl" 2> "$dir/case-$name.err"
  grep -q "kv-disk: 0 hits, 0 misses, rejected: $why 2, 2 written" "$dir/case-$name.err" ||
    fail "$name: $(grep kv-disk "$dir/case-$name.err")"
  cmp -s "$dir/cold.jsonl" "$dir/case-$name.jsonl" || fail "$name changed the output"
done

# Two processes on one directory at once: both writing it (rounds 1, 3), then both reading it
# (rounds 2, 4). No torn read (no rejection) and the cold output every time.
for round in 1 2 3 4; do
  gen --kv-disk "$dir/kv-shared" > "$dir/a$round.jsonl" 2> "$dir/a$round.err" &
  a=$!
  gen --kv-disk "$dir/kv-shared" > "$dir/b$round.jsonl" 2> "$dir/b$round.err"
  wait "$a"
  for r in a b; do
    cmp -s "$dir/cold.jsonl" "$dir/$r$round.jsonl" || fail "concurrent run $r$round changed the output"
    grep -q "rejected: none" "$dir/$r$round.err" || fail "concurrent $r$round: $(grep kv-disk "$dir/$r$round.err")"
  done
  if [ $((round % 2)) -eq 0 ]; then rm -rf "$dir/kv-shared"; fi  # odd rounds write, even read
done

# serve: a restarted server finds the prompt on disk on its first request.
ask() {
  curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"m\",\"prompt\":[$p2],\"max_tokens\":4,\"temperature\":0,\"logprobs\":2}"
}
for run in 1 2; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin" serve --model "$dir/m" --tokenizer assets/tokenizer/deepseek-v3 --port "$port" --kv-disk "$dir/kv-serve" > "$dir/serve$run.log" 2>&1 &
  server=$!
  for _ in $(seq 1 150); do curl -s "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.1; done
  curl -s "http://127.0.0.1:$port/health" > /dev/null || fail "server $run: $(cat "$dir/serve$run.log")"
  ask "$port" > "$dir/resp$run.json"
  curl -s "http://127.0.0.1:$port/metrics" > "$dir/metrics$run.txt"
  kill -TERM "$server"
  wait "$server" || true
  server=""
done
python3 - "$dir/resp1.json" "$dir/resp2.json" <<'PY' || fail "serve restart"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, a["usage"]
assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 128, b["usage"]
assert b["usage"]["prompt_cache_hit_tokens"] == 128, b["usage"]
assert b["usage"]["prompt_cache_miss_tokens"] == b["usage"]["prompt_tokens"] - 128, b["usage"]
assert a["choices"][0]["text"] == b["choices"][0]["text"]
assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]
PY
# /metrics: the first server wrote the prompt's two blocks, the restarted one read them.
grep -q '^moeserve_kv_disk_miss_blocks_total 1$' "$dir/metrics1.txt" || fail "metrics 1"
grep -q '^moeserve_kv_disk_hit_blocks_total 2$' "$dir/metrics2.txt" ||
  fail "metrics 2: $(grep kv_disk "$dir/metrics2.txt")"
[ "$(grep -c '^moeserve_kv_disk_rejected_total{reason="[a-z]*"} 0$' "$dir/metrics2.txt")" = 7 ] ||
  fail "metrics 2 rejected: $(grep kv_disk_rejected "$dir/metrics2.txt")"
grep -q '^moeserve_prefix_cache_disk_hits_total 128$' "$dir/metrics2.txt" || fail "metrics 2 disk hit tokens"
echo "kv_disk: ok"

