#!/usr/bin/env bash
# Writes lstm_fixture.json: a small LSTM forecaster trained by tools/traces/train_lstm.py (PyTorch)
# on a 3-day trace of 24 intervals a day, with the series and PyTorch's forecasts of the first
# four held-out intervals, which the planner's C++ LSTM must reproduce (tests/router/planner_test.cpp).
#   PYTHON=/path/to/python-with-torch bash tests/data/planner/make_lstm_fixture.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tools/traces/make_trace.py --days 3 --day-seconds 2400 --mean-rps 2 --seed 5 \
  --out "$tmp/trace.csv"
"${PYTHON:-python3}" tools/traces/train_lstm.py --trace "$tmp/trace.csv" --day-seconds 2400 \
  --bin-s 100 --held-out-days 1 --hidden 8 --epochs 40 --fixture tests/data/planner/lstm_fixture.json
