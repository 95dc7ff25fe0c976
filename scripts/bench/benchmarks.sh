#!/usr/bin/env bash
# Builds the W4A16+FlashHead (calibrated) and BF16 images of the default model, then runs Kestrel
# and llama.cpp side by side (scripts/bench/run_vs_llamacpp.py) on the prefill shape (2,048 in,
# 128 out) and the decode shape (3,072 in, 50 out). Prints Markdown.
#   scripts/bench/benchmarks.sh [RUNS (default 5)]
# IK_LLAMA_BENCH=/path/to/ik_llama.cpp/build/bin/llama-bench adds ik_llama.cpp (built by hand
# outside the repository; docs/benchmarks.md says how) as a peer row.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
build/kestrel build default -o "$DIR/w4a16-flashhead.kimg" --flashhead \
  --calib ../shared/data/oasst/en-validation.jsonl >/dev/null 2>&1
build/kestrel build default -o "$DIR/bf16.kimg" --precision bf16 >/dev/null 2>&1
IMAGES=(--image "kestrel W4A16+FlashHead=$DIR/w4a16-flashhead.kimg"
        --image "kestrel W4A16 dense head=$DIR/w4a16-flashhead.kimg --head dense"
        --image "kestrel BF16 baseline=$DIR/bf16.kimg")
PEERS=()
if [[ -n "${IK_LLAMA_BENCH:-}" ]]; then PEERS=(--peer-bench "ik_llama.cpp=$IK_LLAMA_BENCH -fa 1"); fi
for shape in "2048 128" "3072 50"; do
  set -- $shape
  echo "### $( [[ $1 == 2048 ]] && echo Prefill || echo Decode ): $1 tokens in, $2 out"
  echo
  python3 scripts/bench/run_vs_llamacpp.py --runs "$RUNS" --prompt "$1" --out-tokens "$2" \
    "${IMAGES[@]}" "${PEERS[@]}" 2>/dev/null
  echo
done
