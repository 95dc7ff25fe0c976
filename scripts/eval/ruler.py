"""RULER's synthetic long-context tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size
of Your Long-Context Language Models?", arXiv 2404.06654), generated from a seed at a length in
the served model's tokens, and scored as RULER scores them.

The task definitions follow NVIDIA/RULER's `scripts/synthetic.yaml` and its generators (read to
compare; this is an independent implementation): the prompts and answer prefixes are RULER's (the
benchmark's inputs), the fillers and word lists are described in `ruler_sources.py`. Each prompt is
RULER's `base` template (no chat format: the default model is a base model) followed by the task's
answer prefix, which the model continues. The length L counts the prompt's tokens as the completions
endpoint counts them (BOS included) plus the task's answer budget, as RULER's `max_seq_length`
counts input plus `tokens_to_generate`: each item's haystack is the largest for which that sum is
at most L (binary search over the haystack's units, with the server's tokenizer).

Scoring (RULER's `scripts/eval/synthetic/constants.py`): the answer is stripped and its control
characters (U+0000-U+001F) turned into newlines; `string_match_all` is the fraction of the
reference strings found in it, case-insensitive, as substrings; `string_match_part` is 1 when any
reference is found. Every synthetic task uses `string_match_all`. RULER's two QA tasks (SQuAD,
HotpotQA) are not included: neither data set is in ../shared/data or a PyPI package.
"""
from __future__ import annotations

import random
import re
import string
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ruler_sources as src

# RULER's answer budgets (`tokens_to_generate`), per task family.
GEN_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}


@dataclass(frozen=True)
class Niah:
    """A needle-in-a-haystack task: `haystack` 'noise' | 'essay' | 'needle' (distractor needles),
    key and value kinds 'words' | 'numbers' | 'uuids', how many keys, values per key and queried keys."""
    haystack: str
    key: str
    value: str
    n_keys: int = 1
    n_values: int = 1
    n_queries: int = 1
    family: str = "niah"


@dataclass(frozen=True)
class VariableTracking:
    """Chains of `VAR X = VAR Y` assignments in noise; the answer is every variable of chain 0."""
    n_chains: int = 1
    n_hops: int = 4
    family: str = "vt"


@dataclass(frozen=True)
class CommonWords:
    """A numbered list in which `n_common` words appear `freq_common` times and the rest
    `freq_uncommon` times; the answer is the common words."""
    freq_common: int = 30
    freq_uncommon: int = 3
    n_common: int = 10
    family: str = "cwe"


@dataclass(frozen=True)
class FrequentWords:
    """Coded 6-letter words drawn with Zipf frequencies (exponent `alpha`); the answer is the
    three most frequent after the top one ('...', noise)."""
    alpha: float = 2.0
    word_len: int = 6
    family: str = "fwe"


TASKS = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", n_keys=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", n_values=4),
    "niah_multiquery": Niah("essay", "words", "numbers", n_keys=4, n_queries=4),
    "vt": VariableTracking(),
    "cwe": CommonWords(),
    "fwe": FrequentWords(),
}
DEFAULT_LENGTHS = (4096, 8192, 16384, 32768)

_NIAH_PLURAL = ("Some special magic {v} are hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the {v} afterwards.\n{context}\n"
                "What are all the special magic {v} for {query} mentioned in the provided text?",
                " The special magic {v} for {query} mentioned in the provided text are")
_NIAH_SINGULAR = ("A special magic {v} is hidden within the following text. Make sure to memorize it. "
                  "I will quiz you about the {v} afterwards.\n{context}\n"
                  "What is the special magic {v} for {query} mentioned in the provided text?",
                  " The special magic {v} for {query} mentioned in the provided text is")
_NEEDLE = "One of the special magic {v} for {key} is: {value}."
_VT = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
       "Question: Find all variables that are assigned the value {value} in the text above.",
       " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
       "assigned the value {value}, they are: ")
_CWE = ("Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often.\n{context}\n"
        "Question: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:")
_FWE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
        "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
        "the dots '....'. What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:")
