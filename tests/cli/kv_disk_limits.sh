#!/usr/bin/env bash
# The KV disk tier at its limits, with real processes and real file systems (tests/cli/kv_disk.sh
# covers hits, corruption and restarts):
#   (a) ENOSPC: a tiny tmpfs as --kv-disk. `generate` and a `serve` with several requests keep
#       going with the cold output (tokens and logprobs), say "writes turned off" exactly once,
#       leave no temp file, and what they did write is read back by the next process.
#   (b) a read-only DIR (a read-only bind mount: root ignores file modes): a new process gets
#       disk hits with the cold output and says "writes turned off" once only when it had
#       something new to write; a read-only empty DIR works too; a restarted server reads it.
#   (c) --kv-disk-gb under churn: three processes at once, several rounds, one small budget:
#       cold output, no rejection, the directory ends within the budget.
# Mounts are made in a private mount namespace (unshare --mount), so they vanish with the test.
# Exits 77 (ctest: skipped) where unshare or mount is not permitted (not root, no CAP_SYS_ADMIN).
set -euo pipefail
bin=$(realpath "$1")

if [ -z "${KV_DISK_LIMITS_NS:-}" ]; then
  probe() {
    unshare --mount --propagation private sh -c \
      'd=$(mktemp -d) && mount -t tmpfs -o size=64k kvprobe "$d" && mount -o remount,ro "$d" &&
       umount "$d" && rmdir "$d"' 2>&1
  }
  if ! command -v unshare > /dev/null || ! why=$(probe); then
    echo "SKIP: kv_disk_limits needs a private mount namespace with tmpfs and read-only mounts" \
      "(unshare --mount; root or CAP_SYS_ADMIN): ${why:-unshare not found}"
    exit 77
  fi
  KV_DISK_LIMITS_NS=1 exec unshare --mount --propagation private bash "$0" "$bin"
fi

