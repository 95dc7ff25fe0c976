"""The accuracy harness (scripts/eval): answer extraction, item sampling, IFEval scoring, the
paired bootstrap, and one short run end to end against `kestrel serve`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "eval"))

import evalsets  # noqa: E402
from evalsets import (GSM8K_SHOT_LINES, gsm8k_extract, gsm8k_gold, gsm8k_worked,  # noqa: E402
                      load_gsm8k, load_ifeval, normalize_number, sample_evenly, score_ifeval)
from serve_helpers import KESTREL, model_path  # noqa: E402
from stats import paired_bootstrap  # noqa: E402

GSM8K = evalsets.DATA / "gsm8k" / "test.jsonl"
IFEVAL = evalsets.DATA / "ifeval" / "input_data.jsonl"
needs_data = pytest.mark.skipif(not GSM8K.exists() or not IFEVAL.exists(), reason="../shared/data missing")


@pytest.mark.parametrize("text,want", [
    ("The answer is 1,234.", "1234"),
    ("so she pays $18.00 in total. The answer is $18.00", "18"),
    ("First 3 then 4, finally 12 apples", "12"),
    ("The answer is: -7 degrees", "-7"),
    ("the Answer is 3.50 and later 9", "3.5"),
    ("The answer is 5. Then the answer is 6.", "6"),
    ("no digits here", None),
    ("", None),
    ("007 agents", "7"),
    ("0.0", "0"),
])
def test_gsm8k_extract(text, want):
    assert gsm8k_extract(text) == want


def test_normalize_number():
    assert normalize_number("1,000,000") == "1000000"
    assert normalize_number("-0.0") == "0"
    assert normalize_number("$0.25") == "0.25"


@needs_data
def test_gsm8k_gold_and_worked_examples_round_trip_on_the_whole_set():
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    assert len(rows) == 1319
    assert gsm8k_gold(rows[0]["answer"]) == "18"  # Janet's ducks
    for r in rows:
        gold = gsm8k_gold(r["answer"])
        worked = gsm8k_worked(r["answer"])
        assert "<<" not in worked and "####" not in worked
        assert worked.endswith(f"The answer is {r['answer'].split('####')[-1].strip()}.")
        # the extraction rule recovers the reference from every reference solution
        assert gsm8k_extract(worked) == gold
    with pytest.raises(ValueError):
        gsm8k_gold("no final marker")


def test_sample_evenly():
    a = sample_evenly(1314, 300, seed=0)
    assert a == sample_evenly(1314, 300, seed=0)
    assert a != sample_evenly(1314, 300, seed=1)
    assert len(a) == 300 and len(set(a)) == 300 and a == sorted(a)
    for k, i in enumerate(a):  # exactly one index in each of the 300 equal strata
        assert (k * 1314) // 300 <= i < ((k + 1) * 1314) // 300
    assert sample_evenly(10, None, 0) == list(range(10))
    assert sample_evenly(10, 10, 0) == list(range(10))
    assert sample_evenly(10, 99, 0) == list(range(10))
    with pytest.raises(ValueError):
        sample_evenly(10, 0, 0)


@needs_data
def test_gsm8k_items_exclude_the_worked_examples():
    items = load_gsm8k(None, 0, shots=5)
    assert len(items) == 1319 - len(GSM8K_SHOT_LINES)
    ids = {it.id for it in items}
    assert not ids & {f"gsm8k-{i}" for i in GSM8K_SHOT_LINES}
    it = load_gsm8k(300, 0, shots=5)[0]
    assert [m["role"] for m in it.messages] == ["user", "assistant"] * 5 + ["user"]
    assert it.messages[1]["content"].endswith("The answer is 18.")
    assert len(load_gsm8k(300, 0, shots=0)[0].messages) == 1
    with pytest.raises(ValueError):
        load_gsm8k(3, 0, shots=6)


@needs_data
def test_ifeval_items_and_scoring():
    items = load_ifeval(None, 0)
    assert len(items) == 541
    assert sum(len(it.reference["instruction_id_list"]) for it in items) == 834  # the paper's count
    it = next(i for i in items if i.id == "ifeval-1000")  # no commas, 3 highlights, >= 300 words
    body = " ".join(["word"] * 310)
    good = f"*Part one*\n{body}\n*Part two*\nmore\n*Part three*\nend"
    s = score_ifeval(it, good)
    assert s["strict"] == [1, 1, 1] and s["prompt_strict"] == 1 and s["prompt_loose"] == 1
    s = score_ifeval(it, good.replace("more", "more, and"))
    assert s["strict"] == [0, 1, 1] and s["prompt_strict"] == 0
    s = score_ifeval(it, "*a* *b* *c* short")
    assert s["strict"] == [1, 1, 0]
    assert score_ifeval(it, "")["strict"] == [0, 0, 0]
    # sentence counting runs NLTK's Punkt (scripts/eval/punkt_data.py); key 1262: a <<title>> and
    # "less than 5 sentences". Hand-counted: 4 sentences ("Mr." and "Dr." are abbreviations, which
    # a split on periods would count as 6), then 5.
    it = next(i for i in items if i.id == "ifeval-1262")
    four = "<<Roads>>\nMr. Smith drives. Heavy axles hurt roads. Dr. Lee agrees. Repair costs rise."
    assert score_ifeval(it, four)["strict"] == [1, 1]
    assert score_ifeval(it, four + " Taxes follow.")["strict"] == [1, 0]


def test_paired_bootstrap():
    n = 200
    ones, zeros = np.ones(n), np.zeros(n)
    same = paired_bootstrap((zeros, ones), (zeros, ones))
    assert same["delta"] == 0 and same["lo"] == 0 and same["hi"] == 0
    flips = np.zeros(n)
    flips[:20] = 1  # other answers 20 more items right: +10 points
    d = paired_bootstrap((zeros, ones), (flips, ones), resamples=4000)
    assert d["delta"] == pytest.approx(0.10)
    assert 0 < d["lo"] < 0.10 < d["hi"] < 0.2
    # paired: a shared per-item effect cancels, so the interval is narrower than the spread
    base = np.r_[np.ones(100), np.zeros(100)]
    other = base.copy()
    other[0] = 0
    d = paired_bootstrap((base, ones), (other, ones), resamples=4000)
    assert d["delta"] == pytest.approx(-0.005) and d["hi"] <= 0
    # instruction-level: ratio of sums
    r = paired_bootstrap((np.array([1., 2.]), np.array([2., 2.])), (np.array([2., 2.]), np.array([2., 2.])))
    assert r["base"] == pytest.approx(0.75) and r["other"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        paired_bootstrap((ones, ones), (ones[:5], ones[:5]))


@pytest.mark.skipif(not os.environ.get("KESTREL_IFEVAL_GPT4_RESPONSES"),
                    reason="set KESTREL_IFEVAL_GPT4_RESPONSES to the paper's GPT-4 responses (docs/accuracy.md)")
def test_scorer_matches_published_gpt4_scores():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval" / "check_scorer.py"),
                          os.environ["KESTREL_IFEVAL_GPT4_RESPONSES"], "--tolerance", "0.5"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@needs_data
def test_two_identical_images_end_to_end(tmp_path):
    """The same model under two labels: greedy answers, scores and perplexity must agree exactly
    (deltas 0, KL 0); a rerun resumes without asking again."""
    model = model_path()
    cmd = [sys.executable, str(ROOT / "scripts" / "eval" / "kestrel_eval.py"), "--kestrel", str(KESTREL),
           "--image", f"base={model}", "--image", f"copy={model}", "--limit", "2", "--max-tokens", "8",
           "--gsm8k-shots", "1", "--out", str(tmp_path), "--threads", "2", "--ppl-chunks", "1",
           "--ppl-ctx", "64", "--resamples", "200"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    for s in ("gsm8k", "ifeval"):
        a = [json.loads(x) for x in (tmp_path / s / "base.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in (tmp_path / s / "copy.jsonl").read_text().splitlines()]
        assert len(a) == 2 and [r["id"] for r in a] == [r["id"] for r in b]
        assert [r["answer"] for r in a] == [r["answer"] for r in b]
        assert all(r["completion_tokens"] <= 8 and r["answer"] for r in a)
    rep = json.loads((tmp_path / "report.json").read_text())
    for t in rep["table"].values():
        assert t["items"] == 2
        assert all(r.get("delta", 0) == 0 for r in t["rows"])
    assert rep["perplexity"]["copy"]["kl_mean"] == pytest.approx(0, abs=1e-9)
    assert rep["perplexity"]["copy"]["same_top1_pct"] == 100
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "every item already answered" in again.stdout
    bad = subprocess.run(cmd[:-10] + ["--limit", "3", "--out", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode != 0 and "use another --out" in bad.stderr


@needs_data
def test_bad_input_is_a_clear_error(tmp_path):
    """Usage errors name the problem; a label keeps its image across resumes; a model file that is
    not a model is reported with the server's reason, without a traceback."""
    script = [sys.executable, str(ROOT / "scripts" / "eval" / "kestrel_eval.py"), "--kestrel", str(KESTREL)]
    model = model_path()

    def run(*args):
        return subprocess.run(script + list(args), capture_output=True, text=True, timeout=600)

    r = run("--image", f"a={model}", "--gsm8k-shots", "9", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--gsm8k-shots" in r.stderr
    r = run("--image", f"a={model}", "--resamples", "0", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--resamples" in r.stderr
    r = run("--image", f"a={model}", "--image", f"b={model}", "--ppl-file", str(tmp_path / "none.txt"),
            "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--ppl-file" in r.stderr
    r = run("--image", f"a={ROOT / 'README.md'}", "--sets", "ifeval", "--limit", "1", "--out", str(tmp_path / "y"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "kestrel serve for 'a' exited" in r.stderr
    out = tmp_path / "z"
    r = run("--image", f"a={model}", "--sets", "ifeval", "--limit", "1", "--max-tokens", "4",
            "--ppl-chunks", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    with open(out / "ifeval" / "a.jsonl", "a") as f:
        f.write('{"id": "cut')  # a kill mid-write
    r = run("--image", f"a={ROOT / 'README.md'}", "--sets", "ifeval", "--limit", "1", "--max-tokens", "4",
            "--ppl-chunks", "0", "--out", str(out))
    assert r.returncode == 1 and "label 'a' was answered by" in r.stderr
    r = run("--image", f"a={model}", "--sets", "ifeval", "--limit", "1", "--max-tokens", "4",
            "--ppl-chunks", "0", "--out", str(out))
    assert r.returncode == 0 and "every item already answered" in r.stdout
