"""n > 1 and best_of (issue 47: both answered 400), and lists of prompts run at once. Samples of
one request run as concurrent requests on the scheduler, so they decode as one batch; each
sample k is the answer of a single request with seed + k (checked against single requests)."""
import time

import openai
import pytest

from serve_helpers import KESTREL, Server, model_path

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")


@pytest.fixture(scope="module")
def server():
    s = Server("--quiet", "--parallel", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
    c.model_id = c.models.list().data[0].id
    return c


def test_chat_n_samples_are_the_seeded_single_answers(client):
    args = dict(model=client.model_id, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12,
                temperature=1.0)
    r = client.chat.completions.create(n=3, seed=40, **args)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(seed=40 + k, **args).choices[0].message.content for k in range(3)]
    assert [c.message.content for c in r.choices] == singles
    assert len(set(singles)) > 1  # sampled: the seeds differ
    assert r.usage.completion_tokens >= 3


def test_completions_n_best_of_and_prompt_lists(client, server):
    status, r = server.request("POST", "/v1/completions", {"prompt": ["Once upon a time", "The sea is"], "n": 2,
                                                          "max_tokens": 8, "temperature": 1.0, "seed": 5})
    assert status == 200, r
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    for i, prompt in enumerate(["Once upon a time", "The sea is"]):
        for k in range(2):
            _, one = server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 1.0,
                                                               "seed": 5 + k})
            assert r["choices"][2 * i + k]["text"] == one["choices"][0]["text"]
    # best_of 4, n 1: the sample of highest summed logprob among the seeds 9..12
    status, r = server.request("POST", "/v1/completions", {"prompt": "The sea is", "best_of": 4, "max_tokens": 6,
                                                          "temperature": 1.0, "seed": 9})
    assert status == 200 and len(r["choices"]) == 1 and r["choices"][0]["logprobs"] is None, r
    scored = []
    for k in range(4):
        _, one = server.request("POST", "/v1/completions", {"prompt": "The sea is", "max_tokens": 6, "temperature": 1.0,
                                                           "seed": 9 + k, "logprobs": 0})
        scored.append((sum(one["choices"][0]["logprobs"]["token_logprobs"]), one["choices"][0]["text"]))
    assert r["choices"][0]["text"] == max(scored, key=lambda s: s[0])[1], scored
    for body, param in (({"prompt": "a", "n": 3, "best_of": 2}, "best_of"), ({"prompt": "a", "n": 2, "stream": True}, "n"),
                        ({"prompt": "a", "n": 17}, "n")):
        status, e = server.request("POST", "/v1/completions", body)
        assert status == 400 and e["error"]["param"] == param, (body, e)


def test_a_list_of_prompts_decodes_as_one_batch(server):
    prompts = ["Tell me a story about a cat.", "Tell me a story about a dog.", "Tell me a story about a bird.",
               "Tell me a story about a fish."]
    body = {"max_tokens": 48, "temperature": 0, "ignore_eos": True}
    t0 = time.time()
    alone = []
    for p in prompts:
        status, r1 = server.request("POST", "/v1/completions", {"prompt": p, **body})
        assert status == 200
        alone.append(r1["choices"][0]["text"])
    one_by_one = time.time() - t0
    t0 = time.time()
    status, r = server.request("POST", "/v1/completions", {"prompt": prompts, **body})
    batched = time.time() - t0
    assert status == 200 and len(r["choices"]) == 4
    # Batched, each prompt's answer is its answer alone (greedy). The time is printed, not
    # asserted: speed is measured in benchmarks (scripts/bench/multi_user_bench.py).
    assert [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])] == alone
    print(f"4 prompts: one by one {one_by_one:.2f} s, one request {batched:.2f} s")
