"""Agent frameworks and client libraries against `kestrel serve`, each case written from the
library's own docs (issue 47's list): openai-agents on its default Responses model path with a
forced tool, instructor Mode.TOOLS and Mode.JSON_SCHEMA, LangChain with_structured_output and
use_responses_api, litellm completion and responses. They live in their own virtual environment
(scripts/install_deps.sh --client-libs; instructor 1.17 pins jiter<0.15, which the project's
openai pin does not accept): each case runs as a script in it and prints a JSON line."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from serve_helpers import KESTREL, Server, model_path

VENV = Path(os.environ.get("KESTREL_CLIENT_LIBS", Path.home() / ".cache" / "kestrel" / "client-libs"))
PYTHON = VENV / "bin" / "python"
pytestmark = [
    pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(), reason="default model or build/kestrel missing"),
    pytest.mark.skipif(not PYTHON.exists(), reason="client libraries not installed (scripts/install_deps.sh --client-libs)"),
]

CITY = '''
from pydantic import BaseModel, Field
class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
'''


@pytest.fixture(scope="module")
def server():
    s = Server("--quiet")
    yield s
    s.stop()


def run(server, code):
    env = {**os.environ, "BASE": server.base + "/v1", "MODEL": "default"}
    r = subprocess.run([str(PYTHON), "-c", "import os\nBASE, MODEL = os.environ['BASE'], os.environ['MODEL']\n" + code],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_openai_agents_default_responses_path_runs_a_forced_tool_once(server):
    out = run(server, '''
import json
from openai import AsyncOpenAI
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
set_tracing_disabled(True)
calls = []
@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"22 C in {city}"
client = AsyncOpenAI(base_url=BASE, api_key="none")
agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
              model=OpenAIResponsesModel(model=MODEL, openai_client=client),
              model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=60),
              tool_use_behavior="stop_on_first_tool")
result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
print(json.dumps({"calls": calls, "output": result.final_output}))
''')
    assert len(out["calls"]) == 1 and out["output"].startswith("22 C in"), out


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor(server, mode):
    out = run(server, CITY + f'''
import json, instructor, openai
client = instructor.from_openai(openai.OpenAI(base_url=BASE, api_key="none"), mode=instructor.Mode.{mode})
city = client.chat.completions.create(model=MODEL, response_model=City, max_retries=0, temperature=0, max_tokens=120,
                                      messages=[{{"role": "user", "content": "Name a city and its country."}}])
print(json.dumps(city.model_dump()))
''')
    assert set(out) == {"name", "country"} and out["name"], out


def test_langchain_structured_output_and_responses_api(server):
    out = run(server, CITY + '''
import json
from langchain_openai import ChatOpenAI
llm = ChatOpenAI(base_url=BASE, api_key="none", model=MODEL, temperature=0, max_tokens=120)
city = llm.with_structured_output(City).invoke("Name a city and its country.")
responses = ChatOpenAI(base_url=BASE, api_key="none", model=MODEL, temperature=0, max_tokens=20, use_responses_api=True)
print(json.dumps({"city": city.model_dump(), "text": responses.invoke("Say hello.").text}))
''')
    assert set(out["city"]) == {"name", "country"} and out["text"], out


def test_litellm_completion_and_responses(server):
    out = run(server, '''
import json, litellm
c = litellm.completion(model="openai/" + MODEL, api_base=BASE, api_key="none", temperature=0, max_tokens=20,
                       messages=[{"role": "user", "content": "Say hello."}])
r = litellm.responses(model="openai/" + MODEL, api_base=BASE, api_key="none", temperature=0, max_output_tokens=20,
                      input="Say hello.")
text = "".join(p.text for o in r.output if o.type == "message" for p in o.content)
print(json.dumps({"chat": c.choices[0].message.content, "responses": text}))
''')
    assert out["chat"] and out["chat"] == out["responses"], out
