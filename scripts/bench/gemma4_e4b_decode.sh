#!/usr/bin/env bash
# Decode after a 3,072-token prompt on the E4B-shaped model, Kestrel W4A16 + FlashHead against
# llama.cpp Q4_K_M (no drafting: --draft none), alternating ROUNDS times (each Kestrel image, then llama.cpp, then again) so
# that all see the same machine; prints each run and the medians. Uses the files
# scripts/bench/gemma4_e4b_bench.sh leaves in WORKDIR (the images, e4b-q4_k_m.gguf, prompt.ids)
# and the same commands as it does. Each round also measures the machine's read bandwidth
# (kestrel_kernels_bench's Memory/ReadBandwidth, 2 threads), so that the share of it a decode step
# reaches (`run --json`'s decode_read_gb_s over it) compares figures of the same minutes.
# Usage: [IMAGES="e4b-fh.kimg e4b-fh-s8.kimg"] scripts/bench/gemma4_e4b_decode.sh [WORKDIR=/tmp/e4b] [N_OUT=32] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/llama_cpp_check.py  # llama.cpp without its crashing AMX kernels (docs/correctness.md)
W=${1:-/tmp/e4b}
N_OUT=${2:-32}
ROUNDS=${3:-3}
read -r -a IMAGES <<< "${IMAGES:-e4b-fh.kimg}"
[[ $N_OUT =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "N_OUT and ROUNDS must be positive integers" >&2; exit 2; }
for f in "${IMAGES[@]}" e4b-q4_k_m.gguf prompt.ids; do
  [[ -f $W/$f ]] || { echo "missing $W/$f: run scripts/bench/gemma4_e4b_bench.sh $W first" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= ROUNDS; i++)); do
  echo "round $i, load $(cut -d' ' -f1-3 /proc/loadavg)"
  build/bench/kestrel_kernels_bench --benchmark_filter=Memory/ReadBandwidth --benchmark_format=json 2>/dev/null |
    python3 -c "import json, sys; print(json.load(sys.stdin)['benchmarks'][0]['GB/s'] / 1e9)" > "$out/bw-$i.txt"
  echo "  read bandwidth $(cat "$out/bw-$i.txt") GB/s"
  for img in "${IMAGES[@]}"; do
    build/kestrel run -m "$W/$img" --token-ids "$W/prompt.ids" -n "$N_OUT" --temp 0 --ignore-eos \
      -t 2 -c 4096 --head flash --draft none --json > "$out/$img-$i.json"
    python3 -c "import json; j = json.load(open('$out/$img-$i.json')); print(f\"  kestrel $img  prefill {j['prefill_tok_s']:.2f} decode {j['decode_tok_s']:.2f} tok/s, reads {j['decode_read_bytes'] / 1e6:.1f} MB a step: {j['decode_read_gb_s']:.2f} GB/s\")"
  done
  python3 - "$W" "$N_OUT" > "$out/llama-$i.txt" 2> "$out/llama-$i.err" <<'PY'
import sys, llama_cpp
w, n_out = sys.argv[1], int(sys.argv[2])
ids = [int(x) for x in open(f"{w}/prompt.ids").read().split()]
llm = llama_cpp.Llama(model_path=f"{w}/e4b-q4_k_m.gguf", n_ctx=4096, n_batch=512, n_threads=2, verbose=False)
llm.eval(ids)
for _ in range(n_out):
    llm.eval([llm.sample(temp=0.0)])
perf = llama_cpp.llama_perf_context(llm.ctx)
print(perf.n_p_eval / perf.t_p_eval_ms * 1e3, perf.n_eval / perf.t_eval_ms * 1e3)
PY
  awk '{printf "  llama.cpp prefill %.2f decode %.2f tok/s\n", $1, $2}' "$out/llama-$i.txt"
done
python3 - "$out" "$ROUNDS" "${IMAGES[@]}" <<'PY'
import json, statistics, sys
out, rounds, images = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
l = [list(map(float, open(f"{out}/llama-{i}.txt").read().split())) for i in range(1, rounds + 1)]
lp, ld = statistics.median(x[0] for x in l), statistics.median(x[1] for x in l)
print(f"median of {rounds}: llama.cpp prefill {lp:.2f} decode {ld:.2f} tok/s")
for img in images:
    k = [json.load(open(f"{out}/{img}-{i}.json")) for i in range(1, rounds + 1)]
    kp, kd = statistics.median(j["prefill_tok_s"] for j in k), statistics.median(j["decode_tok_s"] for j in k)
    share = statistics.median(j["decode_read_gb_s"] / float(open(f"{out}/bw-{i}.txt").read())
                              for i, j in enumerate(k, 1))
    print(f"median of {rounds}: kestrel {img} prefill {kp:.2f} decode {kd:.2f} tok/s; "
          f"decode ratio {kd / ld:.2f}x, prefill ratio {kp / lp:.2f}x; "
          f"decode reads at {100 * share:.0f} % of the round's read bandwidth")
PY
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
