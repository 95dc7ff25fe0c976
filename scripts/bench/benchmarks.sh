#!/usr/bin/env bash
# Builds the W4A16 (calibrated) and BF16 images of the default model, then runs Kestrel and
# llama.cpp side by side (scripts/bench/run_vs_llamacpp.py) on the prefill shape (2,048 in,
# 128 out) and the decode shape (3,072 in, 50 out). Prints Markdown.
#   scripts/bench/benchmarks.sh [RUNS (default 3)]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-3}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
build/kestrel build default -o "$DIR/w4a16.kimg" --calib ../shared/data/oasst/en-validation.jsonl >/dev/null 2>&1
build/kestrel build default -o "$DIR/bf16.kimg" --precision bf16 >/dev/null 2>&1
echo "### Prefill: 2,048 tokens in, 128 out"
echo
python3 scripts/bench/run_vs_llamacpp.py --runs "$RUNS" --prompt 2048 --out-tokens 128 \
  --image "$DIR/w4a16.kimg" --image "$DIR/bf16.kimg" 2>/dev/null
echo
echo "### Decode: 3,072 tokens in, 50 out"
echo
python3 scripts/bench/run_vs_llamacpp.py --runs "$RUNS" --prompt 3072 --out-tokens 50 \
  --image "$DIR/w4a16.kimg" --image "$DIR/bf16.kimg" 2>/dev/null
