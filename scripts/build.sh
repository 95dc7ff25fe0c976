#!/usr/bin/env bash
# Configures and builds Kestrel in Release into build/ (ccache makes rebuilds cheap).
#   scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths under the checkout hash as relative ones: another clone's build reuses the compiler cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
