"""GGUF and bfloat16 on compute capability >= 10.

vLLM 0.23 refuses bf16 activations for GGUF on capability >= 10 (``GGUFConfig.get_supported_act_dtypes``; its
CUDA GGUF kernels round through fp16 and produced garbage in bf16 on an RTX 5090), while ``--dtype auto`` resolves to
the model config's bfloat16 — so ``vllm serve x.gguf`` stops on every Blackwell GPU by default.

Two patches:
* ``dtype-auto`` wraps ``vllm.config.model._get_and_verify_dtype``: for a GGUF on such a GPU, ``--dtype auto``
  becomes float16 (one info line); an explicit ``--dtype bfloat16`` is refused there with a one-line error that
  names the way out, unless GLM5_SHIM_GGUF_BF16=1.
* ``dtype-gate`` wraps ``GGUFConfig.get_supported_act_dtypes`` so that GLM5_SHIM_GGUF_BF16=1 lets bf16 through.

Where the shim's own GGUF kernels run every quantized matmul of the file (``gguf-kernels``; inspect lists them),
vLLM's defect does not apply: ``--dtype auto`` keeps GLM-5's bfloat16 (fp16 can overflow on real activations), an
explicit bf16 is accepted, and the gate admits bf16 for that file in this process.  The rule itself, which doctor
states too: loading/gguf_dtype.py.
"""
from __future__ import annotations

from glm5_shim import settings
from glm5_shim.loading.gguf_dtype import shim_runs_every_matmul
from glm5_shim.registry import Patch, require_attr, require_params, require_names


# GGUF files this process accepted in bf16 on capability >= 10 because the shim's kernels run all their matmuls;
# the gate (checked later in the same process, by VllmConfig) admits bf16 for them.
_BF16_BY_SHIM_KERNELS: set[str] = set()


def gguf_bf16_refused_by_vllm() -> bool:
    """True where vLLM 0.23's gate refuses bf16 for GGUF: the current platform reports capability >= 10.0."""
    from vllm.platforms import current_platform

    from glm5_shim.kernels.gguf.routing import GGUF_BF16_GATE_CAPABILITY

    return bool(current_platform.has_device_capability(GGUF_BF16_GATE_CAPABILITY))


def _capability_str() -> str:
    from vllm.platforms import current_platform

    cap = current_platform.get_device_capability()
    return cap.as_version_str() if cap is not None else "unknown"


# -- dtype-auto ------------------------------------------------------------------------------------------------
def _check_model(model_module) -> None:
    func = require_attr(model_module, "_get_and_verify_dtype", "vllm.config.model")
    require_params(func, ("model_id", "config", "dtype"), "vllm.config.model._get_and_verify_dtype")
    model_config = require_attr(model_module, "ModelConfig", "vllm.config.model")
    post_init = require_attr(model_config, "__post_init__", "ModelConfig")
    require_names(post_init, "ModelConfig.__post_init__", "_get_and_verify_dtype", why="it resolves its dtype there")


def _apply_model(model_module, patch: Patch) -> None:
    import torch
    from vllm.logger import init_logger
    from vllm.transformers_utils.gguf_utils import is_gguf

    logger = init_logger("vllm.glm5_shim.dtype")
    original = model_module._get_and_verify_dtype

    def _get_and_verify_dtype(model_id, config, dtype, *args, **kwargs):
        requested = dtype.lower() if isinstance(dtype, str) else dtype
        if not is_gguf(model_id) or not gguf_bf16_refused_by_vllm() or settings.allow_gguf_bf16():
            return original(model_id, config, dtype, *args, **kwargs)
        covered = shim_runs_every_matmul(model_id)
        if requested == "auto":
            resolved = original(model_id, config, dtype, *args, **kwargs)
            if resolved == torch.bfloat16 and covered:
                _BF16_BY_SHIM_KERNELS.add(str(model_id))
                logger.info("glm5-shim: GGUF on compute capability %s: --dtype auto keeps bfloat16 (the shim's "
                            "kernels run every quantized matmul of this file)", _capability_str())
                return resolved
            if resolved == torch.bfloat16:
                logger.info("glm5-shim: GGUF on compute capability %s: --dtype auto resolves to float16 (some "
                            "quantized matmuls of this file run on vLLM's GGUF kernels, which vLLM 0.23 refuses "
                            "in bfloat16 there; python -m glm5_shim inspect lists them)", _capability_str())
                return original(model_id, config, "float16", *args, **kwargs)
            return resolved
        if requested in ("bfloat16", torch.bfloat16) and covered:
            _BF16_BY_SHIM_KERNELS.add(str(model_id))
            return original(model_id, config, dtype, *args, **kwargs)
        if requested in ("bfloat16", torch.bfloat16):
            raise ValueError(
                f"--dtype bfloat16 with a GGUF model ({model_id}) on compute capability {_capability_str()}: "
                "vLLM 0.23's GGUF kernels are refused in bfloat16 there; use --dtype float16 (what --dtype auto "
                "picks) or set GLM5_SHIM_GGUF_BF16=1 to force bfloat16")
        return original(model_id, config, dtype, *args, **kwargs)

    patch.replace(model_module, "_get_and_verify_dtype", _get_and_verify_dtype)


# -- dtype-gate ------------------------------------------------------------------------------------------------
def _check_gate(gguf_module) -> None:
    cls = require_attr(gguf_module, "GGUFConfig", "vllm.model_executor.layers.quantization.gguf")
    func = require_attr(cls, "get_supported_act_dtypes", "GGUFConfig")
    require_params(func, ("self",), "GGUFConfig.get_supported_act_dtypes")


def _apply_gate(gguf_module, patch: Patch) -> None:
    import torch

    cls = gguf_module.GGUFConfig
    original = cls.get_supported_act_dtypes

    def get_supported_act_dtypes(self):
        supported = list(original(self))
        if (settings.allow_gguf_bf16() or _BF16_BY_SHIM_KERNELS) and torch.bfloat16 not in supported:
            supported.insert(1, torch.bfloat16)
        return supported

    patch.replace(cls, "get_supported_act_dtypes", get_supported_act_dtypes)


PATCHES = [
    Patch(
        name="dtype-auto",
        target="vllm.config.model",
        replaces=("vllm.config.model:_get_and_verify_dtype",),
        summary="--dtype auto picks float16 for GGUF on compute capability >= 10 unless the shim's kernels run "
                "every quantized matmul of the file (then bfloat16); explicit bf16 otherwise needs "
                "GLM5_SHIM_GGUF_BF16=1",
        check=_check_model,
        apply=_apply_model,
    ),
    Patch(
        name="dtype-gate",
        target="vllm.model_executor.layers.quantization.gguf",
        replaces=("vllm.model_executor.layers.quantization.gguf:GGUFConfig.get_supported_act_dtypes",),
        summary="GLM5_SHIM_GGUF_BF16=1 admits bfloat16 through vLLM's GGUF dtype gate",
        check=_check_gate,
        apply=_apply_gate,
    ),
]
