"""EleutherAI's lm-evaluation-harness itself (PyPI `lm-eval`, its `local-completions` model with
the server's own tokenizer through /tokenize, /detokenize and /tokenizer_info) against a
`kestrel serve` this test starts (issue 47): a `generate_until` task and a `loglikelihood`
multiple-choice task, as task YAMLs over the shipped GSM8K set, run to the end on a few documents
(CI has two cores); and lm-eval's loglikelihood of a fixed text equals `kestrel perplexity`'s on
the same tokens within 1e-3 nats per token."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve_helpers import KESTREL, ROOT, Server, export_tokenizer, model_path

sys.path.insert(0, str(ROOT / "scripts" / "eval"))
import evalsets  # noqa: E402

GSM8K = evalsets.DATA / "gsm8k" / "test.jsonl"
DOCS = 4  # documents per task: CI's two cores

pytestmark = [
    pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(), reason="default model or build/kestrel missing"),
    pytest.mark.skipif(not GSM8K.exists(), reason="../shared/data/gsm8k missing"),
]

# generate_until: the question, a greedy answer of up to 48 tokens cut at the next question.
GEN_TASK = """task: kestrel_gsm8k_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('####')[-1] | trim}}}}"
generation_kwargs:
  until: ["Question:", "\\n\\n"]
  max_gen_toks: 48
  do_sample: false
  temperature: 0
filter_list:
  - name: last-number
    filter:
      - function: regex
        regex_pattern: "(-?[0-9.,]+)(?!.*[0-9])"
        group_select: 0
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

# loglikelihood: the gold final answer among three numbers near it, scored as continuations.
MC_TASK = """task: kestrel_gsm8k_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nThe final answer is"
doc_to_choice: "{{% set a = (answer.split('####')[-1] | trim | replace(',', '')) | int %}}{{{{ [a, a + 1, a + 10, a * 3 + 7] | map('string') | list }}}}"
doc_to_target: 0
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def lm_eval():
    return pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def server():
    s = Server("-m", model_path(), "--quiet")
    yield s
    s.stop()


def local_completions(server, **args):
    from lm_eval.api.registry import get_model
    _, models = server.request("GET", "/v1/models")
    return get_model("local-completions")(base_url=server.base + "/v1/completions", model=models["data"][0]["id"],
                                          tokenized_requests=True, num_concurrent=1, max_retries=1, max_length=2048,
                                          **args)


@pytest.fixture(scope="module")
def lm(lm_eval, server, tmp_path_factory):
    """lm-eval's local-completions model pointed at the server, with the model's tokenizer as
    `kestrel export-tokenizer` writes it and a BOS first (Gemma expects one; lm-eval adds it only
    with add_bos_token and a Hugging Face tokenizer)."""
    tok = export_tokenizer(tmp_path_factory.mktemp("tok"))
    return local_completions(server, tokenizer_backend="huggingface", tokenizer=str(tok), add_bos_token=True)


@pytest.fixture(scope="module")
def lm_remote(lm_eval, server):
    """The same with lm-eval's remote tokenizer: the server's /tokenizer_info, /tokenize and /detokenize."""
    return local_completions(server, tokenizer_backend="remote")


def run_task(lm_eval, lm, tmp_path, name, yaml):
    from lm_eval.tasks import TaskManager
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    (tmp_path / f"{name}.yaml").write_text(yaml.format(data=GSM8K))
    results = lm_eval.simple_evaluate(model=lm, tasks=[name], task_manager=TaskManager(include_path=str(tmp_path)),
                                      limit=DOCS, log_samples=True, bootstrap_iters=0)
    return results["results"][name], results["samples"][name]


def test_generate_until_task(lm_eval, lm, server, tmp_path):
    metrics, samples = run_task(lm_eval, lm, tmp_path, "kestrel_gsm8k_gen", GEN_TASK)
    assert len(samples) == DOCS
    assert 0.0 <= metrics["exact_match,last-number"] <= 1.0
    # each answer is the server's greedy completion of that prompt, cut at a stop string
    for s in samples:
        answer = s["resps"][0][0]
        assert isinstance(answer, str) and answer.strip(), s  # the model answers (48 tokens at most)
        args = s["arguments"]
        prompt = args[0][0] if isinstance(args, list) else args["gen_args_0"]["arg_0"]
        # as lm-eval encodes it (BOS first), sent as token ids
        _, t = server.request("POST", "/tokenize", {"prompt": prompt, "add_special_tokens": True,
                                                    "parse_special": False})
        _, r = server.request("POST", "/v1/completions", {"prompt": t["tokens"], "max_tokens": 48, "temperature": 0,
                                                          "stop": ["Question:", "\n\n"]})
        assert r["choices"][0]["text"] == answer, (answer, r)


def test_loglikelihood_multiple_choice_task(lm_eval, lm, tmp_path):
    metrics, samples = run_task(lm_eval, lm, tmp_path, "kestrel_gsm8k_choice", MC_TASK)
    assert len(samples) == DOCS
    assert 0.0 <= metrics["acc,none"] <= 1.0
    for s in samples:
        scores = [r[0][0] for r in s["resps"]]
        assert len(scores) == 4 and all(math.isfinite(x) and x < 0 for x in scores), s
        assert s["acc"] == float(max(range(4), key=lambda i: scores[i]) == 0)


def test_remote_tokenizer_is_the_servers(lm_remote, server):
    text = "Natalia sold clips to 48 of her friends in April."
    _, t = server.request("POST", "/tokenize", {"content": text, "add_special_tokens": False, "parse_special": False})
    assert lm_remote.tok_encode(text) == t["tokens"]
    assert lm_remote.tokenizer.decode(t["tokens"]) == text
    assert lm_remote.tokenizer.eos_token == "<eos>" and lm_remote.tokenizer.eos_token_id == 1


def test_loglikelihood_equals_kestrel_perplexity(lm_remote, server, tmp_path):
    # kestrel perplexity --ctx 256 --chunks 1 scores tokens 129..255 of the text's first 256
    # tokens (BOS first) given those before: lm-eval's loglikelihood of that continuation after
    # that context, divided by its length, is the same mean.
    text = (ROOT / "docs" / "architecture.md").read_text()
    n_ctx = 256
    path = tmp_path / "text.txt"
    path.write_text(text)
    out = subprocess.run([str(KESTREL), "perplexity", "-m", str(model_path()), "-f", str(path), "--ctx", str(n_ctx),
                          "--chunks", "1", "-t", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    ppl = json.loads(out.stdout)["ppl"]
    _, t = server.request("POST", "/tokenize", {"content": text, "add_special_tokens": True, "parse_special": False})
    ids = t["tokens"][:n_ctx]
    context, continuation = ids[:n_ctx // 2 + 1], ids[n_ctx // 2 + 1:]
    [(loglikelihood, _)] = lm_remote._loglikelihood_tokens([(("", ""), context, continuation)])
    mean_nll = -loglikelihood / len(continuation)
    print(f"lm-eval mean NLL {mean_nll:.6f}, kestrel perplexity ln(ppl) {math.log(ppl):.6f}")
    assert abs(mean_nll - math.log(ppl)) < 1e-3, (mean_nll, math.log(ppl))
