#!/usr/bin/env bash
# Builds xgrammar's C++ core (the structured-output library: JSON Schema, regex, EBNF and Lark
# grammars compiled to token masks; Apache-2.0) as a static library, from the source
# distribution PyPI serves, into a prefix that CMakeLists.txt looks in:
#   ${KESTREL_DEPS:-$HOME/.cache/kestrel/deps}/{lib/libxgrammar.a, include/xgrammar, include/dlpack}
# Idempotent: a prefix that already holds this version is left as it is. Called by
# scripts/install_deps.sh; docs/structured-output.md says how Kestrel uses the library.
# Cross builds: KESTREL_XGRAMMAR_TOOLCHAIN names a CMake toolchain file (scripts/test-arm64.sh
# passes cmake/aarch64-linux-gnu.cmake, with KESTREL_DEPS=~/.cache/kestrel/deps-aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.2.8  # keep equal to the xgrammar pin in scripts/requirements.txt (the Python reference)
PREFIX=${KESTREL_DEPS:-$HOME/.cache/kestrel/deps}
MARKER=$PREFIX/share/xgrammar/KESTREL_BUILD
TOOLCHAIN=${KESTREL_XGRAMMAR_TOOLCHAIN:-}
CMAKE_EXTRA=()
STAMP=$VERSION
if [[ -n "$TOOLCHAIN" ]]; then
  TOOLCHAIN=$(realpath "$TOOLCHAIN")
  CMAKE_EXTRA+=(-DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN")
  STAMP="$VERSION $(basename "$TOOLCHAIN" .cmake)"
fi
if [[ "$(cat "$MARKER" 2>/dev/null)" == "$STAMP" && -f $PREFIX/lib/libxgrammar.a ]]; then
  exit 0
fi

PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== xgrammar $STAMP: C++ core from its source distribution (one to four minutes on 2 cores)"
# --no-binary for xgrammar only: the sdist is what we want; its build tools may come as wheels.
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary xgrammar \
  "xgrammar==$VERSION" -d "$work" 2>&1 | grep -v "Running pip as the 'root' user" || true
tar -xzf "$work/xgrammar-$VERSION.tar.gz" -C "$work"
src=$work/xgrammar-$VERSION
# Its cmake/config.cmake turns the Python bindings on whatever -D says; they need the host's
# Python and tvm_ffi, which a cross build cannot link: without the file, the option below holds.
[[ -z "$TOOLCHAIN" ]] || rm -f "$src/cmake/config.cmake"
# Python bindings off; its -flto=auto and -Werror off (a plain static archive that any compiler
# of ours links, whatever warnings a newer GCC adds).
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DXGRAMMAR_BUILD_PYTHON_BINDINGS=OFF -DXGRAMMAR_BUILD_CXX_TESTS=OFF \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$PREFIX" ${CMAKE_EXTRA[@]+"${CMAKE_EXTRA[@]}"} >/dev/null
cmake --build "$work/build" -j"$(nproc)" >/dev/null
cmake --install "$work/build" >/dev/null
rm -f "$PREFIX/libxgrammar_bindings.so"  # installed by its CMakeLists even with the bindings off; unused
mkdir -p "$PREFIX/share/xgrammar"
cp "$src/LICENSE" "$src/NOTICE" "$PREFIX/share/xgrammar/"
printf '%s' "$STAMP" >"$MARKER"
echo "   $PREFIX/lib/libxgrammar.a"
