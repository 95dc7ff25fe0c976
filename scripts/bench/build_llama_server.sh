#!/usr/bin/env bash
# Builds llama.cpp's llama-server, the serving peer of the multi-user benchmark
# (scripts/bench/multi_user_bench.py), from the llama.cpp source that the pinned llama-cpp-python
# (scripts/requirements-peers.txt) vendors: its source distribution from PyPI, CMake Release, CPU
# only, the instruction sets of scripts/llama_cpp_cmake_args.sh (no AMX), into
# ${KESTREL_PEERS:-~/.cache/kestrel/peers}/llama.cpp/bin/llama-server. Idempotent.
#   scripts/bench/build_llama_server.sh        (JOBS: parallel compile jobs, default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=${KESTREL_PEERS:-$HOME/.cache/kestrel/peers}
OUT=$PEERS/llama.cpp
pin=$(grep -m1 '^llama-cpp-python==' scripts/requirements-peers.txt)
args=$(scripts/llama_cpp_cmake_args.sh)
info="$pin $args"
if [[ -x "$OUT/bin/llama-server" && "$(cat "$OUT/BUILD_INFO" 2>/dev/null)" == "$info" ]]; then
  echo "$OUT/bin/llama-server"
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
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON $args >&2
cmake --build "$work/build" -j"${JOBS:-2}" --target llama-server >&2
mkdir -p "$OUT/bin"
cp "$work/build/bin/llama-server" "$OUT/bin/"
echo "$info" >"$OUT/BUILD_INFO"
echo "$OUT/bin/llama-server"
