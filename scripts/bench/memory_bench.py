#!/usr/bin/env python3
"""What a loaded model costs in memory (issue 43): the peak resident set (VmHWM, from GNU time's
%M) of `kestrel run -n 16` on each model file, beside the file's size, the KV cache the run
allocated and the copies made at load (`--json`: kv_cache_bytes, load_copies_bytes, load_ms), and
llama.cpp's own peak on the same GGUF (llama-cpp-python: a process that loads the model and
generates 16 tokens, less the same process without the model).

The bar of issue 43: peak <= file + KV cache + 64 MiB for an image; <= 1.2 x the file for a GGUF.
The GGUF runs twice in an empty image cache (a temporary KESTREL_CACHE): the first run converts it
and writes its cached image (`image cache`: written), the second maps that image (hit); their bar is
the cached image's (its size + KV cache + 64 MiB: the issue's "or the cached image").

  python3 scripts/bench/memory_bench.py [--image FILE ...] [--gguf FILE] [--threads 2] [--ctx 4096]

Without --image: the default image (~/.cache/kestrel/images/gemma-3-270m-w4a16-flashhead.kimg,
scripts/quickstart.sh builds it) where it exists; without --gguf: the default model's GGUF.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu, default_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KESTREL = ROOT / "build" / "kestrel"
PROMPT = "The three most important inventions of the twentieth century are"
MIB = 1 << 20

LLAMA_CPP = """
import sys
import llama_cpp
if sys.argv[1] == "load":
    llm = llama_cpp.Llama(model_path=sys.argv[2], n_ctx=int(sys.argv[3]), n_threads=int(sys.argv[4]), verbose=False)
    llm(sys.argv[5], max_tokens=16, temperature=0.0)
"""


def peak_rss(cmd, env=None):
    """(peak RSS in bytes, stdout) of cmd, run under GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", t.name, *cmd], capture_output=True, text=True,
                             env=env)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{out.stderr[-2000:]}")
        return int(Path(t.name).read_text().split()[-1]) * 1024, out.stdout


def kestrel_row(kestrel, model, threads, ctx, env=None):
    peak, stdout = peak_rss([kestrel, "run", "-m", model, "-p", PROMPT, "-n", "16", "--temp", "0", "-t", str(threads),
                             "-c", str(ctx), "--json"], env=env)
    j = json.loads(stdout)
    j.setdefault("load_copies_bytes", None)  # a build before load_copies_bytes
    j.setdefault("load_ms", None)
    j.setdefault("image_cache", None)  # a build before the GGUF image cache
    size = os.path.getsize(model)
    image = not str(model).endswith(".gguf")
    bar = size + j["kv_cache_bytes"] + 64 * MIB if image else 1.2 * size
    return {"engine": "kestrel", "file": Path(model).name, "file_bytes": size, "kv_cache_bytes": j["kv_cache_bytes"],
            "load_copies_bytes": j["load_copies_bytes"], "load_ms": j["load_ms"], "peak_rss_bytes": peak,
            "image_cache": j["image_cache"],
            "bar_bytes": int(bar), "bar": "file + KV + 64 MiB" if image else "1.2 x file", "meets": peak <= bar}


def llama_cpp_row(gguf, threads, ctx):
    base, _ = peak_rss([sys.executable, "-c", LLAMA_CPP, "import-only"])
    peak, _ = peak_rss([sys.executable, "-c", LLAMA_CPP, "load", gguf, str(ctx), str(threads), PROMPT])
    return {"engine": "llama.cpp (llama-cpp-python)", "file": Path(gguf).name, "file_bytes": os.path.getsize(gguf),
            "peak_rss_bytes": peak - base, "python_bytes": base}


def mib(n):
    return f"{n / MIB:.0f}" if n is not None else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", action="append", default=[], help="a Kestrel image (repeatable)")
    ap.add_argument("--gguf", default=None, help="a GGUF (default: the default model's)")
    ap.add_argument("--kestrel", default=str(KESTREL), help="the kestrel binary (default: build/kestrel)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="context of every run (KV cache size)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama-cpp-python's row")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    images = args.image
    default_image = Path(os.environ.get("KESTREL_CACHE", Path.home() / ".cache" / "kestrel")) / "images" / \
        "gemma-3-270m-w4a16-flashhead.kimg"
    if not images and default_image.exists():
        images = [str(default_image)]
    gguf = args.gguf or default_gguf()
    rows = [kestrel_row(args.kestrel, m, args.threads, args.ctx) for m in images]
    # The GGUF in an empty image cache: the first run converts it and writes its image, the
    # second maps that image (runtime/image_cache.h; a build without the cache: one run).
    with tempfile.TemporaryDirectory(prefix="kestrel-memory-bench-cache-") as cache:
        env = {**os.environ, "KESTREL_CACHE": cache}
        env.pop("KESTREL_IMAGE_CACHE", None)
        rows.append(kestrel_row(args.kestrel, gguf, args.threads, args.ctx, env))
        if rows[-1]["image_cache"] == "written":
            rows.append(kestrel_row(args.kestrel, gguf, args.threads, args.ctx, env))
            # The bar for a run from the cached image: the image's own (file + KV + 64 MiB).
            cached = list((Path(cache) / "images").glob("*.kimg"))
            for r in rows[-2:]:
                if len(cached) == 1:
                    size = cached[0].stat().st_size
                    r["image_bytes"] = size
                    r["bar_bytes"] = size + r["kv_cache_bytes"] + 64 * MIB
                    r["bar"] = f"its cached image ({mib(size)} MiB) + KV + 64 MiB"
                    r["meets"] = r["peak_rss_bytes"] <= r["bar_bytes"]
    if not args.no_llama_cpp:
        rows.append(llama_cpp_row(gguf, args.threads, args.ctx))
    name, flags = cpu()
    print(f"CPU: {name}; flags: {flags}; {args.threads} threads, context {args.ctx}, `run -n 16`\n")
    print("| engine | file | image cache | file MiB | KV MiB | load copies MiB | load ms | peak RSS MiB | bar MiB | meets |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        load_ms = f"{r['load_ms']:.0f}" if r.get("load_ms") is not None else "-"
        meets = ("yes" if r["meets"] else "no") if "meets" in r else "-"
        bar = f"{mib(r['bar_bytes'])} ({r['bar']})" if "bar_bytes" in r else "-"
        print(f"| {r['engine']} | {r['file']} | {r.get('image_cache') or '-'} | {mib(r['file_bytes'])} | "
              f"{mib(r.get('kv_cache_bytes'))} | "
              f"{mib(r.get('load_copies_bytes'))} | {load_ms} | {mib(r['peak_rss_bytes'])} | {bar} | {meets} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": name, "flags": flags, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
