"""scripts/bench/multi_user_bench.py's `--vllm` peer: the command line and environment it starts
vLLM's OpenAI server with, and its errors (no vLLM needed; the run itself: docs/benchmarks.md)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
pytest.importorskip("openai")
import multi_user_bench as mub  # noqa: E402


@pytest.fixture
def venv(tmp_path, monkeypatch):
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    monkeypatch.setattr(mub, "VLLM_VENV", tmp_path / "venv")
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    return tmp_path


def test_vllm_command_binds_the_threads_and_passes_extra_args(venv):
    argv, env = mub.vllm_command(f"{venv / 'export'} --max-model-len 8192", 8123, 2, 3)
    assert argv[:4] == [str(venv / "venv" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert argv[4] == str(venv / "export")
    assert argv[argv.index("--port") + 1] == "8123"
    assert "--enable-prompt-tokens-details" in argv and argv[-2:] == ["--max-model-len", "8192"]
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert mub.vllm_command(str(venv / "export"), 1, 1, 4)[1]["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_vllm_command_refuses_a_folder_that_is_no_export(venv):
    with pytest.raises(SystemExit, match="not a `kestrel export` folder"):
        mub.vllm_command(str(venv / "venv"), 1, 2, 4)


def test_vllm_command_names_the_missing_venv(venv, monkeypatch):
    monkeypatch.setattr(mub, "VLLM_VENV", venv / "none")
    with pytest.raises(SystemExit, match="install_deps.sh --vllm"):
        mub.vllm_command(str(venv / "export"), 1, 2, 4)
