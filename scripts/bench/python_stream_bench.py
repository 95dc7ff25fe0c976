#!/usr/bin/env python3
"""Streaming from the Python package against the CLI: decode tokens/s of the same greedy
generation, runs interleaved (CLI, Python, CLI, ...) so that both see the same machine, median of
each (docs/python.md). The Python rate is the engine's own decode_tok_s of the streamed
generation, which counts the time Python spends between pieces (the iterator drives the steps),
and, as a check, the wall time from the first piece to the last. On a busy machine the rates
scatter; the median ratio of adjacent pairs and the share of the stream's time spent in Python
(between one piece and the next call for the following one) are steadier.

    python3 scripts/bench/python_stream_bench.py [-m default] [-n 128] [--reps 7] [-t 0]
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
    ap.add_argument("-t", "--threads", type=int, default=0, help="threads of both (0: every core)")
    ap.add_argument("--kestrel", default=os.environ.get("KESTREL_BIN", str(ROOT / "build" / "kestrel")))
    a = ap.parse_args()
    model = kestrel.Model(a.model, threads=a.threads)
    common = dict(max_tokens=a.n, temperature=0, ignore_eos=True)
    model.generate(PROMPT, **common)  # warm-up
    cli, py, py_wall, outside = [], [], [], []
    for _ in range(a.reps):
        r = subprocess.run([a.kestrel, "run", "-m", a.model, "-p", PROMPT, "-n", str(a.n), "--temp", "0",
                            "--ignore-eos", "-t", str(a.threads), "--json"], capture_output=True, text=True, check=True)
        cli.append(json.loads(r.stdout)["decode_tok_s"])
        stream = model.generate(PROMPT, stream=True, **common)
        first = last = None
        inside = 0.0  # time in the extension's next() after the first piece: compute, GIL hand-off
        for _piece in stream:
            last = time.perf_counter()
            if first is None:
                first = last
            else:
                inside += last - before
            before = time.perf_counter()
        res = stream.result
        outside.append(1 - inside / (last - first))
        py.append(res.decode_tok_s)
        py_wall.append((len(res.token_ids) - 1) / (last - first))
    name, flags = machine.cpu()
    c, p, w = statistics.median(cli), statistics.median(py), statistics.median(py_wall)
    print(json.dumps({"cpu": name, "flags": flags, "model": model.path, "tokens": a.n, "reps": a.reps, "threads": a.threads,
                      "cli_decode_tok_s": cli, "python_stream_decode_tok_s": py, "python_stream_wall_tok_s": py_wall,
                      "median_cli": c, "median_python": p, "median_python_wall": w,
                      "python_vs_cli": p / c,
                      "median_pair_ratio": statistics.median(b / a for a, b in zip(cli, py)),
                      "python_share_of_stream_time": statistics.median(outside)}, indent=1))


if __name__ == "__main__":
    main()
