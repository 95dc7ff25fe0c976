#!/usr/bin/env python3
"""How decode and prefill grow with the context: Kestrel (one row per KV cache type, --cache-type-k/-v)
beside llama.cpp's llama-bench (flash attention on; f16 and q8_0 KV) and, when built, ik_llama.cpp's.

For each depth D (default 1k, 4k, 8k, 16k, 32k tokens):
  * prefill tok/s of D tokens from an empty cache: Kestrel `run --token-ids F -n 0 --json`
    (prefill_tok_s); llama-bench `-p D -n 0`;
  * decode tok/s of N tokens after D: Kestrel `run --token-ids F -n N --ignore-eos --temp 0 --json`
    (decode_tok_s, its own prefill not timed in it; no drafting: `--draft none`); llama-bench `-p 0 -n N -d D`;
  * Kestrel's `decode_read_bytes` (weights, head, KV cache read by one step at the last position),
    `kv_read_bytes` (the KV cache's part) and `decode_read_gb_s` (bytes x decode tok/s).
The prompt is D token ids: BOS then a fixed pseudo-random sequence (llama-bench times random ids too),
the same for every Kestrel row. Every run uses -t THREADS. Writes a Markdown table (stdout and
--markdown), a JSON record (--json) and a matplotlib plot (--plot, default docs/images/long_context.png).

  python3 scripts/bench/long_context_bench.py                              # the full run (~1 h on 2 cores)
  python3 scripts/bench/long_context_bench.py --depths 1024 4096 -n 32     # a short check

llama-bench and llama-perplexity: LLAMA_TARGETS="llama-bench llama-perplexity"
scripts/bench/build_llama_server.sh; ik_llama.cpp: scripts/bench/build_ik_llama.sh (optional, its row
is left out when its llama-bench is absent).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu, default_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(os.environ.get("KESTREL_PEERS", Path.home() / ".cache" / "kestrel" / "peers"))


def prompt_ids(n):
    return [2] + [1000 + (i * 7919) % 200000 for i in range(n - 1)]


def kestrel_row(kestrel, model, kv, depth, n_gen, threads):
    """Prefill of `depth` tokens, then decode of n_gen, in one run; run --json's figures."""
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write(" ".join(map(str, prompt_ids(depth))))
        ids = f.name
    try:
        cmd = [kestrel, "run", "-m", model, "--token-ids", ids, "-n", str(n_gen), "--temp", "0", "--ignore-eos",
               "--draft", "none",
               "--json", "-t", str(threads), "-c", str(depth + n_gen + 8), "--cache-type-k", kv, "--cache-type-v", kv]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"long_context_bench.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
        j = json.loads(p.stdout)
    finally:
        os.unlink(ids)
    return {"prefill_tok_s": j["prefill_tok_s"], "decode_tok_s": j["decode_tok_s"],
            "decode_read_bytes": j["decode_read_bytes"], "kv_read_bytes": j.get("kv_read_bytes"),
            "kv_cache_bytes": j.get("kv_cache_bytes"), "decode_read_gb_s": j.get("decode_read_gb_s")}


