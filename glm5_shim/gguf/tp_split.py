"""Which tensor-parallel sizes a glm-dsa GGUF can be split at, from headers only.

vLLM 0.23 keeps a quantized GGUF weight as packed bytes and splits a row-parallel weight along its rows' bytes:
each of the TP ranks takes `row_bytes // tp` bytes (RowParallelLinear.weight_loader for attn_output and the dense /
shared-expert ffn_down; FusedMoE._load_w2 for the routed experts' ffn_down_exps).  The cut is right only when every
rank's range holds whole quantization blocks, i.e. when the row's block count is a multiple of TP.  Otherwise each
rank receives pieces of blocks and the model computes with wrong weights, with no error anywhere.

GLM-5 itself splits cleanly at TP 8 for every llama.cpp type (the tightest rows are the experts' 2048 values = 8
blocks of 256); a file whose FFN widths were changed, or a test model, may not.  Column-parallel weights are split by
whole rows, and float weights (including everything the loader dequantizes) by values, so they never break.
With expert parallelism vLLM hands out whole experts, so the routed experts are not cut.
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf

from .load_plan import LoadPlan
from .tensor_map import ROLE_EXPERTS, TP_ROW



@dataclass(frozen=True)
class SplitProblem:
    tensor: str
    type_name: str
    row_values: int
    block_values: int
    tp: int
    is_expert: bool

    @property
    def blocks(self) -> int:
        return self.row_values // self.block_values

    def line(self, where: str) -> str:
        return (f"{where}: tensor {self.tensor} ({self.type_name}, {self.block_values} values a block) cannot be split "
                f"for --tensor-parallel-size {self.tp}: each row is {self.blocks} block(s), expected a multiple of "
                f"{self.tp} (vLLM would cut blocks apart and compute with wrong weights)")


def split_problems(plan: LoadPlan, tp: int, *, expert_parallel: bool = False) -> list[SplitProblem]:
    """Every row-parallel quantized tensor whose rows do not split into whole blocks at tensor-parallel size `tp`."""
    if tp <= 1:
        return []
    problems = []
    for t in plan.tensors:
        name = t.gguf_name
        if t.spec is None or t.spec.tp_split != TP_ROW:  # split along the packed row (the tensor table says which)
            continue
        is_expert = t.spec.base_role == ROLE_EXPERTS
        if is_expert and expert_parallel:
            continue
        type_name = t.vllm_type
        if type_name is None:
            continue
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0]  # 1 for float types
        row = t.info.shape[-1]
        if block > 1 and (row // block) % tp:
            problems.append(SplitProblem(name, type_name, row, block, tp, is_expert))
    return problems


def clean_tp_sizes(plan: LoadPlan, sizes=(1, 2, 4, 8), *, expert_parallel: bool = False) -> list[int]:
    return [tp for tp in sizes if not split_problems(plan, tp, expert_parallel=expert_parallel)]
