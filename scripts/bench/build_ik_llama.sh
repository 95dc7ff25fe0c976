#!/usr/bin/env bash
# Builds ik_llama.cpp (github.com/ikawrakow/ik_llama.cpp, an optional benchmark peer) from a
# source tree outside this repository: llama-bench, llama-cli and llama-server, CPU only,
# CMake Release, statically linked, into ${KESTREL_PEERS:-~/.cache/kestrel/peers}/ik_llama.cpp/
# (bin/ holds the binaries, build/ the CMake tree, BUILD_INFO the commit and the CMake options).
# Idempotent: when BUILD_INFO matches the source's commit and these options, it does nothing.
#
#   scripts/bench/build_ik_llama.sh [SOURCE_DIR]       (or IK_LLAMA_SRC=SOURCE_DIR)
#
# SOURCE_DIR defaults to ${KESTREL_PEERS:-~/.cache/kestrel/peers}/ik_llama.cpp-src. Get it with
#   git clone https://github.com/ikawrakow/ik_llama.cpp ~/.cache/kestrel/peers/ik_llama.cpp-src
# (docs/benchmarks.md, "ik_llama.cpp (optional peer)", names the commit measured there).
# Environment: JOBS (parallel compile jobs, default 2), IK_LLAMA_TARGETS (default
# "llama-bench llama-cli llama-server"; a target the tree lacks is left out with a note).
#
# Instruction sets: -march=native (GGML_NATIVE=ON), as ik_llama.cpp recommends for CPUs; its
# kernels are chosen at compile time. AMX: this ik_llama.cpp has no AMX kernels (llama.cpp's
# crash on some AMX machines, docs/correctness.md); should a later tree have llama.cpp's
# GGML_AMX_* options, they are turned off here, as scripts/llama_cpp_cmake_args.sh does for
# llama-cpp-python.
set -euo pipefail

PEERS=${KESTREL_PEERS:-$HOME/.cache/kestrel/peers}
SRC=${1:-${IK_LLAMA_SRC:-$PEERS/ik_llama.cpp-src}}
OUT=$PEERS/ik_llama.cpp
JOBS=${JOBS:-2}
read -r -a TARGETS <<<"${IK_LLAMA_TARGETS:-llama-bench llama-cli llama-server}"

die() { echo "build_ik_llama.sh: error: $*" >&2; exit 1; }

if [[ ! -f "$SRC/CMakeLists.txt" || ! -d "$SRC/ggml" ]]; then
  die "no ik_llama.cpp source tree at $SRC
  get it:   git clone https://github.com/ikawrakow/ik_llama.cpp $PEERS/ik_llama.cpp-src
  then:     scripts/bench/build_ik_llama.sh [SOURCE_DIR]   (or IK_LLAMA_SRC=SOURCE_DIR)"
fi
if [[ ! -f "$SRC/examples/llama-bench/llama-bench.cpp" ]] || ! grep -q "run-time-repack" "$SRC/examples/llama-bench/llama-bench.cpp"; then
  die "$SRC does not look like ik_llama.cpp (its llama-bench has no --run-time-repack option)"
fi
command -v cmake >/dev/null || die "cmake not found (scripts/install_deps.sh installs it)"
SRC=$(cd "$SRC" && pwd)
commit=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=""
# Files missing from a partial clone (large test vocabularies, web UI sources) do not count;
# modified sources do.
if [[ "$commit" != unknown ]]; then
  changes=$(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null || true)
  if [[ -n "$changes" ]] && grep -qv '^ D ' <<<"$changes"; then dirty="+modified"; fi
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
args=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON
      -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_RPC=OFF
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON)
if grep -q "GGML_AMX" "$SRC/ggml/CMakeLists.txt"; then
  args+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs || true)
info="commit $commit$dirty
source $SRC
cmake ${args[*]}
targets ${TARGETS[*]}
cpu flags $cpu_flags"

have_all() {
  local t
  for t in "${TARGETS[@]}"; do [[ -x "$OUT/bin/$t" ]] || [[ -f "$OUT/bin/$t.absent" ]] || return 1; done
}
if [[ "$(cat "$OUT/BUILD_INFO" 2>/dev/null)" == "$info" ]] && have_all; then
  echo "ik_llama.cpp is up to date in $OUT/bin (commit ${commit:0:9}$dirty)"
  exit 0
fi

echo "== ik_llama.cpp ${commit:0:9}$dirty: configuring in $OUT/build"
mkdir -p "$OUT/bin"
rm -f "$OUT/BUILD_INFO"
cmake -S "$SRC" -B "$OUT/build" "${GEN[@]}" "${args[@]}" >"$OUT/cmake-configure.log" 2>&1 ||
  die "CMake configuration failed; see $OUT/cmake-configure.log"
present=()
known=$(cmake --build "$OUT/build" --target help 2>/dev/null || true)
for t in "${TARGETS[@]}"; do
  rm -f "$OUT/bin/$t.absent"
  if grep -qE "(^|[ :])$t(:| |$)" <<<"$known"; then
    present+=("$t")
  else
    echo "   (this tree has no $t target: skipped)"
    echo "no $t target in ik_llama.cpp $commit" >"$OUT/bin/$t.absent"
  fi
done
[[ " ${present[*]} " == *" llama-bench "* ]] || die "this tree has no llama-bench target"
echo "== building ${present[*]} with $JOBS jobs (ik_llama.cpp's kernels take a while: ~30 min on 2 cores)"
cmake --build "$OUT/build" --target "${present[@]}" -j "$JOBS" >"$OUT/cmake-build.log" 2>&1 ||
  die "build failed; see $OUT/cmake-build.log"
for t in "${present[@]}"; do
  install -m 755 "$OUT/build/bin/$t" "$OUT/bin/$t"
done
printf '%s' "$info" >"$OUT/BUILD_INFO"
echo "ik_llama.cpp built: $OUT/bin/ (${present[*]})"
