#!/usr/bin/env python3
"""The gap a long prompt opens in a running stream (continuous batching, kestrel serve
--prefill-chunk): stream A decodes; after its first tokens, request B arrives with a long
prompt; A's largest inter-token gap while B prefills, against A's median gap and B's TTFT.

  python3 scripts/bench/prefill_gap_bench.py -m IMAGE [--chunks 16 64 256] [--prompt-tokens 2000]

One server per chunk size on a free loopback port, 2 threads; prints a Markdown table.
"""
import argparse
import statistics
import threading
import time
from pathlib import Path


from serve_client import served

ROOT = Path(__file__).resolve().parents[2]


def measure(kestrel, model, threads, chunk, prompt_tokens):
    with served(kestrel, model, threads, "--prefill-chunk", chunk) as client:
        stamps, b_times = [], {}

        def run_b():
            b_times["sent"] = time.perf_counter()
            prompt = [2] + [1000 + (i * 37) % 20000 for i in range(prompt_tokens - 1)]
            for chunk_ in client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0, stream=True):
                b_times.setdefault("first", time.perf_counter())
            b_times["done"] = time.perf_counter()

        b = threading.Thread(target=run_b)
        for _ in client.completions.create(model="m", prompt="The history of", max_tokens=400, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True}):
            stamps.append(time.perf_counter())
            if len(stamps) == 50:
                b.start()
        b.join()
        gaps = [(t1 - t0, t1) for t0, t1 in zip(stamps, stamps[1:])]
        during = [g for g, t in gaps if b_times["sent"] <= t <= b_times["done"] + 0.05]
        before = [g for g, t in gaps[:48]]
        return {"chunk": chunk, "median_gap_ms": 1e3 * statistics.median(before),
                "max_gap_during_prefill_ms": 1e3 * max(during) if during else 0.0,
                "b_ttft_s": b_times["first"] - b_times["sent"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--kestrel", default=str(ROOT / "build" / "kestrel"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    args = ap.parse_args()
    print(f"model {args.model}, {args.threads} threads, B's prompt {args.prompt_tokens} tokens")
    print("| --prefill-chunk | A's median gap ms | A's largest gap during B's prefill ms | B's TTFT s |")
    print("| ---: | ---: | ---: | ---: |")
    for chunk in args.chunks:
        r = measure(args.kestrel, args.model, args.threads, chunk, args.prompt_tokens)
        print(f"| {chunk} | {r['median_gap_ms']:.1f} | {r['max_gap_during_prefill_ms']:.1f} | {r['b_ttft_s']:.2f} |")


if __name__ == "__main__":
    main()
