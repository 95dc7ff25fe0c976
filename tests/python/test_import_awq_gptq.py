"""kestrel build from AWQ and GPTQ W4A16 checkpoints (docs/export.md, "Import: AWQ and GPTQ"),
on tiny random Gemma 3 models made here (tiny_gemma3: 2 layers, hidden 256, vocabulary 512).

- With the libraries (skipped with a message where they are absent; `scripts/install_deps.sh
  --awq-gptq-check` installs them): GPTQ checkpoints quantized and saved by GPTQModel itself (its
  GPTQ algorithm on random calibration tokens, `gptq` v1 asymmetric and `gptq_v2` symmetric) and an
  AWQ checkpoint packed by AutoAWQ itself (its quantizer's pseudo_quantize_tensor and
  WQLinear_GEMM.from_linear, the two steps of AwqQuantizer._apply_quant, and the config its
  to_transformers_dict writes). kestrel build keeps them exactly: the image's codes, fp16 scales
  and integer zero points equal what the library's own unpacking yields (GPTQModel's
  TorchLinear.dequantize_weight after its v1 -> v2 conversion; AutoAWQ's unpack_awq and
  reverse_awq_order), and the dequantized weights d * (q - z) equal the library's dequantization
  (with float32 scales) bit for bit. transformers (with GPTQModel's CPU kernels) runs the same
  checkpoint: Kestrel's greedy continuations are checked step by step against its logits. A
  GPTQModel checkpoint with desc_act (activation order) is refused with a clear error.
- Without them (numpy only): a GPTQ and an AWQ checkpoint packed here by the layouts the docs state
  (the libraries' packers are checked against those layouts above and in the C++ unit tests) import
  exactly, and damaged or unsupported checkpoints fail with exit status 1 and a message naming why.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serve_helpers import KESTREL

np = pytest.importorskip("numpy")
from test_export import _read as read_image  # noqa: E402  (the INT4 tensors and kestrel.quant.* keys of an image)

pytestmark = pytest.mark.skipif(not KESTREL.exists(), reason="build/kestrel missing")

H, N_HEADS, N_KV, HEAD_DIM, D_FF, N_LAYERS, N_VOCAB = 256, 2, 1, 128, 512, 2, 512
# HF module -> (GGUF name, out_features, in_features)
LINEARS = {
    "self_attn.q_proj": ("attn_q", N_HEADS * HEAD_DIM, H),
    "self_attn.k_proj": ("attn_k", N_KV * HEAD_DIM, H),
    "self_attn.v_proj": ("attn_v", N_KV * HEAD_DIM, H),
    "self_attn.o_proj": ("attn_output", H, N_HEADS * HEAD_DIM),
    "mlp.gate_proj": ("ffn_gate", D_FF, H),
    "mlp.up_proj": ("ffn_up", D_FF, H),
    "mlp.down_proj": ("ffn_down", H, D_FF),
}
GROUP = 32
NEAR_TIE = 0.25  # logits; as tests/python/test_export.py
N_TOKENS = 16


def run(*args, timeout=600):
    return subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True, timeout=timeout)


# --- safetensors with numpy ------------------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64}


def write_safetensors(path, tensors):
    """tensors: name -> (safetensors dtype, numpy array); BF16 given as uint16 bits."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, a) in tensors.items():
        b = np.ascontiguousarray(a.astype(_ST_DTYPES[dtype])).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def read_safetensors(path):
    b = Path(path).read_bytes()
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(b[8 + n + s:8 + n + t], dtype=_ST_DTYPES[e["dtype"]]).reshape(e["shape"]))
    return out


# --- the tiny model ----------------------------------------------------------------------------

