"""kestrel.Model and kestrel.Session: the Python face of the Kestrel runtime (docs/python.md)."""
from __future__ import annotations

import json
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _kestrel
from ._chat import chat_completion, chat_chunks

Prompt = Union[str, Sequence[int]]


@dataclass
class Completion:
    """The result of a generation. ``str(completion)`` is its text.

    Attributes:
        text: the generated text (cut before a stop string).
        token_ids: the generated token ids (a final stop token included).
        finish_reason: ``"stop"`` (a stop token or string) or ``"length"`` (``max_tokens`` or the
            context ran out).
        prompt_tokens: tokens of the prompt; cached_tokens: how many of them the KV cache held
            (a Session reuses its cache; 0 for Model.generate).
        ttft_ms: time to the first token, ms; prefill_tok_s, decode_tok_s: rates in tokens/s
            (decode: tokens after the first / the time after it).
        drafted_tokens, accepted_tokens: speculative decoding's drafted and kept tokens.
        logprobs: with ``logprobs=N``, one dict per token: ``id``, ``token`` (its piece),
            ``logprob`` (natural log, the model's own distribution) and ``top_logprobs`` (the N
            most likely, each ``id``, ``token``, ``logprob``); else None.
    """

    text: str
    token_ids: List[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float
    prefill_tok_s: float
    decode_tok_s: float
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    logprobs: Optional[List[Dict[str, Any]]] = None

    def __str__(self) -> str:
        return self.text

    @classmethod
    def _from_json(cls, text: str) -> "Completion":
        r = json.loads(text)
        return cls(text=r["text"], token_ids=r["tokens"], finish_reason=r["finish_reason"],
                   prompt_tokens=r["prompt_tokens"], cached_tokens=r["cached_tokens"], ttft_ms=r["ttft_ms"],
                   prefill_tok_s=r["prefill_tok_s"], decode_tok_s=r["decode_tok_s"],
                   drafted_tokens=r["drafted_tokens"], accepted_tokens=r["accepted_tokens"], logprobs=r["logprobs"])


class TextStream:
    """Text pieces of a generation as they are produced (``Model.generate(..., stream=True)``).

    Iterate it for ``str`` pieces; once it is exhausted, ``result`` is the Completion (text,
    tokens, timings). The stream holds the model from its first piece to its last: other threads
    wait, and a generation started in the same thread ends a stream it left open. ``close()`` (or
    leaving a ``with`` block) ends it early. Ctrl-C between pieces raises KeyboardInterrupt in the
    loop, as anywhere in Python.
    """

    def __init__(self, native: "_kestrel.TokenStream") -> None:
        self._native = native

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return self._native.__next__()

    def close(self) -> None:
        """Ends the generation now and gives the model back (idempotent)."""
        self._native.close()

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def result(self) -> Optional[Completion]:
        """The Completion once the stream is exhausted (or closed after its first piece); else None."""
        r = self._native.result
        return None if r is None else Completion._from_json(r)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _Generator:
    """What Model and Session share: generate and chat on one sequence."""

    _model: "Model"
    _seq: "_kestrel.Sequence"
    _cache_prompt: bool

    def _prompt_ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self._model._engine.encode_prompt(prompt)
        if isinstance(prompt, (bytes, bytearray)):
            raise TypeError("prompt must be str or a sequence of token ids, not bytes")
        return [int(t) for t in prompt]

    def generate(self, prompt: Prompt, max_tokens: int = 256, *, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: Optional[int] = None,
                 stop: Union[str, Sequence[str], None] = None, ignore_eos: bool = False, min_tokens: int = 0,
                 logprobs: Optional[int] = None, logit_bias: Optional[Mapping[int, float]] = None,
                 draft: str = "auto", draft_max: int = 6, draft_accept: str = "exact",
                 json_schema: Union[str, Mapping[str, Any], None] = None, grammar: Optional[str] = None,
                 regex: Optional[str] = None, stream: bool = False) -> Union[Completion, TextStream]:
        """Continues ``prompt`` (text, encoded with BOS and without the chat template, as
        ``kestrel run --raw``; or token ids, used as given).

        Sampling has the CLI's (llama.cpp's) meanings and defaults: ``temperature=0`` is greedy;
        ``seed`` None draws a random one. Generation stops at ``max_tokens``, a stop token
        (``<eos>``, ``<end_of_turn>``; not with ``ignore_eos``) or a ``stop`` string (the text ends
        before it). ``logprobs=N`` (0 to 20) reports each token's log-probability and the N most
        likely. ``logit_bias`` maps token ids to a bias in [-100, 100]. Speculative decoding
        (``draft``: ``"auto"``, ``"ngram"``, ``"none"``, or ``"model"`` for the Model's
        ``draft_model``; ``draft_max`` 0 to 6; ``draft_accept`` ``"exact"`` keeps the tokens
        exactly those without drafting, ``"distribution"`` speculative sampling) changes only the
        speed. Structured output: at most one of ``json_schema`` (a JSON Schema, dict or text),
        ``grammar`` (GBNF) and ``regex``.

        Returns a Completion (``str()`` of it is the text), or with ``stream=True`` a TextStream
        of text pieces. Runs without the GIL; Ctrl-C stops it (KeyboardInterrupt). Raises
        kestrel.InvalidRequestError for bad arguments, kestrel.ContextLengthError when the prompt
        does not fit, kestrel.GrammarError for a schema or grammar that does not compile.
        """
        if isinstance(stop, str):
            stop = [stop]
        if isinstance(json_schema, Mapping):
            json_schema = json.dumps(json_schema)
        if max_tokens < 0:
            raise _kestrel.InvalidRequestError("max_tokens must be 0 or more")
        request = _kestrel.make_request(
            self._model._engine, self._prompt_ids(prompt), max_tokens, temperature, top_k, top_p, min_p,
            repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed, list(stop or []), ignore_eos,
            min_tokens, -1 if logprobs is None else logprobs,
            sorted((int(k), float(v)) for k, v in (logit_bias or {}).items()), draft, draft_max, draft_accept,
            json_schema, grammar, regex, self._cache_prompt)
        if stream:
            return TextStream(_kestrel.TokenStream(self._seq, request))
        return Completion._from_json(_kestrel.run(self._seq, request, _on_main_thread()))

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Optional[Sequence[Mapping[str, Any]]] = None,
             tool_choice: Union[str, Mapping[str, Any], None] = None,
             response_format: Optional[Mapping[str, Any]] = None, max_tokens: Optional[int] = None,
             temperature: Optional[float] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
             stop: Union[str, Sequence[str], None] = None, logprobs: bool = False,
             top_logprobs: Optional[int] = None, draft: str = "auto", draft_max: int = 6,
             draft_accept: str = "exact", stream: bool = False,
             **extra: Any) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """A chat completion, as OpenAI's ``chat.completions.create`` returns it (a dict:
        ``choices[0].message`` with ``content``, ``tool_calls``, ``reasoning_content``; ``usage``).

        ``messages``, ``tools``, ``tool_choice``, ``response_format`` (``json_object`` or
        ``json_schema``, enforced while sampling) and the sampling fields have the OpenAI API's
        meanings and defaults (temperature 1, no top-p cut) and are validated as ``kestrel
        serve`` validates them; other OpenAI or llama-server fields go through ``extra``
        (``top_k``, ``min_p``, ``logit_bias``, ``max_completion_tokens``...). The model's chat
        format renders the messages (Gemma 3's turns, also for a base model; Gemma 4's with tool
        calls and thinking). With ``stream=True``, an iterator of ``chat.completion.chunk`` dicts.
        Raises kestrel.InvalidRequestError (``param`` names the field) for a bad request.
        """
        body: Dict[str, Any] = {"messages": list(messages)}
        for key, value in (("tools", tools), ("tool_choice", tool_choice), ("response_format", response_format),
                           ("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p),
                           ("seed", seed), ("stop", stop), ("top_logprobs", top_logprobs)):
            if value is not None:
                body[key] = value
        if logprobs:
            body["logprobs"] = True
        body.update(extra)
        request = _kestrel.make_chat_request(self._model._engine, json.dumps(body), draft, draft_max, draft_accept,
                                             self._cache_prompt)
        name = self._model.name
        if stream:
            native = _kestrel.TokenStream(self._seq, request)
            return chat_chunks(native, request, name)
        return chat_completion(json.loads(_kestrel.run(self._seq, request, _on_main_thread())), request, name)


class Session(_Generator):
    """A conversation on a Model that keeps its KV cache (``Model.session()``).

    Each ``generate`` or ``chat`` reuses the longest prefix of the cache that its prompt starts
    with, so a follow-up turn (the earlier messages, the answer, a new message) prefills only
    what is new; ``Completion.cached_tokens`` (``usage.prompt_tokens_details.cached_tokens`` in
    chat) says how many prompt tokens came from the cache. Reuse is exact: the tokens are those
    of a fresh run. A Session has a KV cache of its own (``n_ctx`` positions); Sessions of one
    Model take turns computing.
    """

    def __init__(self, model: "Model") -> None:
        self._model = model
        self._seq = _kestrel.Sequence.new(model._engine)
        self._cache_prompt = True

    @property
    def cached_token_ids(self) -> List[int]:
        """Token ids whose keys and values the cache holds."""
        return self._seq.cached_tokens

    def reset(self) -> None:
        """Forgets the conversation (empties the KV cache)."""
        self._seq.reset()


class Model(_Generator):
    """A Gemma model loaded for generation, as ``kestrel run`` loads it.

    Args:
        model: ``"default"`` (the default model: its W4A16 + FlashHead image once ``kestrel build
            default --as-default`` built it, else the Gemma 3 270M GGUF; ``$KESTREL_MODEL``
            overrides) or the path of a GGUF file or Kestrel image.
        n_ctx: context in tokens (None: 4096, or the model's maximum when smaller; 0: the maximum).
        threads: compute threads (0: every core); results do not depend on it.
        precision: how a GGUF's layers load (``auto``, ``source``, ``w4a16``, ``bf16``, ``fp16``).
        head: ``auto`` (FlashHead when the image has one), ``dense`` or ``flash``; probes:
            FlashHead clusters per token (0: the image's).
        decode_act: INT4 layers' activations, ``auto``, ``int8`` or ``bf16`` (``--decode-act``).
        draft_model: a smaller model with the same vocabulary for ``draft="model"``
            (``"default"``: the default model).
        cache_type_k, cache_type_v: the KV cache's element types, ``f16`` (default), ``bf16`` or
            ``q8`` (int8 with an fp16 scale per 32 values: 17/32 of the memory; ``--cache-type-k`` /
            ``--cache-type-v``, docs/quantization.md).

    Raises kestrel.ModelFileError for a missing or damaged file, kestrel.OptionError for an
    option the model does not take, kestrel.Error otherwise. One generation computes at a time:
    threads sharing a Model wait for each other (the GIL is released while they wait).
    """

    def __init__(self, model: str = "default", *, n_ctx: Optional[int] = None, threads: int = 0,
                 precision: str = "auto", head: str = "auto", probes: int = 0, decode_act: str = "auto",
                 draft_model: Optional[str] = None, cache_type_k: str = "f16", cache_type_v: str = "f16") -> None:
        self._engine = _kestrel.load(str(model), n_ctx, threads, precision, head, probes, decode_act,
                                     None if draft_model is None else str(draft_model), cache_type_k, cache_type_v)
        if self._engine.warning:
            warnings.warn(self._engine.warning, RuntimeWarning, stacklevel=2)
        self._model = self
        self._seq = _kestrel.Sequence.default_of(self._engine)
        self._cache_prompt = False
        self.name = str(model)

    @property
    def path(self) -> str:
        """The file loaded."""
        return self._engine.path

    @property
    def n_ctx(self) -> int:
        """Context positions of each sequence's KV cache."""
        return self._engine.n_ctx

    @property
    def n_vocab(self) -> int:
        return self._engine.n_vocab

    @property
    def flashhead(self) -> bool:
        """Whether FlashHead scores the tokens (else the dense head)."""
        return self._engine.flashhead

    @property
    def chat_format(self) -> str:
        """``"gemma3"`` or ``"gemma4"``: the turn format chat() renders messages in."""
        return self._engine.chat_format

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> List[int]:
        """Text to token ids; ``add_special`` adds BOS, ``parse_special`` reads control tokens
        such as ``<start_of_turn>`` as themselves."""
        return self._engine.tokenize(text, add_special, parse_special)

    def detokenize(self, ids: Sequence[int], *, render_special: bool = False) -> str:
        """Token ids to text (control tokens omitted unless ``render_special``). Raises
        kestrel.InvalidRequestError for an id outside the vocabulary."""
        return self._engine.detokenize([int(t) for t in ids], render_special)

    def session(self) -> Session:
        """A new conversation with a KV cache of its own (see Session)."""
        return Session(self)

    def __repr__(self) -> str:
        return f"kestrel.Model({self.name!r}, path={self.path!r}, n_ctx={self.n_ctx})"
