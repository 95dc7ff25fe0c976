#!/usr/bin/env python3
"""Many users at once, as agents use a server: N users, each a conversation of several turns
that starts with the same long system prompt (a tool list of ~1.5k tokens) and then its own
message; every answer streamed, greedy, a fixed number of tokens. Reports per server and N the
wall time, the aggregate generated tokens/s, TTFT p50/p95 per turn, the share of each
follow-up's prompt that the server reported as cached and the server's peak RSS.

  python3 scripts/bench/multi_user_bench.py --users 1,4,16,64 \\
      --kestrel "kestrel=build/kestrel serve -m default" \\
      --kestrel "kestrel -np 16=build/kestrel serve -m default --parallel 16" \\
      --peer "llama-server=/path/llama-server -m model.gguf -np 4 -c 16384" \\
      --vllm "vllm=/tmp/export-dir" \\
      --json /tmp/multi.json --markdown /tmp/multi.md

Each LABEL=COMMAND is started fresh for every N (cold caches) on a free loopback port (the
script appends `--port P -t THREADS` to it; kestrel gets `--model-name m` too), and stopped after.
`--vllm LABEL=DIR [ARGS]` starts vLLM's OpenAI server (the CPU build of `scripts/install_deps.sh
--vllm`, in $KESTREL_VLLM_VENV) on DIR, a `kestrel export` folder, the same way: bfloat16, its
OpenMP threads bound to cores 0..THREADS-1 (VLLM_CPU_OMP_THREADS_BIND), --vllm-kv-gib GiB of KV
cache (VLLM_CPU_KVCACHE_SPACE), automatic prefix caching on (its default), cached tokens reported
(--enable-prompt-tokens-details); ARGS are appended to its command line. Its peak RSS is the sum
of its processes' (the API server and the engine core; shared pages counted in each).
`--url LABEL=http://127.0.0.1:PORT/v1` measures a server already running. Requests
go to /v1/completions with the conversation as plain text (the same bytes for every server; the
default model is a base model), `ignore_eos` so that every answer has --answer-tokens tokens,
`cache_prompt` true. Users start together; each sends its next turn when its answer has ended,
after --think-ms. TTFT is measured at the client: request sent to the first streamed token.
"""
import argparse
import concurrent.futures as cf
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("KESTREL_VLLM_VENV", Path.home() / ".cache" / "kestrel" / "vllm-venv"))
OASST = ROOT.parent / "shared" / "data" / "oasst" / "en-validation.jsonl"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def system_prompt(n_tools):
    """A deterministic tool list, ~60 tokens a tool on Gemma's tokenizer."""
    lines = ["You are an operations agent. Call the tools below by writing a JSON object with 'tool' and 'args'."]
    for i in range(n_tools):
        lines.append(f"- tool_{i:03d}_lookup(record_id: string, fields: array of strings, region: one of "
                     f"'eu', 'us', 'apac'): returns the fields of record {i} in the region's ledger, "
                     f"or an error object when the record is archived.")
    return "\n".join(lines) + "\n"


def user_messages(n):
    """n short user messages from OpenAssistant's validation split (or generated ones without it)."""
    out = []
    if OASST.exists():
        for line in OASST.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("role") == "prompter" and not row.get("deleted") and 40 <= len(row["text"]) <= 300:
                out.append(" ".join(row["text"].split()))
            if len(out) >= n:
                break
    while len(out) < n:
        out.append(f"Please look up record {len(out)} in the eu region and summarize its status.")
    return out


def vllm_command(spec, port, threads, kv_gib):
    """argv and environment of vLLM's OpenAI server for `DIR [ARGS]` (see the module's docstring)."""
    words = shlex.split(spec)
    if not words:
        raise SystemExit("--vllm LABEL=DIR: no model folder given")
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"--vllm: no vLLM venv at {VLLM_VENV} (scripts/install_deps.sh --vllm)")
    if not (Path(words[0]) / "config.json").exists():
        raise SystemExit(f"--vllm: {words[0]} is not a `kestrel export` folder (no config.json)")
    # `vllm serve` looks up the metadata of a distribution named `vllm`, which vllm-cpu is not.
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", words[0], "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "bfloat16", "--served-model-name", "m",
            "--enable-prompt-tokens-details", *words[1:]]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0"}
    return argv, env


