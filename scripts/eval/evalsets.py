"""The evaluation sets: item loading, even sampling, prompts and scoring.

GSM8K (Cobbe et al. 2021, arXiv 2110.14168), `../shared/data/gsm8k/test.jsonl`: exact match of
the final number. IFEval (Zhou et al. 2023, arXiv 2311.07911), `../shared/data/ifeval/
input_data.jsonl`: scored by PyPI `if-verifiable` (the IFEval checkers), strict and loose.
RULER (Hsieh et al. 2024, arXiv 2404.06654): synthetic long-context tasks generated from the
seed (`ruler.py`), asked as plain-text completions, scored with RULER's string match.
docs/accuracy.md states every rule implemented here.
"""
from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("KESTREL_DATA", ROOT.parent / "shared" / "data"))


@dataclass
class Item:
    """One question: `id` is stable across runs (the set's own key or line number). A chat item
    has `messages`; a completion item (a base model continuing text) has `prompt` instead, and
    may carry its own answer cap `max_tokens` (at most the set's cap is used)."""
    id: str
    messages: list[dict] | None = None
    reference: dict = field(default_factory=dict)
    prompt: str | None = None
    max_tokens: int | None = None


def sample_evenly(n_items: int, limit: int | None, seed: int) -> list[int]:
    """Indices of `limit` items spread evenly over `n_items`: the range is cut into `limit` equal
    strata and one index is drawn uniformly inside each with `random.Random(seed)`. Returns
    all indices (sorted) when `limit` is None or >= `n_items`. Raises ValueError for limit < 1."""
    if limit is None or limit >= n_items:
        return list(range(n_items))
    if limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    rng = random.Random(seed)
    picks = []
    for k in range(limit):
        lo = (k * n_items) // limit
        hi = ((k + 1) * n_items) // limit  # exclusive; hi > lo since limit < n_items
        picks.append(rng.randrange(lo, hi))
    return picks


# ---------------------------------------------------------------------------------------------
# GSM8K

