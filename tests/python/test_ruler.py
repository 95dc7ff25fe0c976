"""RULER in the accuracy harness (scripts/eval/ruler.py): the generators are deterministic for a
seed, the needles are where they should be and nowhere else, the haystack fills the length in the
served model's tokens, the scorer is RULER's string match, and a short run goes end to end."""
import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "eval"))

import evalsets  # noqa: E402
import ruler  # noqa: E402
from serve_helpers import KESTREL, Server, model_path  # noqa: E402

ESSAY = evalsets.DATA / "wikitext2" / "wiki.test.raw"
_missing = [m for m in ("wonderwords", "nltk", "punkt") if importlib.util.find_spec(m) is None]
needs_essay = pytest.mark.skipif(not ESSAY.exists() or bool(_missing),
                                 reason=f"../shared/data/wikitext2 or {_missing or 'a package'} missing "
                                        "(pip install -r scripts/requirements.txt)")
needs_model = pytest.mark.skipif(not KESTREL.exists() or not model_path().exists(),
                                 reason="build/kestrel or the default model missing (scripts/quickstart.sh)")


def words_count(text: str) -> int:
    """A stand-in tokenizer for the checks that need no server: 1 (BOS) + whitespace words."""
    return 1 + len(text.split())


# ---------------------------------------------------------------------------------------------
# The scorer: RULER's string_match_all / string_match_part, on hand-made cases.

@pytest.mark.parametrize("pred,refs,want", [
    ("The special magic numbers are 1234567 and 7654321.", ["1234567", "7654321"], 1.0),
    ("The special magic numbers are 1234567 and 7654322.", ["1234567", "7654321"], 0.5),
    (" 1. APPLE 2. Pear", ["apple", "pear", "plum", "fig"], 0.5),  # case-insensitive
    ("", ["1234567"], 0.0),
    ("123456", ["1234567"], 0.0),  # the answer must contain the reference, not the reverse
    ("12345\x0067", ["1234567"], 0.0),  # a control character splits the answer (becomes '\n')
    ("nothing here", ["abc", "def"], 0.0),
    ("party", ["art"], 1.0),  # a plain substring test, as RULER's
])
def test_string_match_all(pred, refs, want):
    assert ruler.string_match_all(pred, refs) == pytest.approx(want)


@pytest.mark.parametrize("pred,refs,want", [
    ("Paris is the capital", ["paris", "Lyon"], 1.0),
    ("Lyon", ["Paris", "Marseille"], 0.0),
    ("", ["Paris"], 0.0),
])
def test_string_match_part(pred, refs, want):
    assert ruler.string_match_part(pred, refs) == want


def test_scorer_refuses_an_empty_reference_list():
    with pytest.raises(ValueError):
        ruler.string_match_all("x", [])


def test_postprocess_is_rulers():
    assert ruler.postprocess("  a\tb\x1fc \n") == "a\nb\nc"


def test_zeta_at_two():
    import math
    assert ruler.zeta(2.0) == pytest.approx(math.pi ** 2 / 6, rel=1e-12)
    assert ruler.zeta(3.0) == pytest.approx(1.2020569031595942, rel=1e-12)


def test_report_rows_average_per_length_and_task(tmp_path):
    """The table's RULER rows: the mean of the items' scores per length and per task, the
    bootstrap pairing the same items."""
    from report import build_table
    (tmp_path / "ruler").mkdir()
    scores = {"a": [1.0, 0.5, 0.0, 1.0, 0.25, 0.75], "b": [1.0, 0.0, 0.0, 1.0, 0.25, 0.25]}
    ids = [(4096, "vt", 0), (4096, "vt", 1), (4096, "cwe", 0), (4096, "cwe", 1), (8192, "vt", 0), (8192, "vt", 1)]
    for lab, sc in scores.items():
        with open(tmp_path / "ruler" / f"{lab}.jsonl", "w") as f:
            for (L, t, i), s in zip(ids, sc):
                f.write(json.dumps({"id": f"ruler-{L}-{t}-{i}", "length": L, "task": t, "score": s}) + "\n")
    rows = {(r["metric"], r["image"]): r for r in build_table(tmp_path, ["ruler"], ["a", "b"], 200)["ruler"]["rows"]}
    assert rows[("4096 average", "a")]["value"] == pytest.approx(0.625)
    assert rows[("4096 average", "a")]["items"] == 4
    assert rows[("4096 average", "b")]["delta"] == pytest.approx(0.5 - 0.625)
    assert rows[("4096 cwe", "b")]["value"] == pytest.approx(0.5)
    assert rows[("8192 vt", "b")]["delta"] == pytest.approx(-0.25)
    assert rows[("8192 average", "a")]["items"] == 2


