#!/usr/bin/env bash
# Quick start, step 2: the whole test suite. .ci/run calls exactly this.
#  1. Release build with warnings as errors; every test (unit + the real model against
#     llama.cpp goldens) through ctest.
#     On a CPU with AMX-BF16, the int8 / AMX product tests again with KESTREL_KERNELS=amx.
#     Then the Python package (pip install .) and the CLI end to end (pytest).
#  2. The unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/);
#     any report fails the run.
#  3. The unit tests cross-built for aarch64 and run under qemu-user (scripts/test-arm64.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths under the checkout hash as relative ones, so that a second clone (CI's, in a folder of
# its own) reuses the compiler cache of the first.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
# Debug builds (-g: the sanitizer build) too: by default ccache hashes the working directory
# into any compile with debug information, so a clone in another folder rebuilt all of
# build-asan/ from scratch (~10 minutes of CI on 2 cores).
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
# Each stage's heading carries the minutes since the start: where CI's time goes.
stage() { printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
scripts/install_deps.sh

stage "Release build (-Werror)"
scripts/build.sh -DKESTREL_WERROR=ON
stage "ctest: unit and model tests"
ctest --test-dir build --output-on-failure -j"$(nproc)"
if grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null; then
  # The opt-in AMX-BF16 prefill (KESTREL_KERNELS=amx, docs/kernels.md) as matmul takes it: its
  # kernel's own tests run above whatever the setting; these check matmul's choice and splits.
  stage "unit tests of the int8 and AMX products with KESTREL_KERNELS=amx"
  KESTREL_KERNELS=amx build/tests/kestrel_unit_tests --gtest_filter='W4*.*:W8A8.*:KernelRegistry.*' --gtest_brief=1
fi
stage "Python package: pip install . (build-py-*; the release build's objects from ccache, docs/python.md)"
scripts/install_python_package.sh --config-settings=cmake.define.KESTREL_WERROR=ON
stage "pytest: the CLI as a user runs it"
python3 -m pytest -q --durations=15 tests/python

stage "ASan + UBSan build of the unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKESTREL_SANITIZE=ON -DKESTREL_WERROR=ON >/dev/null
cmake --build build-asan -j"$(nproc)" --target kestrel_unit_tests
stage "ctest under sanitizers: unit tests"
ASAN_OPTIONS=abort_on_error=0:halt_on_error=1:detect_leaks=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan -L unit --output-on-failure -j"$(nproc)"

# 3. The ARM64 check (docs/arm64.md): the unit tests cross-built for aarch64 and run under
#    qemu-user, when the install step put the cross tools in (KESTREL_ARM64=0 skips it).
if [[ "${KESTREL_ARM64:-1}" != 0 ]]; then
  if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null &&
     [[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libhwy.pc ]]; then
    stage "ARM64: unit tests cross-built for aarch64, under qemu-user (scripts/test-arm64.sh)"
    scripts/test-arm64.sh
  else
    stage "ARM64: skipped (no aarch64 cross compiler, qemu-aarch64 or libhwy-dev:arm64; scripts/install_deps.sh installs them)"
  fi
fi

# 4. libFuzzer targets (fuzz/; clang): in CI, or locally when KESTREL_FUZZ_SECONDS is set
#    (seconds per target; CI runs 60). Any finding fails the run. See docs/fuzzing.md.
if [[ "${CI:-}" == "true" || -n "${KESTREL_FUZZ_SECONDS:-}" ]]; then
  stage "fuzzing (scripts/fuzz.sh)"
  scripts/fuzz.sh "${KESTREL_FUZZ_SECONDS:-60}"
fi
stage "done"
