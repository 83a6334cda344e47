"""What ``--dtype auto`` gives a GGUF with the shim: the rule doctor states and the dtype-auto patch applies.

vLLM 0.23 refuses bf16 activations for GGUF on compute capability >= 10 (its CUDA GGUF kernels round through fp16);
where the shim's own kernels run every quantized matmul of the file, that defect does not apply and GLM-5 keeps its
bfloat16 (fp16 can overflow on real activations).
"""
from __future__ import annotations

from glm5_shim import settings


def gguf_dtype_for_auto(capability: tuple[int, int], shim_runs_every_matmul: bool = False) -> str:
    """What --dtype auto gives a GGUF with the shim on this compute capability.  ``shim_runs_every_matmul``: the
    file's quantized matmuls all run on the shim's kernels (shim_runs_every_matmul(path))."""
    from glm5_shim.kernels.gguf.routing import gguf_bf16_refused_at

    if gguf_bf16_refused_at(capability) and not settings.allow_gguf_bf16() and not shim_runs_every_matmul:
        return "float16"
    return "bfloat16"


def shim_runs_every_matmul(model_id: str) -> bool:
    from glm5_shim.kernels.gguf.routing import every_matmul_on_shim_kernels

    return every_matmul_on_shim_kernels(str(model_id))
