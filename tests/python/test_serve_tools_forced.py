"""Forced tool calls (tool_choice "required" or a named function) are enforced while sampling.

Gemma 3 270M (the default, a base model: it does not follow the tool instructions on its own)
and a tiny random-weight Gemma 4 model (whose unconstrained output is noise) must both answer
every forced request with finish_reason "tool_calls", the right function, and arguments that
validate against the function's parameters (jsonschema). docs/serving.md#forced-tool-calls.
"""
import json

import jsonschema
import pytest
from openai import OpenAI

from serve_helpers import ROOT, Server, model_path

TINY_GEMMA4 = ROOT / "tests" / "data" / "gemma4" / "e2b_tiny" / "model.gguf"


def fn(name, parameters=None, description=""):
    f = {"name": name, "description": description}
    if parameters is not None:
        f["parameters"] = parameters
    return {"type": "function", "function": f}


def obj(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


S = {"type": "string", "maxLength": 12}  # the random model would never end an unbounded string
# Ten tool sets: strings, enums, bounded integers, numbers, booleans, arrays, nested objects,
# nullable, absent parameters, several tools.
TOOL_SETS = [
    [fn("get_weather", obj({"city": S, "unit": {"type": "string", "enum": ["C", "F"]}}, ["city"]))],
    [fn("add", obj({"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}}, ["a", "b"]))],
    [fn("set_alarm", obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "label": S, "repeat": {"type": "boolean"}}, ["hour"])),
     fn("cancel_alarm", obj({"label": S}, ["label"]))],
    [fn("search", obj({"query": S, "tags": {"type": "array", "items": S, "maxItems": 3}}, ["query"]))],
    [fn("move", obj({"to": obj({"x": {"type": "integer", "minimum": -5, "maximum": 5}, "y": {"type": "integer", "minimum": -5, "maximum": 5}}, ["x", "y"])}, ["to"]))],
    [fn("ping")],
    [fn("rate", obj({"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "comment": {"type": ["string", "null"], "maxLength": 10}}, ["stars"]))],
    [fn("toggle", obj({"on": {"type": "boolean"}}, ["on"])), fn("status", obj({})), fn("reset", obj({"hard": {"type": "boolean"}}))],
    [fn("convert", obj({"amount": {"type": "number", "minimum": 0}, "currency": {"type": "string", "enum": ["EUR", "USD", "JPY"]}}, ["amount", "currency"]))],
    [fn("book", obj({"guests": {"type": "integer", "minimum": 1, "maximum": 8}, "names": {"type": "array", "items": S, "minItems": 1, "maxItems": 2}, "vip": {"type": "boolean"}}, ["guests", "names"]))],
]
QUESTIONS = ["What is the weather in Paris?", "Please help me with this.", "Do it now."]


def check(choice, tools, forced):
    """Asserts one OpenAI choice is a valid forced answer; returns the calls."""
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls, choice
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    for call in calls:
        assert call.function.name in by_name, call
        if forced:
            assert call.function.name == forced, call
        args = json.loads(call.function.arguments)
        if "parameters" not in by_name[call.function.name]:
            # OpenAI: omitting parameters defines a function with an empty parameter list
            assert args == {}, call
        schema = by_name[call.function.name].get("parameters") or {"type": "object"}
        jsonschema.validate(args, schema)
    return calls


def run_cases(client, cases, max_tokens):
    n = 0
    for i, (tools, named, temperature, seed, parallel) in enumerate(cases):
        forced = tools[i % len(tools)]["function"]["name"] if named else None
        tool_choice = {"type": "function", "function": {"name": forced}} if forced else "required"
        r = client.chat.completions.create(
            model=client.model_id, messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            tools=tools, tool_choice=tool_choice, temperature=temperature, seed=seed,
            # (a parallel reply may make up to 8 calls: room for all of them, so that it ends by stop)
            parallel_tool_calls=parallel, max_tokens=max_tokens * (4 if parallel else 1))
        calls = check(r.choices[0], tools, forced)
        if not parallel:
            assert len(calls) == 1
        n += 1
    return n


@pytest.fixture(scope="module")
def gemma4():
    if not TINY_GEMMA4.exists():
        pytest.skip("no tiny Gemma 4 model")
    s = Server("-m", TINY_GEMMA4)
    yield s
    s.proc.terminate()
    s.proc.wait()


@pytest.fixture(scope="module")
def gemma3():
    if not model_path().exists():
        pytest.skip("no default model")
    s = Server()
    yield s
    s.proc.terminate()
    s.proc.wait()


def client_for(server):
    client = OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)
    client.model_id = client.models.list().data[0].id
    return client


def test_gemma4_tiny_random_model_always_calls(gemma4):
    # Every tool set (absent parameters: arguments {}), required and named, greedy and sampled
    # with two seeds: 60 answers.
    cases = [(tools, named, temperature, seed, False)
             for tools in TOOL_SETS for named in (False, True) for temperature, seed in ((0, 0), (1, 1), (1, 2))]
    # (Its context is 512 tokens.)
    assert run_cases(client_for(gemma4), cases, 140) == 60


def test_gemma4_parallel_calls(gemma4):
    tools = TOOL_SETS[7][:1]  # short calls: 8 of them fit in the tiny model's context
    counts = []
    for seed in range(4):
        client = client_for(gemma4)
        r = client.chat.completions.create(
            model=client.model_id, messages=[{"role": "user", "content": "Toggle it."}], tools=tools,
            tool_choice="required", temperature=1, seed=seed, max_tokens=300, parallel_tool_calls=True)
        calls = check(r.choices[0], tools, None)
        assert 1 <= len(calls) <= 8
        counts.append(len(calls))
        assert r.choices[0].message.content is None
    # The random model fills the room it is given: several calls in some reply (else the
    # one-call default below would prove nothing).
    assert max(counts) > 1, counts


def test_gemma4_one_call_unless_parallel_tool_calls(gemma4):
    # OpenAI clients leave parallel_tool_calls unset and expect one call to a forced function
    # (issue 47: the openai SDK got 8 identical calls, instructor failed). "required" and a named
    # function both give exactly one call by default; a named function gives one even with
    # parallel_tool_calls: true. Streamed and not.
    tools = TOOL_SETS[7][:1]
    named = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    client = client_for(gemma4)
    for seed in range(4):
        for tool_choice, extra in (("required", {}), (named, {}), (named, {"parallel_tool_calls": True})):
            args = dict(model=client.model_id, messages=[{"role": "user", "content": "Toggle it."}], tools=tools,
                        tool_choice=tool_choice, temperature=1, seed=seed, max_tokens=300, **extra)
            r = client.chat.completions.create(**args)
            assert len(check(r.choices[0], tools, None)) == 1, (seed, tool_choice, extra, r.choices[0])
            n_calls, finish = 0, None
            for chunk in client.chat.completions.create(stream=True, **args):
                n_calls += len(chunk.choices[0].delta.tool_calls or [])
                finish = chunk.choices[0].finish_reason or finish
            assert n_calls == 1 and finish == "tool_calls", (seed, tool_choice, extra)


def test_gemma4_stream_and_raw_text(gemma4):
    tools = TOOL_SETS[0]
    client = client_for(gemma4)
    stream = client.chat.completions.create(
        model=client.model_id, messages=[{"role": "user", "content": "Weather?"}], tools=tools,
        tool_choice="required", temperature=1, seed=3, max_tokens=140, stream=True,
        parallel_tool_calls=False)
    calls, finish = [], None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            calls.append(tc)
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(calls) == 1
    jsonschema.validate(json.loads(calls[0].function.arguments), tools[0]["function"]["parameters"])


def test_gemma3_always_calls(gemma3):
    # The 270M base model: three tool sets, required and named, greedy and sampled; one
    # parallel. (Each answer takes a second or two on 2 cores.)
    cases = [(TOOL_SETS[k], named, temperature, seed, k == 2 and not named)
             for k, temperature, seed in ((0, 0, 0), (2, 1, 5), (5, 1, 6)) for named in (False, True)]
    assert run_cases(client_for(gemma3), cases, 200) == 6


def test_gemma3_call_cut_by_max_tokens_is_the_same_content_streamed_or_not(gemma3):
    # Parallel calls cut by max_tokens: the completed calls are tool_calls, the cut one is content
    # from its <tool_call> (never the newlines between calls), whether streamed or not (a
    # fresh-user check found one leading newline per completed call in the non-streamed answer).
    client = client_for(gemma3)
    args = dict(model=client.model_id, messages=[{"role": "user", "content": QUESTIONS[0]}], tools=TOOL_SETS[0],
                tool_choice="required", temperature=0, parallel_tool_calls=True)
    for max_tokens in (30, 60, 100):
        r = client.chat.completions.create(max_tokens=max_tokens, **args)
        assert r.choices[0].finish_reason == "length", r.choices[0]
        content = r.choices[0].message.content
        assert content and content.startswith("<tool_call>"), (max_tokens, content)
        streamed, n_calls = "", 0
        for chunk in client.chat.completions.create(max_tokens=max_tokens, stream=True, **args):
            delta = chunk.choices[0].delta
            streamed += delta.content or ""
            n_calls += len(delta.tool_calls or [])
        assert streamed == content, (max_tokens, streamed, content)
        assert n_calls == len(r.choices[0].message.tool_calls or [])


def test_forced_tool_errors(gemma3, gemma4):
    msgs = [{"role": "user", "content": "hi"}]
    for server in (gemma3, gemma4):
        # A forced tool_choice and a response format both decide the answer: 400.
        status, body = server.request("POST", "/v1/chat/completions", {
            "messages": msgs, "tools": TOOL_SETS[0], "tool_choice": "required",
            "response_format": {"type": "json_object"}})
        assert status == 400 and body["error"]["param"] == "response_format", body
        # auto is not forced: a response format is fine with it.
    # Parameters the format cannot enforce: 400 naming the tool and the keyword.
    bad = [fn("ok", obj({})), fn("f", obj({"a": {"type": "string", "pattern": "^x"}}))]
    status, body = gemma4.request("POST", "/v1/chat/completions", {"messages": msgs, "tools": bad, "tool_choice": "required"})
    assert status == 400 and body["error"]["param"] == "tools", body
    assert "tools[1] (f)" in body["error"]["message"] and "pattern" in body["error"]["message"], body
    bad = [fn("f", obj({"a": {"type": "string", "not": {"const": "x"}}}))]
    status, body = gemma3.request("POST", "/v1/chat/completions", {"messages": msgs, "tools": bad, "tool_choice": "required"})
    assert status == 400 and body["error"]["param"] == "tools", body
    assert "tools[0] (f)" in body["error"]["message"] and "not" in body["error"]["message"], body


def test_forced_reply_cut_by_max_tokens_says_length(gemma3):
    gemma3_client = client_for(gemma3)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 200}}, "required": ["query"]}}}]
    r = gemma3_client.chat.completions.create(
        model=gemma3_client.models.list().data[0].id, messages=[{"role": "user", "content": "Search for cats."}],
        tools=tools, tool_choice="required", max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason == "length"
