#!/usr/bin/env python3
"""Structured output suite: every case of tests/data/json_schemas/ through `kestrel serve`'s
/v1/completions with response_format json_schema (strict), greedy, one answer each. Each answer
is parsed (json.loads) and validated (jsonschema, Draft 2020-12, formats checked); its
finish_reason, tokens and decode speed are recorded. Then, for the speed comparison, the same
prompt without a schema decodes the same number of tokens (ignore_eos), and the medians of the
two decode speeds are compared. Prints a Markdown summary; --out writes the per-case record.

  python3 scripts/eval/structured_output.py --model /tmp/fh.kimg --out /tmp/so.json
  python3 scripts/eval/structured_output.py --list > docs/structured-output-suite.md

Decode speed is measured on the client from the stream, as the chat page does: the tokens after
the first over the time from the first text to the end of the answer (the time to the first
token, where the grammar is compiled, is recorded apart). The server's own figure, the mean of
its inter-token latency histogram (/metrics) over the request, is recorded beside it: with
--parallel 1 and one request at a time, the histogram's change is this request's alone.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
import machine  # noqa: E402  (scripts/bench/machine.py)

CASES = ROOT / "tests" / "data" / "json_schemas"
KESTREL = Path(os.environ.get("KESTREL_BIN", ROOT / "build" / "kestrel"))
FORMATS = ("date-time", "date", "email", "uuid")  # the formats the suite uses; jsonschema must check them


# ---------------------------------------------------------------------------------------------
# Cases


def load_cases(folder: Path = CASES) -> list[dict]:
    """The cases of FOLDER (one JSON file each: name, prompt, schema), in file-name order."""
    cases = []
    for path in sorted(Path(folder).glob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        missing = {"name", "prompt", "schema"} - case.keys()
        if missing:
            raise ValueError(f"{path}: missing {', '.join(sorted(missing))}")
        if case["name"] != path.stem:
            raise ValueError(f"{path}: name {case['name']!r} differs from the file name")
        cases.append(case)
    if not cases:
        raise ValueError(f"{folder}: no *.json cases")
    return cases


def features(schema) -> list[str]:
    """What a schema exercises, as short tags, for the suite's list (docs/structured-output-suite.md)."""
    tags: set[str] = set()
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    if isinstance(schema, dict):
        root_type = schema.get("type")
        if "$ref" in schema:
            target = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
            root_type = target.get("type")
        if "anyOf" in schema:
            tags.add("root anyOf")
        elif root_type not in (None, "object"):
            tags.add(f"root {root_type if isinstance(root_type, str) else '/'.join(root_type)}")

    def refs_in(node) -> set[str]:
        found = set()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.add(node["$ref"].rsplit("/", 1)[-1])
            for v in node.values():
                found |= refs_in(v)
        elif isinstance(node, list):
            for v in node:
                found |= refs_in(v)
        return found

    for name, body in defs.items():
        if name in refs_in(body):
            tags.add("recursive $ref")

    def walk(node, depth: int, in_array: bool):
        if isinstance(node, list):
            for v in node:
                walk(v, depth, in_array)
            return
        if not isinstance(node, dict):
            return
        t = node.get("type")
        types = [t] if isinstance(t, str) else (t or [])
        if isinstance(t, list):
            tags.add("type array (" + ", ".join(t) + ")")
        if "$ref" in node:
            tags.add("$ref/$defs")
        for key, tag in (("enum", "enum"), ("const", "const"), ("anyOf", "anyOf"), ("pattern", "pattern"),
                         ("prefixItems", "prefixItems")):
            if key in node:
                tags.add(tag)
        if "format" in node:
            tags.add(f"format {node['format']}")
        for key in ("minLength", "maxLength"):
            if key in node:
                tags.add(key)
        if "object" in types:
            if depth >= 2:
                tags.add("nested object" if depth < 4 else "deep nesting")
            if node.get("additionalProperties") is False:
                tags.add("additionalProperties false")
            props = node.get("properties", {})
            if set(props) - set(node.get("required", [])):
                tags.add("optional properties")
            if in_array:
                tags.add("array of objects")
        if "array" in types:
            if "minItems" in node or "maxItems" in node:
                tags.add("minItems/maxItems")
            if in_array:
                tags.add("nested arrays")
        for num in ("integer", "number"):
            if num in types:
                bounds = [k for k in ("minimum", "maximum") if k in node]
                excl = [k for k in ("exclusiveMinimum", "exclusiveMaximum") if k in node]
                tags.add(num + (" min/max" if bounds else ""))
                if excl:
                    tags.add("exclusiveMinimum/Maximum")
        if "boolean" in types:
            tags.add("boolean")
        if "null" in types:
            tags.add("null")
        if "string" in types and not any(k in node for k in ("enum", "const", "pattern", "format", "maxLength")):
            tags.add("unbounded string")
        child_depth = depth + 1 if "object" in types else depth
        for v in node.get("properties", {}).values():
            walk(v, child_depth, False)
        if isinstance(node.get("items"), dict):
            walk(node["items"], child_depth, True)
        for key in ("prefixItems", "anyOf"):
            walk(node.get(key, []), depth, in_array or key == "prefixItems")

    walk(schema, 1, False)
    for name, body in defs.items():
        walk(body, 1, False)
    return sorted(tags)