def tiny_gemma3(d, seed=0):
    """A random Gemma 3 text model as a Hugging Face directory: float32 weights, a 512-token
    vocabulary (4 specials, 256 byte pieces, letters), 2 layers (sliding, global)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    pieces = specials + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581" + a for a in "abcdefghijklmnopqrstuvwxyz"]
    pieces += [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    pieces = pieces[:N_VOCAB]
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, s in enumerate(specials)],
           "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
           "pre_tokenizer": None, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                     "vocab": {p: i for i, p in enumerate(pieces)}, "merges": []}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
        "add_bos_token": True, "add_eos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}))
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": H,
           "intermediate_size": D_FF, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
           "num_key_value_heads": N_KV, "head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM,
           "vocab_size": N_VOCAB, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "rope_local_base_freq": 10000.0, "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"],
           "hidden_activation": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
           "tie_word_embeddings": True, "final_logit_softcapping": None, "attn_logit_softcapping": None,
           "torch_dtype": "float32"}
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    rng = np.random.default_rng(seed)

    def r(*shape, std=0.08):
        return rng.standard_normal(shape).astype(np.float32) * np.float32(std)

    # Small embeddings and a large final norm: the layers matter and the logits spread (std ~3).
    sd = {"model.embed_tokens.weight": r(N_VOCAB, H, std=0.03), "model.norm.weight": 5.0 + r(H, std=0.1)}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        for mod, (_, out_f, in_f) in LINEARS.items():
            sd[p + mod + ".weight"] = r(out_f, in_f)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            sd[p + n + ".weight"] = r(H, std=0.1)
        sd[p + "self_attn.q_norm.weight"] = r(HEAD_DIM, std=0.1)
        sd[p + "self_attn.k_norm.weight"] = r(HEAD_DIM, std=0.1)
    write_safetensors(d / "model.safetensors", {k: ("F32", v) for k, v in sd.items()})
    return d


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return tiny_gemma3(tmp_path_factory.mktemp("tiny") / "dense")


# --- reading the image back ----------------------------------------------------------------

def image_linear(t, layer, mod):
    """(codes int [out, in], fp16 scales [out, in/G], integer zero points int [out, in/G] or None
    for a symmetric matrix) of the image; each minimum must be exactly fp16(-d * z), z in 0..15."""
    g, rows, cols = f"blk.{layer}.{LINEARS[mod][0]}.weight", LINEARS[mod][1], LINEARS[mod][2]
    q4 = t[g + ".q4"].reshape(rows, cols // GROUP, GROUP // 2)
    codes = np.concatenate([q4 & 0xF, q4 >> 4], axis=2).reshape(rows, cols).astype(np.int32)  # kW4: j, j + G/2
    d = t[g + ".scales"].view(np.float16).reshape(rows, -1)
    if g + ".mins" not in t:
        return codes, d, None
    m = t[g + ".mins"].view(np.float16).reshape(rows, -1)
    z = np.rint(-m.astype(np.float32) / np.where(d == 0, 1, d).astype(np.float32)).astype(np.int32)
    assert ((z >= 0) & (z <= 15)).all(), g
    want = (np.float32(0) - d.astype(np.float32) * z).astype(np.float16)  # +0 for z = 0 (quant::integer_zero_point_min)
    assert np.array_equal(want.view(np.uint16), m.view(np.uint16)), g
    return codes, d, z


def image_dequant(codes, d, z):
    """d * (q - z) in float32 (one rounding of an exact product), z = 8 for a symmetric matrix."""
    zz = np.full(d.shape, 8, np.int32) if z is None else z
    return np.repeat(d.astype(np.float32), GROUP, axis=1) * (codes - np.repeat(zz, GROUP, axis=1)).astype(np.float32)


# --- packing from the documented layouts (numpy; the library tests check the libraries agree) ---

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # output of each nibble within an AWQ gemm word


def pack_gptq(codes, zeros, v1):
    """codes [out, in], zeros [out, in/G] (0..15) -> qweight [in/8, out], qzeros [in/G, out/8] int32."""
    out_f, in_f = codes.shape
    qw = np.zeros((in_f // 8, out_f), np.uint32)
    for j in range(8):
        qw |= codes.T[j::8].astype(np.uint32) << np.uint32(4 * j)
    qz = np.zeros((zeros.shape[1], out_f // 8), np.uint32)
    for j in range(8):
        qz |= zeros.T[:, j::8].astype(np.uint32) << np.uint32(4 * j)
    if v1:
        qz = qz - np.uint32(0x11111111)  # modulo 2^32, as GPTQModel's v2 -> v1 conversion
    return qw.view(np.int32), qz.view(np.int32)


def pack_awq(codes, zeros):
    """codes [out, in], zeros [out, in/G] -> qweight [in, out/8], qzeros [in/G, out/8] int32."""
    def pack(a):  # a [n, out]
        w = np.zeros((a.shape[0], a.shape[1] // 8), np.uint32)
        for i, o in enumerate(AWQ_ORDER):
            w |= a[:, o::8].astype(np.uint32) << np.uint32(4 * i)
        return w.view(np.int32)
    return pack(codes.T), pack(zeros.T)


def packed_checkpoint(dense, d, kind, seed=1, sym=False):
    """The dense model's Linears replaced by random codes, fp16 scales and zero points packed as
    `kind` ("gptq", "gptq_v2" or "awq"); returns {hf_base: (codes, scales, zeros)}."""
    shutil.copytree(dense, d)
    sd = read_safetensors(d / "model.safetensors")
    rng = np.random.default_rng(seed)
    out, expected = {}, {}
    for name, (dt, a) in sd.items():
        base = name[: -len(".weight")]
        if not any(base.endswith(m) for m in LINEARS):
            out[name] = (dt, a)
            continue
        rows, cols = a.shape
        codes = rng.integers(0, 16, (rows, cols)).astype(np.int32)
        scales = (rng.random((rows, cols // GROUP)) * 0.01 + 1e-3).astype(np.float16)
        zeros = np.full((rows, cols // GROUP), 8, np.int32) if sym else rng.integers(0, 16, (rows, cols // GROUP)).astype(np.int32)
        zeros[0, 0] = 8 if sym else 0  # a zero point 0: a borrow across the v1 word
        if kind == "awq":
            qw, qz = pack_awq(codes, zeros)
        else:
            qw, qz = pack_gptq(codes, zeros, kind == "gptq")
            out[base + ".g_idx"] = ("I32", np.arange(cols, dtype=np.int32) // GROUP)
        out[base + ".qweight"] = ("I32", qw)
        out[base + ".qzeros"] = ("I32", qz)
        out[base + ".scales"] = ("F16", scales.T.copy())
        expected[base] = (codes, scales, zeros)
    write_safetensors(d / "model.safetensors", out)
    cfg = json.loads((d / "config.json").read_text())
    if kind == "awq":
        q = {"quant_method": "awq", "zero_point": True, "group_size": GROUP, "bits": 4, "version": "gemm",
             "modules_to_not_convert": None}
    else:
        q = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": sym,
             "checkpoint_format": kind, "pack_dtype": "int32"}
    cfg["quantization_config"] = q
    (d / "config.json").write_text(json.dumps(cfg))
    return expected


def check_image(img, expected, symmetric):
    t, keys = read_image(img)
    checked = 0
    for base, (codes, scales, zeros) in expected.items():
        layer, mod = int(base.split(".")[2]), ".".join(base.split(".")[3:])
        c, d, z = image_linear(t, layer, mod)
        assert np.array_equal(c, codes), base
        assert np.array_equal(d.view(np.uint16), scales.view(np.uint16)), base
        if symmetric:
            assert z is None and (zeros == 8).all(), base
        else:
            assert np.array_equal(z, zeros), base
        checked += 1
    assert checked == N_LAYERS * len(LINEARS)
    return keys


# --- without the libraries -------------------------------------------------------------------

@pytest.mark.parametrize("kind,sym", [("gptq", False), ("gptq", True), ("gptq_v2", False), ("awq", False)])
def test_packed_checkpoint_imports_exactly(dense, tmp_path, kind, sym):
    d = tmp_path / kind
    expected = packed_checkpoint(dense, d, kind, sym=sym)
    img = tmp_path / "x.kimg"
    p = run("build", d, "-o", img, "-t", "2")
    assert p.returncode == 0, p.stderr
    keys = check_image(img, expected, sym)
    assert keys["kestrel.quant.method"] == ("awq-gemm" if kind == "awq" else kind)
    assert keys["kestrel.quant.group_size"] == GROUP
    assert keys["kestrel.quant.zero_points"] == (0 if sym else 1)
    info = run("inspect", img)
    assert info.returncode == 0 and f" {kind}/ (sha256" in info.stdout, info.stdout  # the directory, not the GGUF made from it


def test_autogptq_quantize_config_json_is_read(dense, tmp_path):
    """Older AutoGPTQ checkpoints keep the scheme in quantize_config.json (no quant_method)."""
    d = tmp_path / "gptq"
    expected = packed_checkpoint(dense, d, "gptq")
    cfg = json.loads((d / "config.json").read_text())
    q = cfg.pop("quantization_config")
    del q["quant_method"], q["pack_dtype"]
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "quantize_config.json").write_text(json.dumps(q))
    img = tmp_path / "x.kimg"
    p = run("build", d, "-o", img, "-t", "2")
    assert p.returncode == 0, p.stderr
    assert check_image(img, expected, False)["kestrel.quant.method"] == "gptq"


def test_tensor_type_on_a_quantized_checkpoint_says_its_layers_are_already_int4(dense, tmp_path):
    """Every Linear of the checkpoint is INT4 already and is kept as it is: --tensor-type has
    nothing to change, and the error says so (not that the pattern names no layer matrix)."""
    d = tmp_path / "gptq"
    packed_checkpoint(dense, d, "gptq")
    img = tmp_path / "x.kimg"
    p = run("build", d, "-o", img, "-t", "2", "--tensor-type", "attn_v=q8_0")
    assert p.returncode == 1, p.stderr
    assert "--tensor-type attn_v=q8_0: the layer matrices it names are already INT4 in the source" in p.stderr
    assert "matches no layer matrix" not in p.stderr
    assert not img.exists()
    # A pattern naming nothing at all still says that.
    p = run("build", d, "-o", img, "-t", "2", "--tensor-type", "ffn_dwn=q8_0")
    assert p.returncode == 1 and "ffn_dwn=q8_0: the pattern matches no layer matrix" in p.stderr, p.stderr


def _refused(d, tmp_path, *words):
    img = tmp_path / "refused.kimg"
    p = run("build", d, "-o", img, "-t", "2")
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "kestrel: error:" in p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    assert not img.exists()
    return p.stderr


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"].update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(d, fn):
    sd = read_safetensors(d / "model.safetensors")
    fn(sd)
    write_safetensors(d / "model.safetensors", sd)


@pytest.mark.parametrize("case", ["bits8", "gemv", "marlin", "group-1", "no_zero_point", "dynamic"])
def test_unsupported_configs_are_refused(dense, tmp_path, case):
    kind = "awq" if case in ("gemv", "no_zero_point") else "gptq"
    d = tmp_path / kind
    packed_checkpoint(dense, d, kind)
    change, words = {
        "bits8": ({"bits": 8}, ["GPTQ", "bits 8"]),
        "gemv": ({"version": "gemv"}, ["AWQ", "'gemv'"]),
        "marlin": ({"checkpoint_format": "marlin"}, ["GPTQ", "'marlin'"]),
        "group-1": ({"group_size": -1}, ["group_size -1"]),
        "no_zero_point": ({"zero_point": False}, ["zero_point false"]),
        "dynamic": ({"dynamic": {"-:.*down_proj": {}}}, ["dynamic"]),
    }[case]
    _edit_config(d, **change)
    _refused(d, tmp_path, *words)


def test_activation_order_is_refused(dense, tmp_path):
    d = tmp_path / "gptq"
    packed_checkpoint(dense, d, "gptq")

    def permute(sd):
        n = "model.layers.1.mlp.down_proj.g_idx"
        sd[n] = ("I32", np.random.default_rng(0).permutation(sd[n][1]))
    _edit_tensors(d, permute)
    _refused(d, tmp_path, "model.layers.1.mlp.down_proj.g_idx", "activation order", "desc_act")


def test_damaged_checkpoints_are_refused(dense, tmp_path):
    d = tmp_path / "gptq"
    packed_checkpoint(dense, d, "gptq")
    bad = tmp_path / "bad-shape"
    shutil.copytree(d, bad)

    def cut(sd):
        n = "model.layers.0.self_attn.k_proj.qzeros"
        sd[n] = ("I32", sd[n][1][:, :-1].copy())
    _edit_tensors(bad, cut)
    _refused(bad, tmp_path, "model.layers.0.self_attn.k_proj.qzeros")

    missing = tmp_path / "missing"
    shutil.copytree(d, missing)
    _edit_tensors(missing, lambda sd: sd.pop("model.layers.1.mlp.up_proj.scales"))
    _refused(missing, tmp_path, "model.layers.1.mlp.up_proj.scales")

    # sym = true with zero points that are not 8: the wrong checkpoint_format, or damaged qzeros.
    sym = tmp_path / "sym"
    shutil.copytree(d, sym)
    _edit_config(sym, sym=True)
    _refused(sym, tmp_path, "zero points are not 8", "sym=true")


# --- with the libraries ------------------------------------------------------------------

def _need(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed; install them with scripts/install_deps.sh --awq-gptq-check")


_GPTQMODEL_SCRIPT = r"""
import json, sys, torch
from gptqmodel import GPTQModel, QuantizeConfig
src, out, sym, fmt, desc_act = sys.argv[1], sys.argv[2], sys.argv[3] == "sym", sys.argv[4], sys.argv[5] == "desc_act"
g = torch.Generator().manual_seed(1)
calib = [{"input_ids": torch.randint(4, 512, (48,), generator=g).tolist(), "attention_mask": [1] * 48} for _ in range(16)]
qc = QuantizeConfig(bits=4, group_size=32, desc_act=desc_act, sym=sym, format=fmt, pack_impl="original")
m = GPTQModel.load(src, qc, device="cpu")
m.quantize(calib, batch_size=4)
m.save(out)
"""


def gptqmodel_quantize(dense, out, sym, fmt, desc_act=False):
    """GPTQModel's own GPTQ quantization of the tiny model (random calibration tokens), saved."""
    env = dict(os.environ, GPTQMODEL_CPU_WORKERS="2", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run([sys.executable, "-c", _GPTQMODEL_SCRIPT, str(dense), str(out), "sym" if sym else "asym", fmt,
                        "desc_act" if desc_act else "-"], capture_output=True, text=True, timeout=900, env=env,
                       cwd=out.parent)  # GPTQModel writes a logs/ folder into its working directory
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def gptq_ckpts(dense, tmp_path_factory):
    _need("torch", "gptqmodel", "transformers")
    base = tmp_path_factory.mktemp("gptq")
    return {k: gptqmodel_quantize(dense, base / k, sym, fmt)
            for k, sym, fmt in [("gptq", False, "gptq"), ("gptq_v2-sym", True, "gptq_v2")]}


def gptqmodel_reference(ckpt, base, cfg):
    """(codes [out, in], zeros [out, in/G], dequantized float32 [out, in]) through GPTQModel's own
    TorchLinear: its v1 -> v2 conversion and dequantize_weight (codes: scales 1, zero points 0;
    zero points: codes 0, scales 1; weights: float32 scales)."""
    import torch
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module
    q = cfg["quantization_config"]
    qweight, qzeros = torch.from_numpy(ckpt[base + ".qweight"][1].copy()), torch.from_numpy(ckpt[base + ".qzeros"][1].copy())
    scales = torch.from_numpy(ckpt[base + ".scales"][1].astype(np.float32))
    g_idx = torch.from_numpy(ckpt[base + ".g_idx"][1].copy())
    in_f, out_f = qweight.shape[0] * 8, qweight.shape[1]

    def dequant(qw, qz, s):
        m = TorchLinear(bits=4, group_size=q["group_size"], sym=q["sym"], desc_act=q["desc_act"], in_features=in_f,
                        out_features=out_f, bias=False, pack_dtype=torch.int32)
        m.qweight.data = qw.clone()
        m.qzeros.data = qz.clone()
        m.scales.data = s.clone()
        m.g_idx.data = g_idx.clone()
        if q.get("checkpoint_format", q.get("format", "gptq")) == "gptq":
            convert_gptq_v1_to_v2_format_module(m, bits=4, pack_dtype=torch.int32)
        return m.dequantize_weight().T.contiguous()  # [out, in]

    ones = torch.ones_like(scales)
    no_zeros = torch.zeros_like(qzeros) - (0x11111111 if q.get("checkpoint_format", "gptq") == "gptq" else 0)
    codes = dequant(qweight, no_zeros, ones).to(torch.int32).numpy()
    zeros = (-dequant(torch.zeros_like(qweight), qzeros, ones)).to(torch.int32).numpy()[:, ::q["group_size"]]
    weights = dequant(qweight, qzeros, scales).to(torch.float32).numpy()
    return codes, zeros, weights


def _check_against_library(img, ckpt_dir, reference, symmetric):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    ckpt = read_safetensors(ckpt_dir / "model.safetensors")
    t, keys = read_image(img)
    checked = 0
    for layer in range(N_LAYERS):
        for mod in LINEARS:
            base = f"model.layers.{layer}.{mod}"
            codes, zeros, weights = reference(ckpt, base, cfg)
            c, d, z = image_linear(t, layer, mod)
            assert np.array_equal(c, codes), base
            assert np.array_equal(d.view(np.uint16), ckpt[base + ".scales"][1].T.view(np.uint16)), base
            if symmetric:
                assert z is None and (zeros == 8).all(), base
            else:
                assert np.array_equal(z, zeros), base
            assert np.array_equal(image_dequant(c, d, z).view(np.uint32), weights.view(np.uint32)), base
            checked += 1
    assert checked == N_LAYERS * len(LINEARS)
    return keys


PROMPTS = [[2] + list(np.random.default_rng(i).integers(4, N_VOCAB, 6 + i)) for i in range(8)]


def _kestrel_greedy(image, ids, tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ids)))
    p = run("run", "-m", image, "--token-ids", f, "-n", N_TOKENS, "--temp", "0", "--head", "dense",
            "--ignore-eos", "--json", "-t", "2")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["tokens"]


