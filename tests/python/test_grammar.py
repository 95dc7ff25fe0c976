"""Structured output against independent references.

1. Token masks: along token sequences (sampled by `kestrel run --json-schema` at temperature 1, and
   hand-written answers tokenized by transformers), the mask Kestrel's grammar layer computes at
   every step (tests/tools/grammar_masks.cpp) equals the mask xgrammar's Python package computes
   for the same grammar over the vocabulary *it* builds from the Hugging Face tokenizer that
   `kestrel export-tokenizer` writes (xgrammar's own decoding of the vocabulary, not ours).
   Control tokens are left out of the comparison: Kestrel never lets a grammar emit one (the
   detokenizer writes them as nothing), while the HF vocabulary spells them out as text. The
   tokens Kestrel treats so must be HF's special tokens plus at most a few that llama.cpp also
   renders as nothing (end-of-generation texts such as "</s>").
   For JSON schemas Python compiles the grammar Kestrel compiled (its EBNF text): xgrammar's own
   conversion of the schema (asserted equal as text where no date format is involved) with
   Kestrel's two edits, numbers bounded to 16 + 16 digits and dates as strict RFC 3339 patterns.
2. Answers: every answer generated under a JSON schema parses and validates with the `jsonschema`
   package, and one cut by max_tokens says finish_reason "length".
"""
import json
import re
import os
import subprocess

import numpy as np
import pytest

from serve_helpers import KESTREL, ROOT, export_tokenizer, model_path
from xgrammar_ref import load_xgrammar

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")
try:
    xgr = load_xgrammar()
except ImportError as e:
    pytest.skip(f"xgrammar's Python package is not usable: {e}", allow_module_level=True)

MASKS = ROOT / "build" / "tests" / "kestrel_grammar_masks"
pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists() or not MASKS.exists(),
                                reason="default model, build/kestrel or build/tests/kestrel_grammar_masks missing")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "city": {"enum": ["Paris", "Oslo", "Lima", "Kyoto"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}
ORDER = {
    "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{4}"},
                                                         "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                       "required": ["sku", "qty"], "additionalProperties": False}},
    "type": "object",
    "properties": {"id": {"type": "integer"}, "when": {"type": "string", "format": "date-time"},
                   "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 4},
                   "paid": {"type": "boolean"}, "note": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]}},
    "required": ["id", "when", "items", "paid", "note"],
    "additionalProperties": False,
}
NUMBERS = {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
                                            "n": {"type": "integer", "minimum": -5, "maximum": 5}},
           "required": ["x", "n"], "additionalProperties": False}
