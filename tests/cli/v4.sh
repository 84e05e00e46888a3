#!/usr/bin/env bash
# DeepSeek-V4 through the engine (docs/deepseek-v4.md), on the fixture checkpoint in DeepSeek's
# published format (tests/data/v4/tiny, tools/gen_v4_fixture.py):
#   - generate on the reference path with the F32 cache: transformers' deepseek_v4 greedy tokens
#     and top-5 logprobs within 2e-3 (the engine's scheduler chunks the prompt);
#   - the BF16 cache: a batch gives each prompt what it gets alone, and the disk tier (a second
#     process reading the prompt's blocks, compressor state included) gives the same bits; so do
#     a window pool of 6 pages, alone and loading from the disk tier;
#   - the fast path: a batch gives each prompt what it gets alone, so do the starts that write
#     and map the weight cache, with the published formats and requantized (INT8 projections and
#     experts, INT4 head); --expert-dtype fp8 is refused by name;
#   - MTP speculative decoding with V4's module gives the plain runs' output on both paths;
#   - make-model's v4-tiny (DeepSeek's format at tiny widths, the real vocabulary) runs from text;
#   - EP: 2 and 4 ranks, each loading its share of the routed experts, give the one-process
#     run's bits with F32 dispatch on both paths (MTP too); FP8 dispatch runs; so does online
#     EPLB, moving FP4 experts between ranks while generating;
#   - the FP8 KV cache (V4's 583-byte entries): batch = alone, the disk tier the same bits;
#   - serve with an 8-page window pool resumes a prompt after an earlier one's blocks (cached
#     pages) and answers as a fresh server;
#   - under EP (2 ranks, F32 dispatch), serve with DP attention, and PD with 2-rank prefill and
#     decode units, answer concurrent completions as one server does;
#   - PD: a router with a prefill and a decode unit gives one server's output on prompts whose
#     hand-off carries whole and unfinished 128-token groups (the blocks' compressor state).
set -euo pipefail
bin=$(readlink -f "$1")
source tests/serve_lib.sh  # $dir, fail, free_port, wait_health, wait_units, $pids killed at exit
model=tests/data/v4/tiny
fixture=$model/expected.json
p1=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][0]["prompt_ids"])))' "$fixture")
p2=$(python3 -c 'import sys; print(",".join(reversed(sys.argv[1].split(",")[:150])))' "$p1")
gen() {  # OUT ARGS...: greedy JSON with top-5 logprobs, 12 tokens, reference path ($compute)
  local out=$1
  shift
  "$bin" generate --model "$model" --max-tokens 12 --json --logprobs 5 --ignore-eos --threads 1 \
    --compute "${compute:-reference}" "$@" > "$out" 2> "$out.err" || { cat "$out.err" >&2; fail "generate $*"; }
}
gen "$dir/f32.jsonl" --prompt-ids "$p1" --kv-cache-dtype f32
python3 - "$fixture" "$dir/f32.jsonl" <<'PY' || fail "the reference path against transformers' deepseek_v4"
import json, sys
want = json.load(open(sys.argv[1]))["prompts"][0]
got = json.loads(open(sys.argv[2]).readline())
assert got["tokens"] == want["tokens"], (got["tokens"], want["tokens"])
worst = 0
for a, b in zip(want["top_logprobs"], got["top_logprobs"]):
    ours = {x["id"]: x["logprob"] for x in b}
    for x in a:
        assert x["id"] in ours, (x, b)
        worst = max(worst, abs(ours[x["id"]] - x["logprob"]))
assert worst <= 2e-3, worst
print(f"v4: transformers' deepseek_v4, 300-token prompt x 12 tokens: tokens equal, "
      f"max |dlogprob| {worst:.2e}")
PY
gen "$dir/batch.jsonl" --prompt-ids "$p1" --prompt-ids "$p2"
gen "$dir/alone.jsonl" --prompt-ids "$p2"
sed -n 2p "$dir/batch.jsonl" | cmp -s - "$dir/alone.jsonl" || fail "batch != alone"
for i in 1 2; do
  gen "$dir/disk$i.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --kv-disk "$dir/kvdisk"
