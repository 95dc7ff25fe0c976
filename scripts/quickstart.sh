#!/usr/bin/env bash
# Quick start, step 1: install everything, build in Release, and run the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --peers
scripts/build.sh
echo "== kestrel run (Gemma 3 270M, greedy)"
./build/kestrel run -p "The three most important inventions of the twentieth century are" -n 96 --temp 0
