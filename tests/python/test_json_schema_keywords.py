"""The JSON Schema keywords check_json_schema accepts are enforced by xgrammar.

For each keyword the C++ allowlist accepts (src/kestrel/runtime/json_schema_check.cpp), xgrammar's
Python package compiles a schema that uses it, the way Kestrel compiles one (compact separators,
strict mode), and a GrammarMatcher must accept a conforming instance and reject one that
violates the keyword. The second test shows that what the allowlist rejects is indeed not
enforced: if a later xgrammar enforces one, it fails, and the allowlist may grow.
"""

import json
import pathlib
import re

import pytest

from xgrammar_ref import load_xgrammar

try:
    xgr = load_xgrammar()
except ImportError as e:
    pytest.skip(f"xgrammar's Python package is not usable: {e}", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Raw(str):
    """An instance given as JSON text, not as a value to serialize."""


@pytest.fixture(scope="module")
def compiler():
    vocab = ["<pad>", "<eos>", "a"]  # accept_string matches bytes; the vocabulary hardly matters
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[1])
    return xgr.GrammarCompiler(info)


def matches(compiler, schema, instance):
    # As grammar.cpp compiles a schema: no free whitespace, ", " and ": " separators, strict mode.
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
    text = instance if isinstance(instance, Raw) else json.dumps(instance, ensure_ascii=False)
    return matcher.accept_string(text) and matcher.is_completed()


def S(**k):
    return {"type": "string", **k}


def I(**k):
    return {"type": "integer", **k}


def N(**k):
    return {"type": "number", **k}


def O(**k):
    return {"type": "object", **k}


def A(**k):
    return {"type": "array", **k}


P = {"a": I(), "b": S()}
DEFS = {"$defs": {"X": I(maximum=5)}}