# RULER's needle depths: 40 evenly spaced percentages from 0 to 100, rounded.
DEPTHS = tuple(int(round(100 * i / 39)) for i in range(40))


@dataclass
class Sample:
    """One generated item: `prompt` (template + answer prefix, what the model continues),
    `outputs` (the reference strings), `units` (the haystack's size in its units) and `meta`
    (where the needles went, for checks)."""
    prompt: str
    outputs: list[str]
    units: int
    meta: dict


# ---------------------------------------------------------------------------------------------
# Scoring


def postprocess(pred: str) -> str:
    """RULER's clean-up of an answer: strip, control characters U+0000-U+001F to '\\n', strip."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()


def string_match_all(pred: str, refs: list[str]) -> float:
    """Fraction of `refs` that occur in `pred` (case-insensitive substrings), in [0, 1].
    Raises ValueError for an empty `refs`."""
    if not refs:
        raise ValueError("no reference strings")
    p = postprocess(pred).lower()
    return sum(r.lower() in p for r in refs) / len(refs)


def string_match_part(pred: str, refs: list[str]) -> float:
    """1.0 when any of `refs` occurs in `pred` (case-insensitive substring), else 0.0.
    Raises ValueError for an empty `refs`."""
    if not refs:
        raise ValueError("no reference strings")
    p = postprocess(pred).lower()
    return float(any(r.lower() in p for r in refs))


# ---------------------------------------------------------------------------------------------
# Generators: (task spec, haystack units, rng seed, length) -> Sample, deterministic.


def _rng(seed: str) -> random.Random:
    return random.Random(seed)  # a str seed is hashed with SHA-512: the same on every run


def _random_thing(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == "words":
        return src.random_key_word(rng)
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle kind {kind!r}")


def _overlaps(key: str, keys: list[str]) -> bool:
    """Whether `key` equals, contains or is contained in one of `keys` ('red-car', 'bored-car')."""
    return any(key in k or k in key for k in keys)


def _niah(spec: Niah, n: int, seed: str, essay: Path) -> Sample:
    rng = _rng(seed)
    n_keys = max(spec.n_keys, spec.n_queries)
    keys, values, needles = [], [], []
    while len(keys) < n_keys:
        k = _random_thing(rng, spec.key)
        if _overlaps(k, keys):
            continue
        keys.append(k)
        values.append([_random_thing(rng, spec.value) for _ in range(spec.n_values)])
        needles += [_NEEDLE.format(v=spec.value, key=k, value=v) for v in values[-1]]
    rng.shuffle(needles)
    meta: dict = {"needles": needles}
    if spec.haystack == "essay":
        sents = src.essay_sentences(essay, n)
        depths = sorted(rng.sample(DEPTHS, len(needles)))
        cuts = [int(len(sents) * d / 100) for d in depths]
        parts, last = [], 0
        for cut, needle in zip(cuts, needles):
            parts += sents[last:cut] + [needle]
            last = cut
        parts += sents[last:]
        context = " ".join(parts)
        meta["depths"] = depths
    else:
        if spec.haystack == "noise":
            lines = [src.NOISE_SENTENCE] * n
        elif spec.haystack == "needle":
            lines = []
            while len(lines) < n:
                k = _random_thing(rng, spec.key)
                if not _overlaps(k, keys):  # a distractor never repeats a real key, even in part
                    lines.append(_NEEDLE.format(v=spec.value, key=k, value=_random_thing(rng, spec.value)))
        else:
            raise ValueError(f"unknown haystack {spec.haystack!r}")
        for at, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles):
            lines.insert(at, needle)
        context = "\n".join(lines)
    asked = rng.sample(range(n_keys), spec.n_queries)
    answers = [v for i in asked for v in values[i]]
    names = [keys[i] for i in asked]
    query = names[0] if len(names) == 1 else ", ".join(names[:-1]) + ", and " + names[-1]
    if spec.n_queries * spec.n_values == 1:
        body, prefix, v = *_NIAH_SINGULAR, spec.value[:-1]
    else:
        body, prefix, v = *_NIAH_PLURAL, spec.value
    prompt = body.format(v=v, context=context, query=query) + prefix.format(v=v, query=query)
    meta.update({"keys": keys, "queried": names})
    return Sample(prompt, answers, n, meta)


def _vt_chains(rng: random.Random, spec: VariableTracking, letters: int) -> tuple[list[list[str]], list[list[str]]]:
    names: list[str] = []
    while len(names) < spec.n_chains * (spec.n_hops + 1):
        v = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if v not in names:
            names.append(v)
    chains, lines = [], []
    for c in range(spec.n_chains):
        vs = names[c * (spec.n_hops + 1):(c + 1) * (spec.n_hops + 1)]
        chains.append(vs)
        lines.append([f"VAR {vs[0]} = {rng.randint(10000, 99999)}"]
                     + [f"VAR {vs[j + 1]} = VAR {vs[j]} " for j in range(spec.n_hops)])
    return chains, lines


def _vt_text(rng: random.Random, spec: VariableTracking, n: int, letters: int) -> tuple[str, list[str], str]:
    """The task text with its answer prefix, the answer (chain 0's variables) and chain 0's value."""
    chains, lines = _vt_chains(rng, spec, letters)
    sents = [src.NOISE_SENTENCE] * n
    for chain in lines:
        at = sorted(rng.sample(range(len(sents)), len(chain)))
        for j, (pos, line) in enumerate(zip(at, chain)):
            sents.insert(pos + j, line)
    context = "\n".join(sents).replace(". \n", ".\n")
    value = lines[0][0].split("=")[-1].strip()
    body, prefix = _VT
    return (body.format(context=context, value=value) + prefix.format(n=spec.n_hops + 1, value=value),
            chains[0], value)


def vt_example(spec: VariableTracking, seed: str, count: Callable[[str], int], budget: int = 500) -> str:
    """RULER's one worked variable-tracking example that precedes the question: 3-letter variables,
    noise fitted to at most `budget` tokens, its answer written after its answer prefix."""
    def make(n):
        text, answer, _ = _vt_text(_rng(seed + "/example"), spec, n, letters=3)
        return text + " " + " ".join(answer) + "\n"
    n = fit_units(lambda n: make(n), count, budget, lo=spec.n_hops + 1)
    return make(n)


def _vt(spec: VariableTracking, n: int, seed: str, example: str) -> Sample:
    text, answer, value = _vt_text(_rng(seed), spec, n, letters=5)
    return Sample(example + "\n" + text, answer, n, {"value": value})


def _cwe_list(rng: random.Random, pool: tuple[str, ...], n: int, spec: CommonWords,
              freq_common: int, freq_uncommon: int) -> tuple[str, list[str]]:
    if n > len(pool):
        raise ValueError(f"common-words extraction: {n} distinct words asked, {len(pool)} available")
    words = rng.sample(pool, n)
    common, rest = words[:spec.n_common], words[spec.n_common:]
    seq = common * freq_common + rest * freq_uncommon
    rng.shuffle(seq)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(seq)), common


def _cwe(spec: CommonWords, n: int, seed: str, length: int, essay: Path) -> Sample:
    rng = _rng(seed)
    pool = src.common_words()
    if n > len(pool):
        pool = pool + src.extra_words(essay)
    body, prefix = _CWE
    # RULER: below 4k, lower repeats (6/1 for the question, 3/1 in a 20-word example).
    ex_n, ex_fc, ex_fu = (40, 10, 3) if length >= 4096 else (20, 3, 1)
    fc, fu = (spec.freq_common, spec.freq_uncommon) if length >= 4096 else (6, 1)
    ex_ctx, ex_ans = _cwe_list(rng, src.common_words(), ex_n, spec, ex_fc, ex_fu)
    example = body.format(context=ex_ctx) + prefix + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_ans))
    ctx, common = _cwe_list(rng, pool, n, spec, fc, fu)
    return Sample(example + "\n" + body.format(context=ctx) + prefix, common, n, {})


def zeta(s: float) -> float:
    """Riemann zeta for s > 1 (Euler-Maclaurin after 64 terms; relative error < 1e-12 for s >= 1.5)."""
    if s <= 1:
        raise ValueError("zeta needs s > 1")
    n = 64
    head = sum(k ** -s for k in range(1, n))
    return head + n ** (1 - s) / (s - 1) + n ** -s / 2 + s * n ** (-s - 1) / 12 - s * (s + 1) * (s + 2) * n ** (-s - 3) / 720


def fwe_vocab(spec: FrequentWords, seed: str, size: int) -> list[str]:
    """`size` distinct random lowercase words of `spec.word_len` letters in random order, the
    first replaced by '...' (the noise word)."""
    rng = _rng(seed + "/vocab")
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=spec.word_len)))
    out = sorted(vocab)
    rng.shuffle(out)
    out[0] = "..."
    return out


def _fwe(spec: FrequentWords, n: int, seed: str, length: int) -> Sample:
    vocab = fwe_vocab(spec, seed, max((length - GEN_TOKENS["fwe"]) // 50, 5))
    z = zeta(spec.alpha)
    seq = [w for k, w in enumerate(vocab, start=1) for _ in range(int(n * k ** -spec.alpha / z))]
    _rng(seed).shuffle(seq)
    body, prefix = _FWE
    return Sample(body.format(context=" ".join(seq)) + prefix, vocab[1:4], n, {})


def min_units(task: str) -> int:
    """The smallest haystack a task is defined with."""
    spec = TASKS[task]
    if isinstance(spec, Niah):
        return max(spec.n_keys, spec.n_queries) * spec.n_values
    if isinstance(spec, VariableTracking):
        return spec.n_hops + 1
    if isinstance(spec, CommonWords):
        return spec.n_common + 1
    return 100  # FWE: below ~30 words the three answer words' counts can tie with the fourth's


def make_sample(task: str, n: int, seed: str, length: int, essay: Path, example: str = "") -> Sample:
    """One sample of `task` with `n` haystack units. `example` is the variable-tracking worked
    example (`vt_example`). Raises KeyError for an unknown task, ValueError for a bad size."""
    spec = TASKS[task]
    if n < min_units(task):
        raise ValueError(f"{task}: {n} haystack units, at least {min_units(task)}")
    if isinstance(spec, Niah):
        return _niah(spec, n, seed, essay)
    if isinstance(spec, VariableTracking):
        return _vt(spec, n, seed, example)
    if isinstance(spec, CommonWords):
        return _cwe(spec, n, seed, length, essay)
    return _fwe(spec, n, seed, length)


def fit_units(make: Callable[[int], str], count: Callable[[str], int], budget: int, lo: int) -> int:
    """The largest n >= lo with count(make(n)) <= budget (binary search; the count grows with n
    up to small local wobbles). Raises ValueError when even `lo` does not fit."""
    if count(make(lo)) > budget:
        raise ValueError(f"the smallest haystack ({lo} units) needs more than {budget} tokens")
    hi = max(2 * lo, 16)
    while count(make(hi)) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # invariant: make(lo) fits, make(hi) does not
        mid = (lo + hi) // 2
        if count(make(mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def generate(task: str, length: int, index: int, seed: int, count: Callable[[str], int], essay: Path) -> Sample:
    """Sample `index` of `task` at `length` tokens: the largest haystack with
    count(prompt) + the task's answer budget <= length. `count` gives a text's prompt tokens as the
    server counts them (BOS included). Deterministic for (task, length, index, seed, tokenizer).
    Raises ValueError when `length` is too short for the task."""
    if task not in TASKS:
        raise KeyError(f"unknown RULER task {task!r} (known: {', '.join(TASKS)})")
    key = f"ruler/{seed}/{task}/{length}/{index}"
    budget = length - GEN_TOKENS[TASKS[task].family]
    example = vt_example(TASKS[task], key, count) if task == "vt" else ""
    n = fit_units(lambda n: make_sample(task, n, key, length, essay, example).prompt, count, budget, min_units(task))
    return make_sample(task, n, key, length, essay, example)


def task_gen_tokens(task: str) -> int:
    """The task's answer budget in tokens (RULER's tokens_to_generate)."""
    return GEN_TOKENS[TASKS[task].family]

