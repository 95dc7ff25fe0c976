#!/usr/bin/env bash
# Quick start, step 1: install everything, build in Release, build the default model's fast
# image, and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --peers
scripts/build.sh
# The default model's W4A16 + FlashHead image, once, where `-m default` (and no -m) finds it:
# runtime::default_image_path(). Activation-aware (AWQ) when the project's data folder is next
# to the clone; plain W4A16 otherwise.
image="${KESTREL_CACHE:-$HOME/.cache/kestrel}/images/gemma-3-270m-w4a16-flashhead.kimg"
calib=../shared/data/oasst/en-validation.jsonl
if [[ ! -f "$image" ]]; then
  echo "== kestrel build default --as-default (once: a few minutes)"
  if [[ -f "$calib" ]]; then
    ./build/kestrel build default --as-default --calib "$calib"
  else
    ./build/kestrel build default --as-default
  fi
else
  echo "== kestrel build default --as-default: already built ($image)"
fi
prompt="The three most important inventions of the twentieth century are"
echo "== kestrel run (Gemma 3 270M, W4A16 + FlashHead image, greedy): a continuation of \"$prompt\""
./build/kestrel run -p "$prompt" -n 96 --temp 0
