"""bench/e2e.py's float32 reference scoring (needs transformers >= 5.2 for GlmMoeDsaForCausalLM; CI runs this
file in its main step, on transformers 5).  The reference scored against its own greedy tokens gives zero
difference and full top-1 agreement; a served log-probability that is off by 0.5 and a token that is not the
reference's top-1 show."""
from __future__ import annotations

import pytest

from tests.helpers import bench_module

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "GlmMoeDsaForCausalLM"):
    pytest.skip(f"transformers {transformers.__version__} has no GlmMoeDsaForCausalLM (CI's main step has "
                "5.x)", allow_module_level=True)
import torch  # noqa: E402

e2e = bench_module("e2e")


def test_reference_scores_its_own_tokens_exactly_and_sees_a_wrong_one(tmp_path):
    from glm5_shim.gguf.fixture import PEAKED, make_tiny, reference_dir

    path = tmp_path / "tiny-Q8_0.gguf"
    make_tiny(path, quant="Q8_0", layers=2, heads=4, mtp=False, reference="dequantized", **PEAKED)
    model = transformers.GlmMoeDsaForCausalLM.from_pretrained(str(reference_dir(path)), dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    prompt = list(range(20, 220))  # 200 tokens: above index_topk 128, so the indexer's choice matters
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        lp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    gen = ids[len(prompt):]
    served = [lp[t, ids[t + 1]].item() for t in range(len(prompt) - 1, len(ids) - 1)]
    prompt_lp = [None] + [lp[t, ids[t + 1]].item() for t in range(len(prompt) - 1)]
    bad_ids = gen[:5] + [(gen[5] + 1) % lp.shape[1]]  # the last token: earlier contexts stay the same
    greedy = {"p": {"prompt_ids": prompt, "ids": gen, "logprobs": served, "prompt_logprobs": prompt_lp}}
    off = {"p": {"prompt_ids": prompt, "ids": bad_ids, "logprobs": [v + 0.5 for v in served],
                 "prompt_logprobs": prompt_lp}}
    results = {"arms": {"shim-q80-bf16": {"quant": "Q8_0", "functional": {"greedy": greedy}},
                        "native-q80-bf16": {"quant": "Q8_0", "functional": {"greedy": off}}}}
    ref = e2e.reference_scores(results, {"Q8_0": str(path)})
    good = ref["shim-q80-bf16"]["p"]
    assert max(good["decode_abs_diff"]) < 1e-4 and max(good["prefill_abs_diff"]) < 1e-4
    assert len(good["prefill_abs_diff"]) == len(prompt) - 1 and good["top1_agree"] == good["positions"] == 6
    bad = ref["native-q80-bf16"]["p"]
    assert bad["top1_agree"] == 5
    assert min(bad["decode_abs_diff"][:3]) > 0.49  # the 0.5 offset on the shared prefix
