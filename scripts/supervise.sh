#!/usr/bin/env bash
# A minimal supervisor for a unit of a disaggregated deployment (docs/fault-tolerance.md): runs
# COMMAND, and runs it again whenever it exits with anything but 0 (a unit that failed fast, an
# EP unit that lost a rank), after a pause that doubles up to 30 s and resets once a run lasted
# a minute. Exit 0 (a drained unit) ends it; so does SIGTERM, passed on to the command. In
# production systemd's Restart=on-failure or a Kubernetes pod does the same.
#   scripts/supervise.sh mpirun -np 2 moeserve serve --role decode --router URL ...
set -uo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
child=""
trap '[[ -n $child ]] && kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
pause=1
while :; do
  start=$(date +%s)
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  child=""
  [[ $rc -eq 0 ]] && exit 0
  (( $(date +%s) - start >= 60 )) && pause=1
  echo "supervise: '$1' exited with $rc; starting it again in $pause s" >&2
  sleep "$pause"
  pause=$(( pause * 2 > 30 ? 30 : pause * 2 ))
done
