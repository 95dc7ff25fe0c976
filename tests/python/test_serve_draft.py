"""Speculative decoding in kestrel serve (--draft): a request running alone verifies n-gram
drafts; the answer is the one the same server gives with --draft none (greedy and seeded
sampling), the usage reports drafted tokens as OpenAI's predicted-output fields
(completion_tokens_details.accepted_prediction_tokens / rejected_prediction_tokens), and
/metrics counts them. The official openai client reads the usage."""
import openai
import pytest

from serve_helpers import KESTREL, Server, model_path

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

CODE = """def moving_average(values, window):
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
"""
PROMPT = f"In utils.py:\n\n{CODE}\nThe same function in stats.py:\n\n{CODE}\nAnd again in metrics.py:\n\ndef moving_average("


@pytest.fixture(scope="module")
def servers():
    drafting, plain = Server("--model-name", "m", "--draft", "ngram"), Server("--model-name", "m", "--draft", "none")
    yield drafting, plain
    assert drafting.stop() == 0
    assert plain.stop() == 0


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "top_k": 40, "seed": 11}])
def test_drafting_keeps_the_answer_and_reports_its_counts(servers, sampling):
    drafting, plain = servers
    answers = []
    for server in servers:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
        extra = {k: v for k, v in sampling.items() if k not in ("temperature", "seed")}
        r = client.completions.create(model="m", prompt=PROMPT, max_tokens=48, temperature=sampling["temperature"],
                                      seed=sampling.get("seed"), extra_body={"ignore_eos": True, **extra})
        answers.append((r.choices[0].text, r.usage))
    (text, usage), (plain_text, plain_usage) = answers
    assert text == plain_text
    details = usage.completion_tokens_details
    if sampling["temperature"] == 0:
        assert details.accepted_prediction_tokens > 16, usage
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    assert plain_usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert plain_usage.completion_tokens_details.rejected_prediction_tokens == 0


def test_metrics_count_drafted_and_accepted_tokens(servers):
    drafting, _ = servers
    drafted, accepted = drafting.metric("kestrel_draft_tokens_total"), drafting.metric("kestrel_draft_accepted_tokens_total")
    status, body = drafting.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 32, "temperature": 0})
    assert status == 200
    d = body["usage"]["completion_tokens_details"]
    assert drafting.metric("kestrel_draft_accepted_tokens_total") == accepted + d["accepted_prediction_tokens"]
    assert drafting.metric("kestrel_draft_tokens_total") == drafted + d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"]


def test_bad_draft_option_is_a_usage_error():
    import subprocess
    r = subprocess.run([str(KESTREL), "serve", "--draft", "mtp"], capture_output=True, text=True)
    assert r.returncode != 0 and "--draft" in r.stderr


def test_props_say_whether_the_server_drafts(servers):
    drafting, plain = servers
    assert drafting.request("GET", "/props")[1]["speculative"] == {"draft": "ngram", "draft_max": 6,
                                                                  "draft_accept": "exact", "mtp_assistant": None}
    assert plain.request("GET", "/props")[1]["speculative"] is None


def test_props_name_the_kernels_that_run(servers):
    # The kernel registry's choice (docs/kernels.md), as `run --json` prints it.
    _, plain = servers
    kernels = plain.request("GET", "/props")[1]["kernels"]
    assert kernels["switches"] == "default", kernels
    assert kernels["layers"]["decode"] and kernels["layers"]["prefill"], kernels
    assert all("." in name for name in kernels["layers"]["decode"] + [kernels["head"]["decode"]]), kernels
