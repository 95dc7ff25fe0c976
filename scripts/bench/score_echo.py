"""Prompt scoring speed: a 2,048-token echo + logprobs request to `kestrel serve` against
`kestrel run`'s prefill of the same tokens (docs/benchmarks.md#prompt-scoring). Run from the
repository root: python3 scripts/bench/score_echo.py"""
import json, subprocess, sys, time
sys.path.insert(0, "tests/python")
from serve_helpers import Server, KESTREL
text = open("docs/serving.md").read() * 3
s = Server("--quiet", "--parallel", "1", "--ctx", "4096")
try:
    _, r = s.request("POST", "/tokenize", {"content": text, "add_special_tokens": True, "parse_special": False})
    ids = r["tokens"][:2048]
    open("/tmp/ids.txt", "w").write(" ".join(map(str, ids)))
    for rep in range(3):
        t0 = time.time()
        st, r = s.request("POST", "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0})
        dt = time.time() - t0
        assert st == 200
        print(f"echo scoring 2048 tokens: {dt:.2f} s = {2048/dt:.0f} tok/s")
finally:
    s.stop()
for rep in range(2):
    out = subprocess.run([str(KESTREL), "run", "--token-ids", "/tmp/ids.txt", "-n", "0", "--json", "-t", "2", "--ctx", "4096"],
                         capture_output=True, text=True)
    j = json.loads(out.stdout)
    print(f"kestrel run prefill: {j['prefill_tok_s']:.0f} tok/s ({j['prompt_tokens']} tokens)")
