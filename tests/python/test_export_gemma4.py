"""kestrel export of Gemma 4 images (docs/export.md, "Gemma 4"): the text model as transformers'
Gemma4ForCausalLM, INT4 Linears in compressed-tensors' pack-quantized format.

On the committed tiny random-weight Gemma 4 models (tests/data/gemma4/{e2b,e4b}_tiny/hf, made by
scripts/goldens/make_tiny_gemma4.py: KV sharing, per-layer embeddings, double-wide MLPs on E2B's
shared layers, proportional RoPE), built as w4a16 images (symmetric, and integer zero points):

- Round trip (needs only build/kestrel and numpy): export, then `kestrel build` from the export,
  gives the same INT4 codes, scales and minimums bit for bit.
- config.json is read by transformers' own Gemma4TextConfig (transformers only), and the
  exported tokenizer tokenizes as the source checkpoint's tokenizer.json (tokenizers only).
- transformers + compressed-tensors (skipped where torch is absent; `scripts/install_deps.sh
  --export-check` installs them): from_pretrained loads the symmetric export, compressed-tensors'
  decompressor the zero-point one, and every greedy step of `kestrel run --head dense --temp 0`
  on the image is the reference's argmax or within a near-tie margin of it.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from serve_helpers import KESTREL

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"e2b": ROOT / "tests" / "data" / "gemma4" / "e2b_tiny" / "hf",
          "e4b": ROOT / "tests" / "data" / "gemma4" / "e4b_tiny" / "hf"}

pytestmark = pytest.mark.skipif(not KESTREL.exists(), reason="build/kestrel missing")

# Logit margin within which Kestrel's greedy token may differ from the reference's argmax
# (Kestrel's fp16 KV cache and bf16 activation rounding; logits of these random models are ~15).
NEAR_TIE = 0.1

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n    return",
    "Le chat est sur la table et",
    "the the the the the",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "A healthy breakfast usually includes",
]
N_TOKENS = 16


def run(*args, timeout=600):
    return subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _int4_tensors(path):
    from test_export import int4_tensors
    return int4_tensors(path)


def _image_key(path, key):
    from test_export import image_key
    return image_key(path, key)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """w4a16 images of both tiny models: symmetric and integer zero points, group 32 (the PLE
    projections, 16 inputs, stay bf16: fewer inputs than one group)."""
    d = tmp_path_factory.mktemp("export-gemma4")
    out = {}
    for model, src in MODELS.items():
        for kind, opts in (("sym", ["--symmetric"]), ("int", ["--zero-points", "int"])):
            img = d / f"{model}-{kind}.kimg"
            p = run("build", src, "-o", img, "-t", "2", "--tensor-type", "proj=bf16", *opts)
            assert p.returncode == 0, p.stderr
            out[(model, kind)] = img
    out["dir"] = d
    return out


def _export(images, model, kind, dtype):
    target = images["dir"] / f"{model}-{kind}-{dtype}"
    if not (target / "model.safetensors").exists():
        p = run("export", images[(model, kind)], "-o", target, "--dtype", dtype, "-t", "2")
        assert p.returncode == 0, p.stderr
        assert "exact" in p.stdout
    return target


N_LAYERS = {"e2b": 6, "e4b": 8}
N_SHARED = {"e2b": 3, "e4b": 4}


@pytest.mark.parametrize("model", ["e2b", "e4b"])
def test_config_and_tensors(images, model):
    d = _export(images, model, "int", "bfloat16")
    c = json.loads((d / "config.json").read_text())
    src = json.loads((MODELS[model] / "config.json").read_text())
    src = src.get("text_config", src)
    assert c["architectures"] == ["Gemma4ForCausalLM"] and c["model_type"] == "gemma4_text"
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "global_head_dim", "layer_types", "sliding_window",
              "num_kv_shared_layers", "use_double_wide_mlp", "hidden_size_per_layer_input",
              "vocab_size_per_layer_input", "final_logit_softcapping", "rms_norm_eps", "rope_parameters",
              "tie_word_embeddings", "max_position_embeddings"):
        assert c[k] == src[k], k
    assert json.dumps(c["rms_norm_eps"]) == "1e-06"  # the float32 written as the decimal it stands for
    q = c["quantization_config"]
    w = q["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"], w["symmetric"]) == (4, "int", "group", 32, False)
    n = N_LAYERS[model]
    assert q["ignore"] == ["lm_head", "model.per_layer_model_projection"] + [
        f"model.layers.{i}.per_layer_projection" for i in range(n)]
    # Tensor names and shapes are exactly those of transformers' Gemma4ForCausalLM (KV-shared
    # layers have no k/v projections or k norm), INT4 Linears as weight_packed etc.
    b = (d / "model.safetensors").read_bytes()
    header = json.loads(b[8:8 + int.from_bytes(b[:8], "little")])
    header.pop("__metadata__")
    first_shared = n - N_SHARED[model]
    for i in range(n):
        p = f"model.layers.{i}."
        assert header[p + "layer_scalar"]["shape"] == [1]
        assert (p + "self_attn.k_proj.weight_packed" in header) == (i < first_shared)
        assert (p + "self_attn.k_norm.weight" in header) == (i < first_shared)
        assert p + "per_layer_input_gate.weight_packed" in header
        assert header[p + "per_layer_projection.weight"]["dtype"] == "BF16"
    assert "model.embed_tokens_per_layer.weight" in header and "model.per_layer_model_projection.weight" in header
    assert not any("rope_freqs" in k for k in header)


@pytest.mark.parametrize("model", ["e2b", "e4b"])
@pytest.mark.parametrize("kind", ["sym", "int"])
def test_round_trip_is_bit_exact(images, model, kind, tmp_path):
    """export, then kestrel build from the export: every INT4 code, scale and minimum is the same."""
    d = _export(images, model, kind, "bfloat16")
    out = tmp_path / "rt.kimg"
    # The PLE projections the image kept bf16 (the export's `ignore`) have fewer inputs than a
    # group: the build from the export keeps them bf16 the same way.
    p = run("build", d, "-o", out, "-t", "2", "--tensor-type", "proj=bf16")
    assert p.returncode == 0, p.stderr
    a, b = _int4_tensors(images[(model, kind)]), _int4_tensors(out)
    assert len(a) > 0 and a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    assert _image_key(out, "kestrel.quant.method") == "compressed-tensors"


@pytest.mark.parametrize("model", ["e2b", "e4b"])
def test_transformers_config_and_tokenizer(images, model):
    """transformers' Gemma4TextConfig reads config.json as written (per-layer head sizes, KV
    sharing); the exported tokenizer gives the source tokenizer.json's ids."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import AutoConfig
    d = _export(images, model, "sym", "bfloat16")
    cfg = AutoConfig.from_pretrained(str(d))
    assert type(cfg).__name__ == "Gemma4TextConfig"
    n = N_LAYERS[model]
    assert cfg.kv_sharing_modes[n - N_SHARED[model]:] == ["reuse"] * N_SHARED[model]
    ours = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    ref = tokenizers.Tokenizer.from_file(str(MODELS[model] / "tokenizer.json"))
    texts = PROMPTS + ["a\n\n\nb  c", "<|turn>user\nhi<turn|>", "ünïcödé 日本語 🙂", ""]
    for t in texts:
        assert ours.encode(t).ids == ref.encode(t).ids, t


