"""kestrel export --flashhead (docs/export.md, "FlashHead for the flash-head vLLM plugin"): the
image's FlashHead clustering in the layout Embedl's `flash-head` vLLM plugin reads
(config.json flash_head_cache_dir / flash_head_special_token_ids / n_probes,
flash_head/clustering_cache.safetensors with `centroids` and `cluster_assignments`).

On the committed tiny random Gemma 4 model (vocabulary 512, clusters of 16) built with
--flashhead:
- the file and keys as written, against the image's own FlashHead tensors (numpy, gguf);
- the plugin's own loading code (flash_head.loading.load_flash_head_from_checkpoint,
  _load_lm_head_weight, flash_head.flash_head.get_flash_head_parameters; PyPI flash-head 0.1.10,
  pure Python, importable without CUDA or vLLM) reads the export and sees the image's centroids
  and cluster members exactly, and its FlashHead module picks tokens on CPU. Skipped where torch
  or flash-head is absent (`scripts/install_deps.sh --export-check` installs both).
"""
import json
import subprocess
from pathlib import Path

import pytest

from serve_helpers import KESTREL

np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gemma4" / "e4b_tiny" / "hf"
CLUSTER_SIZE = 16

pytestmark = pytest.mark.skipif(not KESTREL.exists(), reason="build/kestrel missing")


def run(*args):
    return subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    d = tmp_path_factory.mktemp("export-flashhead")
    img = d / "fh.kimg"
    p = run("build", TINY, "-o", img, "-t", "2", "--symmetric", "--tensor-type", "proj=bf16", "--flashhead",
            "--cluster-size", CLUSTER_SIZE)
    assert p.returncode == 0, p.stderr
    out = d / "fh-hf"
    p = run("export", img, "-o", out, "--flashhead", "--dtype", "float32", "-t", "2")
    assert p.returncode == 0, p.stderr
    assert "32 clusters" in p.stdout and "flash-head" in p.stdout
    return img, out


