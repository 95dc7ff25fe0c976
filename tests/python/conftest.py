"""pytest configuration shared by the CLI and server tests."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (minutes); CI runs a shorter version")
    # An empty cache: "-m default" (and no -m) means the default GGUF in every test, whether or not
    # this machine has built the default image (scripts/quickstart.sh does); tests of the cached
    # image set KESTREL_CACHE themselves.
    os.environ["KESTREL_CACHE"] = config._kestrel_cache = tempfile.mkdtemp(prefix="kestrel-test-cache-")


def pytest_unconfigure(config):
    # The session's cache holds the GGUF image cache's image of the default model once a test ran
    # its GGUF (runtime/image_cache.h: ~450 MiB): removed with the folder.
    cache = getattr(config, "_kestrel_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session")
def llama_cpp():
    """The llama_cpp module, checked to evaluate a token without crashing (a default pip build
    on an AMX machine does not: scripts/llama_cpp_check.py). Skips where it is not installed."""
    module = pytest.importorskip("llama_cpp")
    msg = llama_cpp_check.problem()
    if msg:
        pytest.fail(msg, pytrace=False)
    return module
