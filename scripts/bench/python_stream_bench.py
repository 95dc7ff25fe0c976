#!/usr/bin/env python3
"""Streaming from the Python package against the CLI: decode tokens/s of the same greedy
generation, runs interleaved (CLI, Python, CLI, ...) so that both see the same machine, median of
each (docs/python.md). The Python rate is the engine's own decode_tok_s of the streamed
generation, which counts the time Python spends between pieces (the iterator drives the steps),
and, as a check, the wall time from the first piece to the last.

    python3 scripts/bench/python_stream_bench.py [-m default] [-n 128] [--reps 7]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402

import kestrel  # noqa: E402

PROMPT = "The history of the printing press begins"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("-n", type=int, default=128, help="tokens per run")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--kestrel", default=os.environ.get("KESTREL_BIN", str(ROOT / "build" / "kestrel")))
    a = ap.parse_args()
    model = kestrel.Model(a.model)
    common = dict(max_tokens=a.n, temperature=0, ignore_eos=True)
    model.generate(PROMPT, **common)  # warm-up
    cli, py, py_wall = [], [], []
    for _ in range(a.reps):
        r = subprocess.run([a.kestrel, "run", "-m", a.model, "-p", PROMPT, "-n", str(a.n), "--temp", "0",
                            "--ignore-eos", "--json"], capture_output=True, text=True, check=True)
        cli.append(json.loads(r.stdout)["decode_tok_s"])
        stream = model.generate(PROMPT, stream=True, **common)
        first = last = None
        for _piece in stream:
            last = time.perf_counter()
            first = first or last
        res = stream.result
        py.append(res.decode_tok_s)
        py_wall.append((len(res.token_ids) - 1) / (last - first))
    name, flags = machine.cpu()
    c, p, w = statistics.median(cli), statistics.median(py), statistics.median(py_wall)
    print(json.dumps({"cpu": name, "flags": flags, "model": model.path, "tokens": a.n, "reps": a.reps,
                      "cli_decode_tok_s": cli, "python_stream_decode_tok_s": py, "python_stream_wall_tok_s": py_wall,
                      "median_cli": c, "median_python": p, "median_python_wall": w,
                      "python_vs_cli": p / c}, indent=1))


if __name__ == "__main__":
    main()
