"""OpenAI-shaped chat responses from Kestrel generations (the shapes ``kestrel serve`` writes)."""
from __future__ import annotations

import json
import secrets
import time
from typing import Any, Dict, Iterator, List, Tuple

from . import _kestrel

_FINGERPRINT = "kestrel-0.1.0"


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _forced_content(text: str) -> str:
    # A forced tool reply's content: nothing for the newlines between calls, else from its first
    # non-blank character (as the server does).
    stripped = text.lstrip(" \n")
    return stripped


def _tool_call(name: str, arguments: str, index: int = -1) -> Dict[str, Any]:
    call: Dict[str, Any] = {"id": _id("call_"), "type": "function", "function": {"name": name, "arguments": arguments}}
    if index >= 0:
        call = {"index": index, **call}
    return call


def _usage(r: Dict[str, Any]) -> Dict[str, Any]:
    n = len(r["tokens"])
    return {"prompt_tokens": r["prompt_tokens"], "completion_tokens": n, "total_tokens": r["prompt_tokens"] + n,
            "prompt_tokens_details": {"cached_tokens": r["cached_tokens"]},
            "completion_tokens_details": {"accepted_prediction_tokens": r["accepted_tokens"],
                                          "rejected_prediction_tokens": r["drafted_tokens"] - r["accepted_tokens"]}}


def chat_completion(r: Dict[str, Any], request: "_kestrel.Request", model: str) -> Dict[str, Any]:
    """A ``chat.completion`` object from a finished generation's result."""
    content, reasoning, calls = "", "", []
    for kind, text, name, arguments in _kestrel.parse_reply(request, r["text"]):
        if kind == "content":
            content += _forced_content(text) if request.forced_tools else text
        elif kind == "reasoning":
            reasoning += text
        else:
            calls.append(_tool_call(name, arguments))
    message: Dict[str, Any] = {"role": "assistant", "content": None if not content and calls else content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls and r["finish_reason"] != "length" else r["finish_reason"]
    return {"id": _id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": _FINGERPRINT,
            "choices": [{"index": 0, "message": message, "logprobs": r.get("chat_logprobs"), "finish_reason": finish}],
            "usage": _usage(r)}


def chat_chunks(native: "_kestrel.TokenStream", request: "_kestrel.Request", model: str) -> Iterator[Dict[str, Any]]:
    """``chat.completion.chunk`` objects as the generation streams; the last carries
    finish_reason, usage and (when asked for) the whole answer's logprobs."""
    meta = {"id": _id("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "system_fingerprint": _FINGERPRINT}

    def chunk(delta: Dict[str, Any], finish: Any = None, logprobs: Any = None) -> Dict[str, Any]:
        return {**meta, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    parser = _kestrel.ReplyParser(request)
    n_calls = 0

    def deltas(events: List[Tuple[str, str, str, str]]) -> Iterator[Dict[str, Any]]:
        nonlocal n_calls
        for kind, text, name, arguments in events:
            if kind == "content":
                if request.forced_tools:
                    text = _forced_content(text)
                    if not text:
                        continue
                yield chunk({"content": text})
            elif kind == "reasoning":
                yield chunk({"reasoning_content": text})
            else:
                yield chunk({"tool_calls": [_tool_call(name, arguments, n_calls)]})
                n_calls += 1

    try:
        yield chunk({"role": "assistant", "content": ""})
        for piece in native:
            yield from deltas(parser.feed(piece))
        yield from deltas(parser.finish())
        r = json.loads(native.result)
        finish = "tool_calls" if n_calls and r["finish_reason"] != "length" else r["finish_reason"]
        last = chunk({}, finish, r.get("chat_logprobs"))
        last["usage"] = _usage(r)
        yield last
    finally:
        native.close()
