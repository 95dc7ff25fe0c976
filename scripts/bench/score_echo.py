"""Prompt scoring speed: a 2,048-token echo + logprobs request to `kestrel serve` against
`kestrel run`'s prefill of the same tokens, and optionally the same request to llama-cpp-python's
server on the same GGUF (docs/benchmarks.md#prompt-scoring). Run from the repository root:
    python3 scripts/bench/score_echo.py [-m MODEL] [--llama-cpp GGUF] [--reps 3]
--llama-cpp needs llama-cpp-python's server extras (fastapi, uvicorn, sse-starlette,
starlette-context, pydantic-settings); it runs `python -m llama_cpp.server --logits_all true`
(echo's prompt logprobs need every row's logits) with 2 threads."""
import argparse, json, subprocess, sys, time, urllib.request
sys.path.insert(0, "tests/python")
from serve_helpers import Server, KESTREL, free_port

p = argparse.ArgumentParser()
p.add_argument("-m", "--model", default=None, help="image or GGUF for kestrel (default: kestrel's default)")
p.add_argument("--llama-cpp", default=None, help="GGUF for llama-cpp-python's server")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--llama-cpp-reps", type=int, default=1)
a = p.parse_args()
N = 2048
text = open("docs/serving.md").read() * 3
model = ["-m", a.model] if a.model else []
s = Server("--quiet", "--parallel", "1", "--ctx", "4096", *model)
body = None
try:
    _, r = s.request("POST", "/tokenize", {"content": text, "add_special_tokens": True, "parse_special": False})
    ids = r["tokens"][:N]
    open("/tmp/ids.txt", "w").write(" ".join(map(str, ids)))
    body = {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
    _, r = s.request("POST", "/detokenize", {"tokens": ids[1:]})
    prompt_text = r["content"]
    for rep in range(a.reps):
        t0 = time.time()
        st, r = s.request("POST", "/v1/completions", body)
        dt = time.time() - t0
        assert st == 200, r
        print(f"kestrel echo scoring {N} tokens: {dt:.2f} s = {N/dt:.0f} tok/s")
    kestrel_lp = r["choices"][0]["logprobs"]["token_logprobs"]
finally:
    s.stop()
for rep in range(2):
    out = subprocess.run([str(KESTREL), "run", *model, "--token-ids", "/tmp/ids.txt", "-n", "0", "--json", "-t", "2",
                          "--ctx", "4096"], capture_output=True, text=True)
    j = json.loads(out.stdout)
    print(f"kestrel run prefill: {j['prefill_tok_s']:.0f} tok/s ({j['prompt_tokens']} tokens)")
if a.llama_cpp:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", a.llama_cpp, "--port", str(port),
                             "--n_ctx", "4096", "--n_batch", "512", "--n_threads", "2", "--logits_all", "true"],
                            stdout=subprocess.DEVNULL, stderr=open("/tmp/llama_cpp_server.log", "w"))
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "llama_cpp.server did not start"
                time.sleep(0.5)
        # llama-cpp-python's server takes text prompts only (it adds the BOS): the same tokens'
        # text; it generates at least one token: max_tokens 1 (lm-eval's request)
        req = {"prompt": prompt_text, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
        for rep in range(a.llama_cpp_reps):
            t0 = time.time()
            raw = urllib.request.urlopen(urllib.request.Request(url, json.dumps(req).encode(),
                                                                {"Content-Type": "application/json"}), timeout=600).read()
            dt = time.time() - t0
            lp = json.loads(raw)["choices"][0]["logprobs"]["token_logprobs"]
            print(f"llama-cpp-python server echo scoring {N} tokens: {dt:.2f} s = {N/dt:.0f} tok/s "
                  f"({len(lp)} logprobs)")
        both = [(x, y) for x, y in zip(kestrel_lp[1:N], lp[1:N]) if x is not None and y is not None]
        print(f"mean logprob over {len(both)} tokens: kestrel {sum(x for x, _ in both)/len(both):.4f}, "
              f"llama.cpp {sum(y for _, y in both)/len(both):.4f}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # uvicorn waits for open connections
            proc.kill()
            proc.wait()
