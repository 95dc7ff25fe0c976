#!/usr/bin/env bash
# Session 9 A/B: the interleaved W4 decode kernel on (default) vs off (KESTREL_NO_INTERLEAVE=1).
set -u
cd /work/main
echo "== $(date -u) $(uptime)"
lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:/Flags:/' | cut -c1-400
for round in 1 2 3 4; do
  for mode in on off; do
    if [ $mode = off ]; then export KESTREL_NO_INTERLEAVE=1; else unset KESTREL_NO_INTERLEAVE; fi
    echo -n "step $mode round $round: "
    KESTREL_BENCH_IMAGE=/tmp/fh.kimg KESTREL_BENCH_THREADS=2 build/bench/kestrel_forward_batch_bench \
      --benchmark_filter='DecodeStep/(1|2|4)/|ForwardBatch/(1|4)/' --benchmark_min_time=1 2>&1 \
      | grep -E "^(DecodeStep|ForwardBatch)" | awk '{printf "%s %s ms  ", $1, $2}'
    echo
  done
done
unset KESTREL_NO_INTERLEAVE
for mode in on off; do
  if [ $mode = off ]; then export KESTREL_NO_INTERLEAVE=1; else unset KESTREL_NO_INTERLEAVE; fi
  echo "== concurrency $mode"
  build/kestrel bench -m fh=/tmp/fh.kimg --concurrency 1,2,4 --output-tokens 128 --prompt-tokens 64 --requests 3 -t 2 --no-progress 2>&1 | tail -8
done
unset KESTREL_NO_INTERLEAVE
echo "== end $(date -u) $(uptime)"