# ---------------------------------------------------------------------------------------------
# The generators, with the stand-in tokenizer.

@needs_essay
@pytest.mark.parametrize("task", list(ruler.TASKS))
def test_generation_is_deterministic_and_fits(task):
    a = ruler.generate(task, 2048, 0, 7, words_count, ESSAY)
    b = ruler.generate(task, 2048, 0, 7, words_count, ESSAY)
    assert (a.prompt, a.outputs) == (b.prompt, b.outputs)
    assert ruler.generate(task, 2048, 1, 7, words_count, ESSAY).prompt != a.prompt
    assert ruler.generate(task, 2048, 0, 8, words_count, ESSAY).prompt != a.prompt
    total = words_count(a.prompt) + ruler.task_gen_tokens(task)
    assert 2048 - 64 <= total <= 2048
    # one more haystack unit no longer fits
    more = ruler.make_sample(task, a.units + 1, f"ruler/7/{task}/2048/0", 2048, ESSAY,
                             ruler.vt_example(ruler.TASKS[task], f"ruler/7/{task}/2048/0", words_count)
                             if task == "vt" else "")
    assert words_count(more.prompt) + ruler.task_gen_tokens(task) > 2048


@needs_essay
@pytest.mark.parametrize("task", [t for t, s in ruler.TASKS.items() if s.family == "niah"])
def test_needles_once_each_where_they_should_be(task):
    spec = ruler.TASKS[task]
    for index in range(3):
        s = ruler.generate(task, 4096, index, 0, words_count, ESSAY)
        needles = s.meta["needles"]
        assert len(needles) == max(spec.n_keys, spec.n_queries) * spec.n_values
        for n in needles:
            assert s.prompt.count(n) == 1, n
        for k in s.meta["keys"]:  # each key only in its needles (and in the question, if asked)
            asked = k in s.meta["queried"]
            assert s.prompt.count(k) == spec.n_values + 2 * asked, k
        assert len(s.outputs) == spec.n_queries * spec.n_values
        for v in s.outputs:
            assert sum(v in n for n in needles) == 1 and s.prompt.count(v) == 1
        head, _, tail = s.prompt.partition("afterwards.\n")
        context = tail.rsplit("\nWhat ", 1)[0]
        if spec.haystack == "essay":  # after the share of the essay's sentences its depth says
            import ruler_sources
            sents = ruler_sources.essay_sentences(ESSAY, s.units)
            at = [context.index(n) for n in needles]
            assert at == sorted(at)
            for n, pos, depth in zip(needles, at, s.meta["depths"]):
                before = context[:pos]
                for other in needles:
                    before = before.replace(other + " ", "")
                cut = int(len(sents) * depth / 100)
                assert before == " ".join(sents[:cut]) + (" " if cut else ""), (n, depth)
        else:  # one needle per line of the filler
            lines = context.split("\n")
            assert len(lines) == s.units + len(needles)
            assert sorted(x for x in lines if x in needles) == sorted(needles)
        singular = spec.n_values * spec.n_queries == 1
        assert s.prompt.endswith("mentioned in the provided text " + ("is" if singular else "are"))


@needs_essay
def test_variable_tracking_chain():
    s = ruler.generate("vt", 4096, 0, 0, words_count, ESSAY)
    example, question = s.prompt.split("\n\nMemorize and track", 1)
    lines = question.split("\n")
    chain = [f"VAR {s.outputs[0]} = {s.meta['value']}"] + [
        f"VAR {b} = VAR {a} " for a, b in zip(s.outputs, s.outputs[1:])]
    at = [lines.index(c) for c in chain]
    assert at == sorted(at) and len(set(s.outputs)) == 5
    assert all(re.fullmatch(r"[A-Z]{5}", v) for v in s.outputs)
    assert example.startswith("Memorize and track") and re.search(r"they are:  ([A-Z]{3} ){4}[A-Z]{3}$", example)
    assert s.prompt.endswith(f"5 variables are assigned the value {s.meta['value']}, they are: ")


