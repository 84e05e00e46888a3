#!/usr/bin/env bash
# DeepSeek Sparse Attention (DeepSeek-V3.2, docs/dsa.md):
#   - against transformers' DeepseekV32ForCausalLM (tests/data/dsa/v32, tools/gen_dsa_fixture.sh)
#     on a make-model v32-tiny checkpoint whose top-k (16) is below the prompts' lengths (40, 70):
#     with the F32 cache (index keys in F32, transformers' arithmetic) the same greedy tokens and
#     top-5 logprobs within 2e-3;
#   - with a top-k above the context, DSA is dense MLA: the same bits as the V3 model of the same
#     weights, F32 and BF16 caches; with top-k 16 it is not;
#   - DeepSeek's FP8 indexer (BF16 and FP8 caches): a batch gives each prompt what it gets alone;
#     the disk tier (a second process), an EP group of 2 ranks, MTP drafts, and a router with a
#     prefill and a decode unit give one process's output (index keys travel in the blocks);
#   - the fast path: dense bits when the top-k covers the context, batch == alone with chunked
#     prefill; its distance to the reference path is printed (not bounded: on random weights
#     the top-k flips at index-score near-ties, docs/dsa.md).
set -euo pipefail
bin=$(readlink -f "$1")
source tests/serve_lib.sh  # $dir, fail, free_port, wait_health, $pids killed at exit
fixture=tests/data/dsa/v32/expected.json

mapfile -t mm < <(python3 -c 'import json,sys; [print(a) for a in json.load(open(sys.argv[1]))["make_model"]]' "$fixture")
"$bin" make-model "${mm[@]}" --out "$dir/v32" > /dev/null 2>&1
python3 - "$fixture" "$dir/v32" <<'PY' || fail "make-model no longer writes the fixture's checkpoint (tools/gen_dsa_fixture.sh remakes the fixture)"
import hashlib, json, os, sys
want = json.load(open(sys.argv[1]))["sha256"]
got = {f: hashlib.sha256(open(os.path.join(sys.argv[2], f), "rb").read()).hexdigest()
       for f in sorted(os.listdir(sys.argv[2]))}
assert got == want, (got, want)
PY
prompts=()
while read -r p; do prompts+=(--prompt-ids "$p"); done < <(python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]: print(",".join(map(str, p["prompt_ids"])))' "$fixture")
steps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' "$fixture")
gen() {  # OUT MODEL ARGS...: greedy JSON with top-5 logprobs, one thread
  local out=$1 model=$2
  shift 2
  "$bin" generate --model "$model" --max-tokens "$steps" --json --logprobs 5 --ignore-eos \
    --threads 1 "$@" > "$out" 2> "$out.err" || { cat "$out.err" >&2; fail "generate $*"; }
}
run() {  # OUT MODEL ARGS...: both prompts on the reference path
  local out=$1 model=$2
  shift 2
  gen "$out" "$model" "${prompts[@]}" --compute reference "$@"
}
run "$dir/f32.jsonl" "$dir/v32" --kv-cache-dtype f32
python3 - "$fixture" "$dir/f32.jsonl" <<'PY' || fail "the reference path against transformers' deepseek_v32"
import json, sys
want = json.load(open(sys.argv[1]))["prompts"]
got = [json.loads(l) for l in open(sys.argv[2])]
assert len(got) == len(want)
worst = 0
for w, g in zip(want, got):
    assert g["tokens"] == w["tokens"], (g["tokens"], w["tokens"])
    for a, b in zip(w["top_logprobs"], g["top_logprobs"]):
        ours = {x["id"]: x["logprob"] for x in b}
        for x in a:
            if x["id"] in ours:
                worst = max(worst, abs(ours[x["id"]] - x["logprob"]))
assert worst <= 2e-3, worst
print(f"dsa: transformers' deepseek_v32, {len(want)} prompts x {len(want[0]['tokens'])} tokens: "
      f"tokens equal, max |dlogprob| {worst:.2e}")
PY

# Dense when the top-k covers the context: the V3 checkpoint of the same seed has the same
# tensors but the indexer's.
seed=$(python3 -c 'import sys; a=sys.argv[1:]; print(a[a.index("--seed")+1])' "${mm[@]}")
"$bin" make-model --preset v32-tiny --set vocab_size=2000 --set num_hidden_layers=2 --set index_topk=4096 --seed "$seed" --out "$dir/wide" > /dev/null 2>&1
"$bin" make-model --preset tiny --set vocab_size=2000 --set num_hidden_layers=2 --seed "$seed" --out "$dir/v3" > /dev/null 2>&1
for kv in f32 bf16; do
  run "$dir/wide_$kv.jsonl" "$dir/wide" --kv-cache-dtype $kv
  run "$dir/v3_$kv.jsonl" "$dir/v3" --kv-cache-dtype $kv
  cmp -s "$dir/wide_$kv.jsonl" "$dir/v3_$kv.jsonl" || fail "top-k above the context is not dense MLA ($kv)"
