#!/usr/bin/env bash
# The model card's variants table for the default model, in one command: builds the W4A16+FlashHead
# image (calibrated on OpenAssistant text) and the BF16 baseline image if they are not there yet,
# runs the card's two suites on llama.cpp (scripts/bench/peers_bench.py, same GGUF, threads and
# token ids), then `kestrel bench` on the images with the llama.cpp row added, and draws the
# chart. Writes OUT/bench.json, OUT/bench.md, OUT/bench.png; prints the Markdown.
#   scripts/bench/card_bench.sh [OUT (default /tmp/kestrel-card-bench)] [more kestrel bench options]
# More variants are more -m options, e.g. a W4A16 image with the dense head:
#   scripts/bench/card_bench.sh /tmp/card -m "W4A16 (dense head)=/tmp/card/w4a16.kimg"
# THREADS (default: every core) sets the threads of every engine. ik_llama.cpp, an optional peer,
# adds two rows (scripts/bench/ik_llama_bench.py: its llama-bench, flash attention on, without and
# with -rtr 1, IK_RUNS repetitions, default 10) where scripts/bench/build_ik_llama.sh has built it.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/kestrel-card-bench}
shift || true
THREADS=${THREADS:-$(nproc)}
TEXT=../shared/data/oasst/en-validation.jsonl
mkdir -p "$OUT"
[[ -f "$OUT/w4a16-flashhead.kimg" ]] ||
  build/kestrel build default -o "$OUT/w4a16-flashhead.kimg" --flashhead --calib "$TEXT" >&2
[[ -f "$OUT/bf16.kimg" ]] || build/kestrel build default -o "$OUT/bf16.kimg" --precision bf16 >&2
python3 scripts/bench/peers_bench.py -t "$THREADS" --text "$TEXT" --json "$OUT/peers.json"
ROWS=(--add-rows "$OUT/peers.json")
rm -f "$OUT/ik_llama.json"
python3 scripts/bench/ik_llama_bench.py -t "$THREADS" --runs "${IK_RUNS:-10}" --json "$OUT/ik_llama.json"
[[ -f "$OUT/ik_llama.json" ]] && ROWS+=(--add-rows "$OUT/ik_llama.json")
build/kestrel bench -t "$THREADS" --text "$TEXT" \
  -m "W4A16+FlashHead=$OUT/w4a16-flashhead.kimg" -m "BF16 baseline=$OUT/bf16.kimg" "$@" \
  "${ROWS[@]}" --json "$OUT/bench.json" --markdown "$OUT/bench.md" >/dev/null
python3 scripts/bench/plot_bench.py "$OUT/bench.json" -o "$OUT/bench.png"
cat "$OUT/bench.md"
echo "(written: $OUT/bench.json, $OUT/bench.md, $OUT/bench.png)" >&2
