"""`kestrel build TARGET --assistant DIR` and `--draft auto` with a Gemma 4 MTP assistant, as a
user runs them, on the tiny Gemma 4 models and their tiny assistants (tests/data/gemma4/,
docs/speculative.md "Gemma 4 MTP assistant"). No Python packages beyond pytest are needed."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KESTREL = Path(os.environ.get("KESTREL_BIN", ROOT / "build" / "kestrel"))
DATA = ROOT / "tests" / "data" / "gemma4"


def kestrel(*args, timeout=300):
    return subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def error_of(result):
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith("kestrel: error: "), result.stderr
    return result.stderr


@pytest.mark.parametrize("name, precision", [("e4b_tiny", "bf16"), ("e2b_tiny", "w4a16")])
def test_build_with_assistant_then_draft_auto_keeps_the_tokens(tmp_path, name, precision):
    image = tmp_path / f"{name}.kimg"
    extra = ["--tensor-type", "proj=bf16"] if precision == "w4a16" else []  # PLE rows of 16 < one group
    r = kestrel("build", DATA / name / "hf", "--assistant", DATA / name / "assistant", "-o", image,
                "--precision", precision, *extra)
    assert r.returncode == 0, r.stderr
    info = kestrel("inspect", image)
    assert info.returncode == 0 and "assistant     Gemma 4 MTP assistant, 4 layers" in info.stdout, info.stdout
    runs = {}
    for draft in ("none", "auto", "ngram"):
        r = kestrel("run", "-m", image, "-p", "The quick brown fox", "-n", 24, "--temp", 0,
                    "--ignore-eos", "--draft", draft, "--json")
        assert r.returncode == 0, r.stderr
        runs[draft] = json.loads(r.stdout)
    assert runs["auto"]["tokens"] == runs["none"]["tokens"]
    assert runs["ngram"]["tokens"] == runs["none"]["tokens"]
    assert runs["none"]["drafted_tokens"] == 0
    assert runs["auto"]["drafted_tokens"] > 0  # the image's assistant drafted
    if precision == "bf16":  # the export writes the target's text model and says so of the assistant
        out = tmp_path / "export"
        r = kestrel("export", image, "-o", out)
        assert r.returncode == 0, r.stderr
        assert "MTP assistant" in r.stderr and "is not exported" in r.stderr, r.stderr
        assert (out / "model.safetensors").exists() and "mtp." not in (out / "model.safetensors").read_bytes()[:1 << 20].decode("latin-1")


def test_assistant_errors(tmp_path):
    out = tmp_path / "x.kimg"
    # Not a Hugging Face target.
    assert "--assistant needs the target as a Gemma 4 Hugging Face checkpoint" in error_of(
        kestrel("build", DATA / "e4b_tiny" / "model.gguf", "--assistant", DATA / "e4b_tiny" / "assistant",
                "-o", out, "--precision", "bf16"))
    # An assistant for another target (1 KV head; the e4b target has 2).
    assert "reads the target's K/V of 2 heads" in error_of(
        kestrel("build", DATA / "e4b_tiny" / "hf", "--assistant", DATA / "e2b_tiny" / "assistant",
                "-o", out, "--precision", "bf16"))
    # Not an assistant.
    assert "is not a Gemma 4 assistant checkpoint" in error_of(
        kestrel("build", DATA / "e4b_tiny" / "hf", "--assistant", DATA / "e2b_tiny" / "hf",
                "-o", out, "--precision", "bf16"))
    assert not out.exists()


def test_props_name_the_images_assistant(tmp_path):
    """/props's speculative settings name the image's MTP assistant and whether it drafts (only
    --draft auto drafts with it); an image without one says null."""
    from serve_helpers import Server
    image = tmp_path / "e4b.kimg"
    r = kestrel("build", DATA / "e4b_tiny" / "hf", "--assistant", DATA / "e4b_tiny" / "assistant", "-o", image,
                "--precision", "bf16")
    assert r.returncode == 0, r.stderr
    for draft, drafting in (("auto", True), ("ngram", False)):
        server = Server("-m", image, "--draft", draft)
        try:
            spec = server.request("GET", "/props")[1]["speculative"]
            assert spec["draft"] == draft
            # the tiny assistant: 4 layers of width 48 (assistant/config.json's text_config.hidden_size)
            assert spec["mtp_assistant"] == {"kind": "gemma4-mtp", "layers": 4, "width": 48, "drafting": drafting}, spec
        finally:
            assert server.stop() == 0
    server = Server("-m", DATA / "e4b_tiny" / "model.gguf")
    try:
        assert server.request("GET", "/props")[1]["speculative"]["mtp_assistant"] is None
    finally:
        assert server.stop() == 0
