"""The float32 reference: transformers' GlmMoeDsaForCausalLM on each model's reference weights, teacher-forced on
every arm's own tokens (run by `bench/e2e.py reference DIR` in its own process)."""
from __future__ import annotations


def reference_scores(results: dict, models: dict[str, str]) -> dict:
    """Teacher-forced float32 log-probabilities of every arm's own tokens; |served - reference| per position."""
    import torch
    from transformers import GlmMoeDsaForCausalLM

    from glm5_shim.gguf.fixture import reference_dir

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for quant, gguf_path in models.items():
        model = GlmMoeDsaForCausalLM.from_pretrained(str(reference_dir(gguf_path)), dtype=torch.float32,
                                                     attn_implementation="eager").to(device).eval()
        for arm_name, arm_res in results["arms"].items():
            if arm_res.get("quant") != quant or "functional" not in arm_res:
                continue
            per_prompt = {}
            for pname, g in arm_res["functional"]["greedy"].items():
                ids = g["prompt_ids"] + g["ids"]
                with torch.no_grad():
                    lp = model(torch.tensor([ids], device=device)).logits[0].float().log_softmax(-1).cpu()
                n_p = len(g["prompt_ids"])
                gen_pos = range(n_p - 1, len(ids) - 1)  # logits at t predict token t+1
                ref_gen = [lp[t, ids[t + 1]].item() for t in gen_pos]
                top2 = [lp[t].topk(2) for t in gen_pos]
                ref_top1 = [int(k.indices[0]) for k in top2]
                dec = [abs(a - b) for a, b in zip(g["logprobs"], ref_gen)]
                pre = [abs(g["prompt_logprobs"][t + 1] - lp[t, ids[t + 1]].item())
                       for t in range(n_p - 1) if g["prompt_logprobs"][t + 1] is not None]
                top1_margin = [float(k.values[0] - k.values[1]) for k in top2]
                per_prompt[pname] = {
                    "decode_abs_diff": dec, "prefill_abs_diff": pre,
                    "top1_agree": sum(a == b for a, b in zip(g["ids"], ref_top1)), "positions": len(g["ids"]),
                    "min_ref_margin": min(top1_margin)}
            out[arm_name] = per_prompt
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return out
