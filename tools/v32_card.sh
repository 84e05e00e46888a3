#!/usr/bin/env bash
# The held-out figures of a DeepSeek-V3.2 checkpoint's card (assets/models/tiny-py-v32/README.md):
# `moeserve perplexity` over the held-out split of tools/train_tiny.py's corpus (the files
# tiny-py's train_log.json lists, in its order), on the reference and fast paths, with the
# checkpoint's index_topk (sparse) and with a top-k above every window (dense: the same weights,
# every query attending to its whole context), beside tiny-py (dense V3) on the same windows.
#   tools/v32_card.sh BIN MODELS_DIR [WINDOWS]     (WINDOWS of 512 tokens; default 200)
set -euo pipefail
bin=$(readlink -f "$1")
models=$(readlink -f "$2")
windows=${3:-200}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mapfile -t files < <(python3 -c '
import json, sys
log = json.load(open(sys.argv[1]))
for f in log["corpus"]["heldout_file_list"]: print("/usr/lib/python3.11/" + f)' \
  "$(dirname "$0")/../assets/models/tiny-py/train_log.json")
# The dense copy: every file linked but config.json, whose index_topk covers any window.
mkdir "$tmp/dense"
for f in "$models/tiny-py-v32"/*; do ln -s "$f" "$tmp/dense/$(basename "$f")"; done
rm "$tmp/dense/config.json"
python3 -c '
import json, sys
c = json.load(open(sys.argv[1])); c["index_topk"] = 1 << 20
json.dump(c, open(sys.argv[2], "w"), indent=2)' "$models/tiny-py-v32/config.json" "$tmp/dense/config.json"
ppl() {  # LABEL MODEL ARGS...
  local label=$1 model=$2
  shift 2
  "$bin" perplexity --model "$model" --text "${files[@]}" --window 512 --max-windows "$windows" \
    --json "$@" 2> /dev/null | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(json.dumps({"case": sys.argv[1], "tokens": r.get("tokens"), "nats_per_token": r["nats_per_token"]}))' "$label"
}
ppl "v32 sparse, reference" "$models/tiny-py-v32" --compute reference
ppl "v32 dense, reference" "$tmp/dense" --compute reference
ppl "v32 sparse, fast" "$models/tiny-py-v32"
ppl "v32 dense, fast" "$tmp/dense"
ppl "tiny-py (V3), reference" "$models/tiny-py" --compute reference
ppl "tiny-py (V3), fast" "$models/tiny-py"
