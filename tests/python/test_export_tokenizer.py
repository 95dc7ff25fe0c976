"""kestrel export-tokenizer: transformers.AutoTokenizer loads the directory offline and tokenizes
exactly as Kestrel (and llama.cpp, tests/goldens/tokenizer.json) do."""
import json
import os
import subprocess

import pytest

from serve_helpers import ROOT, KESTREL, Server, export_tokenizer, model_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

OASST = ROOT.parent / "shared" / "data" / "oasst" / "en-validation.jsonl"
GOLDENS = json.loads((ROOT / "tests" / "goldens" / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def hf(exported):
    return transformers.AutoTokenizer.from_pretrained(str(exported))


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def test_files_and_special_tokens(exported, hf):
    assert {p.name for p in exported.iterdir()} >= {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert hf.bos_token == "<bos>" and hf.bos_token_id == 2
    assert hf.eos_token == "<eos>" and hf.eos_token_id == 1
    assert len(hf) == 262144


def test_matches_llamacpp_goldens(hf):
    """llama.cpp's ids (parse_special off) for edge cases and OpenAssistant messages. Texts that
    spell a control token are left out: Hugging Face always matches added tokens in text."""
    specials = [t for t in hf.all_special_tokens] + ["<start_of_turn>", "<end_of_turn>", "<unused", "</s>"]
    checked = 0
    for case in GOLDENS["cases"]:
        if "text" not in case or case["special"] or any(s in case["text"] for s in specials):
            continue
        assert hf.encode(case["text"]) == case["ids"], case["name"]
        if case.get("roundtrip"):
            assert hf.decode(case["ids"], skip_special_tokens=True) == case["text"], case["name"]
        checked += 1
    assert checked > 300


@pytest.mark.skipif(not OASST.exists(), reason="../shared/data (OpenAssistant) is not next to this clone")
def test_matches_kestrel_on_oasst(hf, server):
    """Every English OpenAssistant validation message (2022 strings): the exported tokenizer and
    Kestrel's /tokenize give the same ids, with and without BOS."""
    texts = [json.loads(line)["text"] for line in OASST.read_text(encoding="utf-8").splitlines()]
    assert len(texts) > 2000
    for i, text in enumerate(texts):
        _, body = server.request("POST", "/tokenize", {"content": text, "add_special": i % 2 == 0})
        assert hf.encode(text, add_special_tokens=i % 2 == 0) == body["tokens"], (i, text[:200])


def test_chat_template_matches_the_server(hf, server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    _, body = server.request("POST", "/tokenize", {"messages": messages})
    assert hf.encode(text, add_special_tokens=False) == body["tokens"]
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    # a system message alone is the user turn, in both
    alone = [{"role": "system", "content": "Be brief."}]
    text = hf.apply_chat_template(alone, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n"
    _, body = server.request("POST", "/tokenize", {"messages": alone})
    assert hf.encode(text, add_special_tokens=False) == body["tokens"]