SCHEMAS = {"person": PERSON, "order": ORDER, "numbers": NUMBERS}
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": False}
HANDWRITTEN = {
    "person": '{"name": "Ann Lee", "age": 31, "email": "ann@example.org", "city": "Kyoto", "tags": ["a", "b c"]}',
    "order": '{"id": -12, "when": "2024-12-31T10:30:00.25+05:30", "items": [{"sku": "ABC-0042", "qty": 3}], "paid": true, "note": null}',
    "numbers": '{"x": 3.25, "n": -5}',
    # (xgrammar admits escapes only in strings without length limits)
    "text": '{"text": "caf\\u00e9 \\"quoted\\"\\n\\\\ and caf\u00e9 \u6771\u4eac"}',
}
PROMPTS = {"person": "A JSON record of a person:\n", "order": "An order, as JSON:\n", "numbers": "Two numbers in JSON:\n"}


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    return transformers.AutoTokenizer.from_pretrained(str(export_tokenizer(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def reference(hf_tokenizer):
    """xgrammar's compiler over the vocabulary it reads from the HF tokenizer; the stop tokens
    are Kestrel's (<eos>, <end_of_turn>)."""
    stop = [hf_tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<end_of_turn>")]
    info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, stop_token_ids=stop)
    control = np.zeros(info.vocab_size, dtype=bool)
    for token_id in hf_tokenizer.all_special_ids:
        control[token_id] = True
    for token_id, added in hf_tokenizer.added_tokens_decoder.items():  # <start_of_turn>, <unused12>, ...
        if added.special:
            control[token_id] = True
    control[stop] = False  # allowed where the grammar may end
    return xgr.GrammarCompiler(info, max_threads=2), control


def kestrel_masks(kind, spec_path, tokens):
    r = subprocess.run([str(MASKS), str(model_path()), kind, str(spec_path)], input=" ".join(map(str, tokens)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    masks = [line for line in lines if "mask" in line]
    accepted = [line["accepted"] for line in lines if "token" in line]
    return masks, accepted, lines[0]["special"], lines[1]["ebnf"]


def unpack(hex_words, n_vocab):
    words = np.array([int(hex_words[i:i + 8], 16) for i in range(0, len(hex_words), 8)], dtype=np.uint32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    return bits[:n_vocab]


def reference_masks(compiled, tokens, n_vocab):
    matcher = xgr.GrammarMatcher(compiled)
    words = (n_vocab + 31) // 32
    out, accepted = [], []
    for i in range(len(tokens) + 1):
        bitmask = np.full((1, words), -1, dtype=np.int32)
        if matcher.is_terminated():  # after the stop token: nothing more (Kestrel's update() says 0)
            bitmask[:] = 0
        else:
            matcher.fill_next_token_bitmask(bitmask)
        out.append(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little").astype(bool)[:n_vocab])
        if i == len(tokens):
            break
        ok = matcher.accept_token(int(tokens[i]))
        accepted.append(ok)
        if not ok:
            break
    return out, accepted


def sampled_tokens(schema_path, prompt, seed, n=80):
    r = subprocess.run([str(KESTREL), "run", "--raw", "-p", prompt, "--json-schema", str(schema_path), "-n", str(n),
                        "--temp", "1.0", "--seed", str(seed), "-t", "2", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def compare(reference, kind, spec_path, spec_text, tokens):
    compiler, control = reference
    n_vocab = control.size
    ours, ours_accepted, special, ebnf = kestrel_masks(kind, spec_path, tokens)
    extra = sorted(set(special) - set(np.flatnonzero(control).tolist()) - {1, 106})
    assert len(extra) <= 8, f"Kestrel treats {len(extra)} more tokens as control than HF, e.g. {extra[:8]}"
    control = control.copy()
    control[extra] = True
    if kind == "json_schema":
        # Kestrel's edits of a schema's grammar (docs/structured-output.md): dates, times and
        # emails as strict, bounded patterns, numbers bounded to 16 + 16 digits as llama.cpp
        # does. Without formats, its grammar is xgrammar's conversion with the digit bounds.
        if '"format"' not in spec_text:
            theirs = str(xgr.Grammar.from_json_schema(spec_text, any_whitespace=False, strict_mode=True))
            theirs = theirs.replace("[1-9] [0-9]*", "[1-9] [0-9]{0,15}")
            for rule in re.findall(r"^(\S+) ::= \(\(\[0-9\]\)\)$", theirs, re.M):
                theirs = theirs.replace(rule + "{1, -1}", rule + "{1, 16}").replace(rule + "{0, -1}", rule + "{0, 16}")
            assert str(xgr.Grammar.from_ebnf(theirs)) == ebnf
        compiled = compiler.compile_grammar(xgr.Grammar.from_ebnf(ebnf))
    elif kind == "regex":
        compiled = compiler.compile_regex(spec_text)
    else:
        compiled = compiler.compile_grammar(spec_text)
    theirs, their_accepted = reference_masks(compiled, tokens, n_vocab)
    assert ours_accepted == their_accepted
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        a = unpack(a["mask"], n_vocab)
        assert not (a & control).any(), f"step {step}: control token {np.flatnonzero(a & control)[:4]} is allowed"
        differ = np.flatnonzero((a != b) & ~control)
        assert differ.size == 0, f"step {step}: {differ.size} tokens differ, e.g. {differ[:8].tolist()} (Kestrel allows: {a[differ[:8]].tolist()})"
    return ours


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_masks_along_sampled_answers_equal_xgrammar_python(tmp_path, reference, name):
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps(SCHEMAS[name]))
    for seed in (1,):
        out = sampled_tokens(spec, PROMPTS[name], seed)
        compare(reference, "json_schema", spec, spec.read_text(), out["tokens"])
        if out["finish_reason"] == "stop":
            jsonschema.validate(json.loads(out["text"]), SCHEMAS[name], format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("name", sorted(HANDWRITTEN))
def test_masks_along_handwritten_answers_equal_xgrammar_python(tmp_path, reference, hf_tokenizer, name):
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps(SCHEMAS.get(name, TEXT)))
    tokens = hf_tokenizer.encode(HANDWRITTEN[name], add_special_tokens=False) + [1]  # then <eos>
    masks = compare(reference, "json_schema", spec, spec.read_text(), tokens)
    assert len(masks) == len(tokens) + 1 and masks[-1]["allowed"] == 0  # ended: nothing more


def test_masks_of_a_regex_and_a_grammar_equal_xgrammar_python(tmp_path, reference, hf_tokenizer):
    regex = r"(yes|no|maybe), because [a-z ]{3,40}\."
    spec = tmp_path / "answer.regex"
    spec.write_text(regex)
    compare(reference, "regex", spec, regex, hf_tokenizer.encode("maybe, because it rains.", add_special_tokens=False))
    ebnf = 'root ::= item (", " item)*\nitem ::= [0-9]+ " " ("apples" | "pears")'
    spec = tmp_path / "list.gbnf"
    spec.write_text(ebnf)
    compare(reference, "ebnf", spec, ebnf, hf_tokenizer.encode("3 apples, 12 pears", add_special_tokens=False))


def test_a_token_outside_the_grammar_is_refused(tmp_path, hf_tokenizer):
    spec = tmp_path / "n.json"
    spec.write_text(json.dumps(NUMBERS))
    tokens = hf_tokenizer.encode('{"x": 11', add_special_tokens=False)  # 11 > maximum 10
    _, accepted, _, _ = kestrel_masks("json_schema", spec, tokens)
    assert accepted[-1] is False and all(accepted[:-1])


def test_answers_cut_by_max_tokens_say_length(tmp_path):
    spec = tmp_path / "p.json"
    spec.write_text(json.dumps(PERSON))
    out = sampled_tokens(spec, PROMPTS["person"], 3, n=5)
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 5


def run_cli(*args):
    return subprocess.run([str(KESTREL), "run", "--raw", "-t", "2", "--temp", "0", "--json", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_cli_regex_lark_grammar_and_errors(tmp_path):
    r = run_cli("-p", "The year the war ended:", "-n", "12", "--regex", r" (19|20)[0-9]{2}\.")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "stop" and re.fullmatch(r" (19|20)[0-9]{2}\.", out["text"]), out
    lark = tmp_path / "answer.lark"
    lark.write_text('start: " " ANSWER "!"\nANSWER: "yes" | "no"\n')
    r = run_cli("-p", "Is water wet? Answer:", "-n", "8", "--grammar", lark)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] in (" yes!", " no!")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}))
    r = run_cli("-p", "x", "-n", "4", "--json-schema", bad)
    assert r.returncode == 1 and '"contains"' in r.stderr and "kestrel: error:" in r.stderr
    r = run_cli("-p", "x", "-n", "4", "--regex", "(unclosed")
    assert r.returncode == 1 and "regular expression" in r.stderr