done
python3 - "$dir/f32.jsonl" "$dir/v3_f32.jsonl" <<'PY' || fail "top-k 16 changed nothing"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
d = max(abs(x["logprob"] - y["logprob"]) for p, q in zip(a, b)
        for s, t in zip(p["top_logprobs"], q["top_logprobs"]) for x, y in zip(s, t) if x["id"] == y["id"])
assert d > 1e-3, d
PY

# DeepSeek's FP8 indexer: batch == alone, and through the disk tier.
for kv in bf16 fp8; do
  run "$dir/batch_$kv.jsonl" "$dir/v32" --kv-cache-dtype $kv
  gen "$dir/alone_$kv.jsonl" "$dir/v32" "${prompts[@]:2:2}" --compute reference --kv-cache-dtype $kv
  sed -n 2p "$dir/batch_$kv.jsonl" | cmp -s - "$dir/alone_$kv.jsonl" || fail "batch != alone ($kv)"
done
for i in 1 2; do
  run "$dir/disk$i.jsonl" "$dir/v32" --kv-disk "$dir/kvdisk"
done
grep -q 'kv-disk: [1-9][0-9]* hits' "$dir/disk2.jsonl.err" || fail "no disk hits: $(cat "$dir/disk2.jsonl.err")"
cmp -s "$dir/disk1.jsonl" "$dir/disk2.jsonl" || fail "the disk tier changed the output"
cmp -s "$dir/disk1.jsonl" "$dir/batch_bf16.jsonl" || fail "the disk tier run differs from the plain run"

# Through the system, DeepSeek's FP8 indexer: an EP group of 2 ranks (F32 dispatch) and MTP
# drafts give one process's bits.
mpirun="mpirun --allow-run-as-root --oversubscribe"
$mpirun -np 2 "$bin" generate --model "$dir/v32" "${prompts[@]}" --max-tokens "$steps" --compute reference \
  --json --logprobs 5 --ignore-eos --threads 1 --dispatch-dtype f32 > "$dir/ep.jsonl" 2> "$dir/ep.err" ||
  { cat "$dir/ep.err" >&2; fail "EP R=2"; }
cmp -s "$dir/ep.jsonl" "$dir/batch_bf16.jsonl" || fail "EP R=2 differs from one process"
run "$dir/mtp.jsonl" "$dir/v32" --speculative mtp --num-draft-tokens 2 --speculative-max-rows 0
python3 - "$dir/mtp.jsonl" "$dir/batch_bf16.jsonl" <<'PY' || fail "MTP changed the output"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])][:-1]  # (the last line: acceptance figures)
b = [json.loads(l) for l in open(sys.argv[2])]
strip = lambda r: {k: r[k] for k in ("tokens", "top_logprobs")}
assert [strip(r) for r in a] == [strip(r) for r in b]
PY

# PD: a router, a prefill and a decode unit (serve --compute reference) against one serve.
"$bin" make-model "${mm[@]}" --set vocab_size=129280 --out "$dir/v32s" > /dev/null 2>&1
cp build/models/tiny-py/tokenizer.json build/models/tiny-py/tokenizer_config.json "$dir/v32s/"
pd_beside_one "$dir/v32s" --threads 1 --kv-cache-gb 0.05 --compute reference
mapfile -t fixture_prompts < <(python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["prompts"]: print(",".join(map(str, p["prompt_ids"])))' "$fixture")
pd_equals_one "${fixture_prompts[@]}"
echo "dsa: PD (router, prefill and decode unit) = one server"

# The fast path (the indexer's projections on BF16 GEMMs, its scores on the SIMD kernel, sparse
# tokens through mla_sparse):
# with a top-k above the context, the V3 checkpoint's fast-path bits; with top-k 16, a prompt in
# a batch with prefill chunks of 7 tokens gets what it gets alone in one chunk.
gen "$dir/fast_wide.jsonl" "$dir/wide" "${prompts[@]}"
gen "$dir/fast_v3.jsonl" "$dir/v3" "${prompts[@]}"
cmp -s "$dir/fast_wide.jsonl" "$dir/fast_v3.jsonl" || fail "fast path: top-k above the context is not dense MLA"
gen "$dir/fast_batch.jsonl" "$dir/v32" "${prompts[@]}" --prefill-chunk 7
gen "$dir/fast_alone.jsonl" "$dir/v32" "${prompts[@]:2:2}"
sed -n 2p "$dir/fast_batch.jsonl" | cmp -s - "$dir/fast_alone.jsonl" || fail "fast path: batch != alone"
python3 - "$dir/fast_batch.jsonl" "$dir/batch_bf16.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
d = max(abs(x["logprob"] - y["logprob"]) for p, q in zip(a, b)
        for s, t in zip(p["top_logprobs"], q["top_logprobs"]) for x, y in zip(s, t) if x["id"] == y["id"])
same = sum(p["tokens"] == q["tokens"] for p, q in zip(a, b))
print(f"dsa: fast vs reference path (BF16 cache): {same} of {len(a)} prompts' tokens equal, "
      f"max |dlogprob| {d:.3f} (random weights: index-score near-ties flip the top-k, docs/dsa.md)")
PY
echo "dsa: ok"
