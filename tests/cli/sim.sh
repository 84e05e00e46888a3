#!/usr/bin/env bash
# moeserve sim: the shipped DeepSeek day runs, --json has the documented keys, --sweep and --plot
# work, and bad input gives the documented exit codes. $1: the moeserve binary.
set -u
bin="$1"
ex=examples/sim/deepseek-v3-h800-day.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin" sim "$ex" > "$tmp/out.txt" || fail "sim exited $?"
grep -q "published schedule: average 226.75 nodes, cost \$87072" "$tmp/out.txt" || fail "report lacks the published cost"

"$bin" sim "$ex" --json --plot "$tmp/day.svg" > "$tmp/out.json" || fail "--json exited $?"
python3 - "$tmp/out.json" <<'PY' || fail "--json keys"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ["prefill_input_tokens_per_s_per_node", "decode_output_tokens_per_s_per_node", "avg_nodes",
          "daily_cost_usd", "daily_revenue_usd", "cost_profit_margin"]:
    assert isinstance(j[k], (int, float)), k
assert abs(j["observed_daily_cost_usd"] - 87072) < 1e-6
assert len(j["hours"]) == 24
PY
grep -q "<svg" "$tmp/day.svg" || fail "--plot wrote no SVG"

"$bin" sim "$ex" --sweep deployment.decode.batch_per_device=32:160:32 > "$tmp/sweep.txt" || fail "--sweep exited $?"
[ "$(grep -c '^ *[0-9]' "$tmp/sweep.txt")" -eq 5 ] || fail "--sweep should print 5 rows"

"$bin" sim /nonexistent.json > /dev/null 2>&1; [ $? -eq 1 ] || fail "missing file should exit 1"
"$bin" sim "$ex" --sweep nonsense > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad --sweep should exit 2"
"$bin" sim > /dev/null 2>&1; [ $? -ne 0 ] || fail "no scenario should fail"
echo "sim.sh: ok"
