#!/usr/bin/env bash
# Usage: bench/bf16_ab.sh THREADS ROUNDS [more bench train flags]. A B A B: tapeformer bench train fp32 vs bf16, same flags, printing median ms/step, CPU ms/step, tgt tok/s
bin=${TAPEFORMER:-build/apps/tapeformer}
threads=$1; rounds=$2; shift 2
for ((r=1; r<=rounds; r++)); do
  for p in fp32 bf16; do
    j=$($bin bench train --threads $threads --steps 12 --precision $p "$@" | grep '^{' | tail -1)
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(sys.argv[2], sys.argv[3], "median_ms %.1f cpu_ms %.1f tok/s %.0f loss_last %.4f" % (d["ms_per_step_median"], d["cpu_ms_per_step"], d["tgt_tokens_per_s"], d["loss_last"]))' "$j" $r $p
  done
done
