#!/usr/bin/env python3
"""Checks the IFEval scorer (if-verifiable, as evalsets.score_ifeval calls it) against the IFEval
paper's published scores (Zhou et al. 2023, arXiv 2311.07911, Table 3: GPT-4 76.89 / 83.57 /
79.30 / 85.37 % prompt strict / instruction strict / prompt loose / instruction loose), by
scoring the paper's own GPT-4 responses: google-research/google-research,
instruction_following_eval/data/input_response_data_gpt4_20231107_145030.jsonl (not shipped here;
pass its path). Prints the four scores and their differences from the published ones.

  python3 scripts/eval/check_scorer.py RESPONSES.jsonl [--tolerance 1.0]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evalsets import load_ifeval, score_ifeval  # noqa: E402

PUBLISHED_GPT4 = {"prompt strict": 76.89, "instruction strict": 83.57,
                  "prompt loose": 79.30, "instruction loose": 85.37}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("responses", type=Path)
    p.add_argument("--tolerance", type=float, default=1.0, help="allowed |difference| in points")
    a = p.parse_args()
    rows = [json.loads(line) for line in a.responses.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_prompt = {r["prompt"]: r["response"] for r in rows}
    items = load_ifeval(None, 0)
    missing = [it.id for it in items if it.reference["prompt"] not in by_prompt]
    if missing:
        sys.exit(f"{len(missing)} IFEval prompts have no response in {a.responses}")
    ps = pl = 0
    i_s, i_l, i_n = 0, 0, 0
    for it in items:
        s = score_ifeval(it, by_prompt[it.reference["prompt"]])
        ps += s["prompt_strict"]
        pl += s["prompt_loose"]
        i_s += sum(s["strict"])
        i_l += sum(s["loose"])
        i_n += len(s["strict"])
    ours = {"prompt strict": 100 * ps / len(items), "instruction strict": 100 * i_s / i_n,
            "prompt loose": 100 * pl / len(items), "instruction loose": 100 * i_l / i_n}
    ok = True
    print("| metric | published % | if-verifiable % | Δ (pt) |\n| --- | ---: | ---: | ---: |")
    for k, v in PUBLISHED_GPT4.items():
        d = ours[k] - v
        ok &= abs(d) <= a.tolerance
        print(f"| {k} | {v:.2f} | {ours[k]:.2f} | {d:+.2f} |")
    print(f"{len(items)} prompts, {i_n} instructions: {'within' if ok else 'OUTSIDE'} ±{a.tolerance} pt")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
