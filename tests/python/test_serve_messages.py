"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) with the official
`anthropic` SDK: system and multi-turn, streamed, a tool_use / tool_result round trip, tool_choice,
stop_sequences, usage, and errors in Anthropic's shape. Issue 47: the door was missing (it is how
Claude Code and the Anthropic SDK reach a local model)."""
import json

import pytest

from serve_helpers import KESTREL, Server, model_path

anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"]}}
# This SDK has no temperature argument any more (the server reads it): greedy answers to compare.
T0 = {"temperature": 0}
CONVERSATION = [{"role": "user", "content": "Hello, who are you?"},
                {"role": "assistant", "content": "I am a small model."},
                {"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}]


@pytest.fixture(scope="module")
def server():
    s = Server("--quiet", api_key="secret")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    # The SDK sends the key as x-api-key.
    return anthropic.Anthropic(base_url=server.base, api_key="secret", max_retries=0, timeout=300)


def test_create_is_the_chat_completions_answer(client, server):
    m = client.messages.create(model="claude-any-name", max_tokens=20, extra_body=T0, system="Be brief.",
                               messages=CONVERSATION)
    assert m.type == "message" and m.role == "assistant" and m.model == "claude-any-name"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    status, chat = server.request("POST", "/v1/chat/completions", {
        "max_tokens": 20, "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, *[
            {"role": x["role"], "content": x["content"] if isinstance(x["content"], str) else x["content"][0]["text"]}
            for x in CONVERSATION]]})
    assert status == 200
    assert chat["choices"][0]["message"]["content"] == m.content[0].text
    assert m.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert m.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert (m.stop_reason == "max_tokens") == (chat["choices"][0]["finish_reason"] == "length")
    n = client.messages.count_tokens(model="claude-any-name", system="Be brief.", messages=CONVERSATION)
    assert n.input_tokens == m.usage.input_tokens


def test_stream_events(client):
    args = dict(model="m", max_tokens=20, extra_body=T0, messages=CONVERSATION)
    with client.messages.stream(**args) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_start" in types and "content_block_delta" in types and "message_delta" in types
    plain = client.messages.create(**args)
    assert final.content[0].text == plain.content[0].text
    assert final.usage.output_tokens == plain.usage.output_tokens and final.stop_reason == plain.stop_reason


def test_tool_use_round_trip(client):
    for stream in (False, True):
        args = dict(model="m", max_tokens=80, extra_body=T0, tools=[WEATHER],
                    tool_choice={"type": "tool", "name": "get_weather"},
                    messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        if stream:
            with client.messages.stream(**args) as s:
                m = s.get_final_message()
        else:
            m = client.messages.create(**args)
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(uses) == 1, m
        assert uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
        jsonschema.validate(uses[0].input, WEATHER["input_schema"])
        follow = client.messages.create(
            model="m", max_tokens=20, extra_body=T0, tools=[WEATHER],
            messages=[{"role": "user", "content": "What is the weather in Paris?"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": uses[0].name,
                                                         "input": uses[0].input}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                    "content": "22 C and sunny"}]}])
        assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # "any": a call of one of the tools
    m = client.messages.create(model="m", max_tokens=80, extra_body=T0, tools=[WEATHER], tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "Weather?"}])
    assert m.stop_reason == "tool_use"


def test_stop_sequences(client):
    m = client.messages.create(model="m", max_tokens=60, extra_body=T0, stop_sequences=[" "],
                               messages=[{"role": "user", "content": "Write a sentence about cats."}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == " ", m
    assert " " not in m.content[0].text.strip() if m.content else True


def test_errors_in_anthropic_shape(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", messages=CONVERSATION, max_tokens=None)  # type: ignore[arg-type]
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    status, body = server.request("POST", "/v1/messages", {"max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {}}]}]}, headers={"x-api-key": "secret"})
    assert status == 400 and body["type"] == "error" and "messages[0].content[0].type" in body["error"]["message"]
    wrong = anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model="m", max_tokens=5, messages=CONVERSATION)
    assert e.value.body["error"]["type"] == "authentication_error"
