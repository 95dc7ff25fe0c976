#!/usr/bin/env python3
"""Multi-turn chat through `kestrel serve` with the official openai client: TTFT of a long first
turn, then of a follow-up that adds a short message, with the prompt cache (cache_prompt true,
the default) and without it (false: a cold prefill of the same full prompt). Also checks that
the warm and cold follow-ups answer the same (greedy).

  python3 scripts/bench/chat_turns_bench.py -m IMAGE [--first-tokens 3000] [--rounds 3] [--json OUT]

Starts its own server on a free loopback port (2 threads by default), prints a Markdown table
and the CPU's model and flags. TTFT is measured at the client: request sent to the first
streamed content chunk.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from machine import cpu
from serve_client import served

ROOT = Path(__file__).resolve().parents[2]
OASST = ROOT.parent / "shared" / "data" / "oasst" / "en-validation.jsonl"


def texts():
    for line in OASST.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if not row["deleted"]:
            yield row["text"]


def stream_ttft(client, model, messages, cache_prompt, max_tokens):
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"cache_prompt": cache_prompt}):
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = ttft or time.perf_counter() - t0
            text += chunk.choices[0].delta.content
    return ttft or time.perf_counter() - t0, text, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--kestrel", default=str(ROOT / "build" / "kestrel"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--first-tokens", type=int, default=3000, help="approximate tokens of the first turn")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()

    with served(args.kestrel, args.model, args.threads, "--ctx", 8192) as client:
        source = texts()
        rows = []
        for r in range(args.rounds):
            body = ""
            while len(body) < args.first_tokens * 4:  # ~4 characters a token in English
                body += next(source) + "\n\n"
            turn1 = [{"role": "user", "content": "Read these messages and summarize them.\n\n" + body}]
            t1, a1, u1 = stream_ttft(client, "m", turn1, True, args.max_tokens)
            turn2 = turn1 + [{"role": "assistant", "content": a1},
                             {"role": "user", "content": "Now list the three most important points, briefly."}]
            warm, a_warm, u_warm = stream_ttft(client, "m", turn2, True, args.max_tokens)
            cold, a_cold, u_cold = stream_ttft(client, "m", turn2, False, args.max_tokens)
            row = {"round": r, "turn1_prompt_tokens": u1.prompt_tokens, "turn1_ttft_s": t1,
                   "turn2_prompt_tokens": u_warm.prompt_tokens,
                   "turn2_cached_tokens": u_warm.prompt_tokens_details.cached_tokens,
                   "turn2_warm_ttft_s": warm, "turn2_cold_ttft_s": cold, "same_answer": a_warm == a_cold}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)

    name, flags = cpu()
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    print(f"CPU: {name}; flags: {flags}; {os.cpu_count()} cores; threads {args.threads}; model {args.model}")
    print("| turn | prompt tokens | cached | TTFT s (median) | vs first turn |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| first | {med('turn1_prompt_tokens'):.0f} | 0 | {med('turn1_ttft_s'):.3f} | 100 % |")
    print(f"| follow-up, prompt cache | {med('turn2_prompt_tokens'):.0f} | {med('turn2_cached_tokens'):.0f} | "
          f"{med('turn2_warm_ttft_s'):.3f} | {100 * med('turn2_warm_ttft_s') / med('turn1_ttft_s'):.1f} % |")
    print(f"| follow-up, cache_prompt false | {med('turn2_prompt_tokens'):.0f} | 0 | {med('turn2_cold_ttft_s'):.3f} | "
          f"{100 * med('turn2_cold_ttft_s') / med('turn1_ttft_s'):.1f} % |")
    print(f"warm answer == cold answer in {sum(r['same_answer'] for r in rows)} of {len(rows)} rounds")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": name, "flags": flags, "threads": args.threads,
                                               "model": args.model, "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()
