#!/usr/bin/env bash
# Data-parallel training against one process, same global batch (issue #31 §3): the toy preset's model on
# data/toy, --accumulate 2 (two micro-batches of 3000 tokens a step), back to back:
#   one process, 2 threads | one process, 1 thread | mpirun -np 2, 1 thread per rank
# Prints each run's target tokens/s and, for the MPI run, the ms per step in the gradient exchange, as the
# means over the logged windows after the first (which holds the start-up). Usage, from the repository root
# after building: bash bench/data_parallel.sh [steps (default 60)]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
cli=build/apps/tapeformer
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(train --train-src data/toy/train.src --train-tgt data/toy/train.tgt --tokenizer word --vocab-size 0
       --tie all --d-model 128 --heads 4 --ffn 256 --layers 2 --dropout 0.1 --batch-tokens 3000 --max-len 40
       --lr 1.0 --warmup 400 --accumulate 2 --max-steps "$steps" --log-every 10 --checkpoint-every 100000)
summary() {  # $1: the run's name, $2: its directory
  python3 - "$1" "$2/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[2]) if '"train"' in l][1:]
tok = sum(l["tok_per_s"] for l in lines) / len(lines)
red = [l["reduce_ms"] for l in lines if "reduce_ms" in l]
print(f"{sys.argv[1]:<34} {tok:8.0f} tgt tok/s" + (f"   reduce {sum(red)/len(red):6.2f} ms/step" if red else ""))
PY
}
"$cli" --threads 2 "${flags[@]}" --out "$out/p2" 2>/dev/null;  summary "1 process, 2 threads" "$out/p2"
"$cli" --threads 1 "${flags[@]}" --out "$out/p1" 2>/dev/null;  summary "1 process, 1 thread" "$out/p1"
mpirun --oversubscribe --allow-run-as-root -np 2 "$cli" --threads 1 "${flags[@]}" --out "$out/r2" 2>/dev/null
summary "mpirun -np 2, 1 thread per rank" "$out/r2"
