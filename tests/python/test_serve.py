"""kestrel serve with real clients: the official `openai` package and raw HTTP.

Independent references: llama.cpp's token ids and greedy continuations
(tests/goldens/model_llamacpp.json, tests/goldens/tokenizer.json), hand-written chat templates,
and OpenAI's documented response shapes.
"""
import http.client
import json
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from serve_helpers import ROOT, KESTREL, Server, drop, model_path, open_stream, sse_events, wait_idle

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

GOLDENS = json.loads((ROOT / "tests" / "goldens" / "model_llamacpp.json").read_text(encoding="utf-8"))
TOKENIZER_GOLDENS = json.loads((ROOT / "tests" / "goldens" / "tokenizer.json").read_text(encoding="utf-8"))
KEY = "test-key-123"


@pytest.fixture(scope="module")
def server():
    s = Server("--precision", "source", api_key=KEY)  # the float32 path: llama.cpp's f32 goldens
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def greedy_item(i=0):
    item = GOLDENS["references"]["f32"][i]
    greedy = item["greedy"]
    if isinstance(greedy, str):
        greedy = json.loads(greedy)
    return item, greedy


# --- basics -----------------------------------------------------------------------------------

def test_health_models_and_metrics(server, client, model_id):
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    assert model_id == model_path().stem
    status, body = server.request("GET", "/v1/models")
    assert status == 200 and body["object"] == "list" and body["data"][0]["object"] == "model"
    status, text = server.request("GET", "/metrics")
    assert status == 200
    for name in ("kestrel_requests_total", "kestrel_prompt_tokens_total", "kestrel_generation_tokens_total",
                 "kestrel_queue_depth", "kestrel_time_to_first_token_seconds_bucket",
                 "kestrel_inter_token_latency_seconds_bucket"):
        assert name in text


def test_retrieve_one_model(server, client, model_id):
    # GET /v1/models/{model} was 404 "no such endpoint": the openai client's models.retrieve failed (a fresh-user check).
    m = client.models.retrieve(model_id)
    assert (m.id, m.object, m.owned_by) == (model_id, "model", "kestrel")
    assert server.request("GET", f"/v1/models/{model_id}")[1] == server.request("GET", "/v1/models")[1]["data"][0]
    # the alias requests may use (the server runs the default model): the same model object
    assert client.models.retrieve("default").id == model_id
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-9")
    assert e.value.code == "model_not_found" and f"serves '{model_id}'" in e.value.message, e.value
    assert error_of(server.request("GET", f"/v1/models/{model_id}", headers={"Authorization": ""}), 401)


def test_health_is_503_while_loading():
    s = Server(wait_ready=False)
    try:
        deadline = time.time() + 30
        seen = set()
        while time.time() < deadline and 200 not in seen:
            try:
                status, body = s.request("GET", "/health")
                seen.add(status)
                if status == 503:
                    assert body["error"]["code"] == "model_loading"
            except OSError:
                pass
        assert 200 in seen
        assert 503 in seen, "the socket should listen before the model is loaded"
    finally:
        s.stop()


