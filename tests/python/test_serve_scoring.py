"""Prompt scoring through /v1/completions: echo + logprobs (OpenAI's legacy completions, what
lm-eval's loglikelihood requests send), vLLM's prompt_logprobs, and /tokenize's
add_special_tokens (issue 47).

The numbers are checked against `kestrel perplexity` (the same text, chunk and positions: mean
NLL within 1e-3 nats/token) and against llama.cpp (llama-cpp-python's logits for the same GGUF,
log-softmax in float64 numpy; Q4_K_M differs by ~0.5 % in perplexity, docs/correctness.md).
"""
import json
import math
import subprocess

import pytest

from serve_helpers import KESTREL, ROOT, Server, model_path

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

TEXT = (ROOT / "docs" / "architecture.md").read_text()


@pytest.fixture(scope="module")
def server():
    s = Server("--quiet")
    yield s
    s.stop()


def tokenize(server, text, add_special_tokens=True):
    status, r = server.request("POST", "/tokenize", {"content": text, "add_special_tokens": add_special_tokens,
                                                     "parse_special": False})
    assert status == 200, r
    return r["tokens"]


def complete(server, **body):
    status, r = server.request("POST", "/v1/completions", {"temperature": 0, **body})
    assert status == 200, r
    return r


def test_tokenize_honours_add_special_tokens(server):
    with_bos = tokenize(server, "Hello world", True)
    without = tokenize(server, "Hello world", False)
    assert with_bos[1:] == without and with_bos[0] == 2, (with_bos, without)  # Gemma's <bos> is id 2
    # llama-server's name still works
    status, r = server.request("POST", "/tokenize", {"content": "Hello world", "add_special": False})
    assert status == 200 and r["tokens"] == without


def test_echo_shapes_for_max_tokens_0_and_1_string_and_token_prompts(server):
    prompt = "The capital of France is"
    ids = tokenize(server, prompt)
    for max_tokens in (0, 1):
        for p in (prompt, ids):
            r = complete(server, prompt=p, echo=True, logprobs=1, max_tokens=max_tokens)
            choice = r["choices"][0]
            lp = choice["logprobs"]
            n = len(ids) + max_tokens
            assert r["usage"]["prompt_tokens"] == len(ids) and r["usage"]["completion_tokens"] == max_tokens
            assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:])
            # lm-eval's greedy check reads the best alternative at each position
            for x, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
                assert len(top) == 1 and max(top.values()) >= x - 1e-6
            if isinstance(p, str):
                assert choice["text"].startswith(prompt) and (max_tokens == 1 or choice["text"] == prompt)
            else:
                assert prompt in choice["text"]
    # The same scores from a string and from its token ids; the generated token is the one a
    # plain greedy request gives.
    a = complete(server, prompt=prompt, echo=True, logprobs=2, max_tokens=1)["choices"][0]
    b = complete(server, prompt=ids, echo=True, logprobs=2, max_tokens=1)["choices"][0]
    assert a["logprobs"]["token_logprobs"] == b["logprobs"]["token_logprobs"]
    plain = complete(server, prompt=prompt, max_tokens=1)["choices"][0]
    assert a["text"] == prompt + plain["text"]


def test_lists_of_prompts_score_each(server):
    prompts = ["One two three four", "The quick brown fox jumps", "Paris is in"]
    ids = [tokenize(server, p) for p in prompts]
    single = [complete(server, prompt=p, echo=True, logprobs=1, max_tokens=1)["choices"][0] for p in ids]
    for body_prompt in (prompts, ids):
        r = complete(server, prompt=body_prompt, echo=True, logprobs=1, max_tokens=1)
        choices = sorted(r["choices"], key=lambda c: c["index"])
        assert [c["index"] for c in choices] == [0, 1, 2]
        for c, s, p in zip(choices, single, prompts):
            assert c["text"].startswith(p)
            for x, y in zip(c["logprobs"]["token_logprobs"][1:-1], s["logprobs"]["token_logprobs"][1:-1]):
                assert x == pytest.approx(y, abs=1e-5)


