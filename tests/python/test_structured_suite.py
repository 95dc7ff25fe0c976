"""The structured output suite (tests/data/json_schemas, scripts/eval/structured_output.py): every
schema is a valid Draft 2020-12 schema within what xgrammar enforces, the answer checker, and a
small subset run through `kestrel serve` against the default model, where every answer must parse,
validate and end by stop. The whole suite (docs/structured-output-suite.md) is a manual run."""
import json
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "eval"))

import structured_output as so  # noqa: E402
from serve_helpers import KESTREL, model_path  # noqa: E402

CASES = so.load_cases()
# Keywords xgrammar does not enforce: a schema using them would not be a test of the engine.
UNENFORCED = {"uniqueItems", "contains", "minContains", "maxContains", "multipleOf", "patternProperties", "not",
              "if", "then", "else", "minProperties", "maxProperties", "propertyNames", "dependentSchemas",
              "dependentRequired", "unevaluatedProperties", "unevaluatedItems", "allOf", "oneOf"}
# A varied handful that answers in few tokens: enum, number bounds, const, pattern, anyOf with
# null, type arrays, format date, a root anyOf of tool calls, a $ref.
SUBSET = ["sentiment", "tool_get_weather", "const_number_and_bool", "anyof_primitive", "nullable_fields",
          "date_range", "tool_choice_union", "shared_defs"]


def schema_nodes(schema, path="#"):
    """(path, node) for every subschema (not the property names of 'properties' or '$defs')."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key in ("properties", "$defs"):
        for name, sub in schema.get(key, {}).items():
            yield from schema_nodes(sub, f"{path}/{key}/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from schema_nodes(schema[key], f"{path}/{key}")
    for key in ("anyOf", "prefixItems"):
        for i, sub in enumerate(schema.get(key, [])):
            yield from schema_nodes(sub, f"{path}/{key}/{i}")


def test_the_suite_has_enough_distinct_cases():
    assert len(CASES) >= 55
    assert len({c["name"] for c in CASES}) == len(CASES)
    assert len({c["prompt"] for c in CASES}) == len(CASES)
    for c in CASES:
        assert isinstance(c["prompt"], str) and c["prompt"].strip(), c["name"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_schema_is_valid_and_within_what_xgrammar_enforces(case):
    schema = case["schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    for path, node in schema_nodes(schema):
        assert not UNENFORCED & node.keys(), f"{path}: {UNENFORCED & node.keys()}"
        if "format" in node:
            assert node["format"] in so.FORMATS, path
        if "pattern" in node or "format" in node:
            # xgrammar ignores min/maxLength beside a pattern or a format: the pattern carries the bounds
            assert not {"minLength", "maxLength"} & node.keys(), path
        if "pattern" in node:
            assert node["pattern"].startswith("^") and node["pattern"].endswith("$"), path
        if node.get("type") == "object" or (isinstance(node.get("type"), list) and "object" in node["type"]):
            assert node.get("additionalProperties") is False, path
        if "$ref" in node:
            assert node["$ref"].startswith("#/$defs/") and node["$ref"][len("#/$defs/"):] in schema["$defs"], path


def test_check_answer():
    schema = next(c for c in CASES if c["name"] == "tool_create_event")["schema"]
    good = {"title": "Standup", "start": "2024-05-01T09:00:00Z", "end": "2024-05-01T09:15:00+02:00",
            "attendees": ["ann@example.com"], "location": None}
    assert so.check_answer(json.dumps(good), schema) == {"parsed": True, "valid": True, "error": None}
    assert so.check_answer(json.dumps(good)[:-1], schema)["parsed"] is False
    for field, value in [("start", "2024-05-01 09:00"), ("attendees", ["not an address"]), ("attendees", []),
                         ("location", 3)]:
        r = so.check_answer(json.dumps({**good, field: value}), schema)
        assert r["parsed"] and not r["valid"], (field, value)
        assert field in r["error"], r["error"]
    r = so.check_answer(json.dumps({**good, "extra": 1}), schema)
    assert not r["valid"] and "Additional properties" in r["error"]


def test_features_name_what_a_schema_exercises():
    by_name = {c["name"]: so.features(c["schema"]) for c in CASES}
    assert "recursive $ref" in by_name["tree_recursive"]
    assert "root anyOf" in by_name["tool_choice_union"]
    assert "format uuid" in by_name["uuid_record"]
    assert "exclusiveMinimum/Maximum" in by_name["exclusive_bounds"]
    assert "type array (string, null)" in by_name["nullable_fields"]
    assert "optional properties" in by_name["optional_properties"]
    assert "root array" in by_name["root_array"]


def test_the_docs_list_every_case():
    listing = so.list_markdown(CASES, so.CASES)
    assert (ROOT / "docs" / "structured-output-suite.md").read_text() == listing, \
        "regenerate: python3 scripts/eval/structured_output.py --list > docs/structured-output-suite.md"


@pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(), reason="default model or build/kestrel missing")
def test_a_subset_parses_validates_and_stops():
    cases = {c["name"]: c for c in CASES}
    checker = so.format_checker()
    with so.Server(model_path(), KESTREL, threads=2) as server:
        records = [so.run_case(server, cases[name], max_tokens=256, compare=False, checker=checker)
                   for name in SUBSET]
    bad = [(r["name"], r["finish_reason"], r["error"], r["text"]) for r in records
           if not (r["parsed"] and r["valid"] and r["stop"])]
    assert not bad, bad
