#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite twice: a Release build, then a build
# under AddressSanitizer + UndefinedBehaviorSanitizer; then a short bounded run of every fuzz target.
# README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
# install-deps.sh installed Chromium and Graphviz: a case that needs one and finds it missing fails here
# instead of being reported as skipped (tf_test::tool_missing, tests/helpers.h). Every tier runs: the fast
# one (ctest -LE slow) and the slow one (-L slow).
export TAPEFORMER_REQUIRE_TOOLS=1

echo "== Release build and tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
# -O1 -g1 (line tables): stack traces still name file and line, and the build compiles in about 40% of
# -O2 -g's time (test_train.cpp: 51 s against 135 s under ASan + UBSan, Zen 5), which was most of this
# script's time; the tests run somewhat slower at -O1, far less than the build saves.
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DTAPEFORMER_SANITIZE=ON >/dev/null
cmake --build build-sanitize -j "$jobs" --target tapeformer_tests tapeformer_tests_f64 tapeformer_cli
# OpenMP's thread pool is created once and never freed: not a leak of ours.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Every test but three kinds, which the Release phase ran and which would add most of this phase's time
# (about 17 of its 34 minutes of test time, Zen 5) without reaching code the others leave unchecked:
# - kernel_sets: reruns of the same code of ours over other OpenBLAS and oneDNN kernels, which the
#   sanitizers do not instrument;
# - learns: trainings of hundreds of steps to a quality bar (the copy task, the presets); the steps they
#   repeat are the ones the short training, resume and Ctrl-C cases run here;
# - lessons: the docs' commands, checked for the words they print; each command is run here by its own
#   command's end-to-end case (tests/test_cli.cpp and beside it);
# - mpi: the CLI under mpirun (tests/test_distributed.cpp): OpenMPI is not instrumented, and its runtime
#   (the launcher, shared-memory transport) is not known to run clean under LeakSanitizer; the training
#   step those cases reach runs here in one process (the --accumulate cases of test_train*.cpp).
ctest --test-dir build-sanitize -j "$jobs" --output-on-failure -LE "kernel_sets|learns|lessons|mpi"

echo "== libFuzzer: each loader of untrusted input fuzzed for 10 s from tests/fuzz/corpus (scripts/fuzz.sh)"
bash scripts/fuzz.sh 10
