"""kestrel serve's sessions: the prompt cache across chat turns (OpenAI's
usage.prompt_tokens_details.cached_tokens), separate conversations kept in separate sessions
(--parallel), llama-server's per-request cache_prompt, the bounded queue (429 + Retry-After),
and the memory check of --parallel at start.

Independent references: a request with cache_prompt false (a cold prefill of the same prompt)
for the answers, and the openai package's own types for the errors.
"""
import os
import resource
import subprocess
import threading
import time

import openai
import pytest

from serve_helpers import KESTREL, Server, drop, model_path, open_stream, wait_idle

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

# A first turn of a few hundred tokens, then short follow-ups.
STORY = " ".join(f"Day {i}: the expedition walked north along the river and counted {i * 7} birds." for i in range(1, 26))


def chat(client, messages, cache_prompt=True, max_tokens=16):
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0,
                                       extra_body={"cache_prompt": cache_prompt, "ignore_eos": True})
    return r.choices[0].message.content, r.usage


@pytest.fixture(scope="module")
def server():
    s = Server("--model-name", "m", "--parallel", 2)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)


def test_follow_up_turn_prefills_only_the_new_tokens(server, client):
    wait_idle(server)
    hits = server.metric('kestrel_prompt_cache_requests_total{result="hit"}')
    turn1 = [{"role": "user", "content": "Summarize this log. " + STORY}]
    answer1, u1 = chat(client, turn1)
    assert u1.prompt_tokens > 300
    turn2 = turn1 + [{"role": "assistant", "content": answer1}, {"role": "user", "content": "And on day 12?"}]
    answer2, u2 = chat(client, turn2)
    cached = u2.prompt_tokens_details.cached_tokens
    # turn 1's prompt comes from the cache (its answer, written by decode steps, is prefilled
    # again: KvCache::prefilled())
    assert u1.prompt_tokens <= cached < u2.prompt_tokens, (u1.prompt_tokens, cached, u2.prompt_tokens)
    assert server.metric('kestrel_prompt_cache_requests_total{result="hit"}') == hits + 1
    # the same answer as a cold run of the full prompt
    cold, u_cold = chat(client, turn2, cache_prompt=False)
    assert u_cold.prompt_tokens_details.cached_tokens == 0
    assert answer2 == cold


def test_two_conversations_keep_their_own_sessions(server, client):
    wait_idle(server)
    a = [{"role": "user", "content": "Conversation A. " + STORY}]
    b = [{"role": "user", "content": "Conversation B, about something else entirely. " + STORY[::-1]}]
    ra, _ = chat(client, a)
    rb, _ = chat(client, b)
    a2 = a + [{"role": "assistant", "content": ra}, {"role": "user", "content": "More."}]
    b2 = b + [{"role": "assistant", "content": rb}, {"role": "user", "content": "More."}]
    _, ua = chat(client, a2)
    _, ub = chat(client, b2)
    assert ua.prompt_tokens_details.cached_tokens > 300
    assert ub.prompt_tokens_details.cached_tokens > 300


def test_a_regenerated_answer_reuses_its_prompt(server, client):
    # A short prompt and an answer longer than it: the shared prefix is under half of the
    # session's cache (prompt + answer) but all of the prompt, so it counts.
    wait_idle(server)
    turn = [{"role": "user", "content": "Name three rivers."}]
    first, u1 = chat(client, turn, max_tokens=48)
    assert u1.completion_tokens == 48 and u1.prompt_tokens < 48
    again, u2 = chat(client, turn, max_tokens=48)
    assert u2.prompt_tokens_details.cached_tokens >= u1.prompt_tokens - 8, (u1, u2)
    assert again == first


def test_one_session_serves_one_conversation_at_a_time():
    s = Server("--model-name", "m", "--parallel", 1)
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=300)
        assert s.metric("kestrel_sessions") == 1
        a = [{"role": "user", "content": "Conversation A. " + STORY}]
        ra, _ = chat(c, a)
        chat(c, [{"role": "user", "content": "Conversation B. " + STORY[::-1]}])
        _, ua = chat(c, a + [{"role": "assistant", "content": ra}, {"role": "user", "content": "More."}])
        # B took the only session, but A's first prompt waits in the shared prefix cache (whole
        # blocks of 32 positions): A's follow-up copies it from there.
        assert ua.prompt_tokens_details.cached_tokens >= 400
        assert s.metric("kestrel_prefix_cache_hits_total") >= 1
    finally:
        assert s.stop() == 0
    # Without that cache (--cache-ram 0) the session holds B's, which shares only the template's start.
    s = Server("--model-name", "m", "--parallel", 1, "--cache-ram", 0)
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=300)
        ra, _ = chat(c, a)
        chat(c, [{"role": "user", "content": "Conversation B. " + STORY[::-1]}])
        _, ua = chat(c, a + [{"role": "assistant", "content": ra}, {"role": "user", "content": "More."}])
        assert ua.prompt_tokens_details.cached_tokens < 10
    finally:
        assert s.stop() == 0


