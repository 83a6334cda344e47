"""Tensor-parallel split check: which TP sizes cut a quantized row-parallel weight inside its blocks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.fixture import make_tiny
from glm5_shim.report import inspect_report
from glm5_shim.gguf.load_plan import PlannedTensor, plan_load
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.gguf.tp_split import clean_tp_sizes, split_problems
from glm5_shim.gguf.type_policy import DEQUANTIZE, KEEP, REQUANTIZE


def _plan(tensors):
    """A stand-in LoadPlan: (gguf name, action, type, numpy shape) per tensor, each with the tensor table's entry for
    its name (how vLLM splits it), from a 5-layer table (block 0 dense, 1-4 MoE)."""
    from glm5_shim.gguf.fixture import tiny_hf_config, tiny_tokenizer
    from glm5_shim.gguf.tensor_map import build_tensor_map

    table = build_tensor_map(tiny_hf_config(layers=5, heads=4, index_heads=32, index_topk=128, mtp=False,
                                            tokenizer=tiny_tokenizer()))
    return SimpleNamespace(tensors=[PlannedTensor(SimpleNamespace(name=n, type_name=t, shape=s), table[n], a, "hf")
                                    for n, a, t, s in tensors])


def test_glm5_real_widths_split_at_tp8_but_not_16():
    # GLM-5: o_proj rows 64 heads x 256 = 16384, dense down 12288, shared and routed expert down 2048 (8 Q4_K blocks)
    plan = _plan([("blk.0.attn_output.weight", KEEP, "Q4_K", (6144, 16384)),
                  ("blk.0.ffn_down.weight", KEEP, "Q6_K", (6144, 12288)),
                  ("blk.3.ffn_down_shexp.weight", KEEP, "Q4_K", (6144, 2048)),
                  ("blk.3.ffn_down_exps.weight", KEEP, "IQ2_XXS", (256, 6144, 2048)),
                  ("blk.3.ffn_up_exps.weight", KEEP, "IQ2_XXS", (256, 2048, 6144))])  # column-parallel: rows
    assert clean_tp_sizes(plan, (1, 2, 4, 8, 16)) == [1, 2, 4, 8]
    problems = split_problems(plan, 16)
    assert [p.tensor for p in problems] == ["blk.3.ffn_down_shexp.weight", "blk.3.ffn_down_exps.weight"]
    assert problems[1].blocks == 8 and problems[1].is_expert


def test_expert_parallel_exempts_only_routed_experts_and_float_rows_never_break():
    plan = _plan([("blk.3.ffn_down_shexp.weight", KEEP, "Q4_K", (256, 512)),  # 2 blocks
                  ("blk.3.ffn_down_exps.weight", KEEP, "Q4_K", (8, 256, 256)),  # 1 block
                  ("blk.0.ffn_down.weight", DEQUANTIZE, "Q4_K", (256, 256)),  # becomes float: split by values
                  ("blk.4.ffn_down_exps.weight", REQUANTIZE, "F16", (8, 256, 32))])  # re-quantized to Q8_0: 1 block
    assert [p.tensor for p in split_problems(plan, 2)] == ["blk.3.ffn_down_exps.weight", "blk.4.ffn_down_exps.weight"]
    assert split_problems(plan, 2, expert_parallel=True) == []
    assert [p.tensor for p in split_problems(plan, 4, expert_parallel=True)] == ["blk.3.ffn_down_shexp.weight"]
    line = split_problems(plan, 2)[1].line("m.gguf")
    assert line.startswith("m.gguf: tensor blk.4.ffn_down_exps.weight (Q8_0, 32 values a block) cannot be split for "
                           "--tensor-parallel-size 2: each row is 1 block(s), expected a multiple of 2")


@pytest.mark.parametrize("quant, clean", [("Q8_0", [1, 2, 4, 8]), ("Q4_K", [1]), ("F16", [1, 2, 4, 8])])
def test_tiny_files(tmp_path, quant, clean):
    """The generator's tiny models (FFN rows of 256/512 values): Q8_0 splits up to TP 8, Q4_K at TP 1 only (the
    shared expert's 256-value rows are one block); F16 experts are re-quantized to Q8_0 and split like Q8_0."""
    path = make_tiny(tmp_path / "m.gguf", quant=quant, layers=2, write_reference=False)[0]
    model = open_gguf(path)
    assert clean_tp_sizes(plan_load(model, build_hf_config(model))) == clean
    report = inspect_report(path)
    assert report["tp_split"]["clean"] == clean
    assert sorted(report["tp_split"]["first_problem"]) == [str(tp) for tp in (1, 2, 4, 8) if tp not in clean]


def test_the_tensor_table_says_how_vllm_splits_each_weight():
    """One home for the split kind (tensor_map.TensorSpec.tp_split), read by the split check and by the weight-memory
    report: vLLM 0.23 splits column-parallel weights by output rows, row-parallel ones along the packed row."""
    from glm5_shim.gguf.fixture import tiny_hf_config, tiny_tokenizer
    from glm5_shim.gguf.tensor_map import TP_COLUMN, TP_REPLICATED, TP_ROW, build_tensor_map

    table = build_tensor_map(tiny_hf_config(layers=3, heads=4, index_heads=32, index_topk=128, mtp=True,
                                            tokenizer=tiny_tokenizer()))
    kinds = {}
    for spec in table:
        kinds.setdefault(spec.tp_split, set()).add(spec.gguf_name.split(".", 2)[-1] if spec.layer is not None
                                                   else spec.gguf_name)
    assert kinds[TP_ROW] == {"attn_output.weight", "ffn_down.weight", "ffn_down_shexp.weight", "ffn_down_exps.weight"}
    assert kinds[TP_COLUMN] == {"token_embd.weight", "output.weight", "attn_q_b.weight", "attn_k_b.weight",
                                "attn_v_b.weight", "attn_kv_b.weight", "ffn_gate.weight", "ffn_up.weight",
                                "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_gate_exps.weight",
                                "ffn_up_exps.weight"}
    replicated = kinds[TP_REPLICATED]
    assert {"attn_q_a.weight", "attn_kv_a_mqa.weight", "indexer.attn_q_b.weight", "ffn_gate_inp.weight",
            "attn_norm.weight", "nextn.eh_proj.weight"} <= replicated
