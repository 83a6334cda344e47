"""Which models of a vLLM config are GLM-5 GGUFs the shim serves: the one predicate every patch asks.

A model counts when vLLM built its config as GLM-5 (the target ``glm_moe_dsa``, the MTP draft ``deepseek_mtp``, as
the gguf-config and mtp-draft patches make them) *and* its file is a glm-dsa GGUF (its header, read once per file
version).  Any other model, GGUF or not, is vLLM's alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["target", "draft"]


@dataclass(frozen=True)
class ServedGGUF:
    role: Role
    model_config: Any     # vllm.config.ModelConfig
    parallel_config: Any  # the parallel config it runs at (the draft's own where vLLM gives it one)


def served_glm_ggufs(vllm_config) -> tuple[ServedGGUF, ...]:
    """The target model and its MTP draft (--speculative-config method mtp), each where it is a glm-dsa GGUF."""
    from glm5_shim.loading.hf_config import is_glm_dsa_gguf
    from glm5_shim.names import HF_MODEL_TYPE, HF_MTP_MODEL_TYPE

    parallel = getattr(vllm_config, "parallel_config", None)
    spec = getattr(vllm_config, "speculative_config", None)
    served = []
    for role, model_config, model_parallel, model_type in (
            ("target", getattr(vllm_config, "model_config", None), parallel, HF_MODEL_TYPE),
            ("draft", getattr(spec, "draft_model_config", None),
             getattr(spec, "draft_parallel_config", None) or parallel, HF_MTP_MODEL_TYPE)):
        if (getattr(getattr(model_config, "hf_config", None), "model_type", None) == model_type
                and getattr(model_config, "model", None) and is_glm_dsa_gguf(model_config.model)):
            served.append(ServedGGUF(role, model_config, model_parallel))
    return tuple(served)


def serves_glm_gguf(vllm_config, role: Role | None = None) -> bool:
    """Whether this config serves a glm-dsa GGUF (as ``role``, or as either)."""
    return any(role is None or s.role == role for s in served_glm_ggufs(vllm_config))