# keyword: [(schema, conforming instances, violating instances)]
ENFORCED = {
    "type": [(I(), [3], ["3", 1.5, None]), ({"type": ["string", "null"]}, ["a", None], [1])],
    "enum": [({"enum": ["a", 1, None]}, ["a", 1, None], ["b", 2])],
    "const": [({"const": {"k": [1]}}, [Raw('{"k":[1]}')], [Raw('{"k":[2]}')])],
    "$ref": [(O(properties={"x": {"$ref": "#/$defs/X"}}, required=["x"], **DEFS), [{"x": 5}], [{"x": 6}]),
             (O(properties={"n": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, required=["n"]),
              [{"n": {"n": None}}], [{"n": 1}])],
    "$defs": [({"$ref": "#/$defs/X", **DEFS}, [5], [6])],
    "definitions": [({"$ref": "#/definitions/X", "definitions": {"X": I(maximum=5)}}, [5], [6])],
    "anyOf": [({"anyOf": [I(), S(maxLength=1)]}, [1, "a"], ["ab", None])],
    "oneOf": [({"oneOf": [I(), S()]}, [1, "a"], [None]),
              ({"oneOf": [{"const": "a"}, {"enum": ["b"]}, I()]}, ["a", "b", 1], ["c"]),
              ({"oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
                "$defs": {"A": O(properties={"t": {"const": "a"}, "x": I()}, required=["t", "x"]),
                          "B": O(properties={"t": {"const": "b"}, "x": S()}, required=["t", "x"])}},
               [{"t": "a", "x": 1}, {"t": "b", "x": "s"}], [{"t": "a", "x": "s"}])],
    "allOf": [({"allOf": [I(maximum=5)]}, [5], [6])],
    "minimum": [(I(minimum=3), [3], [2]), (N(minimum=1.5), [1.5, 2], [1.4, -3])],
    "maximum": [(I(maximum=3), [3], [4]), (N(maximum=1.5), [1.5, -2], [1.6, Raw("1e5")])],
    "exclusiveMinimum": [(I(exclusiveMinimum=3), [4], [3]), (N(exclusiveMinimum=1.5), [1.6], [1.5])],
    "exclusiveMaximum": [(I(exclusiveMaximum=3), [2], [3]), (N(exclusiveMaximum=1.5), [1.4], [1.5])],
    "multipleOf": [(I(multipleOf=3), [9, -6, 0], [10]),
                   (I(multipleOf=3, exclusiveMinimum=0, exclusiveMaximum=10001), [9999], [10, 10002])],
    "minLength": [(S(minLength=3), ["abc"], ["ab"])],
    "maxLength": [(S(maxLength=3), ["abc", "éèà"], ["abcd"])],
    "pattern": [(S(pattern="^a+$"), ["aa"], ["ab"])],
    "format": [(S(format=f), [good], [bad]) for f, good, bad in [
        ("date", "2024-01-02", "2024-13-02"), ("time", "03:04:05Z", "25:00:00Z"),
        ("date-time", "2024-01-02T03:04:05Z", "2024-01-02"), ("duration", "P1D", "1D"),
        ("email", "a@b.com", "a.b.com"), ("hostname", "a.com", "a b"), ("ipv4", "1.2.3.4", "1.2.3.400"),
        ("ipv6", "::1", "1.2.3.4"), ("uuid", "12345678-1234-1234-1234-123456789012", "1234"),
        ("uri", "http://a.com/x", "x y"), ("uri-reference", "/x", "x y"), ("uri-template", "/x/{a}", "{"),
        ("json-pointer", "/a/b", "a"), ("relative-json-pointer", "0/a", "a")]],
    "properties": [(O(properties=P), [{"a": 1}], [{"a": "x"}])],
    "required": [(O(properties=P, required=["a"]), [{"a": 1}], [{"b": "x"}, {}])],
    "additionalProperties": [(O(properties=P, additionalProperties=False), [{"a": 1}], [{"z": 1}]),
                             (O(properties=P, additionalProperties=I()), [{"z": 1}], [{"z": "x"}])],
    "unevaluatedProperties": [(O(properties=P, unevaluatedProperties=I()), [{"z": 1}], [{"z": "x"}])],
    "patternProperties": [(O(patternProperties={"^x[0-9]$": I()}), [{"x1": 1}], [{"x1": "s"}, {"y": 1}])],
    "propertyNames": [(O(propertyNames={"pattern": "^[a-c]+$"}, additionalProperties=I()), [{"ab": 1}], [{"xy": 1}])],
    "minProperties": [(O(additionalProperties=I(), minProperties=2), [{"a": 1, "b": 2}], [{"a": 1}])],
    "maxProperties": [(O(additionalProperties=I(), maxProperties=1), [{"a": 1}], [{"a": 1, "b": 2}])],
    "items": [(A(items=I()), [[1, 2]], [["x"]]), (A(prefixItems=[I()], items=False), [[1]], [[1, 2]])],
    "prefixItems": [(A(prefixItems=[I(), S()]), [[1, "x"]], [["x", 1], [1, "x", 3]])],
    "unevaluatedItems": [(A(prefixItems=[I()], unevaluatedItems=S()), [[1, "x"]], [[1, 2]])],
    "minItems": [(A(items=I(), minItems=2), [[1, 2]], [[1]])],
    "maxItems": [(A(items=I(), maxItems=2), [[1, 2]], [[1, 2, 3]])],
    "uniqueItems": [(A(items=I(), uniqueItems=False), [[1, 1]], [["x"]])],  # only false is accepted
}

# What the allowlist rejects, each with an instance the schema forbids that xgrammar still lets through.
NOT_ENFORCED = {
    "uniqueItems true": (A(items=I(), uniqueItems=True), [1, 1]),
    "contains": (A(items=I(), contains={"const": 5}), [1]),
    "not": (I(**{"not": {"const": 3}}), 3),
    "if/then": (I(**{"if": {"minimum": 3}, "then": {"maximum": 5}}), 7),
    "dependentRequired": (O(properties=P, dependentRequired={"a": ["b"]}), {"a": 1}),
    "multipleOf on number": (N(multipleOf=0.5), 1.3),
    "multipleOf not whole": (I(multipleOf=1.5), 1),
    "multipleOf over 1024": (I(multipleOf=2000), 10),
    "multipleOf with one bound": (I(multipleOf=3, minimum=0), 10),
    "multipleOf over a wide range": (I(multipleOf=3, minimum=0, maximum=100000), 10),
    "format with minLength": (S(format="date", minLength=20), "2024-01-02"),
    "pattern with maxLength": (S(pattern="^a+$", maxLength=2), "aaa"),
    "format with pattern": (S(format="date", pattern="^x$"), "2024-01-02"),
    "unknown format": (S(format="iri"), "x y"),
    "required name not in properties": (O(properties=P, required=["c"]), {"a": 1}),
    "unevaluatedProperties with additionalProperties": (
        O(properties=P, additionalProperties=True, unevaluatedProperties=I()), {"z": "x"}),
    "unevaluatedItems with items": (A(prefixItems=[I()], items=True, unevaluatedItems=False), [1, 2]),
    "keyword beside $ref": (O(properties={"x": {"$ref": "#/$defs/X", "minimum": 3}}, required=["x"], **DEFS), {"x": 1}),
    "keyword beside anyOf": ({"anyOf": [S(), I()], "maxLength": 2}, "abc"),
    "type beside enum": ({"type": "string", "enum": ["a", 1]}, 1),
    "allOf with two schemas": ({"allOf": [I(maximum=5), I(minimum=0)]}, "s"),
    "oneOf with overlapping branches": ({"oneOf": [I(), N()]}, 1),
    "minLength without type": ({"minLength": 3}, "a"),
    "external $ref": (O(properties={"x": {"$ref": "http://x/y"}}, required=["x"]), {"x": "s"}),
}


def allowlist():
    """The keywords json_schema_check.cpp accepts as enforced."""
    source = (ROOT / "src/kestrel/runtime/json_schema_check.cpp").read_text()
    table = source[source.index("kTypeKeywords[] = {"):]
    table = table[: table.index("};")]
    return set(re.findall(r'\{"(\w+)",', table)) | {"type", "enum", "const", "$ref", "$defs", "definitions",
                                                     "anyOf", "oneOf", "allOf"}


def test_every_allowed_keyword_has_a_proof():
    assert allowlist() == set(ENFORCED)


@pytest.mark.parametrize("keyword", sorted(ENFORCED))
def test_allowed_keyword_is_enforced(compiler, keyword):
    for schema, good, bad in ENFORCED[keyword]:
        for instance in good:
            assert matches(compiler, schema, instance), f"{schema} should accept {instance!r}"
        for instance in bad:
            assert not matches(compiler, schema, instance), f"{schema} should reject {instance!r}"


@pytest.mark.parametrize("case", sorted(NOT_ENFORCED))
def test_rejected_keyword_is_not_enforced(compiler, case):
    schema, forbidden = NOT_ENFORCED[case]
    assert matches(compiler, schema, forbidden), (
        f"xgrammar now rejects {forbidden!r} under {schema}: check_json_schema may accept {case}")
