#!/usr/bin/env python3
"""TTFT of a new conversation whose prompt starts with a ~1.5k-token tool list that another
conversation has just prefilled (kestrel serve's shared prefix cache, docs/serving.md) against a
cold one: three rounds, each with a new tool list (cold), then another user message on it (warm).

  python3 scripts/bench/prefix_ttft.py IMAGE_OR_MODEL
"""
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi_user_bench import system_prompt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
img = sys.argv[1]
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = subprocess.Popen([str(ROOT / "build" / "kestrel"), "serve", "-m", img, "--port", str(port), "-t", "2", "--model-name", "m"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)
while True:
    try: c.models.list(); break
    except Exception: time.sleep(0.3)
def ttft(prompt):
    t0 = time.perf_counter()
    st = c.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0, stream=True,
                              stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    first, cached, n = None, None, None
    for ch in st:
        if ch.choices and ch.choices[0].text and first is None: first = time.perf_counter() - t0
        if getattr(ch, "usage", None):
            cached, n = ch.usage.prompt_tokens_details.cached_tokens, ch.usage.prompt_tokens
    return first, cached, n
cold, warm = [], []
for i in range(3):
    sysp = f"Deployment {i}.\n" + system_prompt(24)   # a new prefix each round: cold
    cold.append(ttft(sysp + f"User: what does tool_00{i} return?\nAssistant:"))
    warm.append(ttft(sysp + f"User: list the regions tool_01{i} accepts.\nAssistant:"))
p.terminate(); p.wait()
print("cold", cold); print("warm", warm)
cm = statistics.median(x[0] for x in cold); wm = statistics.median(x[0] for x in warm)
print(f"median TTFT cold {cm:.3f} s, new conversation on the cached prefix {wm:.3f} s: {100*wm/cm:.1f} %")
