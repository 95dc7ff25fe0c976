"""`kestrel bench` as a user runs it, with tiny counts on the default model: the JSON schema,
the methodology's invariants on every request, the prompts against llama.cpp's tokenizer, the
Markdown table, the peers rows, and clear errors.
"""
import json
import math
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from test_cli import KESTREL, ROOT, error_of, kestrel, model_path, needs_model

OASST = ROOT.parent / "shared" / "data" / "oasst" / "en-validation.jsonl"
needs_text = pytest.mark.skipif(not OASST.exists(), reason="OpenAssistant text not found")

TINY = ["--warmup", 1, "--requests", 2, "--prompt-tokens", 40, "--output-tokens", 6, "-t", 2,
        "--idle-seconds", 0, "--no-progress", "--text", OASST]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not model_path().exists() or not OASST.exists():
        pytest.skip("default model or OpenAssistant text missing")
    d = tmp_path_factory.mktemp("bench")
    out, md = d / "bench.json", d / "bench.md"
    r = kestrel("bench", "-m", f"q4km={model_path()}", *TINY, "--json", out, "--markdown", md)
    assert r.returncode == 0, r.stderr
    assert md.read_text(encoding="utf-8") == r.stdout
    return json.loads(out.read_text(encoding="utf-8")), r.stdout


def test_schema_and_variant(report):
    j, _ = report
    assert j["schema"] == "kestrel-bench/1"
    assert j["settings"]["card_settings"] is False
    assert j["machine"]["logical_cpus"] >= 1
    [v] = j["variants"]
    assert v["variant"] == "q4km"
    assert v["precision"] == "GGUF Q4_K_M"
    assert v["threads"] == 2
    assert v["size_bytes"] == os.path.getsize(model_path())
    mem = v["memory"]
    assert 0 < mem["rss_idle_bytes"] <= mem["peak_rss_bytes"]
    assert mem["kv_cache_bytes"] > 0
    assert set(v["suites"]) == {"throughput", "decode"}
    p = v["power"]
    assert (p["idle_power_w"] is None) or p["sources"]
    assert p["sources"] or p["unavailable"]  # either a sensor or the reasons there is none


@pytest.mark.parametrize("suite, same_prompt", [("throughput", False), ("decode", True)])
def test_every_request_follows_the_method(report, suite, same_prompt):
    j, _ = report
    s = j["variants"][0]["suites"][suite]
    assert (s["prompt_tokens"], s["output_tokens"], s["warmup_requests"], s["measured_requests"]) == (40, 6, 1, 2)
    assert s["same_prompt"] is same_prompt
    reqs = s["requests"]
    assert [r["warmup"] for r in reqs] == [True, False, False]
    assert [r["index"] for r in reqs] == [0, 1, 2]
    assert [r["prompt_index"] for r in reqs] == ([0, 0, 0] if same_prompt else [0, 1, 2])
    for r in reqs:
        assert r["prompt_tokens"] == 40 and r["output_tokens"] == 6  # exactly, EOS ignored
        assert r["ttft_s"] > 0 and r["decode_s"] > 0
        assert math.isclose(r["e2e_s"], r["ttft_s"] + r["decode_s"], rel_tol=1e-9)
        assert math.isclose(r["prefill_tok_s"], 40 / r["ttft_s"], rel_tol=1e-9)
        assert math.isclose(r["decode_tok_s"], 5 / r["decode_s"], rel_tol=1e-9)
        assert 0 < r["itl_max_s"] <= r["decode_s"]
    measured = reqs[1:]
    summary = s["summary"]
    for key in ("e2e_s", "ttft_s", "prefill_tok_s", "decode_tok_s"):
        assert math.isclose(summary[key]["mean"], statistics.mean(r[key] for r in measured), rel_tol=1e-9)
    assert summary["generated_tokens"] == 12
    assert summary["wall_s"] >= sum(r["e2e_s"] for r in measured) * (1 - 1e-9)
    if summary["energy_j"] is None:
        assert summary["energy_per_token_j"] is None
    else:
        assert math.isclose(summary["energy_per_token_j"], summary["energy_j"] / 12, rel_tol=1e-9)