done
grep -q 'kv-disk: [1-9][0-9]* hits' "$dir/disk2.jsonl.err" || fail "no disk hits: $(cat "$dir/disk2.jsonl.err")"
cmp -s "$dir/disk1.jsonl" "$dir/disk2.jsonl" || fail "the disk tier changed the output"
cmp -s "$dir/disk1.jsonl" "$dir/batch.jsonl" || fail "the disk tier run differs from the plain run"
# The window pool (docs/kv-cache.md "The window pool") at 6 pages (this model's window is 16: one
# block before a boundary; chunks of at most 256 tokens),
# pages let go of behind the window (and sequences preempted when the two need more); then a
# second process loading the first's blocks from the disk tier, pages only for the blocks before
# its end.
gen "$dir/wpool.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --kv-window-blocks 6
cmp -s "$dir/wpool.jsonl" "$dir/batch.jsonl" || fail "a window pool of 6 pages changed the output"
for i in 1 2; do
  gen "$dir/wdisk$i.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --kv-window-blocks 6 --kv-disk "$dir/kvdisk-w"
done
grep -q 'kv-disk: [1-9][0-9]* hits' "$dir/wdisk2.jsonl.err" || fail "no disk hits with the window pool"
cmp -s "$dir/wdisk2.jsonl" "$dir/batch.jsonl" || fail "the disk tier with the window pool changed the output"
if "$bin" generate --model "$model" --prompt-ids "$p1" --max-tokens 1 --kv-window-blocks 2 \
  > "$dir/w3.out" 2>&1; then
  fail "a window pool of 2 pages was taken"
fi
grep -q "window pool of 2 pages is too small" "$dir/w3.out" || fail "no clear refusal: $(cat "$dir/w3.out")"
# The fast path (the default: FP8 projections through gemm_fp8, FP4 experts through gemm_fp4):
# a batch gives each prompt what it gets alone.
compute=fast gen "$dir/fbatch.jsonl" --prompt-ids "$p1" --prompt-ids "$p2"
compute=fast gen "$dir/falone.jsonl" --prompt-ids "$p2"
sed -n 2p "$dir/fbatch.jsonl" | cmp -s - "$dir/falone.jsonl" || fail "fast path: batch != alone"
for i in 1 2; do  # the weight cache: written by the first start, mapped by the second
  compute=fast gen "$dir/fcache$i.jsonl" --prompt-ids "$p2" --weight-cache "$dir/wcache"
  cmp -s "$dir/fcache$i.jsonl" "$dir/falone.jsonl" || fail "fast path: the weight cache ($i) changed the output"
