#!/usr/bin/env bash
# Builds llama.cpp's llama-server, the serving peer of the multi-user benchmark
# (scripts/bench/multi_user_bench.py), from the llama.cpp source that the pinned llama-cpp-python
# (scripts/requirements-peers.txt) vendors: its source distribution from PyPI, CMake Release, CPU
# only, the instruction sets of scripts/llama_cpp_cmake_args.sh (no AMX), into
# ${KESTREL_PEERS:-~/.cache/kestrel/peers}/llama.cpp/bin/llama-server. Idempotent.
#   scripts/bench/build_llama_server.sh        (JOBS: parallel compile jobs, default 2)
# LLAMA_TARGETS (default "llama-server") names other tools of the same tree to build beside it:
# the long-context benchmark and the KV-cache KL comparison (docs/benchmarks.md) take
#   LLAMA_TARGETS="llama-server llama-bench llama-perplexity" scripts/bench/build_llama_server.sh
# It prints the path of the first target.
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=${KESTREL_PEERS:-$HOME/.cache/kestrel/peers}
OUT=$PEERS/llama.cpp
pin=$(grep -m1 '^llama-cpp-python==' scripts/requirements-peers.txt)
args=$(scripts/llama_cpp_cmake_args.sh)
read -r -a TARGETS <<<"${LLAMA_TARGETS:-llama-server}"
info="$pin $args"
have=1
for t in "${TARGETS[@]}"; do [[ -x "$OUT/bin/$t" ]] || have=0; done
if [[ $have == 1 && "$(cat "$OUT/BUILD_INFO" 2>/dev/null)" == "$info" ]]; then
  echo "$OUT/bin/${TARGETS[0]}"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: -d "$work" "$pin" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
[[ -f "$src/CMakeLists.txt" ]] || { echo "build_llama_server.sh: no vendored llama.cpp in the sdist" >&2; exit 1; }
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON $args >&2
cmake --build "$work/build" -j"${JOBS:-2}" --target "${TARGETS[@]}" >&2
mkdir -p "$OUT/bin"
for t in "${TARGETS[@]}"; do cp "$work/build/bin/$t" "$OUT/bin/"; done
# Tools built by an earlier call from another source are stale: BUILD_INFO names one tree.
if [[ "$(cat "$OUT/BUILD_INFO" 2>/dev/null)" != "$info" ]]; then
  for f in "$OUT"/bin/*; do
    keep=0
    for t in "${TARGETS[@]}"; do [[ "$(basename "$f")" == "$t" ]] && keep=1; done
    [[ $keep == 1 ]] || rm -f "$f"
  done
fi
echo "$info" >"$OUT/BUILD_INFO"
echo "$OUT/bin/${TARGETS[0]}"
