#!/usr/bin/env python3
"""A PNG chart of a `kestrel bench` report (JSON, schema "kestrel-bench/1"): one bar per variant
for decode tok/s (decode suite), prefill tok/s and decode tok/s (throughput suite), end-to-end
latency, peak memory and, where a sensor was readable, energy per token.

Usage: python3 scripts/bench/plot_bench.py REPORT.json -o chart.png
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def get(d, *path):
    for key in path:
        if not isinstance(d, dict) or d.get(key) is None:
            return None
        d = d[key]
    return d


def shape(report, suite):
    for v in report["variants"]:
        s = get(v, "suites", suite)
        if s:
            return f"{s['prompt_tokens']:,} in / {s['output_tokens']:,} out"
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    with open(args.report, encoding="utf-8") as f:
        report = json.load(f)
    if report.get("schema") != "kestrel-bench/1" or not report.get("variants"):
        sys.exit(f"{args.report}: not a kestrel bench report")
    names = [v["variant"] for v in report["variants"]]
    panels = [
        (f"decode tok/s ({shape(report, 'decode')})", ("suites", "decode", "summary", "decode_tok_s", "mean"), 1),
        (f"prefill tok/s ({shape(report, 'throughput')})", ("suites", "throughput", "summary", "prefill_tok_s", "mean"), 1),
        (f"decode tok/s ({shape(report, 'throughput')})", ("suites", "throughput", "summary", "decode_tok_s", "mean"), 1),
        (f"end-to-end s ({shape(report, 'throughput')})", ("suites", "throughput", "summary", "e2e_s", "mean"), 1),
        ("peak memory (MiB)", ("memory", "peak_rss_bytes"), 1 / 2**20),
        ("energy / token, decode suite (J)", ("suites", "decode", "summary", "energy_per_token_j"), 1),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, path, scale) in zip(axes.flat, panels):
        values = [get(v, *path) for v in report["variants"]]
        ax.set_title(title, fontsize=10)
        if all(x is None for x in values):
            ax.text(0.5, 0.5, "n/a (no sensor readable)" if "energy" in title else "n/a",
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ys = [0 if x is None else x * scale for x in values]
        bars = ax.bar(range(len(names)), ys, color=colors[: len(names)])
        for b, x in zip(bars, values):
            ax.annotate("n/a" if x is None else f"{x * scale:.3g}", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    m = report.get("machine", {})
    fig.suptitle(f"kestrel bench: {m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs", fontsize=11)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
