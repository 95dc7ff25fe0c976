"""Kestrel: small Gemma models fast on CPU, from Python (docs/python.md).

    >>> import kestrel
    >>> model = kestrel.Model("default")
    >>> print(model.generate("The capital of France is", max_tokens=8, temperature=0))
    >>> for piece in model.generate("Once upon a time", max_tokens=32, stream=True):
    ...     print(piece, end="", flush=True)
"""
from ._kestrel import (ContextLengthError, Error, GrammarError, InvalidRequestError, ModelFileError,
                       OptionError)
from ._model import Completion, Model, Session, TextStream

__version__ = "0.1.0"

__all__ = ["Model", "Session", "Completion", "TextStream", "Error", "ModelFileError", "InvalidRequestError",
           "ContextLengthError", "GrammarError", "OptionError", "__version__"]
