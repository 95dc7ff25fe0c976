"""A draft model for speculative decoding (--draft IMAGE) through the CLI and the server: the
default model drafting for itself gives the same greedy tokens as --draft none and every draft
is kept (--json counts them); the tiny Gemma 4 pair (E2B-like drafting for E4B-like, one
vocabulary) drafts with --draft-accept distribution; a draft model with another vocabulary is a
usage error (exit 2) for `kestrel run` and fails `kestrel serve` at startup; the server reports
drafted tokens in the usage and /metrics."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from serve_helpers import KESTREL, ROOT, Server, model_path

TINY = ROOT / "tests" / "data" / "gemma4"
E2B, E4B = TINY / "e2b_tiny" / "model.gguf", TINY / "e4b_tiny" / "model.gguf"

needs_model = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                 reason="default model or build/kestrel missing")
needs_kestrel = pytest.mark.skipif(not KESTREL.exists(), reason="build/kestrel missing")

PROMPT = "The capital of France is Paris. The capital of Germany is"


def run_json(*args):
    r = subprocess.run([str(KESTREL), "run", "-t", "2", "--json", *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_model
def test_the_default_model_drafting_for_itself_keeps_every_greedy_draft():
    args = ["-m", model_path(), "-p", PROMPT, "-n", "24", "--temp", "0", "--ignore-eos"]
    plain = run_json(*args, "--draft", "none")
    drafted = run_json(*args, "--draft", model_path())
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["drafted_tokens"] > 0
    assert drafted["accepted_tokens"] == drafted["drafted_tokens"]


@needs_kestrel
@pytest.mark.parametrize("accept", ["exact", "distribution"])
def test_the_tiny_gemma4_pair_drafts(accept):
    args = ["-m", E4B, "-p", "the the and of to in", "-n", "32", "--temp", "0.8", "--seed", "5", "--ignore-eos",
            "--raw"]
    plain = run_json(*args, "--draft", "none")
    drafted = run_json(*args, "--draft", E2B, "--draft-accept", accept)
    assert len(drafted["tokens"]) == 32
    assert drafted["drafted_tokens"] > 0
    if accept == "exact":
        assert drafted["tokens"] == plain["tokens"]


@needs_model
def test_another_vocabulary_is_a_usage_error():
    r = subprocess.run([str(KESTREL), "run", "-m", model_path(), "-p", "Hi", "-n", "2", "--draft", E2B],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "vocabulary" in r.stderr and "kestrel: error:" in r.stderr


@needs_kestrel
def test_draft_default_is_the_default_model(tmp_path):
    """--draft default drafts with the default model as -m default finds it ($KESTREL_MODEL here:
    the tiny E2B-like model drafting for the E4B-like one); naming the default model as the model
    too is refused by name (drafting for itself is only extra work), with the usage status."""
    env = dict(os.environ, KESTREL_MODEL=str(E2B), KESTREL_CACHE=str(tmp_path))
    args = ["run", "-t", "2", "--json", "-p", "the the and of to in", "-n", "16", "--temp", "0", "--ignore-eos",
            "--raw", "--draft", "default"]
    r = subprocess.run([str(KESTREL), *args, "-m", str(E4B)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["drafted_tokens"] > 0
    for model in ("default", str(E2B)):
        r = subprocess.run([str(KESTREL), *args, "-m", model], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 2, r.stderr
        assert f"kestrel: error: --draft default names the default model ({E2B}), which is the model itself" \
            in r.stderr, r.stderr


@needs_kestrel
def test_a_missing_draft_file_is_a_usage_error():
    r = subprocess.run([str(KESTREL), "run", "-m", E4B, "-p", "Hi", "--draft", "/nonexistent/draft.kimg"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--draft" in r.stderr


@needs_kestrel
def test_a_draft_file_that_is_no_model_names_the_option(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    r = subprocess.run([str(KESTREL), "run", "-m", E4B, "-p", "Hi", "--draft", str(text)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"kestrel: error: --draft {text}: GGUF" in r.stderr, r.stderr
    r = subprocess.run([str(KESTREL), "run", "-m", E4B, "-p", "Hi", "--draft-accept", "maybe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--draft-accept" in r.stderr


@needs_model
def test_serve_fails_at_startup_with_another_vocabulary():
    # Before the port is bound: no "listening" line, one error line naming --draft, usage status.
    proc = subprocess.run([str(KESTREL), "serve", "--port", "0", "-t", "2", "-m", model_path(), "--draft", E2B],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "listening" not in proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(f"kestrel: error: --draft {E2B}: the draft model has another vocabulary"), \
        proc.stderr


@needs_model
def test_serve_with_a_draft_model_reports_its_drafts():
    server = Server("--model-name", "m", "-m", model_path(), "--draft", model_path())
    try:
        drafted = server.metric("kestrel_draft_tokens_total")
        status, body = server.request("POST", "/v1/completions",
                                      {"model": "m", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                       "ignore_eos": True})
        assert status == 200, body
        d = body["usage"]["completion_tokens_details"]
        assert d["accepted_prediction_tokens"] > 0 and d["rejected_prediction_tokens"] == 0
        assert server.metric("kestrel_draft_tokens_total") == drafted + d["accepted_prediction_tokens"]
        props = server.request("GET", "/props")[1]["speculative"]
        assert props == {"draft": str(model_path()), "draft_max": 6, "draft_accept": "exact", "mtp_assistant": None}
    finally:
        assert server.stop() == 0


OASST = ROOT.parent / "shared" / "data" / "oasst" / "en-validation.jsonl"


@needs_model
@pytest.mark.skipif(not OASST.exists(), reason="OpenAssistant text not found")
def test_bench_counts_a_draft_models_drafts(tmp_path):
    # The target as its own draft model. With bf16 activations every draft is accepted. With int8
    # activations (the default on AVX2 / AVX512-VNNI) the products are the same bits in prefill
    # and decode, but the attention tiles that filled part of the draft's cache round otherwise,
    # and int8 rounding can turn that into a flip at a near-tie: measured 7 of 9 accepted on an
    # AVX2 AMD EPYC (the output stays the target's either way: tests of greedy identity).
    for act in ("bf16", "int8"):
        out = tmp_path / f"bench-{act}.json"
        r = subprocess.run([str(KESTREL), "bench", "-m", f"q4km={model_path()}", "--suite", "decode", "--warmup",
                            "0", "--requests", "1", "--prompt-tokens", "40", "--output-tokens", "12", "-t", "2",
                            "--idle-seconds", "0", "--no-progress", "--text", str(OASST), "--draft",
                            str(model_path()), "--json", str(out)], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "KESTREL_W4_INT8": "1" if act == "int8" else "0"})
        assert r.returncode == 0, r.stderr
        suite = json.loads(out.read_text())["variants"][0]["suites"]["decode"]
        request = [q for q in suite["requests"] if not q["warmup"]][0]
        assert request["drafted_tokens"] > 0, act
        if act == "bf16":
            assert request["accepted_tokens"] == request["drafted_tokens"]
        else:
            assert request["accepted_tokens"] >= 0.6 * request["drafted_tokens"], request
