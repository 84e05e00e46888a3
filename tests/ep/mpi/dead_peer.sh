#!/usr/bin/env bash
# A rank that dies in the middle of a dispatch: the others must fail within the timeout with a
# message naming it and exit 1 (issue 7, "no hangs").
# mpirun would otherwise kill the survivors itself as soon as it sees the death; the two MCA
# settings keep them alive so that what is tested is their own timeout (the case of a peer on
# another host that hangs or vanishes without mpirun noticing).
set -uo pipefail
exe=$1
mpirun=${2:-mpirun}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$log" >&2; exit 1; }

for np in 2 4; do
  "$mpirun" --allow-run-as-root --oversubscribe -np $np \
    --mca orte_abort_on_non_zero_status 0 --mca orte_allowed_exit_without_sync 1 \
    bash -c '"$0" --dead-peer 1500; echo "exit code of rank $OMPI_COMM_WORLD_RANK: $?"' "$exe" \
    > "$log" 2>&1
  dead=$((np - 1))
  grep -q "rank $dead: exiting in the middle of a dispatch" "$log" || fail "np $np: no death"
  for r in $(seq 0 $((np - 2))); do
    grep -q "rank $r failed: EP dispatch: all-to-all on rank $r: no answer from rank $dead within 1500 ms" "$log" \
      || fail "np $np: rank $r did not name rank $dead"
    grep -q "exit code of rank $r: 1$" "$log" || fail "np $np: rank $r did not exit 1"
  done
  ! grep -q "went unnoticed" "$log" || fail "np $np: a rank missed the death"
done
echo "dead_peer.sh: ok"