GSM8K_SHOT_LINES = (0, 1, 2, 3, 4)  # test.jsonl lines used as worked examples, never scored
_CALC = re.compile(r"<<[^>]*>>")
_NUMBER = re.compile(r"-?[$]?\d[\d,]*(?:\.\d+)?")
_ANSWER_IS = re.compile(r"answer is\s*:?\s*(-?[$]?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)


def normalize_number(text: str) -> str | None:
    """'$1,234.50' -> '1234.5', '-3.0' -> '-3', '007' -> '7'; None when `text` holds no number."""
    m = _NUMBER.search(text)
    if not m:
        return None
    s = m.group(0).replace("$", "").replace(",", "")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    neg = s.startswith("-")
    digits = s.lstrip("-").lstrip("0")
    if not digits or digits.startswith("."):
        digits = "0" + digits
    return ("-" if neg and digits != "0" else "") + digits


def gsm8k_gold(answer: str) -> str:
    """The reference number: what follows '####' in a GSM8K answer. Raises ValueError if absent."""
    if "####" not in answer:
        raise ValueError("GSM8K answer without '####'")
    gold = normalize_number(answer.split("####")[-1])
    if gold is None:
        raise ValueError("GSM8K answer without a number after '####'")
    return gold


def gsm8k_extract(response: str) -> str | None:
    """The model's final number. Rule: the number after the last 'the answer is' (any case) when
    the response has one, else the last number in the response; '$' and thousands commas are
    dropped, trailing zeros after a decimal point too. None when the response has no number."""
    found = _ANSWER_IS.findall(response)
    if found:
        return normalize_number(found[-1])
    numbers = _NUMBER.findall(response)
    return normalize_number(numbers[-1]) if numbers else None


def gsm8k_worked(answer: str) -> str:
    """A GSM8K reference solution as an example answer: calculator notes '<<...>>' removed and
    '#### N' written as 'The answer is N.'."""
    body, final = answer.split("####")
    return _CALC.sub("", body).strip() + f"\nThe answer is {final.strip()}."


def load_gsm8k(limit: int | None, seed: int, shots: int) -> list[Item]:
    """GSM8K test items (ids 'gsm8k-<line>'), the example lines excluded, sampled evenly. With
    `shots` > 0 the first `shots` example lines come first as earlier user/assistant turns (the
    few-shot examples as a multi-turn conversation, so the chat template frames every turn)."""
    lines = (DATA / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    if shots > len(GSM8K_SHOT_LINES):
        raise ValueError(f"--gsm8k-shots is at most {len(GSM8K_SHOT_LINES)}")
    prefix = []
    for i in GSM8K_SHOT_LINES[:shots]:
        prefix += [{"role": "user", "content": rows[i]["question"]},
                   {"role": "assistant", "content": gsm8k_worked(rows[i]["answer"])}]
    pool = [i for i in range(len(rows)) if i not in GSM8K_SHOT_LINES]
    items = []
    for k in sample_evenly(len(pool), limit, seed):
        i = pool[k]
        items.append(Item(id=f"gsm8k-{i}",
                          messages=prefix + [{"role": "user", "content": rows[i]["question"]}],
                          reference={"gold": gsm8k_gold(rows[i]["answer"])}))
    return items


def score_gsm8k(item: Item, response: str) -> dict:
    """{'extracted': str|None, 'gold': str, 'correct': 0|1}."""
    got = gsm8k_extract(response)
    gold = item.reference["gold"]
    return {"extracted": got, "gold": gold, "correct": int(got == gold)}


# ---------------------------------------------------------------------------------------------
# IFEval

def load_ifeval(limit: int | None, seed: int) -> list[Item]:
    """IFEval prompts (ids 'ifeval-<key>'), zero-shot, sampled evenly (all 541 by default)."""
    lines = (DATA / "ifeval" / "input_data.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    items = []
    for k in sample_evenly(len(rows), limit, seed):
        r = rows[k]
        items.append(Item(id=f"ifeval-{r['key']}", messages=[{"role": "user", "content": r["prompt"]}],
                          reference={"key": r["key"], "prompt": r["prompt"],
                                     "instruction_id_list": r["instruction_id_list"],
                                     "kwargs": r["kwargs"]}))
    return items


_scorer_ready = False


def _ifeval_scorer():
    global _scorer_ready
    from if_verifiable import evaluate_output_for_sample
    from if_verifiable.types import IFEvalSample
    if not _scorer_ready:
        from punkt_data import ensure_punkt
        ensure_punkt()
        import langdetect
        langdetect.DetectorFactory.seed = 0  # the language check is random otherwise
        _scorer_ready = True
    return evaluate_output_for_sample, IFEvalSample


def score_ifeval(item: Item, response: str) -> dict:
    """Strict and loose results per instruction by if-verifiable's IFEval checkers:
    {'strict': [0|1...], 'loose': [0|1...], 'prompt_strict': 0|1, 'prompt_loose': 0|1}."""
    evaluate, Sample = _ifeval_scorer()
    ref = item.reference
    sample = Sample(key=ref["key"], prompt=ref["prompt"],
                    instruction_id_list=ref["instruction_id_list"], kwargs=ref["kwargs"])
    results, _ = evaluate("ifeval", sample, response)
    n = len(ref["instruction_id_list"])
    strict = [int(r.strict_pass) for r in results] or [0] * n  # empty response: all fail
    loose = [int(r.loose_pass) for r in results] or [0] * n
    return {"strict": strict, "loose": loose,
            "prompt_strict": int(all(strict)), "prompt_loose": int(all(loose))}


# ---------------------------------------------------------------------------------------------
# RULER

RULER_DEFAULT_SAMPLES = 500  # RULER's NUM_SAMPLES per task and length


def load_ruler(samples: int | None, seed: int, lengths: list[int], tasks: list[str], count) -> list[Item]:
    """`samples` items (default 500, RULER's) of each task at each length, ids
    'ruler-<length>-<task>-<index>', generated from `seed`; `count(text)` is the served model's
    prompt-token count of a text (the server's /tokenize). Ordered by length, task, index."""
    import ruler
    items = []
    for length in lengths:
        for task in tasks:
            for i in range(samples or RULER_DEFAULT_SAMPLES):
                smp = ruler.generate(task, length, i, seed, count, DATA / "wikitext2" / "wiki.test.raw")
                items.append(Item(id=f"ruler-{length}-{task}-{i}", prompt=smp.prompt,
                                  max_tokens=ruler.task_gen_tokens(task),
                                  reference={"task": task, "length": length, "outputs": smp.outputs,
                                             "units": smp.units}))
    return items


def score_ruler(item: Item, response: str) -> dict:
    """RULER's string_match_all: {'task', 'length', 'outputs', 'score': fraction of the outputs
    found in the answer (case-insensitive)}."""
    import ruler
    ref = item.reference
    return {"task": ref["task"], "length": ref["length"], "outputs": ref["outputs"],
            "score": ruler.string_match_all(response, ref["outputs"])}


SETS = {
    "gsm8k": {"load": lambda a: load_gsm8k(a.limits["gsm8k"], a.seed, a.gsm8k_shots), "score": score_gsm8k},
    "ifeval": {"load": lambda a: load_ifeval(a.limits["ifeval"], a.seed), "score": score_ifeval},
    "ruler": {"load": lambda a: load_ruler(a.limits["ruler"], a.seed, a.ruler_lengths, a.ruler_tasks,
                                           a.count_tokens),
              "score": score_ruler, "tokenizer": True},
}
