#!/usr/bin/env bash
# README's main command: installs what is missing, builds, trains the toy translator on data/toy,
# then scores it on the toy test set and shows a few translations.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target tapeformer_cli
tf=./build/apps/tapeformer

echo "== training the toy translator (data/toy, preset toy) into runs/toy"
$tf train --preset toy --out runs/toy --force

echo "== test set: data/toy/test.src -> data/toy/test.tgt"
$tf eval --model runs/toy --src data/toy/test.src --ref data/toy/test.tgt

echo "== a few translations (source / model / reference)"
head -n 5 data/toy/test.src > runs/toy/samples.src
$tf translate --model runs/toy --input runs/toy/samples.src --output runs/toy/samples.out
paste -d '\n' runs/toy/samples.src runs/toy/samples.out <(head -n 5 data/toy/test.tgt) <(yes '' | head -n 5) |
  awk 'NR % 4 == 1 {print "  src: " $0} NR % 4 == 2 {print "  out: " $0} NR % 4 == 3 {print "  ref: " $0} NR % 4 == 0 {print ""}'