def _check_greedy(model, image, tmp_path):
    """Every step of Kestrel's greedy continuation, teacher-forced through `model`: Kestrel's token
    is the reference's argmax or within NEAR_TIE logits of it."""
    import torch
    exact = steps = identical = 0
    worst = 0.0
    for ids in PROMPTS:
        ids = [int(i) for i in ids]
        ours = _kestrel_greedy(image, ids, tmp_path)
        assert len(ours) == N_TOKENS
        with torch.no_grad():
            logits = model(torch.tensor([ids + ours])).logits[0].float()
        all_argmax = True
        for i, tok in enumerate(ours):
            row = logits[len(ids) - 1 + i]
            gap = float(row.max() - row[tok])
            steps += 1
            exact += int(gap == 0.0)
            worst = max(worst, gap)
            assert gap <= NEAR_TIE, (ids, i, tok, int(row.argmax()), gap)
            all_argmax = all_argmax and gap == 0.0
        identical += int(all_argmax)
    print(f"\n{image.name}: {exact}/{steps} steps Kestrel's token is the reference's argmax, largest gap "
          f"{worst:.4f} logits; {identical}/{len(PROMPTS)} continuations identical")
    assert exact >= 0.9 * steps


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gptq", "gptq_v2-sym"])
def test_gptqmodel_checkpoint_is_kept_exactly_and_continues_as_transformers(gptq_ckpts, tmp_path, kind):
    import torch
    from transformers import AutoModelForCausalLM, GPTQConfig
    d = gptq_ckpts[kind]
    symmetric = kind.endswith("sym")
    img = tmp_path / f"{kind}.kimg"
    p = run("build", d, "-o", img, "-t", "2")
    assert p.returncode == 0, p.stderr
    keys = _check_against_library(img, d, gptqmodel_reference, symmetric)
    assert keys["kestrel.quant.method"] == kind.split("-")[0]
    # transformers with GPTQModel's pure-torch kernel (no JIT-compiled extension) on CPU.
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, device_map="cpu",
                                                 quantization_config=GPTQConfig(bits=4, backend="torch")).eval()
    _check_greedy(model, img, tmp_path)