def test_second_server_on_a_busy_port_is_refused(server):
    # llama-server's behaviour: a port another server listens on is an error (exit 1), not a
    # second listener sharing the connections (what SO_REUSEPORT would allow).
    import subprocess
    r = subprocess.run([str(KESTREL), "serve", "--port", str(server.port), "-t", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{server.port}" in r.stderr
    status, _ = server.request("GET", "/health")
    assert status == 200


def test_completion_token_ids_greedy_matches_llamacpp(server, client, model_id):
    item, greedy = greedy_item(0)
    r = client.completions.create(model=model_id, prompt=item["tokens"], max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True})
    status, expected = server.request("POST", "/detokenize", {"tokens": greedy[:24]})
    assert r.choices[0].text == expected["content"]
    assert r.usage.prompt_tokens == len(item["tokens"])
    assert r.usage.completion_tokens == 24
    assert r.choices[0].finish_reason == "length"
    assert r.object == "text_completion"


def test_completion_prompt_forms_agree(server, client, model_id):
    item, _ = greedy_item(1)
    text = item["text"]
    outs = []
    for prompt in (text, [text], item["tokens"]):
        r = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=0)
        outs.append(r.choices[0].text)
        # llama.cpp's tokenization of the text (BOS included) is the prompt
        assert r.usage.prompt_tokens == len(item["tokens"])
    assert outs[0] == outs[1] == outs[2]
    # two prompts: two choices, in order, usage summed
    r = client.completions.create(model=model_id, prompt=[text, text], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == r.choices[1].text
    assert r.usage.prompt_tokens == 2 * len(item["tokens"])


def test_tokenize_matches_llamacpp(server):
    for case in [c for c in TOKENIZER_GOLDENS["cases"] if "text" in c][:60]:
        status, body = server.request("POST", "/tokenize", {"content": case["text"],
                                                             "parse_special": case["special"]})
        assert status == 200
        assert body["tokens"] == case["ids"], case["name"]


# --- chat -------------------------------------------------------------------------------------

GEMMA3_HI = "<bos><start_of_turn>user\nYou are terse.\n\nSay hi<end_of_turn>\n<start_of_turn>model\n"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi", "name": ""}]


def test_chat_usage_is_the_gemma3_template(server, client, model_id):
    r = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=6, temperature=0)
    # the hand-written Gemma 3 rendering, tokenized with special tokens parsed, no extra BOS
    _, tok = server.request("POST", "/tokenize", {"content": GEMMA3_HI, "add_special": False})
    assert r.usage.prompt_tokens == len(tok["tokens"])
    assert tok["tokens"][0] == 2 and tok["tokens"][1] == 105  # <bos>, <start_of_turn>
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the same prompt through /v1/completions (token ids) gives the same greedy text
    c = client.completions.create(model=model_id, prompt=tok["tokens"], max_tokens=6, temperature=0)
    assert c.choices[0].text == r.choices[0].message.content


def test_chat_with_only_a_system_message_keeps_its_text(server, client, model_id):
    """No user turn to fold the system text into: it is the user turn (it was dropped: the prompt was
    only <bos><start_of_turn>model)."""
    alone = [{"role": "system", "content": "You are terse."}]
    r = client.chat.completions.create(model=model_id, messages=alone, max_tokens=2, temperature=0)
    expected = "<bos><start_of_turn>user\nYou are terse.<end_of_turn>\n<start_of_turn>model\n"
    _, tok = server.request("POST", "/tokenize", {"content": expected, "add_special": False})
    _, chat = server.request("POST", "/tokenize", {"messages": alone})
    assert chat["tokens"] == tok["tokens"]
    assert r.usage.prompt_tokens == len(tok["tokens"])


def test_chat_streaming_equals_non_streaming(client, model_id):
    full = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert full.usage.completion_tokens == 16


def test_stream_framing_and_no_usage_unless_asked(server):
    body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=server.headers())
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").split(";")[0] == "text/event-stream"
    events = sse_events(resp.read().decode())
    assert events[-1] == "[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    assert all(p["object"] == "chat.completion.chunk" and "usage" not in p for p in payloads)