class Server:
    def __init__(self, label, command=None, url=None, threads=2, kind="peer", vllm_kv_gib=4):
        self.label, self.command, self.url, self.threads, self.kind = label, command, url, threads, kind
        self.vllm_kv_gib = vllm_kv_gib
        self.proc = None

    def spec(self):
        return Server(self.label, self.command, self.url, self.threads, self.kind, self.vllm_kv_gib)

    def __enter__(self):
        if self.url:
            self.client = openai.OpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=1800)
            self.model = self.client.models.list().data[0].id
            return self
        port = free_port()
        env = None
        if self.kind == "vllm":
            argv, env = vllm_command(self.command, port, self.threads, self.vllm_kv_gib)
        else:
            argv = shlex.split(self.command) + ["--port", str(port), "-t", str(self.threads)]
            if self.kind == "kestrel":
                argv += ["--model-name", "m"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                    timeout=1800)
        deadline = time.time() + 900
        while True:
            try:
                self.model = self.client.models.list().data[0].id
                # llama-server lists the model before it has loaded it: a one-token request waits.
                self.client.completions.create(model=self.model, prompt="Hi", max_tokens=1, temperature=0)
                break
            except (openai.APIError, IndexError):
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{self.label}: the server did not start: {shlex.join(argv)}")
                time.sleep(0.3)
        return self

    def peak_rss_mib(self):
        """The started server's peak resident memory (VmHWM), MiB, summed over its process and its
        children (vLLM's engine core runs in one); None for --url servers."""
        if not self.proc:
            return None
        pids, total = [self.proc.pid], 0
        for children in Path(f"/proc/{self.proc.pid}/task").glob("*/children"):
            try:
                pids += [int(c) for c in children.read_text().split()]
            except OSError:
                pass
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return total / 1024 if total else None

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def one_turn(server, prompt, answer_tokens):
    t0 = time.perf_counter()
    ttft, text, usage, n = None, "", None, 0
    stream = server.client.completions.create(
        model=server.model, prompt=prompt, max_tokens=answer_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "cache_prompt": True})
    for chunk in stream:
        if getattr(chunk, "usage", None):
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].text:
            ttft = ttft or time.perf_counter() - t0
            text += chunk.choices[0].text
            n += 1
    done = time.perf_counter() - t0
    prompt_tokens = usage.prompt_tokens if usage else None
    cached = None
    if usage is not None:
        details = getattr(usage, "prompt_tokens_details", None)
        if details is not None:
            cached = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    completion = usage.completion_tokens if usage else n
    return {"ttft": ttft if ttft is not None else done, "seconds": done, "text": text,
            "prompt_tokens": prompt_tokens, "cached_tokens": cached, "completion_tokens": completion}


def run_users(server, n_users, turns, system, messages, answer_tokens, think_ms):
    def user(u):
        prompt = system
        out = []
        for k in range(turns):
            prompt += f"User: {messages[(u * turns + k) % len(messages)]}\nAssistant:"
            r = one_turn(server, prompt, answer_tokens)
            r["turn"] = k + 1
            out.append(r)
            prompt += r["text"] + "\n"
            if think_ms:
                time.sleep(think_ms / 1000)
        return out

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=n_users) as ex:
        results = list(ex.map(user, range(n_users)))
    wall = time.perf_counter() - t0
    return wall, [r for rs in results for r in rs]


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(label, n_users, wall, rows, turns):
    generated = sum(r["completion_tokens"] or 0 for r in rows)
    row = {"server": label, "users": n_users, "wall_s": wall, "generated_tokens": generated,
           "aggregate_tok_s": generated / wall if wall else None}
    for k in range(1, turns + 1):
        t = [r["ttft"] for r in rows if r["turn"] == k]
        row[f"turn{k}_ttft_p50_s"] = pct(t, 0.5)
        row[f"turn{k}_ttft_p95_s"] = pct(t, 0.95)
        shares = [r["cached_tokens"] / r["prompt_tokens"] for r in rows
                  if r["turn"] == k and r["cached_tokens"] is not None and r["prompt_tokens"]]
        row[f"turn{k}_cached_share_min"] = min(shares) if shares else None
        row[f"turn{k}_cached_share_mean"] = statistics.mean(shares) if shares else None
    return row


