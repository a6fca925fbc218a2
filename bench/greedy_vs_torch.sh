#!/usr/bin/env bash
# Usage: bench/greedy_vs_torch.sh THREADS ROUNDS [--bf16] [more flags for both]
#
# Greedy decoding speed against PyTorch's decoder with a key/value cache (issue #12 §4), alternating the
# two programs ROUNDS times: `tapeformer bench train --steps 0 --eval-greedy --eval-reps 5` against
# `../shared/bench/torch_ref.py --steps 1 --eval-greedy --eval-reps 5`, whose `greedy_cached_tokens_per_s`
# decodes the same batch (64 sentences, 20 steps) with a cache. Both run under compare.sh's settings:
# passive OpenMP waiting, the same OpenBLAS kernel set, the same thread count. With --bf16 tapeformer runs
# `--precision bf16` and PyTorch its CPU autocast. Prints each run's tokens/s and the median ratio.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TAPEFORMER:-$here/../build/apps/tapeformer}
torch_ref=$here/../../shared/bench/torch_ref.py
[[ $# -ge 2 ]] || { echo "usage: bench/greedy_vs_torch.sh THREADS ROUNDS [--bf16] [flags]" >&2; exit 2; }
threads=$1; rounds=$2; shift 2
[[ -x $bin ]] || { echo "greedy_vs_torch.sh: no executable at $bin (build first, or set TAPEFORMER)" >&2; exit 2; }
[[ -f $torch_ref ]] || { echo "greedy_vs_torch.sh: $torch_ref not found" >&2; exit 2; }
ours_flags=("$@"); theirs_flags=("$@")
for i in "${!ours_flags[@]}"; do [[ ${ours_flags[$i]} == --bf16 ]] && ours_flags[$i]="--precision=bf16"; done
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [[ -z ${OPENBLAS_CORETYPE:-} ]] && grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; fi
omp=/usr/lib/x86_64-linux-gnu/openblas-openmp
[[ -d $omp ]] || { echo "greedy_vs_torch.sh: install libopenblas0-openmp first" >&2; exit 2; }
echo "settings for both: OMP_WAIT_POLICY=$OMP_WAIT_POLICY OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto} threads $threads flags: $*"
field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ratios=()
for ((r = 1; r <= rounds; r++)); do
  a=$("$bin" bench train --threads "$threads" --steps 0 --eval-greedy --eval-reps 5 "${ours_flags[@]}" | grep '^{' | tail -n 1)
  b=$(LD_LIBRARY_PATH=$omp /usr/bin/python3 "$torch_ref" --threads "$threads" --steps 1 --eval-greedy --eval-reps 5 "${theirs_flags[@]}" |
      grep '^{' | tail -n 1)
  ours=$(field "$a" greedy_tokens_per_s); theirs=$(field "$b" greedy_cached_tokens_per_s)
  ratio=$(/usr/bin/python3 -c "print('%.2f' % ($ours / $theirs))")
  ratios+=("$ratio")
  printf 'round %d: tapeformer %.0f tok/s, PyTorch cached %.0f tok/s, ratio %s (load %s)\n' \
    "$r" "$ours" "$theirs" "$ratio" "$(cut -d' ' -f1 /proc/loadavg)"
done
echo "median ratio: $(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