@pytest.mark.slow
def test_gptqmodel_activation_order_checkpoint_is_refused(dense, tmp_path):
    _need("torch", "gptqmodel", "transformers")
    d = gptqmodel_quantize(dense, tmp_path / "desc_act", False, "gptq", desc_act=True)
    _refused(d, tmp_path, ".g_idx", "activation order")


def autoawq_checkpoint(dense, d):
    """The tiny model's Linears quantized and packed by AutoAWQ's own code, as
    AwqQuantizer._apply_quant does (fp16 weights, pseudo_quantize_tensor with zero points, scales
    and zeros transposed, WQLinear_GEMM.from_linear), dense tensors in fp16 and AutoAWQ's
    quantization_config (AwqConfig.to_transformers_dict)."""
    import types

    import torch
    from awq.models._config import AwqConfig
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.quantize.quantizer import AwqQuantizer
    shutil.copytree(dense, d)
    sd = read_safetensors(d / "model.safetensors")
    quantizer = types.SimpleNamespace(zero_point=True, w_bit=4, group_size=GROUP)
    out = {}
    for name, (_, a) in sd.items():
        base = name[: -len(".weight")]
        if not any(base.endswith(m) for m in LINEARS):
            out[name] = ("F16", a.astype(np.float16))
            continue
        linear = torch.nn.Linear(a.shape[1], a.shape[0], bias=False).half()
        linear.weight.data = torch.from_numpy(a).half()
        linear.weight.data, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(quantizer, linear.weight.data)
        q = WQLinear_GEMM.from_linear(linear, 4, GROUP, init_only=False, scales=scales.t().contiguous(),
                                      zeros=zeros.t().contiguous())
        out[base + ".qweight"] = ("I32", q.qweight.numpy())
        out[base + ".qzeros"] = ("I32", q.qzeros.numpy())
        out[base + ".scales"] = ("F16", q.scales.numpy())
    write_safetensors(d / "model.safetensors", out)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = AwqConfig(q_group_size=GROUP, zero_point=True, w_bit=4, version="gemm").to_transformers_dict()
    cfg["torch_dtype"] = "float16"
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def autoawq_reference(ckpt, base, cfg):
    """(codes, zeros, dequantized float32), all [out, ...], through AutoAWQ's unpack_awq,
    reverse_awq_order and dequantize_gemm (scales as float32)."""
    import torch
    from awq.utils.packing_utils import dequantize_gemm, reverse_awq_order, unpack_awq
    qweight = torch.from_numpy(ckpt[base + ".qweight"][1].copy())
    qzeros = torch.from_numpy(ckpt[base + ".qzeros"][1].copy())
    scales = torch.from_numpy(ckpt[base + ".scales"][1].astype(np.float32))
    iw, iz = unpack_awq(qweight, qzeros, 4)
    iw, iz = reverse_awq_order(iw, iz, 4)
    codes = torch.bitwise_and(iw, 15).to(torch.int32).T.numpy()  # [out, in]
    zeros = torch.bitwise_and(iz, 15).to(torch.int32).T.numpy()  # [out, in/G]
    weights = dequantize_gemm(qweight, qzeros, scales, 4, GROUP).T.contiguous().numpy()
    return codes, zeros, weights


@pytest.mark.slow
def test_autoawq_checkpoint_is_kept_exactly_and_continues_as_transformers(dense, tmp_path):
    _need("torch", "awq", "gptqmodel", "transformers")
    import torch
    from transformers import AutoModelForCausalLM, AwqConfig
    d = autoawq_checkpoint(dense, tmp_path / "awq")
    img = tmp_path / "awq.kimg"
    p = run("build", d, "-o", img, "-t", "2")
    assert p.returncode == 0, p.stderr
    keys = _check_against_library(img, d, autoawq_reference, False)
    assert keys["kestrel.quant.method"] == "awq-gemm"
    # transformers runs AWQ through GPTQModel's kernels; its pure-torch one on CPU.
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, device_map="cpu",
                                                 quantization_config=AwqConfig(bits=4, backend="torch_awq")).eval()
    _check_greedy(model, img, tmp_path)
