#!/usr/bin/env python3
"""Speculative decoding by workload: `kestrel run` with --draft none, ngram and auto on the same
prompts (greedy, or seeded sampling for prose), alternating the modes within each round.
Reports per workload and mode the median decode tok/s, drafted and accepted tokens, the
acceptance rate, tokens per verification step and the speedup over --draft none, and checks
that every mode generated exactly the same tokens.

  python3 scripts/bench/draft_bench.py -m IMAGE [--threads 2] [--rounds 3] [--tokens 200] [--json OUT]

Workloads (the default model is a base model: continuation prompts):
  code   a function shown twice, then the start of a third copy
  json   a JSON payload, then "the same payload again"
  table  a Markdown table, then its header again
  quote  a WikiText-2 paragraph, then "Quoted exactly:" and its first words
  prose  a WikiText-2 paragraph continued with temperature 0.8, top-k 40, seed 7 (no repetition
         to exploit: what drafting costs when it does not pay)
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from machine import cpu

ROOT = Path(__file__).resolve().parents[2]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext2" / "wiki.test.raw"
KESTREL = ROOT / "build" / "kestrel"

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over a sliding window."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''

PAYLOAD = json.dumps({"order_id": 48213, "customer": {"name": "Ada Lovelace", "email": "ada@example.com",
                                                       "address": {"street": "12 St James's Square", "city": "London",
                                                                   "postcode": "SW1Y 4JH"}},
                      "items": [{"sku": "KX-100", "name": "Kestrel nest box", "quantity": 2, "price": 34.5},
                                {"sku": "KX-220", "name": "Field guide to falcons", "quantity": 1, "price": 18.0},
                                {"sku": "KX-310", "name": "Binoculars 8x42", "quantity": 1, "price": 129.99}],
                      "shipping": "express", "paid": True}, indent=2)

TABLE = """| station | date | min °C | max °C | rain mm |
| --- | --- | ---: | ---: | ---: |
| Aberdeen | 2026-11-02 | 3.1 | 9.8 | 4.2 |
| Belfast | 2026-11-02 | 5.4 | 11.2 | 7.9 |
| Cardiff | 2026-11-02 | 6.0 | 13.1 | 2.0 |
| Dover | 2026-11-02 | 7.2 | 12.4 | 0.0 |
| Exeter | 2026-11-02 | 6.8 | 14.0 | 1.1 |
| Glasgow | 2026-11-02 | 2.9 | 9.1 | 11.5 |
"""


def paragraphs():
    for line in WIKITEXT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if len(line) > 600 and not line.startswith("="):
            yield line


def workloads():
    paras = paragraphs()
    quote = next(paras)[:900]
    prose = next(paras)[:700]
    return {
        "code": ("In utils.py:\n\n" + CODE + "\nThe same function, copied into stats.py without changes:\n\n" + CODE +
                 "\nAnd once more, copied into metrics.py:\n\ndef moving_average(", {}),
        "json": ("Request body:\n\n" + PAYLOAD + "\n\nThe server logged the same payload again:\n\n{\n  \"order_id\":", {}),
        "table": ("Weather observations:\n\n" + TABLE + "\nThe same observations, as published the next day:\n\n| station |", {}),
        "quote": (quote + "\n\nQuoted exactly from the article above:\n\n\"" + " ".join(quote.split()[:8]), {}),
        "prose": (prose, {"--temp": "0.8", "--top-k": "40", "--seed": "7"}),
    }


def run(model, prompt, mode, args, extra):
    cmd = [str(KESTREL), "run", "-m", model, "-p", prompt, "-n", str(args.tokens), "--ignore-eos", "--json",
           "-t", str(args.threads), "--draft", mode]
    for k, v in extra.items():
        cmd += [k, v]
    if "--temp" not in extra:
        cmd += ["--temp", "0"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--workloads", default="code,json,table,quote,prose")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()
    modes = ["none", "ngram", "auto"]
    rows, raw, failed = [], {}, False
    for name, (prompt, extra) in workloads().items():
        if name not in args.workloads.split(","):
            continue
        results = {m: [] for m in modes}
        for _ in range(args.rounds):
            for m in modes:
                results[m].append(run(args.model, prompt, m, args, extra))
        raw[name] = results
        base = statistics.median(r["decode_tok_s"] for r in results["none"])
        for m in modes:
            rs = results[m]
            if any(r["tokens"] != results["none"][0]["tokens"] for r in rs):
                print(f"{name}: --draft {m} generated other tokens than --draft none", file=sys.stderr)
                failed = True
            tok_s = statistics.median(r["decode_tok_s"] for r in rs)
            drafted, accepted, n = rs[0]["drafted_tokens"], rs[0]["accepted_tokens"], len(rs[0]["tokens"])
            rows.append((name, m, tok_s, tok_s / base, drafted, accepted,
                         accepted / drafted if drafted else 0.0, n / max(1, n - accepted)))
    name, flags = cpu()
    print(f"CPU: {name}; flags: {flags}; threads {args.threads}; {args.rounds} rounds, median; {args.tokens} tokens")
    print("| workload | --draft | decode tok/s | vs none | drafted | accepted | acceptance | tokens / step |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.2f}x | {r[4]} | {r[5]} | {100 * r[6]:.0f} % | {r[7]:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(raw))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
