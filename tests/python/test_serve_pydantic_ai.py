"""pydantic-ai (pydantic-ai-slim[openai] 2.78, pinned in scripts/requirements.txt) against
`kestrel serve` (issue 47), written from its docs: `OpenAIChatModel` (what the issue calls
OpenAIModel: renamed in pydantic-ai 1.0) and `OpenAIResponsesModel`, each through an
`OpenAIProvider` pointed at the server. Cases: an Agent with a structured output (pydantic-ai
makes it an output tool the model must call), and a function-tool round trip (a forced call to
`get_weather`, its result sent back, a text answer) on both models. It lives in the project's
environment, not the client-libs venv: it needs openai >= 3.50, and that venv pins 3.3.0."""
import json

import pytest

from serve_helpers import KESTREL, Server, model_path

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def pai():
    return pytest.importorskip("pydantic_ai")


@pytest.fixture(scope="module")
def server():
    s = Server("--quiet")
    yield s
    s.stop()


def model(server, kind):
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
    provider = OpenAIProvider(base_url=server.base + "/v1", api_key="none")
    return (OpenAIChatModel if kind == "chat" else OpenAIResponsesModel)("default", provider=provider)


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_agent_structured_output(pai, server, kind):
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolCallPart

    class City(BaseModel):
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    agent = Agent(model(server, kind), output_type=City, retries=0,
                  model_settings={"temperature": 0, "max_tokens": 120})
    result = agent.run_sync("Name a city and its country.")
    assert isinstance(result.output, City) and result.output.name, result.output
    calls = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolCallPart)]
    assert len(calls) == 1 and calls[0].tool_name == "final_result", calls


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_function_tool_round_trip(pai, server, kind):
    from pydantic_ai import ModelRequest
    from pydantic_ai.direct import model_request_sync
    from pydantic_ai.messages import TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.tools import ToolDefinition

    m = model(server, kind)
    params = ModelRequestParameters(function_tools=[ToolDefinition(
        name="get_weather", description="The weather in a city.", parameters_json_schema=WEATHER)])
    history = [ModelRequest.user_text_prompt("What is the weather in Paris?")]
    first = model_request_sync(m, history, model_request_parameters=params,
                               model_settings={"temperature": 0, "max_tokens": 60, "tool_choice": ["get_weather"]})
    calls = [p for p in first.parts if isinstance(p, ToolCallPart)]
    assert len(calls) == 1 and calls[0].tool_name == "get_weather", first.parts
    args = calls[0].args if isinstance(calls[0].args, dict) else json.loads(calls[0].args)
    assert isinstance(args.get("city"), str) and args["city"], args
    history += [first, ModelRequest(parts=[ToolReturnPart(tool_name="get_weather", content="22 C and sunny",
                                                          tool_call_id=calls[0].tool_call_id)])]
    second = model_request_sync(m, history, model_request_parameters=params,
                                model_settings={"temperature": 0, "max_tokens": 40, "tool_choice": "none"})
    texts = [p.content for p in second.parts if isinstance(p, TextPart)]
    assert texts and texts[0].strip(), second.parts