def test_stop_string_cuts_the_text(client, model_id):
    item, _ = greedy_item(0)
    base = client.completions.create(model=model_id, prompt=item["text"], max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[10:14]
    assert stop.strip(), base
    r = client.completions.create(model=model_id, prompt=item["text"], max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == base[:base.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=model_id, prompt=item["text"], max_tokens=24, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == base[:base.index(stop)]


def test_an_answer_cut_inside_a_character_ends_and_the_server_goes_on(server):
    """A 4-byte emoji is 4 byte tokens here: max_tokens 1 or 3 stops inside it. The bytes held
    back are flushed at the end (once deadlocked the scheduler: its flush queued an event under
    the lock that completing the request held)."""
    for stream in (False, True):
        for max_tokens in (1, 3):
            body = {"prompt": "\U0001FAE8\U0001FABF\U0001FAE8\U0001FABF\U0001FAE8\U0001FABF\U0001FAE8",
                    "max_tokens": max_tokens, "temperature": 0, "stream": stream}
            status, out = server.request("POST", "/v1/completions", body, timeout=60)
            assert status == 200, out
    status, out = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert status == 200 and out["usage"]["completion_tokens"] >= 1


def test_shutdown_mid_stream_ends_the_stream_with_an_error():
    """SIGTERM while a stream runs: the stream ends with an error event saying the server stops
    (it used to end after an ordinary chunk, so a client could not tell the answer was cut)."""
    s = Server()
    conn, resp = open_stream(s, 2000)
    try:
        for _ in range(6):
            resp.fp.readline()
        s.proc.terminate()
        rest = resp.fp.read().decode(errors="replace")  # raw: the lines above were read raw too
        events = [line for line in rest.splitlines() if line.startswith("data: ")]
        assert events and "error" in events[-1] and "stopping" in events[-1], rest[-400:]
    finally:
        conn.close()
        assert s.stop() == 0


def test_sigterm_does_not_wait_for_an_idle_keep_alive_connection():
    """The openai client keeps its connection open between requests; SIGTERM used to wait for
    it for cpp-httplib's default keep-alive of 5 s. Now at most kKeepAliveSeconds (1 s)."""
    s = Server()
    c = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0)
    try:
        assert c.models.list().data
        t = time.monotonic()
        assert s.stop() == 0
        assert time.monotonic() - t < 3.0
    finally:
        c.close()


def test_seed_reproducibility(client, model_id):
    def sample(seed):
        return client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=24,
                                         temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text
    a, b, c = sample(1234), sample(1234), sample(99)
    assert a == b
    assert a != c


def test_logprobs_shapes_and_values(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for step in content:
        assert len(step.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert step.token == step.top_logprobs[0].token and step.logprob == pytest.approx(step.top_logprobs[0].logprob)
        lps = [t.logprob for t in step.top_logprobs]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
        assert sum(2.718281828 ** lp for lp in lps) <= 1.0001
    c = client.completions.create(model=model_id, prompt="The sky is", max_tokens=4, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and len(lp.top_logprobs[0]) == 2
    assert "".join(lp.tokens) == c.choices[0].text


def test_min_tokens_and_max_completion_tokens(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=MESSAGES, max_completion_tokens=30, temperature=0,
                                       extra_body={"min_tokens": 30})
    assert r.usage.completion_tokens == 30 and r.choices[0].finish_reason == "length"


# --- tools ------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_gemma3_tool_round_trip_rendering(server):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    _, body = server.request("POST", "/tokenize", {"messages": messages, "tools": [WEATHER], "with_pieces": True})
    text = "".join(body["pieces"])
    decl = json.dumps({"name": "get_weather", "description": "Current weather in a city",
                       "parameters": WEATHER["function"]["parameters"]}, separators=(",", ":"), sort_keys=True)
    assert text.startswith("<bos><start_of_turn>user\nYou can call these functions")
    assert decl in text
    assert ('<start_of_turn>model\n<tool_call>{"arguments":{"city":"Paris"},"name":"get_weather"}</tool_call>'
            '<end_of_turn>\n') in text
    assert text.endswith('<start_of_turn>user\n<tool_response name="get_weather">18 C, sunny</tool_response>'
                         '<end_of_turn>\n<start_of_turn>model\n')


def test_gemma3_tool_call_parsed_from_the_reply(client, model_id):
    # A few-shot conversation in which the base model copies the call format of earlier turns.
    shot = {"role": "assistant", "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'}
    messages = [{"role": "user", "content": "Weather in Paris?"}, shot,
                {"role": "user", "content": "Weather in Paris?"}, shot,
                {"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER], max_tokens=40,
                                       temperature=0)
    choice = r.choices[0]
    # the base model may go on after its call until max_tokens: then the finish is "length"
    assert choice.finish_reason == ("length" if r.usage.completion_tokens == 40 else "tool_calls"), choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER], max_tokens=40,
                                                 temperature=0, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert json.loads(deltas[0].function.arguments) == {"city": "Paris"}
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_") and deltas[0].type == "function"
    # streamed and whole replies agree, calls and content
    streamed_content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed_content == (choice.message.content or "")
    assert [d.function.arguments for d in deltas] == [t.function.arguments for t in choice.message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [choice.finish_reason]


# --- errors -----------------------------------------------------------------------------------

def error_of(status_body, status):
    got, body = status_body
    assert got == status, body
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


def test_errors_are_openai_shaped(server, model_id):
    chat = "/v1/chat/completions"
    ok = {"messages": MESSAGES, "max_tokens": 2}
    assert "JSON" in error_of(server.request("POST", chat, raw="{not json"), 400)["message"]
    e = error_of(server.request("POST", chat, {**ok, "temperature": "hot"}), 400)
    assert e["param"] == "temperature" and "number" in e["message"]
    assert error_of(server.request("POST", chat, {**ok, "max_tokens": "5"}), 400)["param"] == "max_tokens"
    assert error_of(server.request("POST", chat, {**ok, "stream": 1}), 400)["param"] == "stream"
    assert error_of(server.request("POST", chat, {**ok, "messages": "hi"}), 400)["param"] == "messages"
    assert error_of(server.request("POST", chat, {"max_tokens": 2}), 400)["param"] == "messages"
    e = error_of(server.request("POST", chat, {**ok, "response_format": {"type": "json_schema", "json_schema": {}}}), 400)
    assert "json_schema" in e["message"]
    assert error_of(server.request("POST", chat, {**ok, "n": 17}), 400)["param"] == "n"  # above kMaxSamples
    assert error_of(server.request("POST", chat, {**ok, "n": 2, "stream": True}), 400)["param"] == "n"
    assert error_of(server.request("POST", chat, {**ok, "messages": [{"role": "wizard", "content": "x"}]}), 400)
    # a user message without content, or with null, names messages[i].content (was accepted)
    for user in ({"role": "user"}, {"role": "user", "content": None}):
        e = error_of(server.request("POST", chat, {**ok, "messages": [MESSAGES[0], user]}), 400)
        assert e["param"] == "messages[1].content" and "required" in e["message"], e
    # roles out of order: the Gemma template refuses, with 400 and not 500
    bad_order = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    assert "alternate" in error_of(server.request("POST", chat, {**ok, "messages": bad_order}), 400)["message"]
    # absurdly nested JSON is refused before anything recurses over it
    deep = '{"messages": [{"role": "user", "content": "x"}], "tools": ' + "[" * 100000 + "]" * 100000 + "}"
    assert "deeper" in error_of(server.request("POST", chat, raw=deep), 400)["message"]
    # unknown fields are ignored
    assert server.request("POST", chat, {**ok, "user": "x", "frobnicate": {"a": 1}})[0] == 200
    # unknown model
    e = error_of(server.request("POST", chat, {**ok, "model": "gpt-9"}), 404)
    assert e["code"] == "model_not_found"
    assert f"serves '{model_path().stem}' (also named 'default')" in e["message"], e
    # wrong and missing API key
    assert error_of(server.request("POST", chat, ok, headers={"Authorization": "Bearer nope"}), 401)["code"] == \
        "invalid_api_key"
    assert error_of(server.request("GET", "/v1/models", headers={"Authorization": ""}), 401)
    # unknown endpoint
    assert error_of(server.request("GET", "/v1/nothing"), 404)
    # GET on a POST route: 405, not "no such endpoint"
    e = error_of(server.request("GET", chat), 405)
    assert "use POST" in e["message"], e
    # token id outside the vocabulary
    assert error_of(server.request("POST", "/v1/completions", {"prompt": [2, 10 ** 9]}), 400)["param"] == "prompt"


def test_default_names_the_default_model(server):
    """Started with -m default, or without -m: requests may say "model": "default" (they got 404:
    a fresh-user check); /v1/models lists the file's stem, and answers name it too."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "model": "default"}
    status, reply = server.request("POST", "/v1/chat/completions", body)
    assert status == 200 and reply["model"] == model_path().stem, reply
    explicit = Server("-m", "default", "--parallel", 1)
    try:
        status, reply = explicit.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "model": "default"})
        assert status == 200, reply
        assert [m["id"] for m in explicit.request("GET", "/v1/models")[1]["data"]] == [model_path().stem]
    finally:
        assert explicit.stop() == 0
    # A model named by its path answers to its name only.
    by_path = Server("-m", model_path(), "--parallel", 1)
    try:
        e = error_of(by_path.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "model": "default"}),
                     404)
        assert e["code"] == "model_not_found" and "also named" not in e["message"], e
    finally:
        assert by_path.stop() == 0


def test_context_overflow_names_both_numbers(server):
    prompt = [2] + [1000] * 4000
    e = error_of(server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 200}), 400)
    assert "4096" in e["message"] and "4001" in e["message"] and "200" in e["message"]
    assert e["code"] == "context_length_exceeded"
    e = error_of(server.request("POST", "/v1/completions", {"prompt": [2] + [1000] * 5000}), 400)
    assert "5001" in e["message"]


def test_body_too_large_is_413():
    s = Server("--max-body-mib", 1)
    try:
        e = error_of(s.request("POST", "/v1/completions", raw=json.dumps({"prompt": "x" * (2 << 20)})), 413)
        assert "larger than" in e["message"]
        # a chunked body has no Content-Length to check first: it is cut off at the limit all the same
        big = json.dumps({"prompt": "x" * (2 << 20)}).encode()
        chunks = (big[i:i + 65536] for i in range(0, len(big), 65536))
        status, body = raw_post(s, "/v1/completions", chunks, {"Content-Type": "application/json"}, encode_chunked=True)
        assert status == 413 and "larger than" in body["error"]["message"], (status, body)
        assert s.request("GET", "/health")[0] == 200
    finally:
        s.stop()


def raw_post(server, path, body, headers, encode_chunked=False):
    """POST with exactly these headers (Server.request always adds Content-Type: application/json)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", path, body=body, headers=headers, encode_chunked=encode_chunked)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    conn.close()
    return resp.status, json.loads(text)


def test_json_body_without_json_content_type(server):
    """A ~9 KB JSON body without Content-Type, or labelled as a form as `curl -d` labels it, is read as
    JSON like any other body (was 413: cpp-httplib's 8 KiB form limit)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    tokenize = json.dumps({"content": "word " * 1800})
    chat = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "pad": "x" * 9000})
    assert len(tokenize) > 9000 and len(chat) > 9000
    for content_type in (None, "application/x-www-form-urlencoded", "text/plain"):
        headers = dict(auth, **({"Content-Type": content_type} if content_type else {}))
        status, body = raw_post(server, "/tokenize", tokenize, headers)
        assert status == 200 and body["count"] > 1800, (content_type, status, body)
        status, body = raw_post(server, "/v1/chat/completions", chat, headers)
        assert status == 200 and body["usage"]["completion_tokens"] == 1, (content_type, status, body)
    # a multipart form is no JSON: 415, and the connection stays usable
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    form = "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b--\r\n"
    conn.request("POST", "/tokenize", body=form, headers=dict(auth, **{"Content-Type": "multipart/form-data; boundary=b"}))
    resp = conn.getresponse()
    assert resp.status == 415 and "application/json" in json.loads(resp.read())["error"]["message"]
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()


def test_openai_client_raises_typed_errors(client, model_id):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=[2] + [1000] * 4090, max_tokens=100)
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# --- cancellation and robustness -------------------------------------------------------------

def test_disconnect_cancels_generation(server):
    wait_idle(server)
    before_tokens = server.metric("kestrel_generation_tokens_total")
    before_cancel = server.metric("kestrel_requests_cancelled_total")
    conn, resp = open_stream(server, 3000)
    resp.fp.readline()  # first event line
    resp.fp.readline()
    drop(conn, resp)
    wait_idle(server)
    assert server.metric("kestrel_requests_cancelled_total") == before_cancel + 1
    generated = server.metric("kestrel_generation_tokens_total") - before_tokens
    assert generated < 50, generated  # far fewer than the 3000 asked for
    # non-streaming requests are cancelled as well
    before_tokens = server.metric("kestrel_generation_tokens_total")
    conn, resp = open_stream(server, 3000, stream=False)
    time.sleep(0.5)
    drop(conn, resp)
    wait_idle(server)
    assert server.metric("kestrel_requests_cancelled_total") == before_cancel + 2
    assert server.metric("kestrel_generation_tokens_total") - before_tokens < 3000


def test_requests_queue_in_fifo_order():
    """Requests beyond the sessions wait for one in arrival order (one session here)."""
    server = Server("--parallel", 1)
    order = []
    lock = threading.Lock()

    def run(i):
        status, _ = server.request("POST", "/v1/completions",
                                   {"prompt": f"Item {i}:", "max_tokens": 12, "ignore_eos": True})
        with lock:
            order.append(i)
        return status

    try:
        with ThreadPoolExecutor(4) as pool:
            futures = []
            for i in range(4):
                futures.append(pool.submit(run, i))
                time.sleep(0.15)  # arrival order 0, 1, 2, 3
            assert [f.result() for f in futures] == [200] * 4
        assert order == [0, 1, 2, 3]
    finally:
        assert server.stop() == 0


def test_health_and_metrics_answer_while_the_queue_is_full():
    """Default --queue (64) and --parallel (4): 64 slow streams fill the sessions and the queue, each
    holding a connection thread; /health and /metrics still answer within a second, and one request
    more gets its 429 as quickly. (With 16 connection threads, the fresh-user trial's /health hung.)"""
    s = Server("--ctx", 1024)
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True, "stream": True})
    conns = []
    try:
        for _ in range(64):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            conn.request("POST", "/v1/completions", body=body, headers=s.headers())
            conns.append(conn)
        # every one is admitted: a thread has taken it and sent the stream's headers
        resps = [c.getresponse() for c in conns]
        assert [r.status for r in resps] == [200] * 64
        deadline = time.time() + 10
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=1)
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            conn.close()
            if "kestrel_queue_depth 60" in text and "kestrel_requests_running 4" in text:
                break
            assert time.time() < deadline, text
            time.sleep(0.05)
        for path in ("/health", "/metrics", "/health"):
            t0 = time.time()
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=1)
            conn.request("GET", path)
            assert conn.getresponse().status == 200
            conn.close()
            assert time.time() - t0 < 1.0
        t0 = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=1)
        conn.request("POST", "/v1/completions", body=body, headers=s.headers())
        assert conn.getresponse().status == 429
        conn.close()
        assert time.time() - t0 < 1.0
    finally:
        for conn in conns:
            if conn.sock is not None:
                conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
        wait_idle(s, timeout=120)
        assert s.stop() == 0


def robustness_run(server, n_requests):
    rng = random.Random(1)

    def one(i):
        kind = rng.random()
        if kind < 0.3:  # disconnect mid-stream
            conn, resp = open_stream(server, 200)
            resp.fp.readline()
            drop(conn, resp)
            return "dropped"
        if kind < 0.4:  # a malformed request
            return server.request("POST", "/v1/chat/completions", raw='{"messages": [')[0]
        body = {"messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": rng.randint(1, 24),
                "stream": kind < 0.7, "temperature": 0.7, "seed": i}
        return server.request("POST", "/v1/chat/completions", body)[0]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(n_requests)))
    assert set(results) <= {"dropped", 200, 400}, set(results)
    return results


def test_robustness_short(server):
    """CI's version: 32 requests at concurrency 4 with random disconnects."""
    robustness_run(server, 8)  # warm-up: allocator pools, thread stacks
    wait_idle(server)
    rss0 = server.rss_kib()
    robustness_run(server, 32)
    wait_idle(server)
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    rss1 = server.rss_kib()
    assert rss1 <= rss0 * 1.10, (rss0, rss1)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("KESTREL_LONG_TESTS"), reason="set KESTREL_LONG_TESTS=1 (minutes)")
