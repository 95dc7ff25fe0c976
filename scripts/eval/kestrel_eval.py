#!/usr/bin/env python3
"""Accuracy of Kestrel images, the model card's method: greedy, one answer per item, sets sampled
evenly over their items, every image on the same items, the optimized images against the first
(the baseline) with paired-bootstrap 95 % intervals. Each image is served by `kestrel serve` and
queried through the OpenAI API (the official `openai` client), so the chat template is the
server's. Per-item JSONL lands in OUT/<set>/<label>.jsonl as answers arrive; a rerun with the same
OUT resumes. docs/accuracy.md describes the method and holds the recorded table.

  python3 scripts/eval/kestrel_eval.py --image baseline=bf16.kimg --image w4a16-fh=fh.kimg \\
      --sets gsm8k,ifeval --limit 20 --out /tmp/eval
  python3 scripts/eval/kestrel_eval.py --image baseline=bf16.kimg --image w4a16-fh=fh.kimg \\
      --sets ruler --ruler-lengths 4096,8192 --limit ruler=2 --ppl-chunks 0 --out /tmp/ruler
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evalsets import DATA, ROOT, SETS  # noqa: E402
from ruler import DEFAULT_LENGTHS as RULER_LENGTHS, TASKS as RULER_TASKS  # noqa: E402
from report import build_table, markdown, read_records  # noqa: E402

CARD_MAX_TOKENS = 3500  # the card's answer cap


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", action="append", required=True, metavar="LABEL=PATH",
                   help="a model image or GGUF; repeat; the first is the baseline")
    p.add_argument("--serve-args", action="append", default=[], metavar="LABEL=ARGS",
                   help="extra `kestrel serve` options for one image, e.g. 'w4a16=--head dense'")
    p.add_argument("--sets", default="gsm8k,ifeval", help="comma-separated: gsm8k, ifeval, ruler")
    p.add_argument("--limit", action="append", default=[], metavar="[SET=]N",
                   help="items per set, for all sets or one (default: the whole set); for ruler, "
                        "samples per task and length (default 500, RULER's)")
    p.add_argument("--ruler-lengths", default=",".join(map(str, RULER_LENGTHS)), metavar="L,...",
                   help="RULER lengths in the served model's tokens, prompt plus answer budget "
                        "(default %(default)s); the servers' context is raised to the longest")
    p.add_argument("--ruler-tasks", default=",".join(RULER_TASKS), metavar="TASK,...",
                   help="RULER tasks (default: all %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="item sampling seed")
    p.add_argument("--max-tokens", action="append", default=[], metavar="[SET=]N",
                   help=f"answer cap in tokens, for all sets or one (default {CARD_MAX_TOKENS}, the card's)")
    p.add_argument("--gsm8k-shots", type=int, default=5, choices=range(0, 6), metavar="{0..5}",
                   help="GSM8K worked examples as earlier chat turns (0: zero-shot)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--threads", type=int, default=0, help="threads per server (0: every core)")
    p.add_argument("--ctx", type=int, default=4096, help="context per server in tokens")
    p.add_argument("--kestrel", type=Path, default=Path(os.environ.get("KESTREL_BIN", ROOT / "build" / "kestrel")))
    p.add_argument("--ppl-file", type=Path, default=DATA / "wikitext2" / "wiki.test.raw",
                   help="text for perplexity, KL and same-top-1 against the baseline")
    p.add_argument("--ppl-chunks", type=int, default=8, help="chunks of --ppl-ctx tokens for perplexity (0: skip)")
    p.add_argument("--ppl-ctx", type=int, default=512,
                   help="tokens per perplexity chunk, the second half of each scored (llama-perplexity's -c; at least 4)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    a = p.parse_args(argv)
    a.images = []
    for spec in a.image:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            p.error(f"--image wants LABEL=PATH, got {spec!r}")
        if not re.fullmatch(r"[A-Za-z0-9._+-]+", label):
            p.error(f"image label {label!r}: letters, digits and . _ + - only")
        if not Path(path).is_file():
            p.error(f"--image {label}: no such file {path}")
        a.images.append((label, Path(path)))
    if len({lab for lab, _ in a.images}) != len(a.images):
        p.error("image labels must differ")
    a.extra = {}
    for spec in a.serve_args:
        label, sep, args = spec.partition("=")
        if not sep or label not in {lab for lab, _ in a.images}:
            p.error(f"--serve-args wants LABEL=ARGS with the label of an --image, got {spec!r}")
        a.extra[label] = shlex.split(args)
    a.sets = [s for s in a.sets.split(",") if s]
    for s in a.sets:
        if s not in SETS:
            p.error(f"unknown set {s!r} (known: {', '.join(SETS)})")
    a.caps, a.limits = _per_set(p, "--max-tokens", a.max_tokens, CARD_MAX_TOKENS), _per_set(p, "--limit", a.limit, None)
    try:
        a.ruler_lengths = sorted({int(x) for x in a.ruler_lengths.split(",") if x.strip()})
    except ValueError:
        p.error(f"--ruler-lengths {a.ruler_lengths!r}: want comma-separated token counts")
    if not a.ruler_lengths or any(n < 1024 or n > 131072 for n in a.ruler_lengths):
        p.error(f"--ruler-lengths {a.ruler_lengths}: each from 1024 to 131072 tokens")
    a.ruler_tasks = [t for t in a.ruler_tasks.split(",") if t]
    bad = [t for t in a.ruler_tasks if t not in RULER_TASKS]
    if bad or not a.ruler_tasks:
        p.error(f"--ruler-tasks: unknown {', '.join(bad) or 'empty list'} (known: {', '.join(RULER_TASKS)})")
    if "ruler" in a.sets:
        a.ctx = max(a.ctx, a.ruler_lengths[-1])
    if a.resamples < 1:
        p.error("--resamples must be at least 1")
    if a.threads < 0:
        p.error("--threads must be 0 (every core) or more")
    if not os.access(a.kestrel, os.X_OK):
        p.error(f"--kestrel {a.kestrel}: not an executable (build first: scripts/build.sh)")
    if a.ppl_ctx < 4:
        p.error(f"--ppl-ctx {a.ppl_ctx}: at least 4 tokens")
    if a.ppl_chunks > 0 and len(a.images) > 1 and not a.ppl_file.is_file():
        p.error(f"--ppl-file {a.ppl_file}: no such file (or --ppl-chunks 0)")
    if a.out.exists() and not a.out.is_dir():
        p.error(f"--out {a.out}: exists and is not a folder")
    return a


def _per_set(p, flag: str, specs: list[str], default):
    """'N' (every set) or 'SET=N' (one set; wins over a plain N), N >= 1 -> {set: N or default}."""
    out = {s: default for s in SETS}
    for spec in sorted(specs, key=lambda x: "=" in x):
        name, sep, n = spec.rpartition("=")
        if sep and name not in SETS:
            p.error(f"{flag} {spec!r}: unknown set {name!r}")
        if not n.isdigit() or int(n) < 1:
            p.error(f"{flag} {spec!r}: want a positive integer")
        for s in ([name] if sep else SETS):
            out[s] = int(n)
    return out


class Server:
    """`kestrel serve` for one image on a free loopback port; a context manager."""

    def __init__(self, kestrel: Path, model: Path, label: str, threads: int, ctx: int, log: Path,
                 extra: list[str] = ()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [str(kestrel), "serve", "-m", str(model), "--port", str(self.port), "--model-name", label,
               "-c", str(ctx)] + (["-t", str(threads)] if threads else []) + list(extra)
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        import urllib.request
        deadline = time.time() + 600
        while True:
            if self.proc.poll() is not None:
                self.log.close()
                tail = Path(log).read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"kestrel serve for '{label}' exited with {self.proc.returncode}: "
                                   + " | ".join(tail) + f" (log: {log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"kestrel serve not ready after 600 s; see {log}")
            time.sleep(0.2)

    def __enter__(self):
        return self

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of `text` as /v1/completions counts them (BOS added, control tokens
        parsed), from the server's /tokenize."""
        import urllib.request
        body = json.dumps({"content": text, "add_special": True, "parse_special": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return int(json.loads(r.read())["count"])

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


_CTX_ERR = re.compile(r"\((\d+) in the prompt")


def answer(client, label: str, item, cap: int, ctx: int) -> dict:
    """One greedy answer: a chat completion of `item.messages`, or a plain completion of
    `item.prompt` (capped by `item.max_tokens` too). When prompt + cap exceed the context the cap
    shrinks to what fits (the server says how many prompt tokens there are) and the record says so."""
    import openai
    max_tokens, clipped = min(cap, item.max_tokens or cap), False
    t0 = time.time()
    while True:
        try:
            if item.prompt is not None:
                r = client.completions.create(model=label, prompt=item.prompt, temperature=0,
                                              max_tokens=max_tokens, seed=0)
                text = r.choices[0].text or ""
            else:
                r = client.chat.completions.create(model=label, messages=item.messages, temperature=0,
                                                   max_tokens=max_tokens, seed=0)
                text = r.choices[0].message.content or ""
            break
        except openai.BadRequestError as e:
            m = _CTX_ERR.search(str(e))
            if not m or clipped or int(m.group(1)) >= ctx:
                raise
            max_tokens, clipped = ctx - int(m.group(1)), True
    return {"answer": text, "finish_reason": r.choices[0].finish_reason,
            "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
            "max_tokens": max_tokens, "cap_clipped_by_context": clipped,
            "seconds": round(time.time() - t0, 3)}


def start_server(a, label: str, path: Path) -> Server:
    return Server(a.kestrel, path, label, a.threads, a.ctx, a.out / f"serve-{label}.log", a.extra.get(label, []))


def run_image(a, label: str, path: Path, items_by_set: dict, srv: Server | None = None) -> None:
    """Answers the items `label` has not answered yet, on `srv` (this image's running server) or
    on a server started for the purpose."""
    import openai
    todo = {s: [it for it in items if it.id not in read_records(a.out / s / f"{label}.jsonl")]
            for s, items in items_by_set.items()}
    if not any(todo.values()):
        print(f"[{label}] every item already answered", flush=True)
        return
    with contextlib.ExitStack() as stack:
        if srv is None:
            srv = stack.enter_context(start_server(a, label, path))
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", timeout=3600, max_retries=0)
        for s, items in todo.items():
            out = a.out / s / f"{label}.jsonl"
            t0, done = time.time(), 0
            if out.exists() and out.stat().st_size and not out.read_bytes().endswith(b"\n"):
                with open(out, "a", encoding="utf-8") as f:  # close a line cut short by a kill
                    f.write("\n")
            with open(out, "a", encoding="utf-8") as f:
                for it in items:
                    rec = {"id": it.id, "set": s, "image": label,
                           "image_spec": " ".join([str(path)] + a.extra.get(label, []))}
                    rec.update(answer(client, label, it, a.caps[s], a.ctx))
                    rec.update(SETS[s]["score"](it, rec["answer"]))
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    f.flush()
                    done += 1
                    if done % 10 == 0 or done == len(items):
                        rate = done / (time.time() - t0)
                        print(f"[{label}] {s}: {done}/{len(items)} ({rate * 60:.1f} items/min)", flush=True)


def perplexity(a) -> dict:
    """`kestrel perplexity --json` of every image, with KL and same-top-1 against the baseline."""
    base = a.images[0][1]
    out, by_path = {}, {}
    for label, path in a.images:
        is_base = label == a.images[0][0]
        if not is_base and path in by_path:  # the same file under another label (another --head)
            out[label] = by_path[path]
            continue
        cmd = [str(a.kestrel), "perplexity", "-m", str(path), "-f", str(a.ppl_file), "--chunks",
               str(a.ppl_chunks), "-c", str(a.ppl_ctx), "--json"] + (["-t", str(a.threads)] if a.threads else [])
        if not is_base:
            # The baseline as it runs: a GGUF in its auto form, as -m loads it (an image is used
            # as built either way), so that two identical entries give KL 0.
            cmd += ["--kl-base", str(base), "--kl-base-precision", "auto"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[label] = json.loads(res.stdout)
        if not is_base:
            by_path[path] = out[label]
    return out


def load_sets(a, srv: Server | None) -> dict:
    """{set: items}. Sets generated in the served model's tokens (RULER) are fitted with the
    tokenizer of `srv`, the first image's server (every image of a comparison shares the
    tokenizer)."""
    a.count_tokens = srv.count_tokens if srv else None
    t0 = time.time()
    out = {s: SETS[s]["load"](a) for s in a.sets}
    if srv:
        print(f"[{a.images[0][0]}] generated {sum(map(len, out.values()))} items in {time.time() - t0:.0f} s",
              flush=True)
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for s in a.sets:
        (a.out / s).mkdir(exist_ok=True)
    with contextlib.ExitStack() as first:  # the first image's server, when a set needs its tokenizer
        srv = first.enter_context(start_server(a, *a.images[0])) if any(
            SETS[s].get("tokenizer") for s in a.sets) else None
        items_by_set = load_sets(a, srv)
        config = write_config(a, items_by_set)
        for k, (label, path) in enumerate(a.images):
            run_image(a, label, path, items_by_set, srv if k == 0 else None)
            if k == 0:
                first.close()  # stopped before the next image's server starts
    labels = [lab for lab, _ in a.images]
    table = build_table(a.out, a.sets, labels, a.resamples)
    ppl = perplexity(a) if a.ppl_chunks > 0 and len(a.images) > 1 else None
    (a.out / "report.json").write_text(json.dumps({"config": config, "table": table, "perplexity": ppl}, indent=1))
    md = markdown(table, ppl)
    (a.out / "report.md").write_text(md)
    print(md)
    return 0


def write_config(a, items_by_set: dict) -> dict:
    """Writes OUT/config.json (merged with a resumed run's); exits when the folder holds answers
    made with other settings."""
    config = {"images": {lab: " ".join([str(p)] + a.extra.get(lab, [])) for lab, p in a.images}, "sets": a.sets, "limit": {s: a.limits[s] for s in a.sets},
              "seed": a.seed, "max_tokens": {s: a.caps[s] for s in a.sets}, "gsm8k_shots": a.gsm8k_shots,
              "ctx": a.ctx, "threads": a.threads, "items": {s: [it.id for it in v] for s, v in items_by_set.items()}}
    if "ruler" in a.sets:
        config["ruler"] = {"lengths": a.ruler_lengths, "tasks": a.ruler_tasks}
    cfg_path = a.out / "config.json"
    if cfg_path.exists():  # answers already here must come from the same settings
        old = json.loads(cfg_path.read_text())
        # The context changes answers only where a prompt plus its cap may not fit (chat sets);
        # RULER's items fit their length whatever the context, and are generated independently of
        # each other, so lengths and tasks may be added to a folder.
        ctx_matters = any(s != "ruler" and s in old.get("sets", []) for s in a.sets)
        for key in ("seed", "gsm8k_shots") + (("ctx",) if ctx_matters else ()):
            if old.get(key) != config[key]:
                sys.exit(f"{cfg_path}: this folder holds a run with {key}={old.get(key)!r}, not "
                         f"{config[key]!r}; use another --out")
        for key in ("limit", "max_tokens"):
            for s in set(a.sets) & set(old.get(key, {})):
                if old[key][s] != config[key][s]:
                    sys.exit(f"{cfg_path}: this folder holds a run of {s} with {key}={old[key][s]!r}, "
                             f"not {config[key][s]!r}; use another --out")
        for lab, spec in config["images"].items():  # a label's answers belong to one image
            if lab in old.get("images", {}) and old["images"][lab] != spec:
                sys.exit(f"{cfg_path}: label '{lab}' was answered by {old['images'][lab]!r}, not "
                         f"{spec!r}; use another label or --out")
        for key in ("limit", "max_tokens", "items"):
            config[key] = {**old.get(key, {}), **config[key]}
        config["sets"] = list(dict.fromkeys(old.get("sets", []) + a.sets))
        if "ruler" in old:
            cur = config.get("ruler", {"lengths": [], "tasks": []})
            config["ruler"] = {"lengths": sorted(set(old["ruler"]["lengths"]) | set(cur["lengths"])),
                               "tasks": list(dict.fromkeys(old["ruler"]["tasks"] + cur["tasks"]))}
        config["images"] = {**old.get("images", {}), **config["images"]}
    cfg_path.write_text(json.dumps(config, indent=1))
    return config


def _terminate(signum, frame):
    raise KeyboardInterrupt  # unwinds through Server.__exit__, which stops `kestrel serve`


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGTERM, _terminate)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("kestrel_eval: interrupted; rerun with the same --out to resume")
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        detail = f": {e.stderr.strip()}" if isinstance(e, subprocess.CalledProcessError) and e.stderr else ""
        sys.exit(f"kestrel_eval: error: {e}{detail}")
    except Exception as e:  # the API's errors (e.g. a prompt over the context) without a traceback
        if type(e).__module__.startswith("openai"):
            sys.exit(f"kestrel_eval: error from kestrel serve: {e}")
        raise
