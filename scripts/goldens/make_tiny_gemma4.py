#!/usr/bin/env python3
"""Tiny random-weight Gemma 4 models and their reference outputs (docs/gemma4.md).

Writes, for each config below (E2B-like with double-wide MLP layers, E4B-like; every Gemma 4
feature on: KV sharing, sliding and full layers, per-layer embeddings, proportional RoPE on the
full layers, layer scalars, softcap 30):
  OUT/<name>/hf/      a Hugging Face checkpoint: config.json, *.safetensors (F16), tokenizer.json
                      (E2B-like: Gemma4ForConditionalGeneration layout, two shards and an index,
                      with stand-in vision/audio tensors; E4B-like: Gemma4ForCausalLM, one file)
  OUT/<name>/model.gguf   the gemma4 GGUF layout of llama.cpp's converter, written with gguf-py
and, with --goldens, the references from HF transformers' Gemma4ForCausalLM in float32 on CPU
(eager attention) on the same (fp16-rounded) weights:
  GOLDENS/gemma4_<name>.json      prompts (token ids), greedy continuations (full recompute,
                                  no cache), the tolerance used by the test
  GOLDENS/gemma4_<name>_logits.bin float32 logits at every prompt position, prompt after prompt
  GOLDENS/gemma4_tokenizer.json   strings and HF `tokenizers` ids for the BPE proof
With --llamacpp the GGUF is also run through llama-cpp-python and its logits compared with HF
(a check of the GGUF layout; printed, not stored).

Requirements: scripts/requirements-gemma4.txt (numpy, gguf, safetensors, tokenizers; torch and
transformers only for --goldens).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import struct
from pathlib import Path

import numpy as np

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
# Gemma 4 chat/tool tokens (names as in the Gemma 4 vocabulary; ids differ in this tiny vocab).
CHAT_SPECIALS = ["<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                 "<tool_response|>", '<|"|>', "<|think|>", "<|channel>", "<channel|>", "<|turn>",
                 "<turn|>"]
# llama.cpp's converter forces these to USER_DEFINED so that they always render.
VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
           "<tool_response|>", '<|"|>'}
SPACE = "\u2581"
NEWLINE_SPLIT = r"\n+"

CORPUS = """The quick brown fox jumps over the lazy dog.
Kestrel runs Gemma models on the CPU with a small memory footprint.
def main():
    return sum(range(10))
