"""What RULER's synthetic tasks are made of: the haystack fillers and the word lists.

- The **noise** filler: RULER's repeated sentence (its `type_haystack: noise`).
- The **essay** filler: RULER uses Paul Graham's essays, which are not shipped here; this harness
  uses WikiText-2's test articles instead (`../shared/data/wikitext2/wiki.test.raw`, read in
  place): article lines only (the `= Heading =` lines and blank lines dropped), WikiText's
  `@-@`, `@,@`, `@.@` joins undone, whitespace collapsed, then split into words as RULER splits
  its essay text.
- The **word lists**: RULER's keys are adjective-noun pairs and its common-words lists are nouns,
  adjectives and verbs, all from the PyPI package `wonderwords` (pinned in
  scripts/requirements.txt), read here through its public `RandomWord.filter`. When a
  common-words list needs more distinct words than wonderwords has (RULER then switches to a list
  of English words from its own repository, not shipped here), the extra words are WikiText-2's
  lowercase alphabetic words of 3 to 12 letters, in first-seen order.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

_JOINS = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


@functools.cache
def essay_words(path: Path) -> tuple[str, ...]:
    """WikiText-2 article text as a tuple of words (split on single spaces after collapsing
    whitespace). Raises FileNotFoundError when `path` is missing, ValueError when it holds no
    article line."""
    lines = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if not s or (s.startswith("=") and s.endswith("=")):
            continue
        for old, new in _JOINS.items():
            s = s.replace(old, new)
        lines.append(s)
    if not lines:
        raise ValueError(f"{path}: no article text")
    text = re.sub(r"\s+", " ", " ".join(lines)).strip()
    return tuple(text.split(" "))


@functools.cache
def _essay_sentences(path: Path) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The essay cut into sentences by NLTK's Punkt tokenizer (once), and the running word count
    at the end of each sentence."""
    import itertools

    from nltk.tokenize import sent_tokenize
    from punkt_data import ensure_punkt
    ensure_punkt()
    sents = tuple(sent_tokenize(" ".join(essay_words(path))))
    return sents, tuple(itertools.accumulate(len(x.split(" ")) for x in sents))


def essay_sentences(path: Path, n: int) -> list[str]:
    """The essay's first `n` words as sentences (RULER cuts its first n words into sentences with
    NLTK; here the whole essay is cut once and the last sentence is cut short to its words within
    the first n). The essay repeats when shorter than `n` words. Raises ValueError for n < 1."""
    import bisect
    if n < 1:
        raise ValueError(f"essay prefix of {n} words")
    sents, ends = _essay_sentences(path)
    out: list[str] = []
    while n > ends[-1]:
        out += sents
        n -= ends[-1]
    k = bisect.bisect_left(ends, n)  # sentences [0, k) end before word n; sentence k holds it
    out += sents[:k]
    rest = n - (ends[k - 1] if k else 0)
    if rest:
        out.append(" ".join(sents[k].split(" ")[:rest]))
    return out


@functools.cache
def wonderwords_lists() -> dict[str, tuple[str, ...]]:
    """{'nouns', 'adjectives', 'verbs'}: wonderwords' lists, each sorted and de-duplicated.
    Raises ImportError when wonderwords is missing (pip install -r scripts/requirements.txt)."""
    from wonderwords import RandomWord
    rw = RandomWord()
    out = {}
    for cat in ("nouns", "adjectives", "verbs"):
        out[cat] = tuple(sorted(set(rw.filter(include_categories=[cat]))))
        if not out[cat]:
            raise ImportError(f"wonderwords returned no {cat}")
    return out


def random_key_word(rng) -> str:
    """A NIAH key: an 'adjective-noun' pair drawn uniformly from wonderwords' lists (RULER draws
    from the set of all pairs; the ~6 million pairs are not built here)."""
    w = wonderwords_lists()
    return f"{rng.choice(w['adjectives'])}-{rng.choice(w['nouns'])}"


@functools.cache
def common_words() -> tuple[str, ...]:
    """Common-words extraction's words: wonderwords' nouns, adjectives and verbs, sorted, distinct."""
    w = wonderwords_lists()
    return tuple(sorted(set(w["nouns"]) | set(w["adjectives"]) | set(w["verbs"])))


@functools.cache
def extra_words(path: Path) -> tuple[str, ...]:
    """More distinct words for long common-words lists: WikiText-2's lowercase alphabetic words of
    3-12 letters not in `common_words()`, in first-seen order."""
    known = set(common_words())
    seen, out = set(), []
    for w in essay_words(path):
        if 3 <= len(w) <= 12 and w.isascii() and w.isalpha() and w.islower() and w not in known and w not in seen:
            seen.add(w)
            out.append(w)
    return tuple(out)
