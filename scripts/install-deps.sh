#!/usr/bin/env bash
# Installs, from Debian's packages only, whatever tapeformer needs to build and test and is missing.
# Used by both README Quick start commands. Safe to run again: it installs nothing that is present.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev   # OpenBLAS built on OpenMP: one thread pool shared with our own kernels
  libdnnl-dev              # oneDNN: the bf16 matrix products of --precision bf16
  libxsmm-dev              # libxsmm: kernels for small matrix products (attention's per-head ones)
  ocl-icd-opencl-dev       # only recommended by libdnnl-dev, but its CMake config requires OpenCL
  catch2                   # Catch2 v2, single header
  libcli11-dev             # command-line parsing
  libsentencepiece-dev     # subword tokenization
  nlohmann-json3-dev       # JSON (safetensors headers, metrics, reports)
  libtomlplusplus-dev      # TOML (train --config, DIR/config.toml)
  chromium                 # headless, for the test that renders `tapeformer report` (reported skipped without it)
  graphviz                 # dot, for the test that renders `tapeformer tape --dot` (reported skipped without it)
  clang-14 libfuzzer-14-dev libomp-14-dev  # the fuzz pass of scripts/test.sh (scripts/fuzz.sh)
  pybind11-dev python3-pybind11 python3-dev python3-numpy  # the Python module (docs/python.md) and its test
  libopenmpi-dev openmpi-bin  # data-parallel training (mpirun -np R tapeformer train) and its tests
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