def test_prompt_logprobs_as_vllm_names_it(server):
    ids = tokenize(server, "Kestrel serves small Gemma models fast")
    r = complete(server, prompt=ids, prompt_logprobs=3, max_tokens=1, logprobs=0, echo=True)
    choice = r["choices"][0]
    pl = choice["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    for i, position in enumerate(pl[1:], start=1):
        assert str(ids[i]) in position, position
        mine = position[str(ids[i])]
        assert mine["rank"] >= 1 and isinstance(mine["decoded_token"], str)
        ranks = sorted(v["rank"] for k, v in position.items() if k != str(ids[i]))
        assert ranks == [1, 2, 3] or (mine["rank"] <= 3 and len(position) == 3)
        best = max(v["logprob"] for v in position.values())
        assert [v["rank"] for v in position.values() if v["logprob"] == best][0] == 1
        # the same number echo reports for the token
        assert mine["logprob"] == pytest.approx(choice["logprobs"]["token_logprobs"][i], abs=1e-6)


def test_agrees_with_kestrel_perplexity(server, tmp_path):
    # kestrel perplexity --ctx 256 --chunks 1 scores tokens 129..255 of the text's first 256
    # tokens (BOS first): the same positions from echo must give the same mean NLL.
    n_ctx = 256
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    out = subprocess.run([str(KESTREL), "perplexity", "-f", str(path), "--ctx", str(n_ctx), "--chunks", "1",
                          "-t", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    ppl = json.loads(out.stdout)["ppl"]
    ids = tokenize(server, TEXT)[:n_ctx]
    r = complete(server, prompt=ids, echo=True, logprobs=1, max_tokens=0)
    lps = r["choices"][0]["logprobs"]["token_logprobs"]
    scored = lps[n_ctx // 2 + 1:n_ctx]
    assert len(scored) == n_ctx - n_ctx // 2 - 1
    mean_nll = -sum(scored) / len(scored)
    assert abs(mean_nll - math.log(ppl)) < 1e-3, (mean_nll, math.log(ppl))


def test_agrees_with_llama_cpp(server, llama_cpp):
    np = pytest.importorskip("numpy")
    ids = tokenize(server, TEXT)[:200]
    llm = llama_cpp.Llama(model_path=str(model_path()), n_ctx=256, n_batch=256, n_threads=2, logits_all=True,
                          verbose=False)
    llm.eval(ids)
    scores = np.asarray(llm.scores[:len(ids)], dtype=np.float64)
    m = scores.max(axis=1, keepdims=True)
    logz = (m + np.log(np.exp(scores - m).sum(axis=1, keepdims=True)))[:, 0]
    ref = np.array([scores[i - 1, ids[i]] - logz[i - 1] for i in range(1, len(ids))])
    r = complete(server, prompt=ids, echo=True, logprobs=1, max_tokens=0)
    mine = np.array(r["choices"][0]["logprobs"]["token_logprobs"][1:], dtype=np.float64)
    # Q4_K_M: llama.cpp quantizes activations to 8 bits where Kestrel does not, ~0.5 % in
    # perplexity and logits up to ~1.0 apart (docs/correctness.md, tolerance 1.5 there): the mean
    # NLL within 0.05 nats (under 0.02 where this test was written, 0.024 on the AVX2-only
    # Zen 1, whose llama.cpp kernels differ), each token within 1.5 (measured: 0.77 at most, on
    # a token of logprob -18).
    print(f"mean logprob kestrel {mine.mean():.5f} llama.cpp {ref.mean():.5f}; max |diff| {np.abs(mine - ref).max():.3f}")
    assert abs(mine.mean() - ref.mean()) < 0.05, (mine.mean(), ref.mean())
    assert np.abs(mine - ref).max() < 1.5, np.abs(mine - ref).max()
    assert np.corrcoef(mine, ref)[0, 1] > 0.998  # 0.99894 on the AVX2-only Zen 1


def test_scoring_errors_are_400s(server):
    for body, param in (({"prompt": "a", "echo": True, "stream": True}, "echo"),
                        ({"prompt": "a", "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
                        ({"prompt": "a", "prompt_logprobs": 99}, "prompt_logprobs"),
                        ({"prompt": "a", "echo": "yes"}, "echo")):
        status, r = server.request("POST", "/v1/completions", body)
        assert status == 400 and r["error"]["param"] == param, (body, r)
    status, r = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                                "echo": True})
    assert status == 400 and r["error"]["param"] == "echo", r
