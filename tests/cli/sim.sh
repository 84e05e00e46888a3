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

# The router's planner over DeepSeek's day (docs/planner.md): one hour ahead after 14 days of
# history, it runs more nodes than the oracle (each hour exactly what it needs) and fewer than
# static peak provisioning, and is never short at the headroom it keeps.
"$bin" sim "$ex" --planner > "$tmp/planner.txt" || fail "--planner exited $?"
python3 - "$tmp/planner.txt" <<'PY' || fail "--planner figures"
import re, sys
t = open(sys.argv[1]).read().split("planner over the day")[1]
rows = re.findall(r"^\d\d:00 +\d+ +\d+ +(\d+) +(\d+) +(\d+) +(\d+)", t, re.M)
assert len(rows) == 24, len(rows)
for p, d, n, oracle in rows:
    assert int(p) + int(d) == int(n)
planner = float(re.search(r"planner: average ([\d.]+) nodes", t).group(1))
assert planner == sum(int(r[2]) for r in rows) / 24
oracle = float(re.search(r"oracle \(each hour what it needs\) ([\d.]+) nodes", t).group(1))
static = float(re.search(r"static peak (\d+) nodes", t).group(1))
assert oracle < planner < static, (oracle, planner, static)
assert "0 of 24 hours short" in t
assert "published schedule 226.75 nodes" in t
PY

"$bin" sim /nonexistent.json > /dev/null 2>&1; [ $? -eq 1 ] || fail "missing file should exit 1"
"$bin" sim "$ex" --sweep nonsense > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad --sweep should exit 2"
"$bin" sim > /dev/null 2>&1; [ $? -ne 0 ] || fail "no scenario should fail"
echo "sim.sh: ok"