def test_markdown_table(report):
    j, md = report
    v = j["variants"][0]
    row = next(line for line in md.splitlines() if line.startswith("| q4km |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "GGUF Q4_K_M"
    assert float(cells[3]) == pytest.approx(v["suites"]["decode"]["summary"]["decode_tok_s"]["mean"], abs=0.05)
    assert float(cells[4]) == pytest.approx(v["suites"]["throughput"]["summary"]["prefill_tok_s"]["mean"], abs=0.05)
    assert float(cells[6]) == pytest.approx(v["suites"]["throughput"]["summary"]["e2e_s"]["mean"], abs=0.0005)
    if not v["power"]["sources"]:
        assert cells[7].startswith("n/a (no sensor readable: ")
    assert "decode tok/s (40 in / 6 out)" in md


@needs_model
@needs_text
def test_prompts_are_llamacpp_token_windows(tmp_path, llama_cpp):
    """--dump-prompts: BOS + consecutive, non-overlapping windows of the OpenAssistant text as
    llama.cpp tokenizes it (non-deleted messages in file order, joined by blank lines)."""
    out = tmp_path / "prompts.json"
    r = kestrel("bench", "--dump-prompts", out, "--text", OASST, "--warmup", 1, "--requests", 2)
    assert r.returncode == 0, r.stderr
    dump = json.loads(out.read_text(encoding="utf-8"))
    texts = [row["text"] for row in map(json.loads, OASST.read_text(encoding="utf-8").splitlines())
             if not row["deleted"]]
    llm = llama_cpp.Llama(model_path=str(model_path()), vocab_only=True, verbose=False)
    stream = llm.tokenize("\n\n".join(texts).encode("utf-8"), add_bos=False, special=False)
    thr, dec = dump["suites"]["throughput"], dump["suites"]["decode"]
    assert len(thr["prompts"]) == 3 and len(dec["prompts"]) == 1
    for k, p in enumerate(thr["prompts"]):
        assert len(p) == 2048
        assert p == [2] + stream[k * 2047:(k + 1) * 2047]
    assert dec["prompts"][0] == [2] + stream[:3071]


@needs_model
@needs_text
def test_kv_cache_bytes_grow_with_the_context(tmp_path):
    """Gemma 3 270M: 18 layers, every 6th global (full context); 1 KV head of 256 dims, fp16
    keys and values: each context position of a global layer holds 2 x 256 x 2 = 1,024 bytes."""
    sizes = {}
    for ctx in (1024, 2048):
        out = tmp_path / f"kv{ctx}.json"
        r = kestrel("bench", "--suite", "decode", "-c", ctx, *TINY, "--json", out)
        assert r.returncode == 0, r.stderr
        sizes[ctx] = json.loads(out.read_text())["variants"][0]["memory"]["kv_cache_bytes"]
    assert sizes[2048] - sizes[1024] == 3 * 1024 * 1024


@needs_model
def test_peer_rows_are_added(report, tmp_path):
    j, _ = report
    peer = {"schema": "kestrel-bench/1", "variants": [dict(j["variants"][0], variant="llama.cpp",
                                                             runtime="llama.cpp (llama-cpp-python 0.3.36)")]}
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps(peer))
    out = tmp_path / "all.json"
    r = kestrel("bench", *TINY, "--suite", "decode", "--add-rows", peers, "--json", out)
    assert r.returncode == 0, r.stderr
    assert [v["variant"] for v in json.loads(out.read_text())["variants"]] == [model_path().name, "llama.cpp"]
    assert "| llama.cpp | GGUF Q4_K_M | llama.cpp (llama-cpp-python 0.3.36) |" in r.stdout


def test_usage_errors(tmp_path):
    assert "--suite" in error_of(kestrel("bench", "--suite", "fast"), code=2)
    assert "--requests" in error_of(kestrel("bench", "--requests", 0), code=2)
    assert "does not exist" in error_of(kestrel("bench", "--text", tmp_path / "none.jsonl"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    if OASST.exists():
        assert "not a kestrel bench report" in error_of(kestrel("bench", "--text", OASST, "--add-rows", bad))


def test_text_with_no_text_says_so(tmp_path):
    """/dev/null and an empty file are named as having no text, before any model loads (not 'does not
    exist', as the fresh-user trial saw for /dev/null)."""
    e = error_of(kestrel("bench", "--text", "/dev/null"))
    assert "/dev/null has no text" in e and "does not exist" not in e, e
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "empty.txt is empty" in error_of(kestrel("bench", "--text", empty))
    assert "is a directory" in error_of(kestrel("bench", "--text", tmp_path))


@needs_model
def test_whitespace_only_text_says_so(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    assert "blank.txt has no text" in error_of(kestrel("bench", "--text", blank, "--concurrency", 1, "-t", 2))


def test_chart_is_a_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    j, _ = report
    src, png = tmp_path / "r.json", tmp_path / "r.png"
    src.write_text(json.dumps(j))
    r = subprocess.run(["python3", str(ROOT / "scripts" / "bench" / "plot_bench.py"), str(src), "-o", str(png)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_model
@needs_text
def test_peers_script_writes_the_same_schema(report, tmp_path, llama_cpp):
    """scripts/bench/peers_bench.py (llama.cpp): the same keys at every level as kestrel bench."""
    j, _ = report
    out = tmp_path / "peers.json"
    r = subprocess.run(["python3", str(ROOT / "scripts" / "bench" / "peers_bench.py"), "--kestrel", str(KESTREL),
                        "-m", str(model_path()), "--text", str(OASST), "-t", "2", "--idle-seconds", "0",
                        "--warmup", "1", "--requests", "2", "--prompt-tokens", "40", "--output-tokens", "6",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    p = json.loads(out.read_text())
    assert p["schema"] == j["schema"] and set(p) == set(j)
    [pv], [kv] = p["variants"], j["variants"]
    assert set(pv) == set(kv) and set(pv["memory"]) == set(kv["memory"]) and set(pv["power"]) == set(kv["power"])
    assert pv["variant"] == "llama.cpp" and pv["size_bytes"] == kv["size_bytes"]
    for suite in ("throughput", "decode"):
        ps, ks = pv["suites"][suite], kv["suites"][suite]
        assert set(ps) == set(ks) and set(ps["summary"]) == set(ks["summary"])
        assert len(ps["requests"]) == 3
        for pr, kr in zip(ps["requests"], ks["requests"]):
            assert set(pr) == set(kr)
            assert (pr["prompt_index"], pr["prompt_tokens"], pr["output_tokens"], pr["warmup"]) == \
                (kr["prompt_index"], kr["prompt_tokens"], kr["output_tokens"], kr["warmup"])
            assert math.isclose(pr["e2e_s"], pr["ttft_s"] + pr["decode_s"], rel_tol=1e-9)


@needs_text
def test_unwritable_output_fails_before_measuring(tmp_path):
    r = kestrel("bench", "--text", OASST, "--json", tmp_path / "no" / "such" / "dir.json", timeout=20)
    assert "cannot write" in error_of(r)


def test_a_failed_run_leaves_no_empty_report(tmp_path):
    # The tiny Gemma 4 model's context (512) is below the suite's: the run fails after the check
    # that --json is writable, which must not leave the file it created behind.
    image = tmp_path / "tiny.kimg"
    r = kestrel("build", ROOT / "tests" / "data" / "gemma4" / "e4b_tiny" / "hf", "-o", image, "--precision", "bf16")
    assert r.returncode == 0, r.stderr
    report = tmp_path / "b.json"
    # --text: any text file (README.md), so the check does not need ../shared/data next to the clone.
    r = kestrel("bench", "-m", image, "--json", report, "--suite", "decode", "--text", ROOT / "README.md")
    assert r.returncode == 1 and "the context is 512, the model's maximum (lower --prompt-tokens" in r.stderr, r.stderr
    assert not report.exists()


@needs_text
def test_the_default_context_is_clamped_to_the_models_maximum(tmp_path):
    """The default context is 4096 or the model's maximum when smaller (the tiny Gemma 4 model's
    512), as for run and serve; asking for more than the maximum is refused by name."""
    tiny = ROOT / "tests" / "data" / "gemma4" / "e4b_tiny" / "model.gguf"
    out = tmp_path / "b.json"
    r = kestrel("bench", "-m", tiny, *TINY, "--suite", "decode", "--json", out)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["variants"][0]["n_ctx"] == 512
    r = kestrel("bench", "-m", tiny, *TINY, "--suite", "decode", "-c", 1024)
    assert r.returncode == 2, r.stderr  # a usage error (runtime::OptionMismatch)
    assert "context size 1024 exceeds this model's maximum context of 512 tokens" in r.stderr


@needs_text
@needs_model
def test_http_concurrency_bench_counts_every_streamed_token(tmp_path):
    """scripts/bench/http_concurrency_bench.py (issue 41's side-by-side with llama-server) against
    `kestrel serve`: every stream's tokens arrive, and the table and JSON carry each row."""
    out = tmp_path / "hc.json"
    r = subprocess.run(["python3", ROOT / "scripts" / "bench" / "http_concurrency_bench.py", "--users", "1,2",
                        "--rounds", "1", "--prompt-tokens", "16", "--output-tokens", "5", "--kestrel", KESTREL,
                        "--server", f"k={KESTREL} serve -m {model_path()} -t 2 --parallel 2 --port {{port}}",
                        "--json", out], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["servers"]["k"]["rows"]
    assert rows["1"]["tokens_per_round"] == [5] and rows["2"]["tokens_per_round"] == [10]
    assert rows["1"]["aggregate"] > 0 and rows["2"]["aggregate"] > 0
    assert "| k | 2 |" in r.stdout