@needs_essay
def test_common_words_frequencies():
    s = ruler.generate("cwe", 4096, 0, 0, words_count, ESSAY)
    question = s.prompt.split("\nBelow is a numbered list", 1)[1]
    listing = question.split("\n")[1]
    words = re.findall(r"\d+\. (\S+)", listing)
    counts = Counter(words)
    assert sorted(counts[w] for w in s.outputs) == [30] * 10
    assert set(counts.values()) == {30, 3} and len(counts) == s.units


@needs_essay
def test_frequent_words_are_the_three_after_the_noise_word():
    s = ruler.generate("fwe", 4096, 0, 0, words_count, ESSAY)
    text = s.prompt.split("coded words. ", 1)[1].split("\nQuestion:", 1)[0]
    ranked = [w for w, _ in Counter(text.split(" ")).most_common()]
    counts = Counter(text.split(" "))
    assert ranked[0] == "..." and ranked[1:4] == s.outputs
    assert counts[s.outputs[2]] > counts[ranked[4]]


@needs_essay
def test_bad_requests_are_clear_errors():
    with pytest.raises(KeyError, match="unknown RULER task"):
        ruler.generate("qa_1", 4096, 0, 0, words_count, ESSAY)
    with pytest.raises(ValueError, match="smallest haystack"):
        ruler.generate("niah_single_1", 150, 0, 0, words_count, ESSAY)


# ---------------------------------------------------------------------------------------------
# With the served model's tokenizer, and end to end.

@needs_model
@needs_essay
def test_lengths_in_the_served_models_tokens():
    srv = Server("-m", model_path(), "-c", "4096")
    try:
        def count(text):
            status, body = srv.request("POST", "/tokenize", {"content": text})
            assert status == 200, body
            return body["count"]
        for task in ruler.TASKS:
            key = f"ruler/0/{task}/2048/0"
            s = ruler.generate(task, 2048, 0, 0, count, ESSAY)
            gen = ruler.task_gen_tokens(task)
            assert 0.95 * 2048 <= count(s.prompt) + gen <= 2048, task
            example = ruler.vt_example(ruler.TASKS[task], key, count) if task == "vt" else ""
            more = ruler.make_sample(task, s.units + 1, key, 2048, ESSAY, example)
            assert count(more.prompt) + gen > 2048, task  # one haystack unit more would not fit
    finally:
        srv.stop()


@needs_model
@needs_essay
def test_short_run_end_to_end(tmp_path):
    """Three tasks at 1,024 tokens, one sample each, the same model under two labels: answers
    asked as completions of the prompt, every item within its length, identical answers and
    scores, deltas 0; a rerun resumes without asking again. Answers are capped at 24 tokens
    (CI time; a NIAH answer comes first)."""
    model = model_path()
    cmd = [sys.executable, str(ROOT / "scripts" / "eval" / "kestrel_eval.py"), "--kestrel", str(KESTREL),
           "--image", f"base={model}", "--image", f"copy={model}", "--sets", "ruler",
           "--ruler-lengths", "1024", "--ruler-tasks", "niah_single_1,vt,fwe", "--limit", "ruler=1", "--max-tokens", "ruler=24",
           "--out", str(tmp_path), "--threads", "2", "--ppl-chunks", "0", "--resamples", "200"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    a = [json.loads(x) for x in (tmp_path / "ruler" / "base.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "ruler" / "copy.jsonl").read_text().splitlines()]
    assert [r["id"] for r in a] == ["ruler-1024-niah_single_1-0", "ruler-1024-vt-0", "ruler-1024-fwe-0"]
    assert [r["answer"] for r in a] == [r["answer"] for r in b]
    for r in a:
        budget = {"niah_single_1": 128, "vt": 30, "fwe": 50}[r["task"]]
        assert 0.95 * 1024 <= r["prompt_tokens"] + budget <= 1024, r
        assert r["max_tokens"] == 24 and r["completion_tokens"] <= 24
        assert 0 <= r["score"] <= 1 and r["score"] == ruler.string_match_all(r["answer"], r["outputs"])
    rep = json.loads((tmp_path / "report.json").read_text())
    metrics = [r["metric"] for r in rep["table"]["ruler"]["rows"] if r["image"] == "copy"]
    assert metrics == ["1024 average", "1024 niah_single_1", "1024 vt", "1024 fwe"]  # RULER's order
    assert all(r.get("delta", 0) == 0 for r in rep["table"]["ruler"]["rows"])
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "every item already answered" in again.stdout
    bad = subprocess.run(cmd[:-8] + ["--ruler-tasks", "niah_single_1,qa_1", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "qa_1" in bad.stderr
