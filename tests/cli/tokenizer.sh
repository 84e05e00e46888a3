#!/usr/bin/env bash
# `moeserve tokenize | detokenize | render-chat` against the committed fixtures (HF tokenizers and
# jinja2 outputs), and the exit codes of bad input. Usage: tokenizer.sh path/to/moeserve
set -euo pipefail
bin=${1:?usage: tokenizer.sh path/to/moeserve}
tok=assets/tokenizer/deepseek-v3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# tokenize: known ids (checked with HF tokenizers 0.23), with and without BOS.
printf 'Hello world' | "$bin" tokenize --tokenizer "$tok" > "$tmp/ids.json"
[ "$(cat "$tmp/ids.json")" = "[19923,2058]" ] || fail "tokenize: $(cat "$tmp/ids.json")"
[ "$(printf 'Hello world' | "$bin" tokenize --tokenizer "$tok" --bos)" = "[0,19923,2058]" ] || fail "tokenize --bos"
[ "$(printf '' | "$bin" tokenize --tokenizer "$tok")" = "[]" ] || fail "tokenize empty"

# detokenize round trip, exactly (no newline added), and --skip-special.
[ "$("$bin" detokenize --tokenizer "$tok" < "$tmp/ids.json")" = "Hello world" ] || fail "detokenize"
echo '[0,19923,2058,1]' | "$bin" detokenize --tokenizer "$tok" --skip-special > "$tmp/text"
printf 'Hello world' | cmp -s - "$tmp/text" || fail "detokenize --skip-special"

# --jsonl: the first 300 corpus lines give HF's ids (python3 here uses only its standard library).
python3 - "$tmp/lines.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for i, line in enumerate(open("tests/data/tokenizer/corpus.jsonl", encoding="utf-8")):
        if i == 300:
            break
        out.write(json.dumps(json.loads(line)["text"]) + "\n")
PY
"$bin" tokenize --tokenizer "$tok" --jsonl < "$tmp/lines.jsonl" > "$tmp/out.jsonl"
python3 - "$tmp/out.jsonl" <<'PY'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
data, pos = open("tests/data/tokenizer/corpus_ids.bin", "rb").read(), 0
def varint():
    global pos
    v = shift = 0
    while True:
        b = data[pos]; pos += 1
        v |= (b & 0x7F) << shift; shift += 7
        if not b & 0x80:
            return v
for i, ids in enumerate(got):
    want = [varint() for _ in range(varint())]
    assert ids == want, f"line {i}: {ids[:10]} != {want[:10]}"
assert len(got) == 300, len(got)
PY

# render-chat: the first fixture conversations, V3 template, against jinja2's text.
cat > "$tmp/msgs.json" <<'JSON'
[{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}, {"role": "user", "content": "Q"}]
JSON
"$bin" render-chat --tokenizer "$tok" --messages "$tmp/msgs.json" --add-generation-prompt > "$tmp/chat"
printf '<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q<｜Assistant｜>' | cmp -s - "$tmp/chat" || fail "render-chat: $(cat "$tmp/chat")"
"$bin" render-chat --tokenizer "$tok" --messages "$tmp/msgs.json" > "$tmp/chat2"
printf '<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q' | cmp -s - "$tmp/chat2" || fail "render-chat without prompt"
# render-chat with tools: a chat_tools.jsonl row (messages and tools), V3, against jinja2's text.
python3 - "$tmp" <<'PY'
import json, sys
row = json.loads(open("tests/data/tokenizer/chat_tools.jsonl", encoding="utf-8").readlines()[8])
assert row["tools"] and any(m["role"] == "tool" for m in row["messages"]), row
json.dump({"messages": row["messages"], "tools": row["tools"]},
          open(sys.argv[1] + "/tools.json", "w", encoding="utf-8"), ensure_ascii=False)
open(sys.argv[1] + "/tools_want", "w", encoding="utf-8", newline="").write(row["v3"])
assert row["add_generation_prompt"], row
PY
"$bin" render-chat --tokenizer "$tok" --messages "$tmp/tools.json" --add-generation-prompt > "$tmp/chat3"
cmp -s "$tmp/tools_want" "$tmp/chat3" || fail "render-chat with tools: $(cat "$tmp/chat3")"

# Errors: runtime errors exit 1 with a message; never a crash.
expect_exit() {
  local want=$1; shift
  set +e; "$@" > /dev/null 2> "$tmp/err"; local rc=$?; set -e
  [ "$rc" = "$want" ] || fail "exit $rc (want $want): $* : $(cat "$tmp/err")"
  [ -s "$tmp/err" ] || fail "no message: $*"
}
printf 'ok\xff' > "$tmp/bad.txt"
expect_exit 1 "$bin" tokenize --tokenizer "$tok" < "$tmp/bad.txt"
grep -q "UTF-8 (byte 2)" "$tmp/err" || fail "invalid UTF-8 message: $(cat "$tmp/err")"
echo 'not json' > "$tmp/bad.jsonl"
expect_exit 1 "$bin" tokenize --tokenizer "$tok" --jsonl < "$tmp/bad.jsonl"
echo '[1, 999999999]' > "$tmp/bad_ids.json"
expect_exit 1 "$bin" detokenize --tokenizer "$tok" < "$tmp/bad_ids.json"
echo '[1, "x"]' > "$tmp/bad_ids2.json"
expect_exit 1 "$bin" detokenize --tokenizer "$tok" < "$tmp/bad_ids2.json"
expect_exit 1 "$bin" tokenize --tokenizer /nonexistent < /dev/null
echo '[{"role": "user"}]' > "$tmp/nocontent.json"
expect_exit 1 "$bin" render-chat --tokenizer "$tok" --messages "$tmp/nocontent.json"
expect_exit 1 "$bin" render-chat --tokenizer "$tok" --messages "$tmp/missing.json"
echo '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}' > "$tmp/badtools.json"
expect_exit 1 "$bin" render-chat --tokenizer "$tok" --messages "$tmp/badtools.json"
echo "tokenizer CLI: ok"
