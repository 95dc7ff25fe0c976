#!/usr/bin/env bash
# The 64-bit ARM check (the CPU of Jetson Orin, Raspberry Pi 4/5, Graviton): cross-compiles the
# core library and its unit tests (tests/unit) for aarch64 with Debian's cross compiler and
# Highway's NEON target, then runs the unit tests under qemu-user on this x86 machine.
#   scripts/test-arm64.sh
# Needs the cross tools and the target's libraries, which scripts/install_deps.sh installs
# (Debian multiarch) unless KESTREL_ARM64=0. Builds into build-arm64/ (ccache makes rebuilds
# cheap), and xgrammar's C++ core for aarch64 into ${KESTREL_DEPS_AARCH64:-~/.cache/kestrel/deps-aarch64}
# once. Arguments go to the test binary (e.g. --gtest_filter=W4.*).
# scripts/test.sh calls this when the tools are installed (KESTREL_ARM64=0 skips it).
# docs/arm64.md: what is covered, what is not (SVE), and how long it takes.
set -euo pipefail
cd "$(dirname "$0")/.."

TRIPLE=aarch64-linux-gnu
# No -L: the loader and libc come from multiarch (libc6:arm64), as the other target libraries do;
# the cross toolchain's own glibc (/usr/aarch64-linux-gnu) mixed with those hangs the first thread.
QEMU=(qemu-aarch64)
missing=()
command -v "$TRIPLE-g++" >/dev/null || missing+=("$TRIPLE-g++ (apt: g++-aarch64-linux-gnu)")
command -v qemu-aarch64 >/dev/null || missing+=("qemu-aarch64 (apt: qemu-user)")
[[ -f /usr/lib/$TRIPLE/pkgconfig/libhwy.pc ]] || missing+=("libhwy-dev:arm64")
[[ -e /lib/ld-linux-aarch64.so.1 ]] || missing+=("libc6:arm64")
if ((${#missing[@]})); then
  echo "test-arm64: missing ${missing[*]}; run scripts/install_deps.sh" >&2
  exit 2
fi

DEPS=${KESTREL_DEPS_AARCH64:-$HOME/.cache/kestrel/deps-aarch64}
TOOLCHAIN=cmake/$TRIPLE.cmake
KESTREL_DEPS=$DEPS KESTREL_XGRAMMAR_TOOLCHAIN=$TOOLCHAIN scripts/build_xgrammar.sh

echo "== aarch64 cross build of the unit tests (build-arm64/)"
# Only what the unit tests link (kestrel_core, kestrel_server): no benchmarks, tool or model tests.
KESTREL_DEPS=$DEPS cmake -S . -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKESTREL_WERROR=ON \
  -DKESTREL_BENCH=OFF -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DKESTREL_DEPS="$DEPS" >/dev/null
cmake --build build-arm64 -j"$(nproc)" --target kestrel_unit_tests

test_binary=build-arm64/tests/kestrel_unit_tests
readelf -h "$test_binary" | grep -q "Machine:.*AArch64" || {
  echo "test-arm64: $test_binary is not an aarch64 executable" >&2
  exit 1
}
# One process for the whole suite (a process per test, as ctest runs them, pays qemu's start-up
# for each); qemu's default CPU model ("max") has NEON, dotprod, i8mm, bf16 and SVE2.
echo "== unit tests under ${QEMU[*]}"
GTEST_BRIEF=1 "${QEMU[@]}" "$test_binary" "$@"
