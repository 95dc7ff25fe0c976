#!/usr/bin/env bash
# The E4B-shaped random model end to end (docs/benchmarks.md, "Gemma 4 E4B-shaped"):
#   1. scripts/bench/make_e4b_shaped_gguf.py writes a BF16 gemma4 GGUF (~15 GB);
#   2. kestrel build -> the W4A16 + FlashHead image (size, build time, peak RSS); with
#      EMB_INT4=1 also the same with --embedding int4 (token embedding and per-layer table INT4);
#      with SCALE8=1 also the same with --scale-bits 8 (8-bit group scales and minimums), and
#      with --scale-bits 8 --embedding q8_0 (embedding, per-layer table and projection Q8_0),
#      and with --scale-bits 8 --embedding int4 (the same INT4);
#   3. llama.cpp (llama-cpp-python) quantizes the same GGUF to Q4_K_M;
#   4. each row decodes N_OUT tokens after the same 3,072 random token ids, 2 threads, greedy,
#      EOS ignored, one process per row, one after the other; peak RSS of each process (GNU time)
#      and its own timers. Rows: W4A16 with the dense head (the FlashHead image run with
#      --head dense: the same INT4 layers, the head rows in another order), W4A16 + FlashHead,
#      [W4A16 + FlashHead, INT4 embeddings], llama.cpp Q4_K_M.
#   5. FlashHead's head time against the dense head on that image (kestrel flashhead-eval).
# Usage: [EMB_INT4=1] [SCALE8=1] scripts/bench/gemma4_e4b_bench.sh [WORKDIR=/tmp/e4b] [N_OUT=32]
# Needs ~31 GB of disk in WORKDIR (~36 GB with EMB_INT4=1); run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/llama_cpp_check.py  # llama.cpp without its crashing AMX kernels (docs/correctness.md)
W=${1:-/tmp/e4b}
N_OUT=${2:-32}
EMB_INT4=${EMB_INT4:-0}
SCALE8=${SCALE8:-0}
N_PROMPT=3072
mkdir -p "$W"
timed() {  # timed NAME CMD...: GNU time's peak RSS (KiB) and wall seconds into $W/NAME.time
  local name=$1; shift
  /usr/bin/time -f "%M %e" -o "$W/$name.time" "$@"
}
rss_gb() { awk '{printf "%.2f GB", $1 * 1024 / 1e9}' "$W/$1.time"; }
secs() { awk '{printf "%.0f s", $2}' "$W/$1.time"; }
echo "load at start: $(uptime)"

# The BF16 source is needed only to build what is missing (it may be deleted afterwards).
need_source=0
[[ -f $W/e4b-fh.kimg && -f $W/e4b-q4_k_m.gguf ]] || need_source=1
[[ $EMB_INT4 == 1 && ! -f $W/e4b-fh-emb4.kimg ]] && need_source=1
[[ $SCALE8 == 1 && ! ( -f $W/e4b-fh-s8.kimg && -f $W/e4b-fh-s8q8.kimg && -f $W/e4b-fh-s8i4.kimg ) ]] && need_source=1
if [[ $need_source == 1 ]]; then
  [[ -f $W/e4b-bf16.gguf ]] || python3 scripts/bench/make_e4b_shaped_gguf.py "$W/e4b-bf16.gguf"
  echo "source: $(stat -c %s "$W/e4b-bf16.gguf") bytes"
fi

IMAGES=(fh)
if [[ $EMB_INT4 == 1 ]]; then IMAGES+=(fh-emb4); fi
if [[ $SCALE8 == 1 ]]; then IMAGES+=(fh-s8 fh-s8q8 fh-s8i4); fi
for img in "${IMAGES[@]}"; do
  if [[ ! -f $W/e4b-$img.kimg ]]; then
    extra=()
    if [[ $img == fh-emb4 ]]; then extra=(--embedding int4); fi
    if [[ $img == fh-s8 ]]; then extra=(--scale-bits 8); fi
    if [[ $img == fh-s8q8 ]]; then extra=(--scale-bits 8 --embedding q8_0); fi
    if [[ $img == fh-s8i4 ]]; then extra=(--scale-bits 8 --embedding int4); fi
    echo "load before building $img: $(uptime)"
    timed "build-$img" build/kestrel build "$W/e4b-bf16.gguf" -o "$W/e4b-$img.kimg" --flashhead "${extra[@]}" -t 2
  fi
  echo "kestrel image $img: $(stat -c %s "$W/e4b-$img.kimg") bytes; build $(secs "build-$img"), peak RSS $(rss_gb "build-$img")"
done

if [[ ! -f $W/e4b-q4_k_m.gguf ]]; then
  timed quant python3 - "$W" <<'EOF'
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

kestrel_row() {  # kestrel_row NAME IMAGE [run options...]
  local name=$1 image=$2; shift 2
  echo "load before $name: $(uptime)"
  timed "run-$name" build/kestrel run -m "$W/$image" --token-ids "$W/prompt.ids" -n "$N_OUT" \
     --temp 0 --ignore-eos -t 2 -c 4096 --json "$@" > "$W/run-$name.json"
  python3 -c "
import json; j = json.load(open('$W/run-$name.json'))
print(f\"kestrel $name: prefill {j['prefill_tok_s']:.2f} tok/s, decode {j['decode_tok_s']:.2f} tok/s, \"
      f\"peak RSS $(rss_gb "run-$name")\")"
}
kestrel_row w4a16-dense e4b-fh.kimg --head dense
kestrel_row w4a16-flashhead e4b-fh.kimg --head flash
if [[ $EMB_INT4 == 1 ]]; then kestrel_row w4a16-flashhead-emb4 e4b-fh-emb4.kimg --head flash; fi
if [[ $SCALE8 == 1 ]]; then
  kestrel_row w4a16-flashhead-s8 e4b-fh-s8.kimg --head flash
  kestrel_row w4a16-flashhead-s8q8 e4b-fh-s8q8.kimg --head flash
  kestrel_row w4a16-flashhead-s8i4 e4b-fh-s8i4.kimg --head flash
fi

echo "load before llama.cpp: $(uptime)"
timed run-llama python3 - "$W" "$N_OUT" <<'EOF'
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
echo "llama.cpp peak RSS $(rss_gb run-llama)"

# Head time per position, FlashHead (the image's probes) against the dense head, over the
# first 64 positions of a text (the random model's logits; the time does not depend on them).
echo "load before flashhead-eval: $(uptime)"
build/kestrel flashhead-eval -m "$W/e4b-fh.kimg" -f README.md --positions 64 --eval-ctx 64 \
   -t 2 --temp 0 --json > "$W/flashhead-eval.json"
python3 -c "
import json; j = json.load(open('$W/flashhead-eval.json')); r = j['rows'][0]
print(f\"head time per position: dense {j['dense_head_ms']:.2f} ms, FlashHead {r['head_ms']:.2f} ms \"
      f\"({r['speedup_vs_dense']:.1f}x less), {r['probes']} probes\")"
echo "load at end: $(uptime)"
