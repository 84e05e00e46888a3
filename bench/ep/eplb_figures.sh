#!/usr/bin/env bash
# EPLB figures at R = 4 (docs/eplb.md "Figures"). $1 = moeserve binary, $2 = work directory (created).
set -euo pipefail
bin=$(readlink -f "$1"); mkdir -p "$2"; cd "$2"; mpi="mpirun --allow-run-as-root --oversubscribe -np 4"
rm -rf m_uniform m_skewed
"$bin" make-model --preset tiny --out m_uniform --set vocab_size=2000 --set num_hidden_layers=4 \
  --set hidden_size=1024 --set moe_intermediate_size=512 --set n_routed_experts=32 \
  --set num_experts_per_tok=8 --set n_group=4 --set topk_group=2 2>/dev/null
cp -r m_uniform m_skewed
python3 - m_skewed <<'PY'
# Skew: +0.5 on the gate's e_score_correction_bias of experts 0..3 in every MoE layer.
import json, struct, sys, glob
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "r+b") as io:
        n = struct.unpack("<Q", io.read(8))[0]
        h = json.loads(io.read(n))
        for name, t in h.items():
            if "e_score_correction_bias" in name:
                base = 8 + n + t["data_offsets"][0]
                io.seek(base); v = list(struct.unpack("<4f", io.read(16)))
                io.seek(base); io.write(struct.pack("<4f", *[x + 0.5 for x in v]))
PY
prompts=()
for i in $(seq 0 7); do prompts+=(--prompt-ids "$(python3 -c "print(','.join(str((t*31+$i*173+7)%1997) for t in range(32)))")"); done
for m in uniform skewed; do
  common=(generate --model m_$m "${prompts[@]}" --max-tokens 32 --ignore-eos --threads 1)
  $mpi "$bin" "${common[@]}" --expert-stats-out stats_$m.json --trace before_$m > /dev/null 2> before_$m.err
  $mpi "$bin" "${common[@]}" --eplb-init stats_$m.json --redundant-experts 8 --expert-stats-out after_$m.json \
    --trace after_$m > /dev/null 2> after_$m.err
  echo "== $m"; grep -h "eplb:\|tokens in" before_$m.err after_$m.err
done
