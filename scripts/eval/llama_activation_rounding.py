#!/usr/bin/env python3
"""What llama.cpp's own 8-bit activation rounding costs on the default model: KL and perplexity.

llama.cpp on a quantized GGUF rounds every matrix product's activations to 8 bits (Q8_K blocks of
256 for K-quant weights, Q8_0 blocks of 32 for Q8_0/Q5_0 weights: ggml-cpu's vec_dot_type). On
the float32 re-encoding of the same file (scripts/goldens/dequantize_gguf.py: the same weights,
exactly) it multiplies float32 activations. So the two runs differ in the activation rounding
alone, and KL(f32 || q4_k_m) over the same positions is its cost. Issue #19 item 1 lets Kestrel's
int8-activation decode kernel be a default only when its own cost (docs/quantization.md) is no
worse than this.

Method as `kestrel perplexity` and llama-perplexity: the text tokenized with BOS, chunks of
n_ctx with the first token replaced by BOS, each from an empty KV cache, positions
n_ctx/2 .. n_ctx-2 scored; log-softmax, NLL and KL in float64 numpy from llama.cpp's float32
logits; KL p99 and same top-1 as llama-perplexity reports them.

  python3 scripts/eval/llama_activation_rounding.py [--ctx 512] [--chunks 24] [--json OUT]
"""
import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)


def log_softmax(logits):
    mx = logits.max(axis=1, keepdims=True)
    z = logits - mx
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def chunk_logits(llm, chunk, first):
    llm.reset()
    llm.eval(chunk)
    return np.array(llm.scores[first:len(chunk) - 1], dtype=np.float64)


def ppl(nll):
    mean = float(np.mean(nll))
    err = math.exp(mean) * math.sqrt(float(np.var(nll)) / (len(nll) - 1))
    return math.exp(mean), err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF (default: the default model's Q4_K_M file)")
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "wikitext2", "wiki.test.raw"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if args.ctx < 4 or args.chunks < 1:
        sys.exit("error: --ctx must be at least 4 and --chunks at least 1")

    import llama_cpp
    model = args.model or llama_cpp_check.default_model()
    llama_cpp_check.require(model)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    first = args.ctx // 2
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "goldens", "dequantize_gguf.py"), model, f32],
                       check=True)
        kw = dict(n_ctx=args.ctx, n_batch=args.ctx, n_ubatch=args.ctx, n_threads=args.threads, logits_all=True,
                  verbose=False, seed=0)
        ref = llama_cpp.Llama(model_path=f32, **kw)
        q = llama_cpp.Llama(model_path=model, **kw)
        tokens = ref.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        n_chunks = min(args.chunks, len(tokens) // args.ctx)
        nll_ref, nll_q, kl, top1 = [], [], [], []
        for i in range(n_chunks):
            chunk = list(tokens[i * args.ctx:(i + 1) * args.ctx])
            chunk[0] = ref.token_bos()
            targets = np.array(tokens[i * args.ctx + first + 1:(i + 1) * args.ctx], dtype=np.int64)
            lp_ref = log_softmax(chunk_logits(ref, chunk, first))
            lp_q = log_softmax(chunk_logits(q, chunk, first))
            rows = np.arange(len(targets))
            nll_ref.append(-lp_ref[rows, targets])
            nll_q.append(-lp_q[rows, targets])
            kl.append((np.exp(lp_ref) * (lp_ref - lp_q)).sum(axis=1))
            top1.append(lp_ref.argmax(axis=1) == lp_q.argmax(axis=1))
            print(f"  chunk {i + 1}/{n_chunks}: KL so far {np.concatenate(kl).mean():.5f}", file=sys.stderr)
    nll_ref, nll_q, kl, top1 = map(np.concatenate, (nll_ref, nll_q, kl, top1))
    p_ref, e_ref = ppl(nll_ref)
    p_q, e_q = ppl(nll_q)
    out = {
        "what": "llama.cpp's 8-bit activation rounding alone: the Q4_K_M file against its exact float32 re-encoding",
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_build": llama_cpp_check.build_flags(),
        "model_file": os.path.basename(model),
        "text_file": os.path.basename(args.text),
        "ctx": args.ctx,
        "chunks": n_chunks,
        "scored": int(len(kl)),
        "ppl_f32": p_ref, "ppl_f32_error": e_ref,
        "ppl_q8_activations": p_q, "ppl_q8_activations_error": e_q,
        "ppl_change_percent": 100 * (p_q / p_ref - 1),
        "kl_mean": float(kl.mean()), "kl_mean_error": float(kl.std() / math.sqrt(len(kl) - 1)),
        "kl_p99": float(np.percentile(kl, 99)),
        "same_top1_percent": 100 * float(top1.mean()),
        "seconds": time.time() - t0,
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