done
ls "$dir"/wcache/*.weights > /dev/null || fail "no weight cache file"
cmp -s "$dir/fbatch.jsonl" "$dir/batch.jsonl" && fail "the fast path gave the reference path's bits"
# The requantizing options (docs/deepseek-v4.md "Requantized weights"), INT8 projections and
# experts with an INT4 head: a batch gives each prompt what it gets alone, the weight cache keeps
# them in a file of their own and gives the same bits; FP8 experts are refused by name.
q=(--projection-dtype int8 --expert-dtype int8 --lm-head-dtype int4)
compute=fast gen "$dir/qbatch.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" "${q[@]}"
compute=fast gen "$dir/qalone.jsonl" --prompt-ids "$p2" "${q[@]}" --weight-cache "$dir/wcache"
sed -n 2p "$dir/qbatch.jsonl" | cmp -s - "$dir/qalone.jsonl" || fail "requantized: batch != alone"
compute=fast gen "$dir/qcache.jsonl" --prompt-ids "$p2" "${q[@]}" --weight-cache "$dir/wcache"
cmp -s "$dir/qcache.jsonl" "$dir/qalone.jsonl" || fail "requantized: the weight cache changed the output"
[ "$(ls "$dir"/wcache/*.weights | wc -l)" -eq 2 ] || fail "the requantized weights share the published ones' cache file"
cmp -s "$dir/qalone.jsonl" "$dir/falone.jsonl" && fail "the requantizing options changed nothing"
if "$bin" generate --model "$model" --prompt-ids 1,2,3 --max-tokens 1 --expert-dtype fp8 \
  > "$dir/fp8e.out" 2>&1; then
  fail "--expert-dtype fp8 ran V4"
fi
grep -q -- "--expert-dtype fp8: DeepSeek-V4's routed experts are FP4" "$dir/fp8e.out" || fail "no clear refusal: $(cat "$dir/fp8e.out")"
# MTP speculative decoding with V4's module, three drafts a step: the tokens and top-5 logprobs
# of the runs without it, on both paths (the fixture's random module's drafts are rejected, so
# every verify step puts the compressors' state back; model_test covers accepted drafts).
gen "$dir/mtp.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --speculative mtp \
  --num-draft-tokens 3 --speculative-max-rows 0
compute=fast gen "$dir/fmtp.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --speculative mtp \
  --num-draft-tokens 3 --speculative-max-rows 0
python3 - "$dir/batch.jsonl" "$dir/mtp.jsonl" "$dir/fbatch.jsonl" "$dir/fmtp.jsonl" <<'PY' || fail "MTP changed the output"
import json, sys
for plain, spec in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
    a = [json.loads(l) for l in open(plain)]
    b = [json.loads(l) for l in open(spec)]
    assert len(a) == 2 and len(b) == 3 and "speculative" in b[2], (len(a), len(b))  # its stats
    b = b[:2]
    for x, y in zip(a, b):
        assert x["tokens"] == y["tokens"] and x["top_logprobs"] == y["top_logprobs"], (plain, spec)
        assert y["draft_tokens"] > 0, y
print("v4: MTP (3 drafts a step) gives the plain runs' tokens and logprobs on both paths")
PY
"$bin" make-model --preset v4-tiny --set num_hidden_layers=3 --set 'compress_ratios=[128,4,0,0]' \
  --out "$dir/v4t" > /dev/null 2>&1 || fail "make-model v4-tiny"
"$bin" generate --model "$dir/v4t" --prompt "def fibonacci(n):" --max-tokens 4 --compute reference \
  --json --threads 1 > "$dir/v4t.json" 2> "$dir/v4t.err" || { cat "$dir/v4t.err" >&2; fail "generate v4-tiny"; }
python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read()); assert len(d["tokens"]) == 4, d' \
  "$dir/v4t.json" || fail "v4-tiny generated no tokens"
# EP (docs/deepseek-v4.md "Expert parallelism"): each rank loads the routed experts placement
# gives it and runs the batch; every MoE layer dispatches and combines. With F32 dispatch the
# combine sums a row's experts in expert order, as the one-process MoE does: the same bits.
mpirun="mpirun --allow-run-as-root --oversubscribe"
for c in reference fast; do
  kv=bf16
  [[ $c == reference ]] && kv=f32
  compute=$c gen "$dir/ep1_$c.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --kv-cache-dtype $kv
  for np in 2 4; do
    $mpirun -np $np "$bin" generate --model "$model" --max-tokens 12 --json --logprobs 5 --ignore-eos \
      --threads 1 --compute $c --kv-cache-dtype $kv --dispatch-dtype f32 --prompt-ids "$p1" \
      --prompt-ids "$p2" > "$dir/ep${np}_$c.jsonl" 2> "$dir/ep.err" || { cat "$dir/ep.err" >&2; fail "EP R=$np $c"; }
    cmp -s "$dir/ep1_$c.jsonl" "$dir/ep${np}_$c.jsonl" || fail "EP R=$np ($c, F32 dispatch) != one process"
  done
done
$mpirun -np 2 "$bin" generate --model "$model" --max-tokens 12 --json --logprobs 5 --ignore-eos \
  --threads 1 --compute fast --dispatch-dtype f32 --speculative mtp --num-draft-tokens 2 \
  --prompt-ids "$p1" --prompt-ids "$p2" > "$dir/epm.jsonl" 2> "$dir/ep.err" || { cat "$dir/ep.err" >&2; fail "EP MTP"; }
$mpirun -np 2 "$bin" generate --model "$model" --max-tokens 12 --json --logprobs 5 --ignore-eos \
  --threads 1 --dispatch-dtype fp8 --prompt-ids "$p1" --prompt-ids "$p2" > "$dir/ep8.jsonl" \
  2> "$dir/ep.err" || { cat "$dir/ep.err" >&2; fail "EP FP8 dispatch"; }
python3 - "$dir/ep1_fast.jsonl" "$dir/epm.jsonl" "$dir/ep8.jsonl" <<'PY' || fail "EP with MTP or FP8 dispatch"
import json, sys
plain, mtp, fp8 = ([json.loads(l) for l in open(p) if '"tokens"' in l] for p in sys.argv[1:])
assert len(plain) == len(mtp) == len(fp8) == 2
for a, b in zip(plain, mtp):
    assert a["tokens"] == b["tokens"] and a["top_logprobs"] == b["top_logprobs"], (a, b)
    assert b["draft_tokens"] > 0, b
worst = 0
for a, b in zip(plain, fp8):
    assert len(b["tokens"]) == 12, b
    ours = {x["id"]: x["logprob"] for x in b["top_logprobs"][0]}
    worst = max([worst] + [abs(ours[x["id"]] - x["logprob"]) for x in a["top_logprobs"][0] if x["id"] in ours])
print(f"v4: EP R = 2 and 4 (F32 dispatch) = one process on both paths, MTP too; FP8 dispatch: "
      f"first token's top-5 within {worst:.2e} of one process")
PY
# Online EPLB: re-planned every 2 steps, the FP4 experts moved between ranks 64 KiB a step in
# the wire format (UE8M0 scales as F32) and packed on arrival: the one-process bits, and the
# placement changed with experts moved.
for run in "fast 4" "reference 2"; do
  set -- $run
  kv=bf16
  [[ $1 == reference ]] && kv=f32
  $mpirun -np $2 "$bin" generate --model "$model" --max-tokens 12 --json --logprobs 5 --ignore-eos \
    --threads 1 --compute $1 --kv-cache-dtype $kv --dispatch-dtype f32 --prompt-ids "$p1" \
    --prompt-ids "$p2" --eplb-interval 2 --redundant-experts 4 --eplb-migrate-mb 0.0625 \
    > "$dir/eplb_$1.jsonl" 2> "$dir/ep.err" || { cat "$dir/ep.err" >&2; fail "online EPLB R=$2 $1"; }
  grep -Eq "eplb: new placement after step [0-9]+ \(planned after step [0-9]+\): [1-9][0-9]* experts moved" \
    "$dir/ep.err" || fail "online EPLB R=$2 $1: no migration: $(cat "$dir/ep.err")"
  cmp -s "$dir/ep1_$1.jsonl" "$dir/eplb_$1.jsonl" || fail "online EPLB R=$2 ($1) != one process"
done

# The FP8 KV cache (model.py's rounding: 448 e4m3 values, 7 UE8M0 scales per 64, the RoPE values
# in BF16): a batch gives each prompt what it gets alone, the disk tier the same bits; a head
# whose non-RoPE part is not whole 64-value tiles is refused by name.
"$bin" make-model --preset v4-tiny --set num_hidden_layers=3 --set 'compress_ratios=[128,4,0,0]' \
  --set head_dim=96 --out "$dir/v4f" > /dev/null 2>&1 || fail "make-model v4-tiny head_dim 96"
fp8gen() {  # OUT ARGS...
  local out=$1
  shift
  "$bin" generate --model "$dir/v4f" --max-tokens 6 --json --logprobs 2 --ignore-eos --threads 1 \
    --compute fast --kv-cache-dtype fp8 "$@" > "$out" 2> "$out.err" || { cat "$out.err" >&2; fail "fp8 $*"; }
}
fp8gen "$dir/fp8batch.jsonl" --prompt-ids "$p1" --prompt-ids "$p2"
fp8gen "$dir/fp8alone.jsonl" --prompt-ids "$p2"
sed -n 2p "$dir/fp8batch.jsonl" | cmp -s - "$dir/fp8alone.jsonl" || fail "FP8 KV: batch != alone"
for i in 1 2; do
  fp8gen "$dir/fp8disk$i.jsonl" --prompt-ids "$p1" --prompt-ids "$p2" --kv-disk "$dir/kvdisk8"
done
grep -q 'kv-disk: [1-9][0-9]* hits' "$dir/fp8disk2.jsonl.err" || fail "FP8 KV: no disk hits"
cmp -s "$dir/fp8disk2.jsonl" "$dir/fp8batch.jsonl" || fail "FP8 KV: the disk tier changed the output"
if "$bin" generate --model "$model" --prompt-ids 1,2,3 --max-tokens 1 --kv-cache-dtype fp8 \
  > "$dir/fp8.out" 2>&1; then
  fail "an FP8 KV cache ran a head of 24 non-RoPE values"
fi
grep -q "multiple of 64" "$dir/fp8.out" || fail "no clear FP8 refusal: $(cat "$dir/fp8.out")"

# A second request through serve with a window pool of 8 pages: the first's blocks stay
# registered with the pages of its last ones cached, so a prompt that starts with the first's
# resumes after them (prefix hits in /metrics) and answers as a fresh server does.
wport=$(free_port) fport=$(free_port)
# (make-model's v4-tiny above: it has a tokenizer, and a 128-token window, two blocks before a
# boundary.)
"$bin" serve --model "$dir/v4t" --threads 1 --compute reference --kv-window-blocks 8 \
  --host 127.0.0.1 --port "$wport" > "$dir/wserve.log" 2>&1 &
pid=$!
wait_health "$wport"
pids+=("$pid")
"$bin" serve --model "$dir/v4t" --threads 1 --compute reference --host 127.0.0.1 --port "$fport" \
  > "$dir/fserve.log" 2>&1 &
pid=$!
wait_health "$fport"
pids+=("$pid")
pid=
python3 - "$wport" "$fport" "$p1" "$p2" <<'PY' || fail "a second turn over cached window pages"
import json, sys, urllib.request
wport, fport, p1, p2 = sys.argv[1:]
def ask(port, ids, n=8):
    body = {"prompt": ids, "max_tokens": n, "temperature": 0, "logprobs": 5, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
def hits(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return next(float(l.split()[-1]) for l in text.splitlines()
                if l.startswith("moeserve_prefix_cache_hits_total"))
first = [int(x) for x in p1.split(",")]
ask(wport, first)
second = first + [int(x) for x in p2.split(",")][:40]  # (a new turn after the first's blocks)
before = hits(wport)
b = ask(wport, second)
assert hits(wport) - before >= 256, (before, hits(wport))
metrics = urllib.request.urlopen(f"http://127.0.0.1:{wport}/metrics", timeout=30).read().decode()
assert "moeserve_kv_window_pages_total 8" in metrics, metrics
c = ask(fport, second)
assert b["text"] == c["text"], (b["text"], c["text"])
assert b["logprobs"]["token_logprobs"] == c["logprobs"]["token_logprobs"]
assert b["logprobs"]["top_logprobs"] == c["logprobs"]["top_logprobs"]
print(f"v4: a second turn resumed {int(hits(wport) - before)} tokens from cached window pages, "
      "answering as a fresh server")
PY

# Under EP (docs/deepseek-v4.md "Expert parallelism"): serve with DP attention over 2 ranks, each
# holding half the routed experts, and PD whose prefill and decode units are each 2 ranks (F32
# dispatch): concurrent completions give the one-process server's bits.
eport=$(free_port) router=$(free_port) pport=$(free_port) dport=$(free_port)
ep_serve=(serve --model "$dir/v4t" --threads 1 --compute reference --dispatch-dtype f32
          --kv-cache-gb 0.2 --host 127.0.0.1)
$mpirun -np 2 "$bin" "${ep_serve[@]}" --port "$eport" > "$dir/epserve.log" 2>&1 &
pids+=($!)
"$bin" router --model "$dir/v4t" --host 127.0.0.1 --port "$router" > "$dir/eprouter.log" 2>&1 &
pids+=($!)
$mpirun -np 2 "$bin" "${ep_serve[@]}" --port "$pport" --role prefill \
  --router "http://127.0.0.1:$router" > "$dir/epprefill.log" 2>&1 &
pids+=($!)
$mpirun -np 2 "$bin" "${ep_serve[@]}" --port "$dport" --role decode \
  --router "http://127.0.0.1:$router" > "$dir/epdecode.log" 2>&1 &
pids+=($!)
wait_health "$eport"
wait_health "$router"
wait_units "$router" 2
python3 - "$eport" "$router" "$fport" "$p1" <<'PY' || fail "V4 under EP (serve, PD) != one server"
import json, sys, threading, urllib.request
eport, rport, fport = sys.argv[1:4]
p1 = [int(x) for x in sys.argv[4].split(",")]
def ask(port, ids):
    body = {"prompt": ids, "max_tokens": 8, "temperature": 0, "logprobs": 5, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    c = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"]
prompts = [p1[:300], p1[:150][::-1], p1[20:90], p1[5:200]]
for port in (eport, rport):
    got = [None] * len(prompts)
    def go(i):
        got[i] = ask(port, prompts[i])
    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in ts: t.start()
    for t in ts: t.join()
    for i, p in enumerate(prompts):
        assert got[i] is not None and got[i] == ask(fport, p), (port, i)
print("v4: serve under EP (2 ranks) and PD with 2-rank units = one server")
PY

# PD: a router, a prefill and a decode unit (serve --compute reference) against one serve, on
# 300- and 150-token prompts: 128-token groups whole and unfinished in the hand-off.
pd_beside_one "$dir/v4t" --threads 1 --kv-cache-gb 0.2 --compute reference
pd_equals_one "$p1" "$p2"
echo "v4: PD (router, prefill and decode unit) = one server"
echo "v4: batch == alone, the disk tier's blocks give the same bits, the fast path batch == alone (published and requantized formats), --expert-dtype fp8 refused by name, make-model v4-tiny runs"