# --- transformers + compressed-tensors -------------------------------------------------------

def _reference_libs():
    try:
        import torch  # noqa: F401
        import compressed_tensors  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # ImportError, or torch failing to load its libraries
        pytest.skip(f"torch + compressed-tensors + transformers not importable ({e}); "
                    "install them with scripts/install_deps.sh --export-check")


def _kestrel_greedy(image, ids, tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ids)))
    p = run("run", "-m", image, "--token-ids", f, "-n", N_TOKENS, "--temp", "0", "--head", "dense",
            "--ignore-eos", "--json", "-t", "2")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["tokens"]


def _decompressed_model(d):
    """The export through compressed-tensors' own decompressor (PackedQuantizationCompressor) into
    a dense transformers Gemma4ForCausalLM (scales cast to float32 first, as from_pretrained does
    for a float32 model)."""
    import torch
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = json.loads((d / "config.json").read_text())
    q = cfg.pop("quantization_config")
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**q["config_groups"]["group_0"]["weights"]))
    sd = load_file(str(d / "model.safetensors"))
    dense = {}
    for k, v in sd.items():
        if k.endswith(".weight_packed"):
            base = k[: -len(".weight_packed")]
            part = {n: sd[f"{base}.{n}"] for n in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
                    if f"{base}.{n}" in sd}
            part["weight_scale"] = part["weight_scale"].to(torch.float32)
            dense[f"{base}.weight"] = PackedQuantizationCompressor.decompress(part, scheme)["weight"].to(torch.float32)
        elif not k.endswith((".weight_scale", ".weight_zero_point", ".weight_shape")):
            dense[k] = v.to(torch.float32)
    model = Gemma4ForCausalLM(Gemma4TextConfig.from_dict(cfg)).to(torch.float32)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()


def _check_against_reference(model, image, source_dir, tmp_path):
    import torch
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(source_dir / "tokenizer.json"))
    exact = steps = identical = 0
    worst = 0.0
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids
        assert ids[0] == 2
        ours = _kestrel_greedy(image, ids, tmp_path)
        assert len(ours) == N_TOKENS
        with torch.no_grad():
            logits = model(torch.tensor([ids + ours]), use_cache=False).logits[0].float()
        all_argmax = True
        for i, t in enumerate(ours):
            row = logits[len(ids) - 1 + i]
            gap = float(row.max() - row[t])
            steps += 1
            exact += int(gap == 0.0)
            worst = max(worst, gap)
            assert gap <= NEAR_TIE, (prompt, i, t, int(row.argmax()), gap)
            all_argmax = all_argmax and gap == 0.0
        identical += int(all_argmax)
    print(f"\n{image.name}: {exact}/{steps} steps Kestrel's token is the reference's argmax, largest gap "
          f"{worst:.4f} logits; {identical}/{len(PROMPTS)} continuations identical")
    assert exact >= 0.95 * steps
    return identical


@pytest.mark.parametrize("model", ["e2b", "e4b"])
def test_transformers_loads_the_symmetric_export_and_continues_as_kestrel(images, model, tmp_path):
    """AutoModelForCausalLM.from_pretrained with compressed-tensors on the float32 export."""
    _reference_libs()
    import torch
    from transformers import AutoModelForCausalLM
    d = _export(images, model, "sym", "float32")
    m = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, attn_implementation="eager").eval()
    assert type(m).__name__ == "Gemma4ForCausalLM"
    identical = _check_against_reference(m, images[(model, "sym")], MODELS[model], tmp_path)
    assert identical >= len(PROMPTS) - 2


@pytest.mark.parametrize("model", ["e2b", "e4b"])
def test_compressed_tensors_decompresses_the_zero_point_export_as_kestrel_runs_it(images, model, tmp_path):
    """Integer zero points through compressed-tensors' decompressor (transformers 5.24's
    from_pretrained cannot load asymmetric pack-quantized checkpoints; docs/export.md)."""
    _reference_libs()
    d = _export(images, model, "int", "float32")
    identical = _check_against_reference(_decompressed_model(d), images[(model, "int")], MODELS[model], tmp_path)
    assert identical >= len(PROMPTS) - 2
