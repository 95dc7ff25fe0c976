"""xgrammar's Python package without torch, as a reference for tests.

xgrammar imports torch at import time, but only calls it to allocate token bitmasks. The tests
here compile grammars and match strings, so a stub `torch` module (numpy in its place) is
enough. `load_xgrammar()` returns the module or raises ImportError saying why.
"""

import importlib
import sys
import types

_module = None


class _TorchStub(types.ModuleType):
    # Attributes xgrammar only names (dtypes, device types in annotations) resolve to empty
    # classes; the few it calls are numpy's.
    def __getattr__(self, name):
        return type(name, (), {})


def _torch_stub():
    import numpy as np

    torch = _TorchStub("torch")
    torch.int32 = np.int32
    torch.bool = np.bool_
    torch.Tensor = np.ndarray
    torch.tensor = lambda values, dtype=None: np.array(values, dtype=dtype)
    torch.full = lambda shape, value, dtype=None: np.full(shape, value, dtype=dtype)
    return torch


def load_xgrammar():
    """Returns the xgrammar module; raises ImportError with the reason when it cannot load."""
    global _module
    if _module is not None:
        return _module
    try:
        # Imported before the stub so that neither sees it (both probe for a real torch).
        importlib.import_module("tvm_ffi")
        importlib.import_module("transformers")
    except ImportError as e:
        raise ImportError(f"xgrammar's dependencies are not installed: {e}") from e
    stubbed = "torch" not in sys.modules
    if stubbed:
        sys.modules["torch"] = _torch_stub()
    try:
        _module = importlib.import_module("xgrammar")
    except Exception as e:  # a broken install raises more than ImportError
        raise ImportError(f"xgrammar does not import: {e!r}") from e
    finally:
        # xgrammar keeps its own reference; a later `import torch` elsewhere must still fail.
        if stubbed:
            del sys.modules["torch"]
    return _module