dir=$(mktemp -d)
server=""
cleanup() {
  if [ -n "$server" ]; then kill -9 "$server" 2>/dev/null || true; fi
  for m in "$dir"/mnt/*; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$dir/mnt"
tmpfs() {  # tmpfs NAME SIZE: a fresh tmpfs at $dir/mnt/NAME
  mkdir -p "$dir/mnt/$1"
  mount -t tmpfs -o "size=$2,mode=0755" "kvtest-$1" "$dir/mnt/$1"
}
ro_bind() {  # ro_bind SRC NAME: SRC read-only at $dir/mnt/NAME
  mkdir -p "$dir/mnt/$2"
  mount --bind "$1" "$dir/mnt/$2"
  mount -o remount,bind,ro "$dir/mnt/$2"
}
objects() { find "$1" -name '*.kv' | wc -l; }
temps() { find "$1" -name '*.tmp.*' | wc -l; }
off_said() { grep -c "kv-disk: writes turned off, reads go on" "$1" || true; }
disk_line() { grep "^kv-disk: " "$1" || echo "(no kv-disk line) $(tail -3 "$1")"; }

"$bin" make-model --preset tiny --out "$dir/m" --set vocab_size=2000 --set num_hidden_layers=2 2>/dev/null
# One object of this model is 37,176 bytes (10 tmpfs pages): a 128 KiB tmpfs holds 3 of them.
p1=$(seq -s, 1 3 300)    # 100 tokens: one full block
p2=$(seq -s, 7 11 1500)  # 136 tokens: two
p3=$(seq -s, 2 5 1999)   # 400 tokens: six
p4=$(seq -s, 1990 -7 5)  # 284 tokens: four
gen() {  # gen OUT ERR [args]: prompts p1 p2 p3 p4
  local out=$1 err=$2
  shift 2
  "$bin" generate --model "$dir/m" --prompt-ids "$p1" --prompt-ids "$p2" --prompt-ids "$p3" \
    --prompt-ids "$p4" --max-tokens 8 --logprobs 3 --json --ignore-eos "$@" > "$out" 2> "$err" ||
    fail "generate $*: $(tail -5 "$err")"
}
gen12() {  # p1 p2 only: no block beyond kv_disk.sh's first three
  local out=$1 err=$2
  shift 2
  "$bin" generate --model "$dir/m" --prompt-ids "$p1" --prompt-ids "$p2" --max-tokens 8 \
    --logprobs 3 --json --ignore-eos "$@" > "$out" 2> "$err" || fail "generate $*: $(tail -5 "$err")"
}
gen "$dir/cold.jsonl" "$dir/cold.err"
gen12 "$dir/cold12.jsonl" "$dir/cold12.err"

# ---- (a) ENOSPC, generate: 13 blocks to write, room for 3.
tmpfs full 128k
gen "$dir/full1.jsonl" "$dir/full1.err" --kv-disk "$dir/mnt/full"
cmp -s "$dir/cold.jsonl" "$dir/full1.jsonl" || fail "ENOSPC changed generate's output"
[ "$(off_said "$dir/full1.err")" = 1 ] || fail "ENOSPC not said exactly once: $(cat "$dir/full1.err")"
grep -q "writes turned off, reads go on: .*No space left on device" "$dir/full1.err" ||
  fail "ENOSPC message: $(grep writes "$dir/full1.err")"
n=$(objects "$dir/mnt/full")
[ "$n" -ge 1 ] && [ "$n" -lt 13 ] || fail "ENOSPC: $n objects on a tmpfs with room for 3"
[ "$(temps "$dir/mnt/full")" = 0 ] || fail "ENOSPC left temp files: $(find "$dir/mnt/full")"
grep -q "^kv-disk: 0 hits, .* rejected: none, $n written, 0 dropped" "$dir/full1.err" ||
  fail "ENOSPC run 1: $(disk_line "$dir/full1.err") ($n objects)"
# The next process reads what fitted (each object is the head of a chain: blocks are written in
# order) and fails to write again: said once more, same output.
gen "$dir/full2.jsonl" "$dir/full2.err" --kv-disk "$dir/mnt/full"
cmp -s "$dir/cold.jsonl" "$dir/full2.jsonl" || fail "ENOSPC run 2 changed the output"
grep -q "^kv-disk: $n hits, .* rejected: none, 0 written" "$dir/full2.err" ||
  fail "ENOSPC run 2: $(disk_line "$dir/full2.err") ($n objects)"
[ "$(off_said "$dir/full2.err")" = 1 ] || fail "ENOSPC run 2: $(cat "$dir/full2.err")"

# ---- (a) ENOSPC, serve: four requests of four or more blocks each, one after the other.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=""
start() {  # start LOG [args]
  local log=$1
  shift
  port=$(free_port)
  "$bin" serve --model "$dir/m" --tokenizer assets/tokenizer/deepseek-v3 --port "$port" "$@" \
    > "$log" 2>&1 &
  server=$!
  for _ in $(seq 1 150); do curl -s "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.1; done
  curl -s "http://127.0.0.1:$port/health" > /dev/null || fail "server: $(cat "$log")"
}
stop() {
  kill -TERM "$server"
  wait "$server" || true
  server=""
}
ask() {  # ask OUT PROMPT_IDS
  curl -s -f "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"m\",\"prompt\":[$2],\"max_tokens\":4,\"temperature\":0,\"logprobs\":2}" \
    > "$1" || fail "request $1 failed (HTTP error or no server)"
}
serve_all() {  # serve_all TAG [args]: every prompt, then p1 again
  local tag=$1
  shift
  start "$dir/$tag.log" "$@"
  ask "$dir/$tag.r3.json" "$p3"
  ask "$dir/$tag.r4.json" "$p4"
  ask "$dir/$tag.r2.json" "$p2"
  ask "$dir/$tag.r1.json" "$p1"
  ask "$dir/$tag.r3b.json" "$p3"
  curl -s "http://127.0.0.1:$port/metrics" > "$dir/$tag.metrics"
  stop
}
same_as_cold() {  # same_as_cold TAG: text and logprobs of every response equal the cold server's
  python3 - "$dir" "$1" <<'PY' || fail "serve $1: output differs from the cold server"
import json, sys
d, tag = sys.argv[1:]
for r in ["r3", "r4", "r2", "r1", "r3b"]:
    a = json.load(open(f"{d}/cold.{r}.json"))["choices"][0]
    b = json.load(open(f"{d}/{tag}.{r}.json"))["choices"][0]
    assert a["text"] == b["text"] and a["logprobs"] == b["logprobs"], (tag, r)
PY
}
cached() {  # cached FILE: usage.prompt_tokens_details.cached_tokens
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens"])' "$1"
}
metric() { sed -n "s/^$1 //p" "$2"; }
serve_all cold
tmpfs sfull 128k
serve_all sfull1 --kv-disk "$dir/mnt/sfull"
same_as_cold sfull1
[ "$(off_said "$dir/sfull1.log")" = 1 ] || fail "serve ENOSPC not said exactly once: $(cat "$dir/sfull1.log")"
n=$(objects "$dir/mnt/sfull")
[ "$n" -ge 1 ] && [ "$n" -lt 6 ] || fail "serve ENOSPC: $n objects"
[ "$(temps "$dir/mnt/sfull")" = 0 ] || fail "serve ENOSPC left temp files"
[ "$(metric moeserve_kv_disk_written_total "$dir/sfull1.metrics")" = "$n" ] ||
  fail "serve ENOSPC: written $(metric moeserve_kv_disk_written_total "$dir/sfull1.metrics"), $n objects"
# A restarted server reads the first request's head blocks from the full tmpfs.
serve_all sfull2 --kv-disk "$dir/mnt/sfull"
same_as_cold sfull2
[ "$(cached "$dir/sfull2.r3.json")" = $((64 * n)) ] ||
  fail "serve ENOSPC restart: cached $(cached "$dir/sfull2.r3.json"), want $((64 * n))"
[ "$(metric moeserve_kv_disk_hit_blocks_total "$dir/sfull2.metrics")" = "$n" ] || fail "serve hits"
[ "$(off_said "$dir/sfull2.log")" = 1 ] || fail "serve ENOSPC restart: $(cat "$dir/sfull2.log")"

# ---- (b) read-only DIR holding kv_disk.sh's three objects (p1, p2).
gen12 "$dir/w.jsonl" "$dir/w.err" --kv-disk "$dir/kv-src"
grep -q "^kv-disk: 0 hits, .* 3 written" "$dir/w.err" || fail "writer: $(disk_line "$dir/w.err")"
ro_bind "$dir/kv-src" ro
touch "$dir/mnt/ro/probe" 2> /dev/null && fail "the bind mount is not read-only"
# Nothing new to write: hits, no write attempted, nothing said.
gen12 "$dir/ro1.jsonl" "$dir/ro1.err" --kv-disk "$dir/mnt/ro"
cmp -s "$dir/cold12.jsonl" "$dir/ro1.jsonl" || fail "read-only DIR changed the output"
grep -q "^kv-disk: 3 hits, 0 misses, rejected: none, 0 written" "$dir/ro1.err" ||
  fail "read-only run 1: $(disk_line "$dir/ro1.err")"
[ "$(off_said "$dir/ro1.err")" = 0 ] || fail "read-only run 1 said writes were off: nothing to write"
# New blocks too: the same hits, the cold output, and writes turned off once.
gen "$dir/ro2.jsonl" "$dir/ro2.err" --kv-disk "$dir/mnt/ro"
cmp -s "$dir/cold.jsonl" "$dir/ro2.jsonl" || fail "read-only DIR (new blocks) changed the output"
grep -q "^kv-disk: 3 hits, .* rejected: none, 0 written" "$dir/ro2.err" ||
  fail "read-only run 2: $(disk_line "$dir/ro2.err")"
[ "$(off_said "$dir/ro2.err")" = 1 ] || fail "read-only run 2: $(cat "$dir/ro2.err")"
# The message names the object (or its new 2-hex subdirectory) and the cause.
grep -Eq "writes turned off, reads go on: $dir/mnt/ro/.*Read-only file system" \
  "$dir/ro2.err" || fail "read-only message: $(grep writes "$dir/ro2.err")"
[ "$(objects "$dir/kv-src")" = 3 ] || fail "a read-only DIR changed"
# A restarted server on the read-only DIR: cached tokens on its first request, cold output.
start "$dir/ro-serve.log" --kv-disk "$dir/mnt/ro"
ask "$dir/ro-serve.r2.json" "$p2"
stop
[ "$(cached "$dir/ro-serve.r2.json")" = 128 ] || fail "read-only serve: cached $(cached "$dir/ro-serve.r2.json")"
python3 - "$dir/cold.r2.json" "$dir/ro-serve.r2.json" <<'PY' || fail "read-only serve output"
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:])
assert a["text"] == b["text"] and a["logprobs"] == b["logprobs"]
PY
# An empty read-only DIR: misses only, writes off once, cold output.
tmpfs empty 64k
mount -o remount,ro "$dir/mnt/empty"
gen "$dir/empty.jsonl" "$dir/empty.err" --kv-disk "$dir/mnt/empty"
cmp -s "$dir/cold.jsonl" "$dir/empty.jsonl" || fail "empty read-only DIR changed the output"
grep -q "^kv-disk: 0 hits, .* rejected: none, 0 written" "$dir/empty.err" ||
  fail "empty read-only: $(disk_line "$dir/empty.err")"
[ "$(off_said "$dir/empty.err")" = 1 ] || fail "empty read-only: $(cat "$dir/empty.err")"

# ---- (c) --kv-disk-gb 0.0003 (300 kB: 8 objects) under churn: 3 processes x 4 rounds, each
# writing up to 13 blocks (483 kB), prompt sets overlapping so that processes also read each
# other's objects while others trim them.
budget=300000
for round in 1 2 3 4; do
  pids=()
  for proc in a b c; do
    case $proc$((round % 2)) in
      a*) set -- "$p1" "$p2" "$p3" "$p4" ;;
      b1 | c0) set -- "$p4" "$p3" "$p2" "$p1" ;;
      *) set -- "$p3" "$p1" "$p4" "$p2" ;;
    esac
    "$bin" generate --model "$dir/m" --prompt-ids "$1" --prompt-ids "$2" --prompt-ids "$3" \
      --prompt-ids "$4" --max-tokens 8 --logprobs 3 --json --ignore-eos \
      --kv-disk "$dir/kv-churn" --kv-disk-gb 0.0003 \
      > "$dir/churn.$proc$round.jsonl" 2> "$dir/churn.$proc$round.err" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a churn process failed"; done
  for proc in a b c; do
    err="$dir/churn.$proc$round.err"
    grep -q "rejected: none" "$err" || fail "churn $proc$round: $(disk_line "$err")"
    [ "$(off_said "$err")" = 0 ] || fail "churn $proc$round turned writes off: $(cat "$err")"
    # The same prompts in another order: compare per prompt.
    python3 - "$dir/cold.jsonl" "$dir/churn.$proc$round.jsonl" <<'PY' || fail "churn $proc$round output"
import json, sys
key = lambda r: tuple(r["prompt_ids"])
a, b = ({key(r): r for r in map(json.loads, open(p))} for p in sys.argv[1:])
assert a == b
PY
  done
  total=$(find "$dir/kv-churn" -name '*.kv' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  [ "$total" -le "$budget" ] || fail "churn round $round: $total bytes on disk, budget $budget"
  [ "$(temps "$dir/kv-churn")" = 0 ] || fail "churn left temp files"
done
hits=$(cat "$dir"/churn.*.err | sed -n 's/^kv-disk: \([0-9]*\) hits.*/\1/p' | awk '{s += $1} END {print s + 0}')
[ "$hits" -gt 0 ] || fail "churn: no process ever read another's objects"
[ "$(objects "$dir/kv-churn")" -gt 0 ] || fail "churn: the budget removed everything"
echo "kv_disk_limits: ok (churn: $hits hits, $(objects "$dir/kv-churn") objects left, $total bytes)"
