#!/usr/bin/env bash
# Resident memory of each rank of `mpirun -np R moeserve serve` after one request.
# usage: bench/ep/rss_per_rank.sh BIN MODEL_DIR R [PORT]
set -euo pipefail
bin=$1 model=$2 np=$3 port=${4:-18931}
args=(serve --model "$model" --port "$port" --threads 1 --kv-cache-gb 0.5)
if [[ $np == 1 ]]; then
  "$bin" "${args[@]}" > /dev/null 2>&1 &
else
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$bin" "${args[@]}" > /dev/null 2>&1 &
fi
launcher=$!
trap 'kill -TERM $launcher 2>/dev/null || true; wait $launcher 2>/dev/null || true' EXIT
for _ in $(seq 1 1200); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 0.5; done
curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' \
  -d '{"prompt":[1,2,3],"max_tokens":4,"ignore_eos":true}' > /dev/null
for p in $(pgrep -f -- "serve --model $model --port $port"); do
  [[ $(cat /proc/$p/comm) == moeserve ]] || continue
  r=$(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
  awk -v np="$np" -v r="${r:-0}" '/^(VmRSS|RssAnon|RssFile):/ {v[$1]=$2}
    END {printf "ranks %d rank %d  rss %.2f GB  anon %.2f GB  file %.2f GB\n", np, r,
         v["VmRSS:"]/1e6, v["RssAnon:"]/1e6, v["RssFile:"]/1e6}' /proc/$p/status
done