def fmt(v, digits=2):
    return "n/a" if v is None else f"{v:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", action="append", default=[], help="LABEL=COMMAND (a kestrel serve command)")
    ap.add_argument("--peer", action="append", default=[], help="LABEL=COMMAND (llama-server or another server)")
    ap.add_argument("--vllm", action="append", default=[],
                    help="LABEL=DIR [ARGS]: vLLM's OpenAI server on a `kestrel export` folder")
    ap.add_argument("--vllm-kv-gib", type=int, default=4, help="vLLM's KV cache, GiB (VLLM_CPU_KVCACHE_SPACE)")
    ap.add_argument("--url", action="append", default=[], help="LABEL=BASE_URL of a running server")
    ap.add_argument("--users", default="1,4,16")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--tools", type=int, default=24, help="tools in the system prompt (~60 tokens each)")
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--think-ms", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    system = system_prompt(args.tools)
    users = [int(x) for x in args.users.split(",")]
    messages = user_messages(max(users) * args.turns)
    for spec in args.kestrel + args.peer + args.vllm + args.url:
        if "=" not in spec:
            ap.error(f"{spec!r}: expected LABEL=...")
    servers = [Server(*s.split("=", 1), threads=args.threads, kind="kestrel") for s in args.kestrel]
    servers += [Server(*s.split("=", 1), threads=args.threads) for s in args.peer]
    servers += [Server(*s.split("=", 1), threads=args.threads, kind="vllm", vllm_kv_gib=args.vllm_kv_gib)
                for s in args.vllm]
    servers += [Server(s.split("=", 1)[0], url=s.split("=", 1)[1]) for s in args.url]
    if not servers:
        ap.error("name at least one server (--kestrel, --peer, --vllm or --url)")
    name, flags = cpu()
    load = os.getloadavg()
    rows = []
    for n in users:
        for spec in servers:  # the servers in turn for each N: drift hits every one alike
            with spec.spec() as s:
                wall, results = run_users(s, n, args.turns, system, messages, args.answer_tokens, args.think_ms)
                rss = s.peak_rss_mib()
            row = summarize(spec.label, n, wall, results, args.turns)
            row["peak_rss_mib"] = rss
            rows.append(row)
            print(json.dumps(row), flush=True)
    cols = ["server", "users", "wall s", "tok/s"]
    for k in range(1, args.turns + 1):
        cols += [f"turn {k} TTFT p50 s", f"turn {k} TTFT p95 s"]
    cols += [f"turn {args.turns} cached (min)", "peak RSS MiB"]
    lines = [f"CPU: {name}; flags: {flags}; threads {args.threads}; load average before: {load[0]:.2f}",
             f"System prompt: {args.tools} tools; {args.turns} turns; {args.answer_tokens} tokens per answer, greedy, "
             "streamed; users start together", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        vals = [r["server"], str(r["users"]), fmt(r["wall_s"]), fmt(r["aggregate_tok_s"], 1)]
        for k in range(1, args.turns + 1):
            vals += [fmt(r[f"turn{k}_ttft_p50_s"]), fmt(r[f"turn{k}_ttft_p95_s"])]
        share = r[f"turn{args.turns}_cached_share_min"]
        vals.append("n/a" if share is None else f"{100 * share:.0f} %")
        vals.append(fmt(r["peak_rss_mib"], 0))
        lines.append("| " + " | ".join(vals) + " |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "kestrel-multi-user/1", "cpu": name, "flags": flags,
                                               "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
