"""pytest configuration shared by the CLI and server tests."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (minutes); CI runs a shorter version")


@pytest.fixture(scope="session")
def llama_cpp():
    """The llama_cpp module, checked to evaluate a token without crashing (a default pip build
    on an AMX machine does not: scripts/llama_cpp_check.py). Skips where it is not installed."""
    module = pytest.importorskip("llama_cpp")
    msg = llama_cpp_check.problem()
    if msg:
        pytest.fail(msg, pytrace=False)
    return module