def list_markdown(cases: list[dict], folder: Path) -> str:
    rel = Path(folder).resolve()
    try:
        rel = rel.relative_to(ROOT)
    except ValueError:
        pass
    lines = [
        "# Structured output suite",
        "",
        f"The {len(cases)} cases of `{rel}/` (one file each: `name`, `prompt`, `schema`), run by",
        "`scripts/eval/structured_output.py` against `kestrel serve` (response_format json_schema, strict,",
        "greedy, max_tokens 512): each answer must parse and validate (jsonschema Draft 2020-12, formats",
        "checked) and should end by stop. The prompts are text for a *base* model (the default Gemma 3",
        "270M) to continue. The schemas are written for this suite, within the OpenAI strict subset and what",
        "xgrammar enforces (no uniqueItems, contains, multipleOf, patternProperties, not, if/then/else,",
        "min/maxProperties; no min/maxLength beside a pattern or a format, which xgrammar ignores there:",
        "patterns carry their own bounds). Strings are mostly bounded by maxLength so that a small model",
        "cannot run on; `unbounded string` marks the few that are not.",
        "",
        "Generated by `python3 scripts/eval/structured_output.py --list > docs/structured-output-suite.md`.",
        "",
        "| # | case | prompt (first line) | exercises |",
        "| --- | --- | --- | --- |",
    ]
    for i, case in enumerate(cases, 1):
        first = case["prompt"].strip().splitlines()[0]
        first = (first if len(first) <= 70 else first[:67] + "...").replace("|", "\\|").replace("`", "'")
        lines.append(f"| {i} | `{case['name']}` | {first} | {', '.join(features(case['schema']))} |")
    counts: dict[str, int] = {}
    for case in cases:
        for tag in features(case["schema"]):
            counts[tag] = counts.get(tag, 0) + 1
    lines += ["", "Cases per feature:", "", "| feature | cases |", "| --- | --- |"]
    lines += [f"| {tag} | {n} |" for tag, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Validation


def format_checker():
    """jsonschema's FormatChecker, checked to know every format the suite uses (date-time needs the
    rfc3339-validator package; without it jsonschema silently passes any string)."""
    import jsonschema
    fc = jsonschema.FormatChecker()
    missing = [f for f in FORMATS if f not in fc.checkers]
    if missing:
        raise RuntimeError(f"jsonschema cannot check format {', '.join(missing)}: pip install rfc3339-validator")
    return fc


def check_answer(text: str, schema: dict, checker=None) -> dict:
    """{parsed, valid, error}: json.loads, then Draft 2020-12 validation with formats checked."""
    import jsonschema
    try:
        value = json.loads(text)
    except ValueError as e:
        return {"parsed": False, "valid": False, "error": f"json: {e}"}
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker or format_checker())
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(map(str, e.absolute_path)) or "(root)"
        return {"parsed": True, "valid": False, "error": f"schema at {where}: {e.message}"[:300]}
    return {"parsed": True, "valid": True, "error": None}


# ---------------------------------------------------------------------------------------------
# The server


