#!/usr/bin/env bash
# Installs the Python package `kestrel` from this checkout (pip install .; docs/python.md):
# scikit-build-core builds the extension module in build-py-<wheel tag>/, which stays, and
# ccache serves the objects, so a second run recompiles only what changed.
#   scripts/install_python_package.sh [extra pip args...]
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
# The compiler scripts/build.sh's CMake picks (c++): pip's environment would otherwise name g++,
# and ccache would not serve the release build's objects to this build.
export CXX="${CXX:-c++}"
PY=${PYTHON:-python3}
PIP_FLAGS=(-q --disable-pip-version-check)
# A Debian system Python is "externally managed" (PEP 668), as in scripts/install_deps.sh.
if "$PY" -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")) else 1)'; then
  PIP_FLAGS+=(--break-system-packages)
fi
# The build requirements of pyproject.toml (pinned there) installed here, and no build isolation:
# an isolated build gets nanobind from a new temporary folder each time, whose changed paths
# recompile nanobind and the module (and miss ccache) on every install.
mapfile -t BUILD_REQS < <("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
"$PY" -m pip install "${PIP_FLAGS[@]}" "${BUILD_REQS[@]}" 2>&1 | grep -v "Running pip as the 'root' user" || true
"$PY" -m pip install "${PIP_FLAGS[@]}" --no-build-isolation "$@" . 2>&1 | grep -v "Running pip as the 'root' user" || true
"$PY" -c 'import kestrel, sys; print("   kestrel", kestrel.__version__, "from", kestrel.__file__)'