def test_robustness_500_requests():
    s = Server()
    try:
        robustness_run(s, 40)
        wait_idle(s)
        rss0 = s.rss_kib()
        robustness_run(s, 500)
        wait_idle(s)
        assert s.request("GET", "/health") == (200, {"status": "ok"})
        rss1 = s.rss_kib()
        print(f"RSS before {rss0} KiB, after 500 requests {rss1} KiB ({100 * (rss1 - rss0) / rss0:+.1f} %)")
        assert rss1 <= rss0 * 1.10, (rss0, rss1)
    finally:
        assert s.stop() == 0


def test_random_field_values_never_crash(server):
    """Every known field set to values of every JSON type: only 200 or 400, and the server lives."""
    rng = random.Random(7)
    values = [None, True, False, 0, -1, 1, 2.5, -1e300, 1e300, 2 ** 63, -(2 ** 63) - 1, "", "x", "\u00e9",
              [], [1], ["a"], [[1]], {}, {"type": "text"}, {"a": [1, {"b": None}]}]
    # (the length fields stay fixed so that no request generates for long; unit tests cover them)
    fields = ["model", "messages", "prompt", "temperature", "top_p", "top_k",
              "min_p", "seed", "stop", "stream", "stream_options", "logprobs",
              "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "tools", "tool_choice",
              "response_format", "n", "echo", "best_of", "chat_template_kwargs"]
    statuses = set()
    for i in range(120):
        path = "/v1/chat/completions" if i % 2 == 0 else "/v1/completions"
        body = {"messages": [{"role": "user", "content": "hi"}]} if i % 2 == 0 else {"prompt": "hi"}
        body["max_tokens"] = 2
        body["max_completion_tokens"] = 2
        for field in rng.sample(fields, 3):
            body[field] = rng.choice(values)
        if body.get("stream") is True:
            body["stream"] = False  # keep the reply one JSON document
        status, reply = server.request("POST", path, body)
        assert status in (200, 400), (status, body, reply)
        if status == 400:
            assert reply["error"]["type"] == "invalid_request_error"
        statuses.add(status)
    assert statuses <= {200, 400}
    # (the sample may hold no valid request: completions read response_format since structured
    # output) and the server still answers one
    assert server.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200
    assert server.request("GET", "/health")[0] == 200