def _image_flashhead(img):
    """(row_tokens, centroids [clusters, d] float32, special tokens, probes) of the image."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(img))
    t = {x.name: x for x in r.tensors}
    row_tokens = np.asarray(t["flashhead.row_tokens"].data).astype(np.int64).reshape(-1)
    c = t["flashhead.centroids"]
    centroids = gguf.quants.dequantize(c.data, c.tensor_type).astype(np.float32).reshape(-1, int(c.shape[0]))
    special = np.asarray(t["flashhead.special_tokens"].data).astype(np.int64).reshape(-1).tolist()
    probes = int(r.fields["kestrel.flashhead.probes"].contents())
    return row_tokens, centroids, special, probes


def _read_safetensors(path):
    b = Path(path).read_bytes()
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        dt = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        s, end = e["data_offsets"]
        out[name] = np.frombuffer(b, dtype=dt, count=(end - s) // np.dtype(dt).itemsize, offset=8 + n + s).reshape(e["shape"])
    return out


def test_cache_file_and_config_match_the_image(export):
    img, d = export
    row_tokens, centroids, special, probes = _image_flashhead(img)
    c = json.loads((d / "config.json").read_text())
    assert c["flash_head_cache_dir"] == "flash_head"
    assert c["flash_head_special_token_ids"] == special and c["n_probes"] == probes
    t = _read_safetensors(d / "flash_head" / "clustering_cache.safetensors")
    assert set(t) == {"centroids", "cluster_assignments"}
    assert t["centroids"].shape == (64, 32) and t["cluster_assignments"].shape == (512,)
    assert np.array_equal(t["centroids"], centroids.T)
    expected = np.empty(512, dtype=np.int64)
    expected[row_tokens] = np.arange(512) // CLUSTER_SIZE
    assert np.array_equal(t["cluster_assignments"], expected)
    assert json.loads((d / "kestrel_export.json").read_text())["image"]["flashhead_exported"] is True


def test_export_without_flashhead_removes_an_earlier_cache(export, tmp_path):
    img, _ = export
    out = tmp_path / "again"
    assert run("export", img, "-o", out, "--flashhead", "-t", "2").returncode == 0
    assert (out / "flash_head" / "clustering_cache.safetensors").exists()
    p = run("export", img, "-o", out, "-t", "2")
    assert p.returncode == 0, p.stderr
    assert not (out / "flash_head").exists()  # no empty directory left behind
    assert "flash_head_cache_dir" not in json.loads((out / "config.json").read_text())
    # A flash_head/ holding files of the user's own is kept (only the export's file goes).
    assert run("export", img, "-o", out, "--flashhead", "-t", "2").returncode == 0
    (out / "flash_head" / "notes.txt").write_text("mine")
    assert run("export", img, "-o", out, "-t", "2").returncode == 0
    assert not (out / "flash_head" / "clustering_cache.safetensors").exists()
    assert (out / "flash_head" / "notes.txt").read_text() == "mine"


def test_flashhead_needs_a_flashhead_image(tmp_path):
    img = tmp_path / "plain.kimg"
    p = run("build", TINY, "-o", img, "-t", "2", "--symmetric", "--tensor-type", "proj=bf16")
    assert p.returncode == 0, p.stderr
    p = run("export", img, "-o", tmp_path / "x", "--flashhead")
    assert p.returncode == 1 and "--flashhead" in p.stderr
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_the_plugin_loads_the_export(export):
    """The flash-head plugin's own loaders read the export; what they see is the image's."""
    try:
        import torch
        from flash_head.flash_head import FlashHead, get_flash_head_parameters
        from flash_head.loading import _load_lm_head_weight, load_flash_head_from_checkpoint
    except Exception as e:  # ImportError, or torch failing to load its libraries
        pytest.skip(f"torch + flash-head not importable ({e}); install them with scripts/install_deps.sh --export-check")
    img, d = export
    row_tokens, centroids, special, probes = _image_flashhead(img)
    meta = load_flash_head_from_checkpoint(str(d), dtype=torch.float32)
    assert meta is not None and Path(meta["cache_dir"]) == d / "flash_head"
    assert meta["special_token_ids"] == special and meta["n_probes"] == probes
    w, key = _load_lm_head_weight(str(d))
    assert key == "model.embed_tokens.weight" and tuple(w.shape) == (512, 64)
    lm_head = torch.nn.Linear(64, 512, bias=False)
    lm_head.weight.data.copy_(w)
    params = get_flash_head_parameters(lm_head, cache_dir=meta["cache_dir"], model_or_dir=meta["model_path"])
    assert np.array_equal(params["centroids"].numpy(), centroids.T)
    maps = params["vocab_maps_tensor"].numpy()
    assert maps.shape == (32, CLUSTER_SIZE)
    for k in range(32):
        assert sorted(maps[k].tolist()) == sorted(row_tokens[k * CLUSTER_SIZE:(k + 1) * CLUSTER_SIZE].tolist()), k
    # Its FlashHead module (what the plugin runs in vLLM's logits processor) picks tokens on CPU:
    # the best-scoring token of the probed clusters and the special tokens.
    head = FlashHead(lm_head, **params, n_probes=meta["n_probes"], special_token_ids=meta["special_token_ids"])
    g = torch.Generator().manual_seed(0)
    agree = 0
    for _ in range(32):
        h = torch.randn(1, 1, 64, generator=g)
        with torch.no_grad():
            token = int(head.get_next_token(h))
            top = head._get_top_clusters(h)[0, 0].tolist()
            candidates = set(maps[top].reshape(-1).tolist()) | set(special)
            best = max(candidates, key=lambda t: float(w[t] @ h[0, 0]))
        assert token == best
        agree += int(token == int((w @ h[0, 0]).argmax()))
    print(f"\nflash-head plugin on random hidden states: {agree}/32 tokens equal the dense argmax")
