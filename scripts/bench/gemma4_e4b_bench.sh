#!/usr/bin/env bash
# The E4B-shaped random model end to end (docs/benchmarks.md, "Gemma 4 E4B-shaped"):
#   1. scripts/bench/make_e4b_shaped_gguf.py writes a BF16 gemma4 GGUF (~16 GB);
#   2. kestrel build -> W4A16 image (size, peak RSS);
#   3. llama.cpp (llama-cpp-python) quantizes the same GGUF to Q4_K_M;
#   4. both decode after the same 3,072 random token ids, 2 threads, greedy, EOS ignored;
#      peak RSS of each process (GNU time) and its own timers.
# Usage: scripts/bench/gemma4_e4b_bench.sh [WORKDIR=/tmp/e4b] [N_OUT=32]
# Needs ~35 GB of disk in WORKDIR; run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-/tmp/e4b}
N_OUT=${2:-32}
N_PROMPT=3072
mkdir -p "$W"
T="/usr/bin/time -f %M"   # peak RSS in KiB on the last stderr line

[[ -f $W/e4b-bf16.gguf ]] || python3 scripts/bench/make_e4b_shaped_gguf.py "$W/e4b-bf16.gguf"

if [[ ! -f $W/e4b-w4a16.kimg ]]; then
  $T -o "$W/build.rss" build/kestrel build "$W/e4b-bf16.gguf" -o "$W/e4b-w4a16.kimg" -t 2
fi
echo "kestrel W4A16 image: $(stat -c %s "$W/e4b-w4a16.kimg") bytes; build peak RSS $(cat "$W/build.rss") KiB"

if [[ ! -f $W/e4b-q4_k_m.gguf ]]; then
  $T -o "$W/quant.rss" python3 - "$W" <<'EOF'
import sys, llama_cpp
w = sys.argv[1]
p = llama_cpp.llama_model_quantize_default_params()
p.nthread = 2
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
rc = llama_cpp.llama_model_quantize(f"{w}/e4b-bf16.gguf".encode(), f"{w}/e4b-q4_k_m.gguf".encode(), p)
sys.exit(rc)
EOF
fi
echo "llama.cpp Q4_K_M: $(stat -c %s "$W/e4b-q4_k_m.gguf") bytes"

python3 -c "
import numpy as np
ids = [2] + list(np.random.default_rng(0).integers(300, 262144, $N_PROMPT - 1))
open('$W/prompt.ids', 'w').write(' '.join(map(str, ids)))"

$T -o "$W/kestrel_run.rss" build/kestrel run -m "$W/e4b-w4a16.kimg" --token-ids "$W/prompt.ids" -n "$N_OUT" \
   --temp 0 --ignore-eos -t 2 -c 4096 --json > "$W/kestrel_run.json"
python3 -c "
import json; j = json.load(open('$W/kestrel_run.json'))
print(f\"kestrel: prefill {j['prefill_tok_s']:.2f} tok/s, decode {j['decode_tok_s']:.2f} tok/s, peak RSS $(cat "$W/kestrel_run.rss") KiB\")"

$T -o "$W/llama_run.rss" python3 - "$W" "$N_OUT" <<'EOF'
import sys, llama_cpp
w, n_out = sys.argv[1], int(sys.argv[2])
ids = [int(x) for x in open(f"{w}/prompt.ids").read().split()]
llm = llama_cpp.Llama(model_path=f"{w}/e4b-q4_k_m.gguf", n_ctx=4096, n_batch=512, n_threads=2, verbose=False)
llm.eval(ids)
for _ in range(n_out):
    tok = llm.sample(temp=0.0)
    llm.eval([tok])
perf = llama_cpp.llama_perf_context(llm.ctx)
print(f"llama.cpp: prefill {perf.n_p_eval / perf.t_p_eval_ms * 1e3:.2f} tok/s, "
      f"decode {perf.n_eval / perf.t_eval_ms * 1e3:.2f} tok/s ({perf.n_eval} steps)")
EOF
echo "llama.cpp peak RSS $(cat "$W/llama_run.rss") KiB"