# --- logit_bias ------------------------------------------------------------------------------

def check_logit_bias(server):
    """Banning the greedy token (-100) gives the runner-up that the unbiased step's top_logprobs
    name; +100 on a token far down the ranking (with FlashHead: outside the probed candidates)
    makes it the answer."""
    def first_step(**extra):
        status, body = server.request("POST", "/v1/completions", {
            "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0, "logprobs": 2, **extra})
        assert status == 200, body
        return body["choices"][0]["text"], body["choices"][0]["logprobs"]["top_logprobs"][0]

    def token_of(piece):
        status, body = server.request("POST", "/tokenize", {"content": piece, "add_special": False})
        assert status == 200 and len(body["tokens"]) == 1, (piece, body)
        return body["tokens"][0]

    text, top = first_step()
    best, runner_up = sorted(top, key=top.get, reverse=True)
    assert text == best
    banned, _ = first_step(logit_bias={str(token_of(best)): -100})
    assert banned == runner_up, (best, runner_up, banned)
    rare = 123457  # a token no continuation of this prompt ranks high
    status, body = server.request("POST", "/detokenize", {"tokens": [rare]})
    assert status == 200
    forced, _ = first_step(logit_bias={str(rare): 100, str(token_of(best)): -5})
    assert forced == body["content"], (forced, body)
    # A small bias changes nothing here, and the unbiased answer is unchanged afterwards.
    assert first_step(logit_bias={str(rare): 0.5})[0] == best
    assert first_step()[0] == best


def test_logit_bias(server):
    check_logit_bias(server)


def test_logit_bias_with_flashhead():
    image = Path.home() / ".cache" / "kestrel" / "images" / "gemma-3-270m-w4a16-flashhead.kimg"
    if not image.exists():
        pytest.skip("no cached default image (the Quick start's first command builds it)")
    s = Server("-m", image)
    try:
        check_logit_bias(s)
    finally:
        assert s.stop() == 0


def flashhead_metrics(server):
    """/metrics' FlashHead figures: probes, searches, clusters scored, searches by proof."""
    _, text = server.request("GET", "/metrics")
    by_proof = {line.split('"')[1]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("kestrel_flashhead_searches_by_proof_total{")}
    return (server.metric("kestrel_flashhead_probes"), server.metric("kestrel_flashhead_searches_total"),
            server.metric("kestrel_flashhead_clusters_scored_total"), by_proof)


@pytest.mark.parametrize("proof", ["off", "on"])
def test_metrics_count_flashhead_searches(proof):
    """/metrics counts FlashHead's searches, the clusters they scored and how each token was
    proven (issue 42): with the proof off every search scores the probes and is "none"; with it
    on, each search is proven at the probes, with extra ones, or by the dense fallback (every
    cluster), and the clusters scored say which."""
    image = Path.home() / ".cache" / "kestrel" / "images" / "gemma-3-270m-w4a16-flashhead.kimg"
    if not image.exists():
        pytest.skip("no cached default image (the Quick start's first command builds it)")
    s = Server("-m", image, "--flashhead-proof", proof, "--draft", "none")
    try:
        probes, searches, clusters, by_proof = flashhead_metrics(s)
        assert (searches, clusters) == (0, 0) and set(by_proof) == {"floor", "extra", "dense", "none"}
        status, r = s.request("POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                                          "temperature": 0, "ignore_eos": True})
        assert status == 200, r
        _, searches, clusters, by_proof = flashhead_metrics(s)
        # A search at the prompt's last position and one per decode step after it.
        assert searches == r["usage"]["completion_tokens"], (searches, r["usage"])
        assert sum(by_proof.values()) == searches
        if proof == "off":
            assert by_proof["none"] == searches and clusters == searches * probes
        else:
            n_clusters = 262144 // 16
            assert by_proof["none"] == 0
            assert clusters >= searches * probes
            # Every dense fallback scores all clusters; proven searches score fewer.
            assert clusters >= by_proof["dense"] * n_clusters
            assert clusters <= (by_proof["dense"] + by_proof["extra"]) * n_clusters + by_proof["floor"] * probes
    finally:
        assert s.stop() == 0


def test_metrics_have_no_flashhead_figures_with_the_dense_head(server):
    _, text = server.request("GET", "/metrics")
    assert "kestrel_flashhead_searches_total" not in text


@pytest.mark.parametrize("bias, message", [
    ([1, 2], "'logit_bias' must be an object mapping token ids to numbers"),
    ({"x": 1}, "keys must be token ids"),
    ({"-3": 1}, "keys must be token ids"),
    ({"5": "a"}, "'logit_bias.5' must be a number"),
    ({"5": 101}, "must be between -100 and 100"),
    ({"5": 1, "005": 2}, "names token 5 twice"),
    ({"999999999": 1}, "outside the vocabulary of 262144"),
])
def test_logit_bias_errors(server, bias, message):
    status, body = server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "logit_bias": bias})
    assert status == 400, body
    assert message in body["error"]["message"] and body["error"]["param"].startswith("logit_bias"), body
