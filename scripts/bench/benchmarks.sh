#!/usr/bin/env bash
# Builds the W4A16+FlashHead (calibrated) and BF16 images of the default model, then runs Kestrel
# and llama.cpp side by side (scripts/bench/run_vs_llamacpp.py) on the prefill shape (2,048 in,
# 128 out) and the decode shape (3,072 in, 50 out). Prints Markdown.
#   scripts/bench/benchmarks.sh [RUNS (default 5)]
# ik_llama.cpp, an optional peer (built outside the repository by scripts/bench/build_ik_llama.sh;
# IK_LLAMA_BENCH=PATH names another llama-bench), adds two rows, flash attention on, without and
# with -rtr 1 (run-time repacking); where it is not built, one line says it is skipped.
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
IK=${IK_LLAMA_BENCH:-${KESTREL_PEERS:-$HOME/.cache/kestrel/peers}/ik_llama.cpp/bin/llama-bench}
if [[ -x "$IK" ]]; then
  PEERS=(--peer-bench "ik_llama.cpp=$IK -fa 1" --peer-bench "ik_llama.cpp -rtr 1=$IK -fa 1 -rtr 1")
else
  echo "ik_llama.cpp: skipped (no $IK; scripts/bench/build_ik_llama.sh builds it)" >&2
fi
for shape in "2048 128" "3072 50"; do
  set -- $shape
  echo "### $( [[ $1 == 2048 ]] && echo Prefill || echo Decode ): $1 tokens in, $2 out"
  echo
  python3 scripts/bench/run_vs_llamacpp.py --runs "$RUNS" --prompt "$1" --out-tokens "$2" \
    "${IMAGES[@]}" "${PEERS[@]}" 2>/dev/null
  echo
done
