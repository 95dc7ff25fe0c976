#!/usr/bin/env python3
"""A full-size Gemma 4 E4B-shaped model with random weights, as a BF16 gemma4 GGUF (docs/gemma4.md).

Not a real model: the shapes, metadata and tokenizer layout of E4B (42 layers, d_model 2560,
8 query / 2 KV heads, head sizes 256 / 512, MLP 10240, per-layer inputs 256 x 42 over a
262,144-token vocabulary, the last 18 layers KV-shared, sliding window 512) with random values,
for measuring build size, memory and speed. ~8 G parameters, ~16 GB; tensors are generated and
written one at a time (gguf-py's streaming writer), so memory stays near one tensor.

    python3 scripts/bench/make_e4b_shaped_gguf.py /tmp/e4b/e4b-bf16.gguf
    python3 scripts/bench/make_e4b_shaped_gguf.py --layers 12 /tmp/e4b12/e4b-bf16.gguf

--layers N (a multiple of 6) keeps every layer's shape and the sliding / global pattern (every
sixth layer global) but stacks N layers; the first 6 * round(N * 24 / 42 / 6) own their KV cache
and the rest share it, so that the last owning layer is a global one as in E4B (llama.cpp and
ik_llama.cpp take the shared layers' cache from the last two owning layers, sliding then
global, and crash on other counts): the same per-layer prefill and
decode work at a fraction of the disk and build time (~5 GB for 12 layers), for comparing
engines layer for layer. Rates per token then differ from the full model's; ratios between
engines on the same file are what such a file is for.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

L, D, H, HKV, HD, GHD, FF, P, V, SHARED, WINDOW = 42, 2560, 8, 2, 256, 512, 10240, 256, 262144, 18, 512


def sliding_pattern(n_layers: int) -> list[bool]:
    """True for a sliding-window layer: five of every six, as in E4B."""
    return [(i + 1) % 6 != 0 for i in range(n_layers)]


def tensors(L: int = L, SHARED: int = SHARED):
    """(name, GGUF shape {ne0, ne1} or {n}, std) in file order; 1-D tensors are F32."""
    yield "rope_freqs.weight", (GHD // 2,), None
    yield "token_embd.weight", (D, V), 0.5
    yield "per_layer_token_embd.weight", (L * P, V), 0.5
    yield "per_layer_model_proj.weight", (D, L * P), D ** -0.5
    yield "per_layer_proj_norm.weight", (P,), 1.0
    yield "output_norm.weight", (D,), 1.0
    sliding = sliding_pattern(L)
    for i in range(L):
        hd = HD if sliding[i] else GHD
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (D,), 1.0
        yield b + "attn_q.weight", (D, H * hd), D ** -0.5
        yield b + "attn_q_norm.weight", (hd,), 0.3
        if i < L - SHARED:
            yield b + "attn_k.weight", (D, HKV * hd), D ** -0.5
            yield b + "attn_v.weight", (D, HKV * hd), D ** -0.5
            yield b + "attn_k_norm.weight", (hd,), 0.3
        yield b + "attn_output.weight", (H * hd, D), (H * hd) ** -0.5
        yield b + "post_attention_norm.weight", (D,), 1.0
        yield b + "ffn_norm.weight", (D,), 1.0
        yield b + "ffn_gate.weight", (D, FF), D ** -0.5
        yield b + "ffn_up.weight", (D, FF), D ** -0.5
        yield b + "ffn_down.weight", (FF, D), FF ** -0.5
        yield b + "post_ffw_norm.weight", (D,), 1.0
        yield b + "inp_gate.weight", (D, P), D ** -0.5
        yield b + "proj.weight", (P, D), P ** -0.5
        yield b + "post_norm.weight", (D,), 1.0
        yield b + "layer_output_scale.weight", (1,), 0.5


def to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    import gguf
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=L, help=f"decoder layers (default {L}, E4B's)")
    args = ap.parse_args()
    if args.layers < 6 or args.layers % 6 != 0:
        ap.error("--layers must be a positive multiple of 6 (the sliding / global period)")
    n_layers = args.layers
    n_shared = n_layers - 6 * max(1, round(n_layers * (L - SHARED) / L / 6))
    rng = np.random.default_rng(4)
    w = gguf.GGUFWriter(args.out, "gemma4")
    w.add_name("gemma4-e4b-shaped-random")
    w.add_context_length(131072)
    w.add_embedding_length(D)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(GHD)
    w.add_value_length(GHD)
    w.add_key_length_swa(HD)
    w.add_value_length_swa(HD)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_rope_dimension_count(GHD)
    w.add_rope_dimension_count_swa(HD)
    w.add_sliding_window(WINDOW)
    w.add_sliding_window_pattern(sliding_pattern(n_layers))
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(P)
    w.add_final_logit_softcapping(30.0)
    # A vocabulary of the real size and layout: specials, byte tokens, then filler pieces.
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [chr(c) for c in range(0x21, 0x7F)] + ["\u2581", "\n", "\u2581t", "to", "ok"]
    toks += [f"tok{i}" for i in range(V - len(toks))]
    types = [3] * 5 + [6] * 256 + [1] * (V - 261)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_token_merges(["\u2581 t", "t o", "o k"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    plan = list(tensors(n_layers, n_shared))
    for name, shape, _ in plan:
        n = int(np.prod(shape))
        if len(shape) == 1:
            w.add_tensor_info(name, shape[::-1], np.dtype(np.float32), n * 4, raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor_info(name, shape[::-1], np.dtype(np.uint16), n * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (name, shape, std) in enumerate(plan):
        if name == "rope_freqs.weight":
            a = np.array([1.0] * 64 + [1e30] * (GHD // 2 - 64), dtype=np.float32)
        elif len(shape) == 1:
            base = 1.0 if "norm" in name else 0.0
            a = (base + std * (0.2 if "norm" in name else 1.0) * rng.standard_normal(shape[0])).astype(np.float32)
            if name.endswith("layer_output_scale.weight"):
                a = np.array([rng.uniform(0.3, 1.0)], dtype=np.float32)
        else:
            rows, cols = shape[1], shape[0]
            a = np.empty((rows, cols), dtype=np.uint16)
            step = max(1, (1 << 26) // cols)
            for r in range(0, rows, step):
                e = min(rows, r + step)
                a[r:e] = to_bf16(rng.standard_normal((e - r, cols), dtype=np.float32) * np.float32(std))
        w.write_tensor_data(a)
        print(f"\r{k + 1}/{len(plan)} {name}", end="", file=sys.stderr, flush=True)
    w.close()
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