def llama_bench(binary, gguf, args, threads):
    cmd = [binary, "-m", gguf, "-t", str(threads), "-fa", "1", "-o", "json"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"long_context_bench.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    tests = json.loads(p.stdout)
    return tests[0]["avg_ts"]


def peer_row(binary, gguf, kv, depth, n_gen, threads, reps, gp=False):
    """llama-bench's prefill of `depth` tokens and decode of n_gen after them: `-d DEPTH` (llama.cpp),
    or `-gp DEPTH,N` where the tree's llama-bench has no -d (ik_llama.cpp): the prompt evaluated,
    then N single-token steps timed, the prompt not."""
    ctk = ["-ctk", kv, "-ctv", kv]
    pp = llama_bench(binary, gguf, ["-p", str(depth), "-n", "0", "-r", str(reps)] + ctk, threads)
    after = ["-n", "0", "-gp", f"{depth},{n_gen}"] if gp else ["-n", str(n_gen), "-d", str(depth)]
    tg = llama_bench(binary, gguf, ["-p", "0", "-r", str(reps)] + after + ctk, threads)
    return {"prefill_tok_s": pp, "decode_tok_s": tg}


def fmt(x, digits=1):
    return "—" if x is None else f"{x:,.{digits}f}"


def plot(path, depths, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, r in rows.items():
        xs = [d for d in depths if d in r]
        style = "-o" if name.startswith("Kestrel") else "--s"
        a.plot(xs, [r[d]["decode_tok_s"] for d in xs], style, label=name)
        b.plot(xs, [r[d]["prefill_tok_s"] for d in xs], style, label=name)
    for ax, title in ((a, "decode tok/s after D tokens"), (b, "prefill tok/s of D tokens")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [f"{round(d / 1024)}k" for d in depths])
        ax.set_xlabel("context depth D (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    a.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="default", help="Kestrel's model (default: the default image)")
    ap.add_argument("--gguf", default=None, help="the peers' GGUF (default: the default model's)")
    ap.add_argument("--kestrel", default=str(ROOT / "build" / "kestrel"))
    # "32k" is 32,704: Gemma 3 270M's context is 32,768 tokens, and the decoded tokens (64 at
    # most here) must fit after the depth (a 32,768-token prompt leaves no room to decode).
    ap.add_argument("--depths", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 32704])
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="decode tokens after each depth")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kv", nargs="+", default=["f16", "q8"], help="Kestrel's KV cache types")
    ap.add_argument("--peer-kv", nargs="+", default=["f16", "q8_0"], help="llama.cpp's KV cache types")
    ap.add_argument("--reps", type=int, default=2, help="llama-bench repetitions per test")
    ap.add_argument("--llama-bench", default=str(PEERS / "llama.cpp" / "bin" / "llama-bench"))
    ap.add_argument("--ik-llama-bench", default=str(PEERS / "ik_llama.cpp" / "bin" / "llama-bench"))
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=str(ROOT / "docs" / "images" / "long_context.png"))
    args = ap.parse_args()
    gguf = args.gguf or default_gguf()

    rows, kestrel_extra = {}, {}
    for kv in args.kv:
        name = f"Kestrel {kv} KV"
        rows[name] = {}
        for d in args.depths:
            t0 = time.time()
            r = kestrel_row(args.kestrel, args.model, kv, d, args.n_gen, args.threads)
            rows[name][d] = r
            print(f"{name} D={d}: prefill {r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.2f} tok/s, "
                  f"decode reads {r['decode_read_bytes'] / 1e6:.1f} MB ({time.time() - t0:.0f} s)", file=sys.stderr)
    for label, binary in (("llama.cpp", args.llama_bench), ("ik_llama.cpp", args.ik_llama_bench)):
        if not Path(binary).exists():
            print(f"long_context_bench.py: no {label} llama-bench at {binary}: its rows are left out", file=sys.stderr)
            continue
        for kv in args.peer_kv:
            name = f"{label} {kv} KV"
            rows[name] = {}
            for d in args.depths:
                t0 = time.time()
                rows[name][d] = peer_row(binary, gguf, kv, d, args.n_gen, args.threads, args.reps,
                                         gp=label == "ik_llama.cpp")
                print(f"{name} D={d}: {rows[name][d]} ({time.time() - t0:.0f} s)", file=sys.stderr)

    model_name, flags = cpu()
    lines = [f"Machine: {model_name} ({flags}), {args.threads} threads; decode of {args.n_gen} tokens after D; "
             f"Kestrel -m {args.model}, peers {Path(gguf).name} (flash attention on)", ""]
    head = "| D | " + " | ".join(f"{n} decode" for n in rows) + " | " + " | ".join(f"{n} prefill" for n in rows)
    lines += [head + " |", "|" + " ---: |" * (1 + 2 * len(rows))]
    for d in args.depths:
        cells = [fmt(rows[n][d]["decode_tok_s"], 2) if d in rows[n] else "—" for n in rows]
        cells += [fmt(rows[n][d]["prefill_tok_s"]) if d in rows[n] else "—" for n in rows]
        lines.append(f"| {d:,} | " + " | ".join(cells) + " |")
    lines += ["", "| D | " + " | ".join(f"Kestrel {kv}: decode reads MB (KV MB), GB/s" for kv in args.kv) + " |",
              "|" + " ---: |" * (1 + len(args.kv))]
    for d in args.depths:
        cells = []
        for kv in args.kv:
            r = rows[f"Kestrel {kv} KV"][d]
            cells.append(f"{r['decode_read_bytes'] / 1e6:.1f} ({(r['kv_read_bytes'] or 0) / 1e6:.1f}), "
                         f"{fmt(r['decode_read_gb_s'], 2)}")
        lines.append(f"| {d:,} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": {"cpu": model_name, "flags": flags},
                                               "threads": args.threads, "n_gen": args.n_gen, "model": args.model,
                                               "gguf": gguf, "rows": rows}, indent=1))
    if args.plot:
        plot(args.plot, args.depths, rows)
        print(f"plot: {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