def test_completions_report_cached_tokens(server):
    wait_idle(server)
    body = {"prompt": STORY, "max_tokens": 4, "temperature": 0}
    status, first = server.request("POST", "/v1/completions", body)
    assert status == 200
    status, again = server.request("POST", "/v1/completions", body)
    assert status == 200
    # all but the last 8 prompt tokens: those are prefilled as a cold run prefills them
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 8
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    status, off = server.request("POST", "/v1/completions", {**body, "cache_prompt": False})
    assert off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    status, bad = server.request("POST", "/v1/completions", {**body, "cache_prompt": "yes"})
    assert status == 400 and bad["error"]["param"] == "cache_prompt"


def test_a_repeated_greedy_request_answers_as_its_cold_run(server):
    # The fresh-user trial's case: the same short prompt three times. Its last token alone from
    # the cache would go through the decode kernels and move the logprobs (a near-tie "who" /
    # "named" flipped); the last 8 prompt tokens are prefilled as the cold run prefills them.
    wait_idle(server)
    body = {"prompt": "Story number 0: Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 3}
    runs = []
    for cache_prompt in (False, True, True):
        status, r = server.request("POST", "/v1/completions", {**body, "cache_prompt": cache_prompt})
        assert status == 200, r
        runs.append(r)
    assert runs[2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for r in runs[1:]:
        assert r["choices"][0]["text"] == runs[0]["choices"][0]["text"]
        assert r["choices"][0]["logprobs"]["token_logprobs"] == runs[0]["choices"][0]["logprobs"]["token_logprobs"]


def test_a_waiting_request_whose_client_left_never_runs():
    """Requests waiting for a session write a heartbeat about once a second, so one whose client
    closed the connection is dropped before it takes a session (it used to be prefilled and
    started first, holding up everyone behind it). Only the running request's prompt counts."""
    s = Server("--parallel", 1, "--queue", 8)
    try:
        first = open_stream(s, 400)
        first[1].fp.readline()  # running
        waiting = [open_stream(s, 400) for _ in range(4)]
        time.sleep(0.3)
        assert s.metric("kestrel_queue_depth") == 4
        p0 = s.metric("kestrel_prompt_tokens_total")
        for conn, resp in waiting:
            drop(conn, resp)
        time.sleep(2.5)  # a heartbeat a second notices
        drop(*first)
        wait_idle(s)
        status, one = s.request("POST", "/v1/completions", {"prompt": "Tell me a long story.", "max_tokens": 1})
        assert status == 200
        per_prompt = one["usage"]["prompt_tokens"]
        assert s.metric("kestrel_prompt_tokens_total") - p0 == 2 * per_prompt  # the first and this one
    finally:
        assert s.stop() == 0


def test_a_full_queue_answers_429_with_retry_after():
    s = Server("--model-name", "m", "--queue", 1)
    try:
        conn, resp = open_stream(s, 3000)  # holds the only place
        resp.fp.readline()
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="m", prompt="Hi", max_tokens=2)
        assert e.value.response.headers["Retry-After"] == "1"
        assert e.value.body["code"] == "rate_limit_exceeded"
        drop(conn, resp)
        wait_idle(s)
        # the place is free again once the first request has gone
        deadline = time.time() + 30
        while True:
            try:
                c.completions.create(model="m", prompt="Hi", max_tokens=2)
                break
            except openai.RateLimitError:
                assert time.time() < deadline
                time.sleep(0.1)
    finally:
        assert s.stop() == 0


def test_more_sessions_than_memory_is_a_clear_error():
    """Checked against the memory available with the model loaded (MemAvailable), not the machine's
    total: the message names what is needed, what is available, and what to lower."""
    r = subprocess.run([str(KESTREL), "serve", "--port", "0", "-t", "2", "--parallel", "256", "--ctx", "32768"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "kestrel: error: --parallel 256 needs 255 more sessions of " in r.stderr, r.stderr
    assert "(a KV cache of 32768 positions)" in r.stderr and "of memory is available" in r.stderr, r.stderr
    assert "lower --parallel to at most " in r.stderr and "or --ctx" in r.stderr, r.stderr


def vm_peak_kib(pid):
    for line in open(f"/proc/{pid}/status", encoding="ascii"):
        if line.startswith("VmPeak:"):
            return int(line.split()[1])
    raise AssertionError("no VmPeak")


def meminfo_kib(key):
    for line in open("/proc/meminfo", encoding="ascii"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key}")


def test_out_of_memory_while_allocating_sessions_is_a_clear_error():
    """An allocation that fails although the check passed (here: an address-space limit, as
    `ulimit -v` or a container sets) says so and names --parallel, not 'std::bad_alloc'."""
    if meminfo_kib("MemAvailable") < 6 << 20:
        pytest.skip("less than 6 GiB available: the memory check itself would refuse --parallel 24")
    args = ["--ctx", 32768, "--queue", 8, "--http-threads", 16, "--model-name", "m"]
    base = Server(*args, "--parallel", 1)  # the address space of one session, loaded and listening
    try:
        peak = vm_peak_kib(base.proc.pid)
    finally:
        assert base.stop() == 0
    limit = (peak + (150 << 10)) << 10  # room for about one more session (108 MiB at 32768 positions)
    r = subprocess.run([str(KESTREL), "serve", "--port", "0", "-t", "2", "--parallel", "24", *map(str, args)],
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert r.returncode == 1, r.stderr
    assert "std::bad_alloc" not in r.stderr, r.stderr
    assert "kestrel: error: out of memory allocating session " in r.stderr, r.stderr
    assert "of --parallel 24" in r.stderr and "lower --parallel or --ctx" in r.stderr, r.stderr


def test_clients_in_parallel_all_complete(server):
    """More clients than sessions: every request completes (they take turns)."""
    wait_idle(server)
    results, lock = [], threading.Lock()

    def one(i):
        status, body = server.request("POST", "/v1/completions",
                                      {"prompt": f"Client {i}: " + STORY[: 40 * (i + 1)], "max_tokens": 6,
                                       "temperature": 0})
        with lock:
            results.append(status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 6


def load_run(s, n_requests, clients, ctx, seed):
    """n_requests from `clients` threads: prompts of random token ids up to the context, streamed
    or not, a quarter of them dropped mid-stream, a 429 retried. Returns the final statuses
    ('dropped' for the dropped ones)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(seed)
    plan = [(rng.randint(1, ctx), rng.random(), rng.randint(1, 8)) for _ in range(n_requests)]

    def one(args):
        length, kind, max_tokens = args
        ids = [2] + [rng.randint(100, 20000) for _ in range(length - 1)]
        if kind < 0.25:
            conn, resp = open_stream(s, 400)
            resp.fp.readline()
            drop(conn, resp)
            return "dropped"
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": kind < 0.6}
        for _ in range(30):  # as the openai client does: retry a 429 after Retry-After (bounded)
            status, out = s.request("POST", "/v1/completions", body)
            if status != 429:
                break
            time.sleep(0.5)
        if status == 200 and not body["stream"]:
            choice = out["choices"][0]
            assert choice["finish_reason"] in ("stop", "length"), out
            assert out["usage"]["prompt_tokens"] == length
            assert 1 <= out["usage"]["completion_tokens"] <= max_tokens
        if status == 200 and body["stream"]:
            assert out.rstrip().endswith("data: [DONE]"), out[-200:]
        if status != 200:
            assert "error" in out and out["error"]["message"], out
        return status

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, plan))


def test_load_sixteen_clients_random_lengths_and_disconnects():
    """CI's size of the load test: 32 requests from 16 clients (random prompt lengths up to the
    context, a quarter dropped mid-stream) on 4 sessions with a queue of 12: only 200, 400
    (prompt over the context) and 429 (queue full); healthy after; RSS within 5 % besides what
    the shared prefix cache took (its bytes, counted in /metrics, bounded by --cache-ram).
    The issue's size: KESTREL_LOAD_REQUESTS=200 (docs/benchmarks.md, Sessions)."""
    n_requests = int(os.environ.get("KESTREL_LOAD_REQUESTS", "32"))
    s = Server("--ctx", 512, "--parallel", 4, "--queue", 12)
    try:
        load_run(s, 8, 8, 512, seed=1)  # warm-up: allocator pools, thread stacks
        wait_idle(s)
        rss0, cache0 = s.rss_kib(), s.metric("kestrel_prefix_cache_bytes")
        results = load_run(s, n_requests, 16, 512, seed=2)
        wait_idle(s)
        assert set(results) <= {"dropped", 200, 400, 429}, set(results)
        print({k: results.count(k) for k in set(results)})
        assert results.count(200) >= n_requests // 2, results
        assert s.request("GET", "/health") == (200, {"status": "ok"})
        rss1, cache1 = s.rss_kib(), s.metric("kestrel_prefix_cache_bytes")
        assert rss1 <= rss0 * 1.05 + (cache1 - cache0) / 1024, (rss0, rss1, cache0, cache1)
    finally:
        assert s.stop() == 0
