"""The set × image table: each metric per image, and its difference from the baseline (the first
image) with a 95 % paired-bootstrap interval over the items both images answered. RULER's rows are
one per length (the mean over all its items: every task has the same number of samples, so this is
RULER's average over tasks) and one per length and task."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ruler import TASKS as RULER_TASKS
from stats import paired_bootstrap

# metric name -> (numerator, denominator) per item, from one scored JSONL record
METRICS = {
    "gsm8k": {
        "exact match": lambda r: (r["correct"], 1),
    },
    "ifeval": {
        "prompt strict": lambda r: (r["prompt_strict"], 1),
        "instruction strict": lambda r: (sum(r["strict"]), len(r["strict"])),
        "prompt loose": lambda r: (r["prompt_loose"], 1),
        "instruction loose": lambda r: (sum(r["loose"]), len(r["loose"])),
    },
}


def ruler_metrics(records: list[dict]) -> dict:
    """RULER's rows for the records present: '<L> average' then '<L> <task>' per length, each
    {metric: (per-item (num, den), item filter)}; the per-item score is RULER's string match."""
    out = {}
    for length in sorted({r["length"] for r in records}):
        out[f"{length} average"] = (lambda r: (r["score"], 1), lambda r, L=length: r["length"] == L)
        present = {r["task"] for r in records if r["length"] == length}
        for task in [t for t in RULER_TASKS if t in present] + sorted(present - set(RULER_TASKS)):
            out[f"{length} {task}"] = (lambda r: (r["score"], 1),
                                       lambda r, L=length, T=task: r["length"] == L and r["task"] == T)
    return out


def metrics_for(name: str, records: list[dict]) -> dict:
    """{metric: (per-item (num, den) function, item filter)} of a set."""
    if name == "ruler":
        return ruler_metrics(records)
    return {m: (f, lambda r: True) for m, f in METRICS[name].items()}


def read_records(path: Path) -> dict[str, dict]:
    """Scored records by item id (the last line wins if an id repeats)."""
    out = {}
    if path.exists():
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:  # a run killed mid-write: that item is asked again on resume
                print(f"{path}: line {n + 1} is cut short; ignored", file=sys.stderr)
                continue
            out[rec["id"]] = rec
    return out


def build_table(out_dir: Path, sets: list[str], labels: list[str], resamples: int = 10_000) -> dict:
    """{set: {'items': n, 'rows': [{metric, image, value, delta, lo, hi}]}} over the items every
    image answered (the paired sample). Values are fractions."""
    table = {}
    for name in sets:
        recs = {lab: read_records(out_dir / name / f"{lab}.jsonl") for lab in labels}
        common = sorted(set.intersection(*(set(r) for r in recs.values()))) if recs else []
        rows = []
        base_recs = [recs[labels[0]][i] for i in common] if common else []
        for metric, (f, keep) in metrics_for(name, base_recs).items():
            ids = [i for i in common if keep(recs[labels[0]][i])]
            if not ids:
                continue
            per = {lab: tuple(np.array(v, dtype=float) for v in zip(*(f(recs[lab][i]) for i in ids)))
                   for lab in labels}
            for lab in labels:
                if lab == labels[0]:
                    num, den = per[lab]
                    rows.append({"metric": metric, "image": lab, "value": float(num.sum() / den.sum()),
                                 "items": len(ids)})
                else:
                    b = paired_bootstrap(per[labels[0]], per[lab], resamples=resamples)
                    rows.append({"metric": metric, "image": lab, "value": b["other"], "items": len(ids),
                                 "delta": b["delta"], "lo": b["lo"], "hi": b["hi"]})
        table[name] = {"items": len(common), "rows": rows}
    return table


def markdown(table: dict, ppl: dict | None = None) -> str:
    """The table as Markdown, percentages with one decimal; deltas in points."""
    out = ["| set | metric | image | score % | Δ vs baseline (pt) | 95 % CI (pt) |",
           "| --- | --- | --- | ---: | ---: | --- |"]
    for name, t in table.items():
        for r in t["rows"]:
            delta = f"{100 * r['delta']:+.1f}" if "delta" in r else "—"
            ci = f"[{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]" if "delta" in r else "—"
            n = r.get("items", t["items"])
            out.append(f"| {name} ({n} items) | {r['metric']} | {r['image']} | "
                       f"{100 * r['value']:.1f} | {delta} | {ci} |")
    if ppl:
        out += ["", "| image | PPL | base PPL | mean KL | KL p99 | same top-1 % |",
                "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for lab, p in ppl.items():
            base_ppl = f"{p['base_ppl']:.3f}" if "base_ppl" in p else "—"
            out.append(f"| {lab} | {p['ppl']:.3f} | {base_ppl} | "
                       f"{p.get('kl_mean', 0.0):.4f} | {p.get('kl_p99', 0.0):.3f} | "
                       f"{p.get('same_top1_pct', 100.0):.1f} |")
    return "\n".join(out) + "\n"
