"""The machine a benchmark ran on, for its record: the CPU's model name and its vector flags
(avx*, amx*, fma, f16c) from /proc/cpuinfo."""
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
