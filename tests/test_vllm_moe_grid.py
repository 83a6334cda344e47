"""tp-split-check's second rule: experts left on vLLM's GGUF MoE kernel must not get more routed tokens a step than
its launch grid takes (vLLM's vector MoE kernel puts tokens x top-k blocks on the grid's z axis, at most 65 535):
refused in the front end with one line instead of "CUDA error: invalid argument" in the engine's profile run."""
from __future__ import annotations

from types import SimpleNamespace

import gguf
import pytest

from glm5_shim.kernels.gguf.routing import vllm_moe_max_tokens
from glm5_shim.loading.config_checks import vllm_moe_grid_problem

T = gguf.GGMLQuantizationType


def test_the_limit_by_expert_types():
    assert vllm_moe_max_tokens(8, T.Q4_K, T.Q6_K) is None          # both on vLLM's tile kernel past 64 tokens
    assert vllm_moe_max_tokens(8, T.Q8_0, T.Q8_0) is None
    assert vllm_moe_max_tokens(8, T.IQ2_XXS, T.IQ2_S) == 8191       # 8 192 x 8 = 65 536: one too many
    assert vllm_moe_max_tokens(8, T.Q4_K, T.IQ4_XS) == 8191         # one vector-only type sends the MoE there
    assert vllm_moe_max_tokens(2, T.IQ2_XXS) == 32767


def _plan(gate_up: str, down: str):
    """The part of a load plan the rule reads (names, types, shapes, the tensor table's role, block and split): one
    MoE layer of 256 experts on GLM-5's hidden width 6144 with an intermediate width of 512, whole (as a file stores
    it; a rank of TP n gets 512 / n of down's K)."""
    from glm5_shim.gguf.tensor_map import ROLE_EXPERTS, ROLE_NORMAL, TP_COLUMN, TP_ROW

    def tensor(name, type_name, shape, role, split):
        return SimpleNamespace(gguf_name=name, vllm_type=type_name, info=SimpleNamespace(shape=shape),
                               spec=SimpleNamespace(base_role=role, layer=3, tp_split=split))

    tensors = [tensor(f"blk.3.ffn_{p}_exps.weight", t, s, ROLE_EXPERTS, split)
               for p, t, s, split in (("gate", gate_up, (256, 512, 6144), TP_COLUMN),
                                      ("up", gate_up, (256, 512, 6144), TP_COLUMN),
                                      ("down", down, (256, 6144, 512), TP_ROW))]
    # not an expert: never counted
    tensors.append(tensor("blk.3.attn_q_a.weight", "IQ2_XXS", (2048, 6144), ROLE_NORMAL, TP_COLUMN))
    return SimpleNamespace(tensors=tensors, model=SimpleNamespace(path="/models/GLM-5-UD-IQ2_M.gguf"))


def test_iq_experts_on_vllms_kernels_are_refused_past_the_grid(monkeypatch):
    monkeypatch.setenv("GLM5_SHIM_GGUF_KERNELS", "vllm")
    line = vllm_moe_grid_problem(_plan("IQ2_XXS", "IQ2_S"), 8192, 8)
    assert line == ("/models/GLM-5-UD-IQ2_M.gguf: the MoE of blk.3 runs on vLLM's GGUF kernels "
                    "(GLM5_SHIM_GGUF_KERNELS=vllm), and with blk.3.ffn_gate_exps.weight in IQ2_XXS on their vector "
                    "kernel, whose launch grid takes at most 65535 routed tokens a step, but --max-num-batched-tokens "
                    "8192 x 8 experts a token is 65536; pass --max-num-batched-tokens 8191 or less, or leave "
                    "GLM5_SHIM_GGUF_KERNELS unset for the shim's kernels")
    assert vllm_moe_grid_problem(_plan("IQ2_XXS", "IQ2_S"), 8191, 8) is None
    assert vllm_moe_grid_problem(_plan("Q4_K", "Q6_K"), 65536, 8) is None   # vLLM's tile kernel past 64 tokens
    # one vector-only type sends the whole MoE there: the line names that one, not the tile-type partner
    assert "with blk.3.ffn_down_exps.weight in IQ4_XS on their vector kernel" in \
        vllm_moe_grid_problem(_plan("Q4_K", "IQ4_XS"), 8192, 8)


@pytest.mark.parametrize("env", [None, "shim"])
def test_on_the_shims_kernels_nothing_is_limited(monkeypatch, env):
    if env is None:
        monkeypatch.delenv("GLM5_SHIM_GGUF_KERNELS", raising=False)
    else:
        monkeypatch.setenv("GLM5_SHIM_GGUF_KERNELS", env)
    assert vllm_moe_grid_problem(_plan("IQ2_XXS", "IQ2_S"), 65536, 8) is None
    assert vllm_moe_grid_problem(_plan("IQ2_XXS", "IQ2_S"), 65536, 8, tp=2) is None   # down's K 256 a rank


def test_moes_the_shim_hands_to_vllm_are_limited_too(monkeypatch):
    """float32 activations (vLLM's GGUF runs them, the shim's MoE does not), and a down projection whose per-rank
    width is no whole number of 256-value super-blocks (512 / TP 4 = 128: the shim's kernels do not take it)."""
    monkeypatch.delenv("GLM5_SHIM_GGUF_KERNELS", raising=False)
    line = vllm_moe_grid_problem(_plan("IQ2_XXS", "IQ2_S"), 8192, 8, acts_16bit=False)
    assert "(float32 activations: the shim's kernels take bf16 or fp16)" in line and line.endswith(
        "8191 or less, or serve in bfloat16")
    line = vllm_moe_grid_problem(_plan("IQ2_XXS", "Q8_0"), 8192, 8, tp=4)
    assert "(the shim's kernels do not cover blk.3.ffn_down_exps.weight (Q8_0))" in line
    assert "with blk.3.ffn_gate_exps.weight in IQ2_XXS on their vector kernel" in line and line.endswith("or less")
    assert vllm_moe_grid_problem(_plan("IQ2_XXS", "Q8_0"), 8192, 8, tp=4, expert_parallel=True) is None   # whole K
