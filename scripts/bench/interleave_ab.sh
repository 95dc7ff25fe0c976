#!/usr/bin/env bash
# A/B of the interleaved W4 decode kernel (docs/quantization.md): on (the default) against off
# (KESTREL_KERNELS=no-interleave), alternating, on the default model's W4A16 + FlashHead image:
# one decode step of 1, 2, 4 sequences (bench/forward_batch_bench.cpp), then kestrel bench
# --concurrency 1,2,4. Run on a quiet machine (uptime first).
#   scripts/bench/interleave_ab.sh [IMAGE]   (default /tmp/fh.kimg, built as docs/benchmarks.md says)
set -u
cd "$(dirname "$0")/../.."
image="${1:-/tmp/fh.kimg}"
echo "== $(date -u) $(uptime)"
lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:/Flags:/' | cut -c1-400
for round in 1 2 3 4; do
  for mode in on off; do
    if [ $mode = off ]; then export KESTREL_KERNELS=no-interleave; else unset KESTREL_KERNELS; fi
    echo -n "step $mode round $round: "
    KESTREL_BENCH_IMAGE="$image" KESTREL_BENCH_THREADS=2 build/bench/kestrel_forward_batch_bench \
      --benchmark_filter='DecodeStep/(1|2|4)/|ForwardBatch/(1|4)/' --benchmark_min_time=1 2>&1 \
      | grep -E "^(DecodeStep|ForwardBatch)" | awk '{printf "%s %s ms  ", $1, $2}'
    echo
  done
done
unset KESTREL_KERNELS
for mode in on off; do
  if [ $mode = off ]; then export KESTREL_KERNELS=no-interleave; else unset KESTREL_KERNELS; fi
  echo "== concurrency $mode"
  build/kestrel bench -m "fh=$image" --concurrency 1,2,4 --output-tokens 128 --prompt-tokens 64 --requests 3 -t 2 --no-progress 2>&1 | tail -8
done
unset KESTREL_KERNELS
echo "== end $(date -u) $(uptime)"
