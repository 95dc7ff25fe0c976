"""vLLM's offline engine as the reference of tests/python/test_vllm_export.py, run by the vLLM venv's
Python (scripts/install_deps.sh --vllm), not by pytest: JSON in on stdin, one `RESULT {...}` line out.

Input: {"model": DIR, "n": N, "prompts": [[id, ...], ...], "reference": [[id, ...], ...], "top": K,
        "max_model_len": L}
`reference` holds Kestrel's N greedy ids per prompt. vLLM continues each prompt greedily; where its
id differs from the reference's, the step is recorded with vLLM's K largest raw logits (bfloat16
values, as float) and vLLM continues from the reference's id (teacher forcing), so that every one
of the N steps is compared, not only those before the first difference. Output per prompt:
{"tokens": vLLM's ids of the first pass, "text": their text, "rounds": passes,
 "differences": [{"step": i, "kestrel": id, "vllm": id, "top": [[id, logit], ...]}, ...]}.
"""
import json
import sys

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def main():
    cfg = json.load(sys.stdin)
    n, top = cfg["n"], cfg.get("top", 5)
    llm = LLM(model=cfg["model"], dtype="bfloat16", max_model_len=cfg.get("max_model_len", 512), seed=0,
              logprobs_mode="raw_logits")
    prompts, refs = cfg["prompts"], cfg["reference"]
    results = [{"tokens": None, "text": None, "rounds": 0, "differences": []} for _ in prompts]
    pos = [0] * len(prompts)  # steps of the reference already compared, per prompt
    while True:
        todo = [i for i in range(len(prompts)) if pos[i] < n]
        if not todo:
            break
        params = [SamplingParams(temperature=0, max_tokens=n - pos[i], logprobs=top, ignore_eos=True) for i in todo]
        outs = llm.generate([TokensPrompt(prompt_token_ids=prompts[i] + refs[i][:pos[i]]) for i in todo], params,
                            use_tqdm=False)
        for i, o in zip(todo, outs):
            c, r = o.outputs[0], results[i]
            r["rounds"] += 1
            if r["tokens"] is None:
                r["tokens"], r["text"] = list(c.token_ids), c.text
            ref = refs[i][pos[i]:]
            k = next((j for j, (a, b) in enumerate(zip(c.token_ids, ref)) if a != b), None)
            if k is None:
                if len(c.token_ids) < len(ref):
                    raise SystemExit(f"prompt {i}: vLLM stopped after {len(c.token_ids)} of {len(ref)} tokens")
                pos[i] = n
                continue
            ranked = sorted(([int(t), float(lp.logprob)] for t, lp in c.logprobs[k].items()), key=lambda x: -x[1])
            r["differences"].append({"step": pos[i] + k, "kestrel": ref[k], "vllm": int(c.token_ids[k]),
                                     "top": ranked})
            pos[i] += k + 1
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
