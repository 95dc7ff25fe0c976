"""POST /v1/responses (OpenAI's Responses API) with the official openai SDK: plain and streamed,
instructions and input items, a forced tool round trip (streamed and not), text.format
json_schema, previous_response_id with store (the follow-up's prompt is served warm from the
sessions' KV caches), and the errors. Issue 47: the door was a 404 for the openai SDK's
client.responses.create, openai-agents, LangChain's use_responses_api, litellm.responses and
pydantic-ai's OpenAIResponsesModel."""
import json

import openai
import pytest

from serve_helpers import KESTREL, Server, model_path

jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def server():
    s = Server("--quiet")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
    c.model_id = c.models.list().data[0].id
    return c


def test_plain_answer_is_the_chat_completions_answer(client):
    r = client.responses.create(model=client.model_id, input="Name three colors.", max_output_tokens=24,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.output_text and r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert isinstance(r.usage.input_tokens_details.cached_tokens, int)
    # One pipeline: the same prompt through chat completions gives the same text.
    c = client.chat.completions.create(model=client.model_id, messages=[{"role": "user", "content": "Name three colors."}],
                                       max_tokens=24, temperature=0)
    assert c.choices[0].message.content == r.output_text
    assert c.usage.prompt_tokens == r.usage.input_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and c.choices[0].finish_reason == "length"


def test_instructions_and_items(client):
    r = client.responses.create(
        model=client.model_id, instructions="Answer in one word.", temperature=0, max_output_tokens=8,
        input=[{"role": "user", "content": "Hello"},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
               {"role": "user", "content": [{"type": "input_text", "text": "What is 2+2?"}]}])
    assert r.instructions == "Answer in one word."
    c = client.chat.completions.create(
        model=client.model_id, temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Hello"},
                  {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "What is 2+2?"}])
    assert r.output_text == c.choices[0].message.content


def test_stream_typed_events(client):
    stream = client.responses.create(model=client.model_id, input="Tell me about the sea.", max_output_tokens=20,
                                     temperature=0, stream=True)
    types, deltas, final = [], [], None
    for event in stream:
        types.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert types[0] == "response.created" and types[1] == "response.in_progress"
    assert "response.output_item.added" in types and "response.content_part.added" in types
    assert types[-1] in ("response.completed", "response.incomplete")
    assert types.index("response.output_text.done") < types.index("response.output_item.done")
    assert "".join(deltas) == final.output_text and final.usage.output_tokens > 0
    plain = client.responses.create(model=client.model_id, input="Tell me about the sea.", max_output_tokens=20,
                                    temperature=0)
    assert plain.output_text == final.output_text


def test_forced_tool_round_trip_streamed_and_not(client):
    named = {"type": "function", "name": "get_weather"}
    for stream in (False, True):
        args = dict(model=client.model_id, input="What is the weather in Paris?", tools=[WEATHER], tool_choice=named,
                    temperature=0, max_output_tokens=60)
        if stream:
            calls, arg_deltas, final = [], [], None
            for event in client.responses.create(stream=True, **args):
                if event.type == "response.function_call_arguments.delta":
                    arg_deltas.append(event.delta)
                if event.type == "response.output_item.done" and event.item.type == "function_call":
                    calls.append(event.item)
                if event.type == "response.completed":
                    final = event.response
            assert "".join(arg_deltas) == calls[0].arguments
            output = final.output
        else:
            output = client.responses.create(**args).output
            calls = [o for o in output if o.type == "function_call"]
        assert len(calls) == 1, output  # one call: parallel_tool_calls not set
        call = calls[0]
        assert call.name == "get_weather" and call.call_id
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        # The tool's answer goes back as function_call_output; the model then answers in text.
        r2 = client.responses.create(
            model=client.model_id, tools=[WEATHER], temperature=0, max_output_tokens=20,
            input=[{"role": "user", "content": "What is the weather in Paris?"},
                   {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                   {"type": "function_call_output", "call_id": call.call_id, "output": "22 C and sunny"}])
        assert r2.status in ("completed", "incomplete") and r2.output


def test_previous_response_id_continues_warm(client):
    r1 = client.responses.create(model=client.model_id, input="My name is Ann and I live in Oslo.", temperature=0,
                                 max_output_tokens=16)
    r2 = client.responses.create(model=client.model_id, previous_response_id=r1.id, input="Where do I live?",
                                 temperature=0, max_output_tokens=16)
    assert r2.previous_response_id == r1.id
    assert r2.usage.input_tokens > r1.usage.input_tokens
    # the first turn's prompt and answer are already in a session's KV cache
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens - 16, r2.usage
    # The same conversation sent whole gives the same answer.
    whole = client.responses.create(
        model=client.model_id, temperature=0, max_output_tokens=16,
        input=[{"role": "user", "content": "My name is Ann and I live in Oslo."},
               {"role": "assistant", "content": r1.output_text}, {"role": "user", "content": "Where do I live?"}])
    assert whole.output_text == r2.output_text
    assert client.responses.retrieve(r1.id).output_text == r1.output_text
    # store: false is not kept; an unknown id is a 404 naming the field
    r3 = client.responses.create(model=client.model_id, input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=client.model_id, previous_response_id=r3.id, input="Again")
    assert e.value.body["param"] == "previous_response_id"


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"]}
    r = client.responses.create(model=client.model_id, input="A city as JSON.", temperature=0, max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "city", "schema": schema}})
    assert r.status == "completed"
    value = json.loads(r.output_text)
    jsonschema.validate(value, schema)
    assert set(value) == {"city", "country"}


def test_errors_name_the_field(client, server):
    for body, param in (({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
                        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
                        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
                        ({}, "input"),
                        ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens")):
        status, r = server.request("POST", "/v1/responses", body)
        assert status == 400 and r["error"]["param"] == param, (body, r)
    status, r = server.request("POST", "/v1/responses", {"input": "hi", "model": "gpt-4o"})
    assert status == 404 and r["error"]["code"] == "model_not_found"
