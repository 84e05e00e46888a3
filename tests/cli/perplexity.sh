#!/usr/bin/env bash
# `moeserve perplexity` on the trained default model (build/models/tiny-py) against transformers:
# the HF fixture's first case (tests/data/hf/tiny-py: its prompt, then transformers' greedy path)
# as one window; the NLL of each path token must be transformers' top-1 logprob within the fast
# path's bound on this model (0.08, tests/model/hf_reference_test.cpp), with and without the INT8
# GEMMs (their own bound, 0.25 there). Then the errors of bad input. Usage: perplexity.sh BIN
set -euo pipefail
bin=${1:?usage: perplexity.sh path/to/moeserve}
model=build/models/tiny-py
fail() { echo "perplexity.sh: $*" >&2; exit 1; }
[ -f "$model/config.json" ] || fail "$model missing (CMake lays it out from assets/models/tiny-py)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - tests/data/hf/tiny-py/expected.json "$tmp" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["prompts"][0]
seq = p["prompt_ids"] + p["tokens"]
json.dump(seq, open(sys.argv[2] + "/tokens.json", "w"))
json.dump({"prompt": len(p["prompt_ids"]), "top1": [s[0]["logprob"] for s in p["top_logprobs"]],
           "path": p["tokens"]}, open(sys.argv[2] + "/ref.json", "w"))
print(len(seq) - 1, file=open(sys.argv[2] + "/window", "w"))
PY
window=$(cat "$tmp/window")
for flags in "" "--gemm-int8 --lm-head-int8" "--projection-dtype int4 --lm-head-dtype int4"; do
  # shellcheck disable=SC2086
  "$bin" perplexity --model "$model" --tokens "$tmp/tokens.json" --window "$window" --json \
    --per-token --threads 2 $flags > "$tmp/out.json"
  python3 - "$tmp/out.json" "$tmp/ref.json" "${flags:-fp8}" <<'PY'
import json, math, sys
out, ref, what = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
# INT4 projections and head: 0.488 measured (AMD EPYC Zen 4, 2026-12-07), held to 1.25x.
bound = {"fp8": 0.08, "--gemm-int8 --lm-head-int8": 0.25,
         "--projection-dtype int4 --lm-head-dtype int4": 0.6}[what]
nll = out["nll"]
assert out["windows"] == 1 and out["tokens"] == len(nll), out
assert abs(out["nats_per_token"] - sum(nll) / len(nll)) < 1e-9, out
assert abs(out["perplexity"] - math.exp(out["nats_per_token"])) < 1e-6 * out["perplexity"], out
# Position prompt-1+s predicts path token s, whose logprob transformers gives as its top-1.
worst = max(abs(nll[ref["prompt"] - 1 + s] + lp) for s, lp in enumerate(ref["top1"]))
assert worst <= bound, (what, worst)
print(f"perplexity {what}: max |nll + hf logprob| = {worst:.3g} over {len(ref['top1'])} tokens")
PY
done

# Bad input: a clear message and a non-zero exit, never a crash.
expect_error() {  # expect_error CODE PATTERN ARGS...
  local code=$1 pattern=$2
  shift 2
  set +e
  "$bin" perplexity --model "$model" "$@" > "$tmp/o" 2> "$tmp/e"
  local rc=$?
  set -e
  [ "$rc" = "$code" ] || fail "perplexity $*: exit $rc, want $code ($(cat "$tmp/e"))"
  grep -q "$pattern" "$tmp/e" || fail "perplexity $*: stderr lacks '$pattern': $(cat "$tmp/e")"
}
expect_error 2 "either --tokens or --text"
echo '[1, 2, 99999999]' > "$tmp/bad.json"
expect_error 1 "outside the vocabulary" --tokens "$tmp/bad.json" --window 2
echo '[1, 2, 3]' > "$tmp/short.json"
expect_error 1 "fewer than one window" --tokens "$tmp/short.json" --window 8
expect_error 2 "longer than the model's context" --tokens "$tmp/short.json" --window 100000000
echo '{"a": 1}' > "$tmp/obj.json"
expect_error 1 "expected a JSON array" --tokens "$tmp/obj.json"
expect_error 1 "cannot open" --text "$tmp/missing.txt"
echo "perplexity.sh: ok"