class Server:
    """`kestrel serve -m MODEL --parallel 1` on a free loopback port, ready (GET /health 200); a
    context manager. Its stderr goes to LOG (a temporary file by default)."""

    def __init__(self, model, kestrel: Path = KESTREL, threads: int = 0, draft: str = "none",
                 extra: list[str] = (), log: Path | None = None, timeout: float = 300):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.cmd = [str(kestrel), "serve", "--port", str(self.port), "--parallel", "1", "--draft", draft]
        if model is not None:
            self.cmd[2:2] = ["-m", str(model)]
        if threads:
            self.cmd += ["-t", str(threads)]
        self.cmd += list(extra)
        self.log_path = Path(log) if log else Path(tempfile.mkstemp(prefix="kestrel-serve-", suffix=".log")[1])
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kestrel serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = self.request("GET", "/health", timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"kestrel serve not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, n: int = 2000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def request(self, method: str, path: str, body=None, timeout: float = 600):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode("utf-8")
        finally:
            conn.close()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

    def itl(self) -> tuple[float, float]:
        """(sum, count) of the server's inter-token latency histogram."""
        _, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            for key in ("sum", "count"):
                if line.startswith(f"kestrel_inter_token_latency_seconds_{key} "):
                    out[key] = float(line.split()[1])
        return out.get("sum", 0.0), out.get("count", 0.0)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def stream_completion(server: Server, body: dict, timeout: float = 600) -> dict:
    """POSTs BODY (stream forced on, usage included) to /v1/completions and reads the stream.
    Returns {status, error, text, finish_reason, completion_tokens, ttft_s, total_s, decode_s,
    decode_tok_s, server_decode_tok_s}; decode_tok_s is None below two tokens."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    itl0 = server.itl()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    t0 = time.perf_counter()
    out = {"status": None, "error": None, "text": "", "finish_reason": None, "completion_tokens": None,
           "ttft_s": None, "total_s": None, "decode_s": None, "decode_tok_s": None, "server_decode_tok_s": None}
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        if resp.status != 200:
            raw = resp.read().decode("utf-8", "replace")
            try:
                out["error"] = json.loads(raw).get("error", {}).get("message", raw)
            except (ValueError, AttributeError):
                out["error"] = raw
            return out
        pieces, t_first, t_end = [], None, None
        for line in resp:  # SSE: "data: {...}\n", blank lines between events, ": comment" heartbeats
            line = line.decode("utf-8").rstrip("\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                out["error"] = event["error"].get("message", str(event["error"])) if isinstance(event["error"], dict) \
                    else str(event["error"])
                continue
            now = time.perf_counter()
            for choice in event.get("choices", []):
                if choice.get("text"):
                    pieces.append(choice["text"])
                    if t_first is None:
                        t_first = now
                    t_end = now
                if choice.get("finish_reason"):
                    out["finish_reason"] = choice["finish_reason"]
                    t_end = now
            if event.get("usage"):
                out["completion_tokens"] = event["usage"].get("completion_tokens")
        out["text"] = "".join(pieces)
        out["total_s"] = time.perf_counter() - t0
        if t_first is not None:
            out["ttft_s"] = t_first - t0
            out["decode_s"] = t_end - t_first
            n = out["completion_tokens"]
            if n and n >= 2 and out["decode_s"] > 0:
                out["decode_tok_s"] = (n - 1) / out["decode_s"]
    finally:
        conn.close()
    s1, c1 = server.itl()
    if c1 > itl0[1] and s1 > itl0[0]:
        out["server_decode_tok_s"] = (c1 - itl0[1]) / (s1 - itl0[0])
    return out


def response_format(case: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"], "strict": True}}


def run_case(server: Server, case: dict, max_tokens: int = 512, compare: bool = True, checker=None,
             repeats: int = 1) -> dict:
    """One case: the constrained answer, checked; then (COMPARE) the same prompt unconstrained for
    as many tokens. With REPEATS > 1 both are run that many times, alternating, and the fastest
    decode of each is kept (greedy: the same answer each time; on a shared machine the best of a
    few is the figure least disturbed by other work). Returns the case's record."""
    rec = {"name": case["name"]}
    c = stream_completion(server, {"prompt": case["prompt"], "max_tokens": max_tokens, "temperature": 0,
                                   "response_format": response_format(case)})
    rec.update({"status": c["status"], "finish_reason": c["finish_reason"], "tokens": c["completion_tokens"],
                "text": c["text"], "ttft_s": c["ttft_s"], "decode_tok_s": c["decode_tok_s"],
                "server_decode_tok_s": c["server_decode_tok_s"]})
    if c["status"] != 200 or c["error"]:
        rec.update({"parsed": False, "valid": False, "error": f"HTTP {c['status']}: {c['error']}"})
    else:
        rec.update(check_answer(c["text"], case["schema"], checker))
    rec["stop"] = rec["finish_reason"] == "stop"
    rec["plain"] = None
    if compare and c["status"] == 200 and (c["completion_tokens"] or 0) >= 2:
        u = stream_completion(server, {"prompt": case["prompt"], "max_tokens": c["completion_tokens"],
                                       "temperature": 0, "ignore_eos": True})
        rec["plain"] = {"status": u["status"], "error": u["error"], "tokens": u["completion_tokens"],
                        "ttft_s": u["ttft_s"], "decode_tok_s": u["decode_tok_s"],
                        "server_decode_tok_s": u["server_decode_tok_s"]}
        for _ in range(repeats - 1):
            c2 = stream_completion(server, {"prompt": case["prompt"], "max_tokens": max_tokens, "temperature": 0,
                                            "response_format": response_format(case)})
            u2 = stream_completion(server, {"prompt": case["prompt"], "max_tokens": c["completion_tokens"],
                                            "temperature": 0, "ignore_eos": True})
            for into, run in ((rec, c2), (rec["plain"], u2)):
                for key in ("decode_tok_s", "server_decode_tok_s"):
                    if run[key] and (not into[key] or run[key] > into[key]):
                        into[key] = run[key]
    return rec


# ---------------------------------------------------------------------------------------------
# Summary


def _median(values):
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def summarize(records: list[dict], max_tokens: int) -> dict:
    n = len(records)
    paired = [r for r in records if r["decode_tok_s"] and r["plain"] and r["plain"]["decode_tok_s"]]
    spaired = [r for r in records if r["server_decode_tok_s"] and r["plain"] and r["plain"]["server_decode_tok_s"]]
    s = {
        "cases": n,
        "parsed": sum(r["parsed"] for r in records),
        "valid": sum(r["valid"] for r in records),
        "stop": sum(r["stop"] for r in records),
        "max_tokens": max_tokens,
        "paired": len(paired),
        "median_tok_s_constrained": _median([r["decode_tok_s"] for r in paired]),
        "median_tok_s_unconstrained": _median([r["plain"]["decode_tok_s"] for r in paired]),
        "median_ratio_per_case": _median([r["decode_tok_s"] / r["plain"]["decode_tok_s"] for r in paired]),
        "server_median_tok_s_constrained": _median([r["server_decode_tok_s"] for r in spaired]),
        "server_median_tok_s_unconstrained": _median([r["plain"]["server_decode_tok_s"] for r in spaired]),
        "median_ttft_s_constrained": _median([r["ttft_s"] for r in paired]),
        "median_ttft_s_unconstrained": _median([r["plain"]["ttft_s"] for r in paired]),
    }
    for prefix in ("", "server_"):
        a, b = s[f"{prefix}median_tok_s_constrained"], s[f"{prefix}median_tok_s_unconstrained"]
        s[f"{prefix}ratio"] = a / b if a and b else None
    return s


def markdown_summary(s: dict, records: list[dict]) -> str:
    def pct(k):
        return f"{s[k]}/{s['cases']} ({100 * s[k] / s['cases']:.1f} %)" if s["cases"] else "-"

    def num(v, fmt="{:.1f}"):
        return fmt.format(v) if v is not None else "-"

    lines = [
        f"| cases | parse | valid | stop within {s['max_tokens']} | decode tok/s, schema | decode tok/s, none "
        "| ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {s['cases']} | {pct('parsed')} | {pct('valid')} | {pct('stop')} | {num(s['median_tok_s_constrained'])} | "
        f"{num(s['median_tok_s_unconstrained'])} | {num(s['ratio'], '{:.3f}')} |",
        "",
        f"Medians over the {s['paired']} cases with both speeds (client, from the stream). Per-case ratio median: "
        f"{num(s['median_ratio_per_case'], '{:.3f}')}. Server ITL: {num(s['server_median_tok_s_constrained'])} vs "
        f"{num(s['server_median_tok_s_unconstrained'])} tok/s (ratio {num(s['server_ratio'], '{:.3f}')}). "
        f"TTFT median: {num(s['median_ttft_s_constrained'], '{:.3f}')} s with the schema, "
        f"{num(s['median_ttft_s_unconstrained'], '{:.3f}')} s without (the prompt cached by then).",
    ]
    bad = [r for r in records if not (r["parsed"] and r["valid"] and r["stop"])]
    if bad:
        lines += ["", "| failing case | parse | valid | finish | tokens | why |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in bad:
            why = (r["error"] or "").replace("|", "\\|").replace("\n", " ")[:160]
            lines.append(f"| `{r['name']}` | {'yes' if r['parsed'] else 'no'} | {'yes' if r['valid'] else 'no'} | "
                         f"{r['finish_reason']} | {r['tokens']} | {why} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", "-m", default=None,
                   help="GGUF or Kestrel image to serve (default: the server's: $KESTREL_MODEL, else Gemma 3 270M)")
    p.add_argument("--cases", type=Path, default=CASES,
                   help=f"folder of case files (default {CASES.relative_to(ROOT)})")
    p.add_argument("--out", type=Path, help="write the JSON record here")
    p.add_argument("--limit", type=int, default=0, help="the first N cases only (0: all)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run this case (repeatable)")
    p.add_argument("--threads", "-t", type=int, default=0, help="server threads (0: every core)")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--draft", choices=("none", "ngram", "auto"), default="none",
                   help="the server's speculative decoding (default none: the speeds compare the plain decode step)")
    p.add_argument("--no-compare", action="store_true", help="skip the unconstrained runs")
    p.add_argument("--repeats", type=int, default=1,
                   help="run each case's pair this many times and keep the fastest decode of each (default 1)")
    p.add_argument("--kestrel", type=Path, default=KESTREL)
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG", help="extra `kestrel serve` argument")
    p.add_argument("--log", type=Path, help="the server's output (default: a temporary file)")
    p.add_argument("--list", action="store_true",
                   help="print the cases and the features they exercise (Markdown) and exit")
    a = p.parse_args(argv)
    if a.limit < 0 or a.max_tokens < 1 or a.threads < 0 or a.repeats < 1:
        p.error("--limit, --threads >= 0, --max-tokens, --repeats >= 1")
    if not a.list and not os.access(a.kestrel, os.X_OK):
        p.error(f"--kestrel {a.kestrel}: not an executable (build first: scripts/build.sh)")
    return a


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    a = parse_args(argv)
    cases = load_cases(a.cases)
    if a.list:
        sys.stdout.write(list_markdown(cases, a.cases))
        return 0
    if a.only:
        unknown = set(a.only) - {c["name"] for c in cases}
        if unknown:
            sys.exit(f"structured_output.py: no case named {', '.join(sorted(unknown))}")
        cases = [c for c in cases if c["name"] in a.only]
    if a.limit:
        cases = cases[:a.limit]
    checker = format_checker()
    cpu_name, cpu_flags = machine.cpu()
    record = {"command": " ".join(shlex.quote(x) for x in [sys.executable, *sys.argv]),
              "machine": {"cpu": cpu_name, "flags": cpu_flags, "cores": os.cpu_count(), "host": platform.node()},
              "git_commit": git_commit(), "model": a.model, "max_tokens": a.max_tokens, "draft": a.draft,
              "repeats": a.repeats, "loadavg_start": os.getloadavg()}
    records = []
    with Server(a.model, a.kestrel, a.threads, a.draft, a.serve_arg, a.log) as server:
        record["server_command"] = " ".join(shlex.quote(x) for x in server.cmd)
        _, record["props"] = server.request("GET", "/props")
        stream_completion(server, {"prompt": "Warm-up:", "max_tokens": 8, "temperature": 0})
        for i, case in enumerate(cases, 1):
            rec = run_case(server, case, a.max_tokens, not a.no_compare, checker, a.repeats)
            records.append(rec)
            plain = rec["plain"] or {}
            print(f"[{i}/{len(cases)}] {case['name']}: parsed={rec['parsed']} valid={rec['valid']} "
                  f"finish={rec['finish_reason']} tokens={rec['tokens']} tok/s={_fmt(rec['decode_tok_s'])} "
                  f"plain={_fmt(plain.get('decode_tok_s'))}" + (f" ({rec['error']})" if rec["error"] else ""),
                  file=sys.stderr, flush=True)
            record["loadavg_end"] = os.getloadavg()  # another job on the machine skews the speeds
            if a.out:  # as the cases arrive
                _write(a.out, record, records, a.max_tokens)
    summary = _write(a.out, record, records, a.max_tokens) if a.out else summarize(records, a.max_tokens)
    print(markdown_summary(summary, records))
    return 0


def _fmt(v):
    return f"{v:.1f}" if v else "-"


def _write(path: Path, record: dict, records: list[dict], max_tokens: int) -> dict:
    summary = summarize(records, max_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({**record, "summary": summary, "cases": records}, indent=1) + "\n")
    tmp.replace(path)
    return summary


if __name__ == "__main__":
    sys.exit(main())
