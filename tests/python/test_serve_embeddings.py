"""/v1/embeddings (`kestrel serve --embeddings --pooling mean|last|cls`, issue 47): the pooled
final hidden states of the same GGUF agree with llama.cpp's (llama-cpp-python's
`Llama(embedding=True, pooling_type=...)`, normalized here) to cosine >= 0.99 per sentence and
pooling; every input shape gives the same vectors; the official openai client's
`embeddings.create` (base64 on the wire by default) decodes to the float vectors; a server
started without --embeddings answers OpenAI's error shape."""
import numpy as np
import pytest

from serve_helpers import KESTREL, ROOT, Server, model_path

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "Gradient descent minimizes a loss function by following its negative gradient.",
    "Paris is the capital and most populous city of France.",
    "I would like two coffees and a croissant, please.",
    "Hi",
    # a long input: more than one ubatch (256 tokens) of the prefill
    (ROOT / "docs" / "architecture.md").read_text()[:2400],
]
POOLINGS = {"mean": 1, "cls": 2, "last": 3}  # llama.cpp's enum llama_pooling_type


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


@pytest.fixture(scope="module", params=sorted(POOLINGS))
def pooled(request):
    s = Server("-m", model_path(), "--quiet", "--embeddings", "--pooling", request.param)
    yield request.param, s
    s.stop()


def embed(server, **body):
    status, r = server.request("POST", "/v1/embeddings", body)
    assert status == 200, r
    return r


@pytest.fixture(scope="module")
def llama_vectors(llama_cpp):
    """llama.cpp's pooled, normalized embeddings of SENTENCES, per pooling."""
    out = {}
    for name, kind in POOLINGS.items():
        llm = llama_cpp.Llama(model_path=str(model_path()), embedding=True, pooling_type=kind, n_ctx=1024,
                              n_batch=1024, n_ubatch=1024, n_threads=2, verbose=False)
        out[name] = [unit(llm.embed(s)) for s in SENTENCES]
        del llm
    return out


def test_matches_llama_cpp(pooled, llama_vectors):
    name, server = pooled
    r = embed(server, input=SENTENCES, encoding_format="float")
    assert [d["index"] for d in r["data"]] == list(range(len(SENTENCES)))
    for i, d in enumerate(r["data"]):
        mine = np.asarray(d["embedding"], dtype=np.float64)
        assert abs(np.linalg.norm(mine) - 1) < 1e-5
        cos = float(mine @ llama_vectors[name][i])
        print(f"{name} sentence {i}: cosine {cos:.5f}")
        assert cos >= 0.99, (name, i, cos)


def test_input_shapes_and_usage(pooled):
    name, server = pooled
    status, t = server.request("POST", "/tokenize", {"content": SENTENCES[0], "add_special": True,
                                                     "parse_special": False})
    ids = t["tokens"]
    one = embed(server, input=SENTENCES[0])
    assert one["object"] == "list" and one["data"][0]["object"] == "embedding"
    assert one["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
    v = np.asarray(one["data"][0]["embedding"])
    assert v.shape == (640,)
    # token ids (used as they are), a list of them, and the string among others in a batch
    for body in ({"input": ids}, {"input": [ids, ids[:3]]}, {"input": [SENTENCES[1], SENTENCES[0]]}):
        r = embed(server, **body)
        row = r["data"][1 if body["input"][0] == SENTENCES[1] else 0]["embedding"]
        assert float(unit(row) @ unit(v)) > 0.9999, body
    if name == "cls":  # a causal model's first row sees only <bos>: the same for every input
        other = embed(server, input=SENTENCES[2])["data"][0]["embedding"]
        assert float(unit(other) @ unit(v)) > 0.9999


# The wire format and the errors do not depend on the pooling: one server's worth (CI time).
@pytest.mark.parametrize("pooled", ["mean"], indirect=True)
def test_openai_client_and_base64(pooled):
    openai = pytest.importorskip("openai")
    name, server = pooled
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0)
    got = client.embeddings.create(model=client.models.list().data[0].id, input=SENTENCES[:3])
    floats = embed(server, input=SENTENCES[:3], encoding_format="float")
    assert len(got.data) == 3 and got.usage.prompt_tokens == floats["usage"]["prompt_tokens"]
    for a, b in zip(got.data, floats["data"]):
        np.testing.assert_array_equal(np.asarray(a.embedding, dtype=np.float32),
                                      np.asarray(b["embedding"], dtype=np.float32))


@pytest.mark.parametrize("pooled", ["mean"], indirect=True)
def test_errors(pooled):
    _, server = pooled
    for body, param in (({}, "input"), ({"input": []}, "input"), ({"input": [[2, 10**7]]}, "input"),
                        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": "a", "dimensions": 64}, "dimensions")):
        status, r = server.request("POST", "/v1/embeddings", body)
        assert status == 400 and r["error"]["param"] == param and r["error"]["type"] == "invalid_request_error", r
    status, r = server.request("POST", "/v1/embeddings", {"input": "a", "model": "no-such-model"})
    assert status == 404 and r["error"]["code"] == "model_not_found", r


def test_without_embeddings_flag_is_an_openai_error():
    s = Server("-m", model_path(), "--quiet")
    try:
        status, r = s.request("POST", "/v1/embeddings", {"input": "hello"})
        assert status == 501, r
        assert r["error"]["type"] == "not_supported_error" and "--embeddings" in r["error"]["message"]
    finally:
        s.stop()
