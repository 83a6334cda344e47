"""Refuse, before any worker starts, a tensor-parallel size a glm-dsa GGUF cannot be split at, and a batch size
vLLM's own MoE kernel cannot launch for the file's expert types.

Target: ``vllm.engine.arg_utils:EngineArgs.create_engine_config``.  Every route (``vllm serve``, ``LLM(...)``,
``vllm bench``) builds its VllmConfig there, in the front-end process, before a worker exists or GPU memory is
touched.  The replacement calls vLLM's own method, then, for a glm-dsa GGUF only, checks that every row-parallel
quantized weight (the target's, and its MTP draft's when one is asked for) splits into whole blocks at the configured
tensor-parallel size, and that experts left on vLLM's GGUF MoE kernel (GLM5_SHIM_GGUF_KERNELS=vllm) do not get more
routed tokens a step than its launch grid takes: the checks are loading/config_checks.py's.
"""
from __future__ import annotations

from glm5_shim.registry import Patch, require_attr, require_params

_TARGET = "vllm.engine.arg_utils"


def _check(module) -> None:
    cls = require_attr(module, "EngineArgs", _TARGET)
    require_params(require_attr(cls, "create_engine_config", "EngineArgs"), ("self",),
                   "EngineArgs.create_engine_config")


def _apply(module, patch: Patch) -> None:
    cls = module.EngineArgs
    original = cls.create_engine_config

    from glm5_shim.loading.config_checks import check_tp_split, check_vllm_moe_grid

    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        check_tp_split(config)
        check_vllm_moe_grid(config)
        return config

    patch.replace(cls, "create_engine_config", create_engine_config)


PATCHES = [
    Patch(
        name="tp-split-check",
        target=_TARGET,
        replaces=(f"{_TARGET}:EngineArgs.create_engine_config",),
        summary="refuses a --tensor-parallel-size at which a glm-dsa GGUF's quantized row-parallel weights "
                "would be cut inside blocks (vLLM would load wrong weights silently), and a --max-num-batched-tokens "
                "vLLM's own MoE kernel cannot launch for experts left on it",
        check=_check,
        apply=_apply,
    ),
]
