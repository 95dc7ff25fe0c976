#!/usr/bin/env python3
"""Tiny random Gemma 4 MTP "assistant" drafters and their reference drafts (docs/speculative.md,
"Gemma 4 MTP assistant").

For each tiny Gemma 4 target of make_tiny_gemma4.py (rebuilt here from the same seeds and checked
against its committed goldens), makes a tiny random `gemma4_assistant` (transformers'
Gemma4AssistantForCausalLM: 4 KV-less layers whose queries read the target's K/V, pre/post
projections from the target's hidden state; the e2b one with the centroid-masked output head
`use_ordered_embeddings`, the e4b one with the plain tied head) and writes:
  OUT/<target>/assistant/   the assistant's Hugging Face checkpoint (config.json, model.safetensors
                            in F16), as `kestrel build TARGET --assistant DIR` reads it
and, with --goldens, the references from transformers (float32, eager attention, CPU) for every
golden prompt of the target:
  GOLDENS/gemma4_<target>_assistant.json  per prompt: the target's greedy next token (the
        "bonus" token), the assistant's N_DRAFT greedy drafts, their top-2 margins, the centroid
        margins, and offsets into the .bin
  GOLDENS/gemma4_<target>_assistant.bin   float32, per prompt: the assistant's logits
        [N_DRAFT, vocab], the target's last hidden state [d_target], and the K and V the
        assistant reads (the target's last full-attention and last sliding layer, every prompt
        position) [n_prompt, kv_heads * head_dim] each: full K, full V, sliding K, sliding V.

The drafts are made by transformers' own SinglePositionMultiTokenCandidateGenerator (what
`generate(..., assistant_model=...)` uses) right after the target's prefill of the prompt, and
cross-checked against a direct loop over Gemma4AssistantForCausalLM.forward.

Requirements: scripts/requirements-gemma4.txt plus torch and transformers >= 5.24.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_gemma4 as tiny  # noqa: E402

N_DRAFT = 4

# Assistants: 4 layers each, all KV-shared (they read the target's caches); head sizes and KV
# heads equal to the target's, as the shared K/V require.
ASSISTANTS = {
    "e2b_tiny": dict(
        text=dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
                  layer_types=["sliding_attention"] * 3 + ["full_attention"], sliding_window=8,
                  num_kv_shared_layers=4, use_double_wide_mlp=False, hidden_size_per_layer_input=0,
                  vocab_size_per_layer_input=0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
                  max_position_embeddings=512,
                  rope_parameters=tiny.CONFIGS["e2b_tiny"]["rope_parameters"],
                  tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
                  eos_token_id=1, bos_token_id=2),
        backbone_hidden_size=64, use_ordered_embeddings=True, num_centroids=16, centroid_intermediate_top_k=4),
    "e4b_tiny": dict(
        text=dict(vocab_size=512, hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
                  layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8,
                  num_kv_shared_layers=4, use_double_wide_mlp=False, hidden_size_per_layer_input=0,
                  vocab_size_per_layer_input=0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
                  max_position_embeddings=512,
                  rope_parameters=tiny.CONFIGS["e4b_tiny"]["rope_parameters"],
                  tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
                  eos_token_id=1, bos_token_id=2),
        backbone_hidden_size=64, use_ordered_embeddings=False),
}


def make_assistant(spec: dict, seed: int):
    """The HF assistant with random fp16-rounded weights (float32 module)."""
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig
    text = Gemma4TextConfig(**spec["text"])
    kw = {k: v for k, v in spec.items() if k != "text"}
    config = Gemma4AssistantConfig(text_config=text, **kw)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma4AssistantForCausalLM(config).float().eval()
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    new = {}
    for name, t in sd.items():
        shape = tuple(t.shape)
        if name.endswith("token_ordering"):
            new[name] = torch.tensor(rng.permutation(shape[0]), dtype=t.dtype)
            continue
        if name.endswith("layer_scalar"):
            v = rng.uniform(0.3, 1.0, size=shape)
        elif name.endswith("q_norm.weight"):
            v = 0.3 * (1.0 + 0.2 * rng.standard_normal(shape))
        elif name.endswith("norm.weight"):
            v = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens" in name or name == "lm_head.weight":
            v = 0.5 * rng.standard_normal(shape)
        else:
            v = rng.standard_normal(shape) / math.sqrt(shape[-1])
        new[name] = torch.tensor(v.astype(np.float16).astype(np.float32))
    if "lm_head.weight" in new:  # tied
        new["lm_head.weight"] = new["model.embed_tokens.weight"]
    res = model.load_state_dict(new, strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    model.lm_head.weight = model.model.embed_tokens.weight
    model.generation_config.num_assistant_tokens = N_DRAFT
    return model


def write_checkpoint(model, dir_: Path):
    """config.json and model.safetensors (F16 floats, token_ordering int64), as save_pretrained
    writes them; checked by reloading."""
    import torch
    from transformers import Gemma4AssistantForCausalLM
    dir_.mkdir(parents=True, exist_ok=True)
    half = Gemma4AssistantForCausalLM(model.config)
    half.load_state_dict(model.state_dict())
    half = half.to(torch.float16)
    half.save_pretrained(str(dir_))
    re = Gemma4AssistantForCausalLM.from_pretrained(str(dir_), dtype=torch.float32)
    for k, v in model.state_dict().items():
        assert torch.equal(re.state_dict()[k].to(v.dtype), v), k


def target_model(name: str, index: int):
    """The tiny target of make_tiny_gemma4.py, from the same seed."""
    model = tiny.hf_model(tiny.CONFIGS[name])
    weights = tiny.rng_weights(model, 1000 + index)
    model.load_state_dict(weights, strict=True)
    model.lm_head.weight = model.model.embed_tokens.weight
    return model


def direct_drafts(target, assistant, ids, out, bonus):
    """The drafting loop written out: input [E_target(last) * sqrt(d), h_target], position of
    the last token, the target's shared K/V, argmax; then the assistant's projected state."""
    import torch
    kv = out.shared_kv_states
    h = out.hidden_states[-1][:, -1:]
    last = torch.tensor([[bonus]])
    pos = torch.tensor([[len(ids)]])
    toks, logits = [], []
    for _ in range(N_DRAFT):
        emb = target.get_input_embeddings()(last)
        o = assistant(inputs_embeds=torch.cat([emb, h], dim=-1), position_ids=pos, shared_kv_states=kv,
                      attention_mask=torch.ones(1, len(ids) + 1, dtype=torch.long))
        last = o.logits.argmax(-1)
        h = o.last_hidden_state
        toks.append(int(last))
        logits.append(o.logits[0, 0])
    return toks, torch.stack(logits)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/gemma4", help="model directory (default tests/data/gemma4)")
    ap.add_argument("--goldens", default=None, help="write goldens here (e.g. tests/goldens)")
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator
    torch.set_num_threads(2)
    names = list(tiny.CONFIGS)
    for index, name in enumerate(names):
        target = target_model(name, index)
        assistant = make_assistant(ASSISTANTS[name], 2000 + index)
        adir = Path(args.out) / name / "assistant"
        write_checkpoint(assistant, adir)
        n_params = sum(v.numel() for k, v in assistant.state_dict().items() if k != "lm_head.weight")
        print(f"{name} assistant: {n_params} parameters -> {adir}")
        if not args.goldens:
            continue
        gold = Path(args.goldens)
        meta_t = json.loads((gold / f"gemma4_{name}.json").read_text())
        ref_logits = np.fromfile(gold / meta_t["logits_file"], dtype="<f4").reshape(-1, meta_t["n_vocab"])
        tcfg = target.config
        full_layer = max(i for i, t in enumerate(tcfg.layer_types[: tcfg.num_hidden_layers - tcfg.num_kv_shared_layers])
                         if t == "full_attention")
        swa_layer = max(i for i, t in enumerate(tcfg.layer_types[: tcfg.num_hidden_layers - tcfg.num_kv_shared_layers])
                        if t == "sliding_attention")
        cases, blobs, offset, row = [], [], 0, 0
        worst_direct = 0.0
        with torch.no_grad():
            for ids in meta_t["prompts"]:
                x = torch.tensor([ids])
                out = target(x, output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
                # The rebuilt target is the committed one.
                d = float((out.logits[0] - torch.tensor(ref_logits[row: row + len(ids)])).abs().max())
                assert d < 1e-4, (name, d)
                row += len(ids)
                bonus = int(out.logits[0, -1].argmax())
                seq = torch.tensor([ids + [bonus]])
                gen = SinglePositionMultiTokenCandidateGenerator(
                    assistant, target.get_input_embeddings(), GenerationConfig(max_length=4096))
                cand, cand_logits = gen.get_candidates(
                    seq, model_kwargs={"attention_mask": torch.ones_like(seq)}, model_outputs=out,
                    is_first_iteration=False, n_last_matches=0)
                drafts = cand[0, len(ids) + 1:].tolist()
                lg = cand_logits[0].float()
                dtoks, dlog = direct_drafts(target, assistant, ids, out, bonus)
                assert dtoks == drafts, (dtoks, drafts)
                worst_direct = max(worst_direct, float((dlog - lg).abs().max()))
                s = torch.sort(lg, dim=-1, descending=True).values
                margins = (s[:, 0] - s[:, 1]).tolist()
                cmargins = []
                if assistant.config.use_ordered_embeddings:
                    # The gap between the k-th and (k+1)-th centroid logit of each step: a
                    # different cluster choice would change which logits are masked.
                    h = out.hidden_states[-1][:, -1:]
                    last = torch.tensor([[bonus]])
                    for t in range(N_DRAFT):
                        emb = target.get_input_embeddings()(last)
                        inner = assistant.model(inputs_embeds=assistant.pre_projection(torch.cat([emb, h], -1)),
                                                attention_mask=assistant.create_attention_masks(
                                                    assistant.pre_projection(torch.cat([emb, h], -1)),
                                                    torch.ones_like(seq), out.shared_kv_states),
                                                position_ids=torch.tensor([[len(ids)]]),
                                                shared_kv_states=out.shared_kv_states, use_cache=False)
                        c = assistant.masked_embedding.centroids(inner.last_hidden_state)[0, 0]
                        cs = torch.sort(c, descending=True).values
                        k = assistant.config.centroid_intermediate_top_k
                        cmargins.append(float(cs[k - 1] - cs[k]))
                        h = assistant.post_projection(inner.last_hidden_state)
                        last = torch.tensor([[drafts[t]]])
                kvf = out.shared_kv_states["full_attention"]
                kvs = out.shared_kv_states["sliding_attention"]
                parts = [lg.numpy(), out.hidden_states[-1][0, -1].numpy()]
                for k_or_v in (kvf[0], kvf[1], kvs[0], kvs[1]):
                    # [1, kv_heads, n, head_dim] -> [n, kv_heads * head_dim]
                    parts.append(k_or_v[0].permute(1, 0, 2).reshape(len(ids), -1).numpy())
                blob = b"".join(p.astype("<f4").tobytes() for p in parts)
                cases.append({"prompt": ids, "bonus": bonus, "position": len(ids), "drafts": drafts,
                              "top2_margins": margins, "centroid_margins": cmargins, "offset": offset})
                offset += len(blob) // 4
                blobs.append(blob)
        acfg = assistant.config
        meta = {"target": name, "target_dir": f"tests/data/gemma4/{name}/hf",
                "assistant_dir": f"tests/data/gemma4/{name}/assistant",
                "source": "HF transformers Gemma4AssistantForCausalLM driven by "
                          "SinglePositionMultiTokenCandidateGenerator after Gemma4ForCausalLM's prefill; "
                          "float32, eager attention, CPU",
                "transformers": transformers.__version__, "torch": torch.__version__,
                "n_vocab": tcfg.vocab_size, "n_draft": N_DRAFT, "d_target": tcfg.hidden_size,
                "full_kv_layer": full_layer, "sliding_kv_layer": swa_layer,
                "full_kv_width": tiny.CONFIGS[name]["num_key_value_heads"] * tiny.CONFIGS[name]["global_head_dim"],
                "sliding_kv_width": tiny.CONFIGS[name]["num_key_value_heads"] * tiny.CONFIGS[name]["head_dim"],
                "use_ordered_embeddings": acfg.use_ordered_embeddings,
                "bin": f"gemma4_{name}_assistant.bin", "cases": cases}
        (gold / f"gemma4_{name}_assistant.json").write_text(json.dumps(meta, indent=1))
        (gold / f"gemma4_{name}_assistant.bin").write_bytes(b"".join(blobs))
        allm = [m for c in cases for m in c["top2_margins"]]
        print(f"  goldens: {len(cases)} prompts x {N_DRAFT} drafts, min top-2 margin {min(allm):.3e}, "
              f"generator vs direct loop max |dlogit| {worst_direct:.1e}, bin {offset * 4} bytes")


if __name__ == "__main__":
    main()