A tokenizer splits text into tokens; the model predicts the next token.
Il était une fois une petite fille qui aimait les crêpes et le café.
Straße, Größe, Übermut und Ärger über die Brücke.
El niño comió una piña en la mañana.
Съешь же ещё этих мягких французских булок, да выпей чаю.
東京は日本の首都です。中文也可以。
the the the and and of of to to in in is is it it that that
function call weather city Paris temperature unit celsius
"""

EXTRA_CHARS = "0123456789!?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`\t"


def train_bpe(vocab_size: int):
    """A small BPE in the Gemma 4 style: SentencePiece-like pieces (U+2581 for spaces), byte
    fallback tokens, special tokens first. Returns (tokens, merges)."""
    tokens = list(SPECIALS) + list(CHAT_SPECIALS)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    lines = [line.replace(" ", SPACE) for line in CORPUS.splitlines()]
    chars = sorted(set("".join(lines)) | set(EXTRA_CHARS) | {SPACE, "\n"})
    tokens += [c for c in chars if c not in tokens]
    words = collections.Counter()
    for line in lines:
        words[tuple(line)] += 1
    words[("\n", "\n")] += 3
    merges = []
    while len(tokens) < vocab_size:
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        merges.append((a, b))
        if merged not in tokens:
            tokens.append(merged)
        new_words = collections.Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    while len(tokens) < vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
    return tokens, merges


def write_tokenizer_json(path: Path, tokens, merges):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(NEWLINE_SPLIT), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS + CHAT_SPECIALS
                            if t not in VISIBLE])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHAT_SPECIALS if t in VISIBLE])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok.save(str(path))
    return tok


CONFIGS = {
    # E2B-like: 1 KV head, (sliding x2, full) x2, the last 3 layers KV-shared with double-wide MLPs.
    # As in the real E2B / E4B, the last two KV-owning layers are (sliding, full): llama.cpp
    # maps shared layers onto those two cache slots by position.
    "e2b_tiny": dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        sliding_window=8, num_kv_shared_layers=3, use_double_wide_mlp=True,
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=512,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, max_position_embeddings=512,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1,
        bos_token_id=2),
    # E4B-like: 2 KV heads, (sliding x3, full) x2, the last 4 layers KV-shared, plain MLPs.
    "e4b_tiny": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=8, num_kv_shared_layers=4, use_double_wide_mlp=False,
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=512,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, max_position_embeddings=512,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1,
        bos_token_id=2),
}

PROMPTS = [
    "The quick brown fox",
    "Kestrel runs Gemma models on the CPU with a small memory footprint and",
    "def main():\n    return",
    "Il était une fois une petite fille qui aimait les crêpes",
    "Съешь же ещё этих мягких",
    "東京は日本の首都です。",
    "the the the and and of of to to in in is is it it that that the",
    "function call weather city Paris 🌧️ temperature",
]
N_GENERATE = 12

TOKENIZER_STRINGS = [
    "", " ", "  ", "Hello world", " leading space", "trailing space ", "double  space",
    "The quick brown fox jumps over the lazy dog.", "line one\nline two", "para\n\npara\n\n\nthree",
    "\n", "\n\n\n\n", "tab\there", "crêpes et café", "Straße Größe Ärger", "niño piña mañana",
    "Съешь же ещё этих мягких французских булок", "東京は日本の首都です。中文", "emoji 🌧️ and 🦅!",
    "<|turn>user\nHi<turn|>\n<|turn>model\n", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "<|channel>thought\nhmm<channel|>done", "<bos>text<eos>", "zzzz qqqq xxxx", "1234567890 + 98765 = ?",
    "mixed\ttabs\n and\r\nCRLF", "ÀÉÎÕÜ àéîõü", "ℵ∑∫√∞≠≤≥", "a" * 40, "the the the the the",
    "def main():\n    return sum(range(10))\n", "function call weather city Paris temperature unit celsius",
    "\u00a0nbsp\u00a0", "ünïcödé wörds", "日本語のテキストと English mixed",
]


def random_strings(n: int, seed: int = 7):
    """Random mixes of corpus words, spaces, newlines, specials, and code points from several
    scripts (some in the tiny vocabulary, most only reachable by byte fallback)."""
    rng = np.random.default_rng(seed)
    words = CORPUS.split() + ["\n", "\n\n", " ", "  ", "\t", "<|turn>", "<turn|>", '<|"|>', "<bos>"]
    ranges = [(0x20, 0x7E), (0xC0, 0x17F), (0x400, 0x4FF), (0x3040, 0x30FF), (0x4E00, 0x4E80), (0x1F300, 0x1F64F)]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(int(rng.integers(1, 12))):
            if rng.random() < 0.6:
                parts.append(words[int(rng.integers(len(words)))])
            else:
                lo, hi = ranges[int(rng.integers(len(ranges)))]
                parts.append("".join(chr(int(rng.integers(lo, hi + 1))) for _ in range(int(rng.integers(1, 5)))))
            parts.append(" " if rng.random() < 0.7 else "")
        out.append("".join(parts))
    return out


def rng_weights(model, seed: int):
    """Random values for every parameter and buffer of the HF model, rounded to fp16."""
    import torch
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    out = {}
    for name, t in sd.items():
        shape = tuple(t.shape)
        if name.endswith("layer_scalar"):
            v = rng.uniform(0.3, 1.0, size=shape)
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            # Attention scale is 1 in Gemma 4: q.k of unit-RMS heads would reach +-head_dim and
            # make a random model's softmax chaotic; trained q/k norms keep the scores moderate.
            v = 0.3 * (1.0 + 0.2 * rng.standard_normal(shape))
        elif name.endswith("norm.weight"):
            v = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens_per_layer" in name:
            v = 0.5 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            v = 0.5 * rng.standard_normal(shape)
        else:
            v = rng.standard_normal(shape) / math.sqrt(shape[-1])
        out[name] = torch.tensor(v.astype(np.float16).astype(np.float32))
    if "lm_head.weight" in out:  # tied: the same values as the embedding
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def gguf_name(hf: str) -> str | None:
    """HF Gemma4ForCausalLM state-dict name -> llama.cpp gemma4 GGUF name (None: not written)."""
    if hf == "lm_head.weight":
        return None
    n = hf[len("model."):]
    top = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
           "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
           "per_layer_model_projection.weight": "per_layer_model_proj.weight",
           "per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
    if n in top:
        return top[n]
    parts = n.split(".")
    assert parts[0] == "layers", hf
    i, rest = parts[1], ".".join(parts[2:])
    per = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "attn_q",
           "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
           "self_attn.o_proj.weight": "attn_output", "self_attn.q_norm.weight": "attn_q_norm",
           "self_attn.k_norm.weight": "attn_k_norm", "post_attention_layernorm.weight": "post_attention_norm",
           "pre_feedforward_layernorm.weight": "ffn_norm", "mlp.gate_proj.weight": "ffn_gate",
           "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down",
           "post_feedforward_layernorm.weight": "post_ffw_norm", "per_layer_input_gate.weight": "inp_gate",
           "per_layer_projection.weight": "proj", "post_per_layer_input_norm.weight": "post_norm",
           "layer_scalar": "layer_output_scale"}
    return f"blk.{i}.{per[rest]}.weight"


def write_gguf(path: Path, name: str, cfg: dict, weights: dict, tokens, merges):
    import gguf
    L = cfg["num_hidden_layers"]
    n_shared = cfg["num_kv_shared_layers"]
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    ff = cfg["intermediate_size"]
    if cfg["use_double_wide_mlp"]:
        w.add_feed_forward_length([ff if i < L - n_shared else 2 * ff for i in range(L)])
    else:
        w.add_feed_forward_length(ff)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["global_head_dim"])
    w.add_value_length(cfg["global_head_dim"])
    w.add_key_length_swa(cfg["head_dim"])
    w.add_value_length_swa(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
    w.add_rope_dimension_count(cfg["global_head_dim"])
    w.add_rope_dimension_count_swa(cfg["head_dim"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(cfg["hidden_size_per_layer_input"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    # Tokenizer, as the converter's Gemma4Model.set_vocab writes it.
    types = []
    for t in tokens:
        if t in VISIBLE:
            types.append(gguf.TokenType.USER_DEFINED)
        elif t in SPECIALS or t in CHAT_SPECIALS:
            types.append(gguf.TokenType.CONTROL)
        elif t.startswith("<0x") and len(t) == 6:
            types.append(gguf.TokenType.BYTE)
        elif t.startswith("<unused"):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    # rope_freqs: 1 on the rotated pairs of the full layers, 1e30 on the rest (the converter's
    # generate_extra_tensors for proportional RoPE).
    hd = cfg["global_head_dim"]
    n_rot = int(hd * cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd // 2 - n_rot), dtype=np.float32))
    for hf, t in weights.items():
        g = gguf_name(hf)
        if g is None:
            continue
        a = t.numpy()
        if a.ndim == 0:
            a = a.reshape(1)
        w.add_tensor(g, a.astype(np.float16) if a.ndim == 2 else a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_hf(dir_: Path, cfg: dict, weights: dict, conditional: bool):
    from safetensors.numpy import save_file
    dir_.mkdir(parents=True, exist_ok=True)
    text_cfg = dict(cfg, model_type="gemma4_text")
    tensors = {}
    for hf, t in weights.items():
        if hf == "lm_head.weight":
            continue
        a = t.numpy().astype(np.float16)
        if a.ndim == 0:
            a = a.reshape(1)
        key = hf.replace("model.", "model.language_model.", 1) if conditional else hf
        tensors[key] = a
    if conditional:
        # Stand-ins for the towers Kestrel skips (names as in the real checkpoints).
        tensors["model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"] = np.zeros((4, 4), np.float16)
        tensors["model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight"] = np.zeros((4, 4), np.float16)
        tensors["model.embed_vision.embedding_projection.weight"] = np.zeros((4, 4), np.float16)
        config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                  "text_config": text_cfg, "vision_config": {"model_type": "gemma4_vision"},
                  "audio_config": {"model_type": "gemma4_audio"}, "torch_dtype": "float16",
                  "eos_token_id": [1, 106], "tie_word_embeddings": True}
        names = sorted(tensors)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        index = {"metadata": {}, "weight_map": {}}
        for fname, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, str(dir_ / fname))
            for k in keys:
                index["weight_map"][k] = fname
        (dir_ / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    else:
        config = dict(text_cfg, architectures=["Gemma4ForCausalLM"], torch_dtype="float16")
        save_file(tensors, str(dir_ / "model.safetensors"))
    (dir_ / "config.json").write_text(json.dumps(config, indent=1))


def hf_model(cfg: dict):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(0)
    config = Gemma4TextConfig(**cfg)
    config._attn_implementation = "eager"
    return Gemma4ForCausalLM(config).float().eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/gemma4", help="model directory (default tests/data/gemma4)")
    ap.add_argument("--goldens", default=None, help="write goldens here (e.g. tests/goldens)")
    ap.add_argument("--llamacpp", action="store_true", help="also compare llama-cpp-python with HF")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens, merges = train_bpe(512)
    for seed, (name, cfg) in enumerate(CONFIGS.items()):
        d = out / name
        (d / "hf").mkdir(parents=True, exist_ok=True)
        tok = write_tokenizer_json(d / "hf" / "tokenizer.json", tokens, merges)
        model = hf_model(cfg)
        weights = rng_weights(model, 1000 + seed)
        missing = model.load_state_dict(weights, strict=True)
        assert not missing.missing_keys and not missing.unexpected_keys
        model.lm_head.weight = model.model.embed_tokens.weight
        write_hf(d / "hf", cfg, weights, conditional=(name == "e2b_tiny"))
        write_gguf(d / "model.gguf", name, cfg, weights, tokens, merges)
        n_params = sum(v.numel() for k, v in weights.items() if k != "lm_head.weight")
        print(f"{name}: {n_params} parameters, GGUF {os.path.getsize(d / 'model.gguf')} bytes")
        if not args.goldens:
            continue
        gold = Path(args.goldens)
        prompts = [tok.encode(p).ids for p in PROMPTS]
        logits_all, continuations = [], []
        with torch.no_grad():
            for ids in prompts:
                lg = model(torch.tensor([ids])).logits[0].float().numpy()
                logits_all.append(lg.astype(np.float32))
                seq = list(ids)
                for _ in range(N_GENERATE):  # greedy by full recomputation, no cache
                    nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                    seq.append(nxt)
                continuations.append(seq[len(ids):])
            # The HF checkpoint written above loads in transformers (CausalLM layout only).
            if name != "e2b_tiny":
                from transformers import AutoModelForCausalLM
                re = AutoModelForCausalLM.from_pretrained(str(d / "hf"), dtype=torch.float32, attn_implementation="eager")
                diff = float((re(torch.tensor([prompts[0]])).logits[0] - torch.tensor(logits_all[0])).abs().max())
                print(f"  reloaded HF dir: max |dlogit| {diff:.2e}")
                assert diff < 1e-4
        margins = []
        for lg in logits_all:
            s = np.sort(lg, axis=-1)
            margins.append(float((s[:, -1] - s[:, -2]).min()))
        meta = {"model": name, "source": "HF transformers Gemma4ForCausalLM, float32, eager attention, CPU",
                "transformers": __import__("transformers").__version__, "torch": torch.__version__,
                "n_vocab": cfg["vocab_size"], "prompts": prompts, "prompt_texts": PROMPTS,
                "continuations": continuations, "n_generate": N_GENERATE,
                "min_top2_margin": min(margins),
                "logits_file": f"gemma4_{name}_logits.bin"}
        (gold / f"gemma4_{name}.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1))
        with open(gold / f"gemma4_{name}_logits.bin", "wb") as f:
            for lg in logits_all:
                f.write(lg.astype("<f4").tobytes())
        print(f"  goldens: {sum(len(p) for p in prompts)} positions, min top-2 margin {min(margins):.2e}")
        if args.llamacpp:
            compare_llamacpp(d / "model.gguf", prompts, logits_all)
    if args.goldens:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(out / "e2b_tiny" / "hf" / "tokenizer.json"))
        cases = [{"text": s, "ids": tok.encode(s).ids} for s in TOKENIZER_STRINGS + random_strings(300)]
        (Path(args.goldens) / "gemma4_tokenizer.json").write_text(
            json.dumps({"source": "HF tokenizers " + __import__("tokenizers").__version__ +
                        " on tests/data/gemma4/e2b_tiny/hf/tokenizer.json (BOS via the post-processor)",
                        "cases": cases}, ensure_ascii=False, indent=1))


def compare_llamacpp(path: Path, prompts, logits_all):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    worst = 0.0
    for ids, ref in zip(prompts, logits_all):
        llm.reset()
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float32)
        worst = max(worst, float(np.abs(got - ref).max()))
    print(f"  llama-cpp-python {llama_cpp.__version__} vs HF: max |dlogit| {worst:.3e}")


if __name__ == "__main__":
    main()
