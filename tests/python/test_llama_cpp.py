"""The installed llama.cpp (llama-cpp-python), the reference and peer of the tests and benchmark
scripts, evaluates tokens on this machine, and was built the way scripts/install_deps.sh builds
it: without AMX kernels (they crash on AMX machines; docs/correctness.md)."""
import subprocess
import sys

import pytest

import llama_cpp_check
from test_cli import ROOT, model_path, needs_model


@needs_model
def test_llama_cpp_evaluates_a_prompt_and_one_token(llama_cpp):
    # The fixture fails with llama_cpp_check's message (the signal, how it was built, the fix)
    # when the child process crashes; here the module is known to work.
    assert llama_cpp_check.problem(str(model_path())) is None


def test_installed_build_has_amx_off(llama_cpp):
    flags = llama_cpp_check.build_flags()
    if flags is None:
        pytest.skip("llama-cpp-python was not installed by scripts/install_deps.sh --peers (no marker)")
    for option in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert f"-D{option}=OFF" in flags
    expected = subprocess.run([str(ROOT / "scripts" / "llama_cpp_cmake_args.sh")], capture_output=True,
                              text=True, check=True).stdout.strip()
    assert flags == expected, "built for another CPU's flags; scripts/install_deps.sh --peers rebuilds it"


def test_a_crash_is_reported_by_signal_not_as_a_crash_of_the_tests(tmp_path, monkeypatch):
    """A child that dies by a signal becomes a sentence naming the signal and the fix."""
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(llama_cpp_check, "_CHILD", crash)
    msg = llama_cpp_check.problem(str(tmp_path / "any.gguf"), timeout=60)
    assert "crashed with SIGSEGV" in msg and "install_deps.sh --peers" in msg
