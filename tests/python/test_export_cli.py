"""kestrel export's command line (docs/export.md): `default` as IMAGE, and an output directory
holding weight files the export does not write. Uses the committed tiny Gemma 4 model (fast;
no default model needed)."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from serve_helpers import KESTREL

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gemma4" / "e4b_tiny" / "hf"

pytestmark = pytest.mark.skipif(not KESTREL.exists(), reason="build/kestrel missing")


def run(*args, env=None):
    return subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    img = tmp_path_factory.mktemp("export-cli") / "tiny.kimg"
    p = run("build", TINY, "-o", img, "-t", "2", "--symmetric", "--tensor-type", "proj=bf16")
    assert p.returncode == 0, p.stderr
    return img


def test_default_is_the_cached_default_image(image, tmp_path):
    """`kestrel export default` reads the image `kestrel build default --as-default` caches, as
    `kestrel run -m default` does; without one it says how to build it."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "KESTREL_MODEL"}
    env["KESTREL_CACHE"] = str(cache)
    p = run("export", "default", "-o", tmp_path / "none", env=env)
    assert p.returncode == 1
    assert "no default image" in p.stderr and "--as-default" in p.stderr
    assert not (tmp_path / "none").exists()
    cached = cache / "images" / "gemma-3-270m-w4a16-flashhead.kimg"  # runtime::default_image_path()
    cached.parent.mkdir(parents=True)
    shutil.copy(image, cached)
    p = run("export", "default", "-o", tmp_path / "out", "-t", "2", env=env)
    assert p.returncode == 0, p.stderr
    assert str(cached) in p.stdout
    assert json.loads((tmp_path / "out" / "kestrel_export.json").read_text())["image"]["file"] == cached.name


def test_stray_weight_files_are_refused_or_removed_with_force(image, tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    stray = ["model-00001-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]
    for name in stray:
        (d / name).write_bytes(b"old")
    (d / "README.md").write_text("kept")
    p = run("export", image, "-o", d, "-t", "2")
    assert p.returncode == 1
    assert "model-00001-of-00002.safetensors" in p.stderr and "--force" in p.stderr
    assert not (d / "config.json").exists() and not (d / "model.safetensors").exists()
    p = run("export", image, "-o", d, "-t", "2", "--force")
    assert p.returncode == 0, p.stderr
    for name in stray:
        assert not (d / name).exists(), name
        assert name in p.stderr
    assert (d / "README.md").read_text() == "kept"
    # Exporting again over the export's own files needs no --force.
    p = run("export", image, "-o", d, "-t", "2")
    assert p.returncode == 0, p.stderr


def test_a_directory_named_like_a_weight_file_is_refused_or_removed_with_force(image, tmp_path):
    """A loader globbing *.safetensors fails on a directory of that name: it is refused as the
    stray files are, and --force removes it with what it holds."""
    d = tmp_path / "out"
    (d / "x.safetensors").mkdir(parents=True)
    (d / "x.safetensors" / "inside").write_bytes(b"old")
    p = run("export", image, "-o", d, "-t", "2")
    assert p.returncode == 1
    assert "x.safetensors" in p.stderr and "--force" in p.stderr
    assert not (d / "model.safetensors").exists()
    p = run("export", image, "-o", d, "-t", "2", "--force")
    assert p.returncode == 0, p.stderr
    assert not (d / "x.safetensors").exists() and "x.safetensors" in p.stderr


@pytest.mark.skipif(not Path(os.environ.get("KESTREL_MODEL", "")).exists() and
                    not (ROOT / "build" / "kestrel").exists(), reason="no default model")
def test_killed_export_leaves_no_partial_file(tmp_path):
    """A SIGTERM during the export removes DIR/model.safetensors.partial, as `kestrel build`
    removes OUT.partial (the default model: float32 tensors make the write last seconds)."""
    import signal
    import time
    img = tmp_path / "sym.kimg"
    p = run("build", "default", "-o", img, "-t", "2", "--symmetric")
    if p.returncode != 0 and "default model" in p.stderr:
        pytest.skip("the default model is not installed")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "export"
    partial = out / "model.safetensors.partial"
    proc = subprocess.Popen([str(KESTREL), "export", str(img), "-o", str(out), "--dtype", "float32", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not partial.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert partial.exists(), "the export never started writing"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not partial.exists() and not (out / "model.safetensors").exists()
