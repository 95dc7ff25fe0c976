#!/usr/bin/env bash
# Prints the CMAKE_ARGS that llama-cpp-python (llama.cpp) is built with for the peers: no
# -march=native and no AMX kernels (they crash on AMX machines; docs/correctness.md), the
# x86 instruction sets this CPU reports named one by one. Elsewhere, llama.cpp's defaults.
set -euo pipefail
if [[ "$(uname -m)" != "x86_64" ]]; then
  echo "-DGGML_NATIVE=ON"
  exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() {  # ON when the CPU reports every flag named
  local f
  for f in "$@"; do [[ "$flags" == *" $f "* ]] || { echo OFF; return; }; done
  echo ON
}
args=(-DGGML_NATIVE=OFF
      -DGGML_SSE42="$(has sse4_2)" -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)"
      -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)"
      -DGGML_AVX_VNNI="$(has avx_vnni)"
      -DGGML_AVX512="$(has avx512f avx512cd avx512vl avx512dq avx512bw)" -DGGML_AVX512_VBMI="$(has avx512vbmi)"
      -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)"
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
echo "${args[*]}"
