#!/usr/bin/env bash
# A local supervisor behind the planner's hook (docs/planner.md): keeps this machine's prefill
# and decode units at the planner's targets. The router runs it with the two targets appended:
#
#   moeserve router ... --planner-hook "scripts/scale_units.sh --state DIR --router URL \
#       --model MODEL_DIR --bin build/moeserve [--serve-flags 'FLAGS'] [--cpu-quota CORES]"
#
# Units it starts are `serve --role prefill|decode --router URL` on free loopback ports (their
# pids and ports under --state); a unit it retires leaves through the router's POST /admin/drain,
# so it finishes what it runs and exits 0: scaling down fails no request. Only its own units
# count. Returns at once (units start in the background; the router sees them when they
# register). Idempotent: the router runs it again while the units alive differ from the targets
# (one died: it is replaced).
#
# --cpu-quota CORES gives each unit a CPU limit, as a container's (`resources.limits.cpu`): a
# cgroup `moeserve-ROLE-PORT` with that many cores' worth of CPU time per 10 ms (cgroup v1 `cpu`
# or v2 `cpu.max`; needs root), so that a unit's capacity is its own and not the machine's.
set -euo pipefail
state="" router="" model="" bin="moeserve" flags="" quota=""
while [[ $# -gt 2 ]]; do
  case "$1" in
    --state) state=$2; shift 2 ;;
    --router) router=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --serve-flags) flags=$2; shift 2 ;;
    --cpu-quota) quota=$2; shift 2 ;;
    *) echo "scale_units.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -eq 2 && -n $state && -n $router && -n $model ]] ||
  { echo "usage: scale_units.sh --state DIR --router URL --model DIR [--bin B] [--serve-flags F] PREFILL DECODE" >&2; exit 2; }
mkdir -p "$state"
declare -A want=([prefill]=$1 [decode]=$2)

# The cgroup directory for a unit NAME under --cpu-quota, made and limited; empty: no quota.
cgroup_for() {
  [[ -n $quota ]] || return 0
  local us d
  us=$(awk -v q="$quota" 'BEGIN { printf "%d", q * 10000 }')
  if [[ -w /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then  # cgroup v1
    d=/sys/fs/cgroup/cpu/moeserve-$1
    mkdir -p "$d" && echo 10000 > "$d/cpu.cfs_period_us" && echo "$us" > "$d/cpu.cfs_quota_us"
  elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then  # v2
    d=/sys/fs/cgroup/moeserve-$1
    mkdir -p "$d" && echo "$us 10000" > "$d/cpu.max"
  else
    echo "scale_units.sh: no writable cgroup cpu controller for --cpu-quota" >&2
    exit 1
  fi
  echo "$d"
}
# Cgroups of units gone (a cgroup with no process left can be removed).
for d in /sys/fs/cgroup/cpu/moeserve-* /sys/fs/cgroup/moeserve-*; do
  [[ -d $d && -z $(cat "$d/cgroup.procs" 2>/dev/null) ]] && rmdir "$d" 2>/dev/null || true
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
units() {  # ROLE: the ports of its live units, oldest first
  local f
  for f in $(ls -tr "$state" 2>/dev/null | grep "^$1\." || true); do
    if kill -0 "$(cat "$state/$f")" 2>/dev/null; then
      echo "${f#*.}"
    else
      rm -f "$state/$f"
    fi
  done
}
for role in prefill decode; do
  mapfile -t have < <(units "$role")
  n=${#have[@]}
  while [[ $n -lt ${want[$role]} ]]; do
    port=$(free_port)
    cg=$(cgroup_for "$role-$port")
    # The unit enters its cgroup before it starts (every thread it makes is limited).
    # shellcheck disable=SC2086  # (flags are words)
    nohup bash -c '[[ -z $1 ]] || echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
      "$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --role "$role" \
      --router "$router" $flags >> "$state/$role-$port.log" 2>&1 &
    echo $! > "$state/$role.$port"
    echo "scale_units.sh: started a $role unit on port $port" >&2
    n=$((n + 1))
  done
  while [[ $n -gt ${want[$role]} ]]; do
    port=${have[$((n - 1))]}  # the newest goes first
    curl -sf -X POST "$router/admin/drain" -H 'Content-Type: application/json' \
      -d "{\"unit\": \"127.0.0.1:$port\"}" > /dev/null ||
      echo "scale_units.sh: the router did not take the drain of 127.0.0.1:$port" >&2
    rm -f "$state/$role.$port"
    echo "scale_units.sh: retiring the $role unit on port $port" >&2
    n=$((n - 1))
  done
done
