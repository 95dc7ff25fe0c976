"""scripts/bench/ik_llama_bench.py, the optional ik_llama.cpp peer row: a clean one-line skip
where ik_llama.cpp is not built, and kestrel bench's JSON schema, checked key for key, from a
stand-in llama-bench (always) and from the real one (only where scripts/bench/build_ik_llama.sh
has built it).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_bench import OASST, report  # noqa: F401  (the kestrel bench report fixture)
from test_cli import ROOT, model_path, needs_model

SCRIPT = ROOT / "scripts" / "bench" / "ik_llama_bench.py"
PEERS = Path(os.environ.get("KESTREL_PEERS") or Path.home() / ".cache" / "kestrel" / "peers")
IK_BENCH = Path(os.environ.get("IK_LLAMA_BENCH") or PEERS / "ik_llama.cpp" / "bin" / "llama-bench")

# A stand-in for llama-bench: parses -p, -gp, -r, -rtr and prints JSON tests of the same shape,
# every sample 1,000 tok/s for prompts and 100 tok/s for generation (more with -rtr 1).
FAKE = r'''#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
val = lambda k: [a[i + 1] for i, x in enumerate(a) if x == k]
reps, rtr = int(val("-r")[0]), int(val("-rtr")[0])
tests = [{"build_commit": "fake", "model_type": "gemma3 270M Q4_K - Medium", "n_prompt": int(p), "n_gen": 0,
          "samples_ts": [1000.0 * (1 + rtr) + i for i in range(reps)]} for p in val("-p")[0].split(",")]
for gp in val("-gp"):
    p, n = map(int, gp.split(","))
    tests.append({"build_commit": "fake", "model_type": "gemma3 270M Q4_K - Medium", "n_prompt": p, "n_gen": n,
                  "samples_ts": [100.0 * (1 + rtr) + i for i in range(reps)]})
print(json.dumps(tests))
'''


def run(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def check_schema(p, j):
    """p (ik_llama_bench.py's report) has the keys of j (kestrel bench's) at every level."""
    assert p["schema"] == j["schema"] == "kestrel-bench/1" and set(p) == set(j)
    assert set(j["machine"]) <= set(p["machine"]) and p["machine"]["cpu_flags"] is not None
    kv = j["variants"][0]
    for pv in p["variants"]:
        assert set(pv) == set(kv) and set(pv["memory"]) == set(kv["memory"]) and set(pv["power"]) == set(kv["power"])
        assert set(pv["suites"]) == set(kv["suites"])
        for suite, ps in pv["suites"].items():
            ks = kv["suites"][suite]
            assert set(ps) == set(ks) and set(ps["summary"]) == set(ks["summary"])
            for s in ("e2e_s", "ttft_s", "prefill_tok_s", "decode_tok_s"):
                assert set(ps["summary"][s]) == set(ks["summary"][s])
            for pr in ps["requests"]:
                assert set(pr) == set(ks["requests"][0])
                assert pr["e2e_s"] == pytest.approx(pr["ttft_s"] + pr["decode_s"])
                assert pr["ttft_s"] == pytest.approx(pr["prompt_tokens"] / pr["prefill_tok_s"])
                assert pr["decode_s"] == pytest.approx((pr["output_tokens"] - 1) / pr["decode_tok_s"])


def test_skips_in_one_line_where_ik_is_not_built(tmp_path):
    # Not built where the scripts look for it ($KESTREL_PEERS): skipped, rc 0, one line.
    out = tmp_path / "ik.json"
    env = {"KESTREL_MODEL": "/nonexistent", "KESTREL_PEERS": str(tmp_path / "peers"), "IK_LLAMA_BENCH": ""}
    r = run("--json", out, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1 and "skipped" in r.stderr and "build_ik_llama.sh" in r.stderr
    assert not out.exists()


def test_a_named_llama_bench_that_is_not_there_is_an_error(tmp_path):
    out = tmp_path / "ik.json"
    r = run("--llama-bench", tmp_path / "no-such-llama-bench", "--json", out, env={"KESTREL_MODEL": "/nonexistent"})
    assert r.returncode == 2
    assert "no-such-llama-bench" in r.stderr and "not an executable file" in r.stderr
    assert not out.exists()


def test_build_script_says_how_to_get_the_source(tmp_path):
    r = subprocess.run([str(ROOT / "scripts" / "bench" / "build_ik_llama.sh"), str(tmp_path / "nothing")],
                       capture_output=True, text=True, timeout=30, env={**os.environ, "KESTREL_PEERS": str(tmp_path)})
    assert r.returncode == 1
    assert "no ik_llama.cpp source tree" in r.stderr and "git clone https://github.com/ikawrakow/ik_llama.cpp" in r.stderr
    assert not (tmp_path / "ik_llama.cpp").exists()


@needs_model
def test_rows_from_a_stand_in_llama_bench(tmp_path, report):  # noqa: F811
    fake = tmp_path / "llama-bench"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    out = tmp_path / "ik.json"
    r = run("--llama-bench", fake, "-m", model_path(), "-t", 2, "--runs", 3, "--json", out)
    assert r.returncode == 0, r.stderr
    p = json.loads(out.read_text())
    check_schema(p, report[0])
    assert [v["variant"] for v in p["variants"]] == ["ik_llama.cpp", "ik_llama.cpp -rtr 1"]
    v0, v1 = p["variants"]
    assert v0["threads"] == 2 and v0["precision"] == "GGUF Q4_K_M" and v0["size_bytes"] == model_path().stat().st_size
    assert v0["memory"]["peak_rss_bytes"] > 0
    t, d = v0["suites"]["throughput"], v0["suites"]["decode"]
    assert (t["prompt_tokens"], t["output_tokens"], d["prompt_tokens"], d["output_tokens"]) == (2048, 128, 3072, 50)
    assert t["measured_requests"] == 3 and t["summary"]["prefill_tok_s"]["median"] == 1001.0
    assert d["summary"]["decode_tok_s"]["median"] == 101.0
    assert v1["suites"]["decode"]["summary"]["decode_tok_s"]["median"] == 201.0
    assert "-rtr 1" in v1["runtime"] and "-rtr" not in v0["runtime"]


@needs_model
@pytest.mark.skipif(not os.access(IK_BENCH, os.X_OK),
                    reason=f"ik_llama.cpp not built (no {IK_BENCH}; scripts/bench/build_ik_llama.sh builds it)")
def test_rows_from_the_real_llama_bench(tmp_path, report):  # noqa: F811
    out = tmp_path / "ik.json"
    r = run("-m", model_path(), "-t", 2, "--runs", 1, "--rtr", "1", "--prompt-tokens", 64, "--output-tokens", 4,
            "--json", out, env={"IK_LLAMA_BENCH": str(IK_BENCH)}, timeout=300)
    assert r.returncode == 0, r.stderr
    p = json.loads(out.read_text())
    check_schema(p, report[0])
    [v] = p["variants"]
    assert v["precision"] == "GGUF Q4_K_M" and p["settings"]["card_settings"] is False
    for s in v["suites"].values():
        assert (s["prompt_tokens"], s["output_tokens"]) == (64, 4)
        assert s["summary"]["prefill_tok_s"]["median"] > 0 and s["summary"]["decode_tok_s"]["median"] > 0
