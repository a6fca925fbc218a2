#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and runs each for a bounded time from
# its seed corpus tests/fuzz/corpus/<target>/. Inputs it finds go to build-fuzz/found/<target>/, never into
# the checked-in corpus; a crash stops with the input saved as build-fuzz/crash-<target>-*, to be copied
# to tests/fuzz/regressions/<target>/ with the fix. Prints executions and coverage per target.
#   scripts/fuzz.sh [SECONDS_PER_TARGET=15] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-15}
shift || true
targets=("$@")  # none named: every target of tests/fuzz/CMakeLists.txt (TF_FUZZ_TARGETS)

launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1: compiles fast and still runs the targets at thousands of inputs per second under ASan.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
      -DCMAKE_CXX_COMPILER=clang++-14 -DTAPEFORMER_FUZZ=ON -DTAPEFORMER_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
if ((${#targets[@]})); then
  cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
else
  cmake --build build-fuzz -j "$(nproc)" --target fuzz_targets
  for exe in build-fuzz/tests/fuzz/fuzz_*; do
    [[ -x $exe && -f $exe ]] && targets+=("${exe##*/fuzz_}")
  done
fi

export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for t in "${targets[@]}"; do
  found=build-fuzz/found/$t
  mkdir -p "$found"
  log=build-fuzz/fuzz-$t.log
  # -rss_limit_mb / -malloc_limit_mb: a size taken from the input must be checked before it is allocated.
  # -timeout: one input taking seconds is a hang.
  if ! build-fuzz/tests/fuzz/fuzz_$t "$found" tests/fuzz/corpus/$t -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix="build-fuzz/crash-$t-" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t failed; the input is build-fuzz/crash-$t-*" >&2
    exit 1
  fi
  execs=$(grep -a -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -a -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  echo "fuzz: $t: ${execs:-?} executions in ${seconds} s, coverage ${cov:-?} edges, no crash"
done
