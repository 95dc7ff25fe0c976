"""pytest configuration shared by the CLI and server tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (minutes); CI runs a shorter version")
