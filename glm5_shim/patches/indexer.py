"""The DSA indexer runs on the shim's Triton kernels where DeepGEMM cannot.

vLLM 0.23 computes the lightning indexer's logits with DeepGEMM, which runs only on compute capability 9.x/10.x
and needs a CUDA toolkit: without one, model construction stops ("Sparse Attention Indexer CUDA op requires
DeepGEMM"); with one on SM120/8.x, the first indexer call dies ("Unsupported architecture").

Targets (module globals, resolved at call time, so vLLM's op keeps its name, graph-splitting status and
``mutates_args``):
* ``vllm.model_executor.layers.sparse_attn_indexer``: ``fp8_fp4_mqa_logits`` (prefill) and
  ``fp8_fp4_paged_mqa_logits`` (decode) dispatch to glm5_shim.kernels.indexer_logits when the Triton path is
  chosen; ``has_deep_gemm`` reports True then, so the op can be built.
* ``vllm.v1.attention.backends.mla.indexer``: ``has_deep_gemm`` reports False then, so the decode metadata
  builder does not ask DeepGEMM for its schedule.
vLLM's own insert, gather and top-k ops stay.  The path is chosen once per process: Triton with
GLM5_SHIM_INDEXER=triton, or when the GPU is not 9.x/10.x, or when DeepGEMM is not importable.
"""
from __future__ import annotations

import functools

from glm5_shim import settings
from glm5_shim.registry import Patch, require

_SAI = "vllm.model_executor.layers.sparse_attn_indexer"
_IDX = "vllm.v1.attention.backends.mla.indexer"


def _uses_name(module, name: str) -> bool:
    import inspect

    return any(name in getattr(fn, "__code__", None).co_names
               for _, fn in inspect.getmembers(module, inspect.isfunction)
               if fn.__module__ == module.__name__ and getattr(fn, "__code__", None) is not None)


def _uses_name_in_classes(module, name: str) -> bool:
    import inspect

    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == module.__name__:
            for _, fn in inspect.getmembers(cls, inspect.isfunction):
                if name in fn.__code__.co_names:
                    return True
    return False


def _check(sai) -> None:
    import importlib

    for name in ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "has_deep_gemm"):
        require(callable(getattr(sai, name, None)), f"{_SAI}.{name} is missing")
        require(_uses_name(sai, name) or _uses_name_in_classes(sai, name),
                f"{_SAI} no longer calls {name} through its module global")
    idx = importlib.import_module(_IDX)
    require(callable(getattr(idx, "has_deep_gemm", None)), f"{_IDX}.has_deep_gemm is missing")
    import_utils = importlib.import_module("vllm.utils.import_utils")
    require(callable(getattr(import_utils, "has_deep_gemm", None)), "vllm.utils.import_utils.has_deep_gemm is missing")
    require(_uses_name_in_classes(idx, "get_paged_mqa_logits_metadata"),
            f"{_IDX} no longer asks DeepGEMM for the decode schedule through its module global")


@functools.lru_cache(maxsize=1)
def triton_indexer_reason() -> str | None:
    """Why this process uses the Triton indexer, or None when DeepGEMM runs.  Decided once per process."""
    if settings.indexer_choice() == "triton":
        return "forced by GLM5_SHIM_INDEXER=triton"
    from vllm.platforms import current_platform

    from glm5_shim.attention.selection import deepgemm_can_run

    capability = current_platform.get_device_capability()
    ok, why = deepgemm_can_run(None if capability is None else (capability.major, capability.minor))
    return None if ok else why


def _apply(sai, patch: Patch) -> None:
    import importlib

    from vllm.logger import init_logger

    logger = init_logger("vllm.glm5_shim.indexer")
    idx = importlib.import_module(_IDX)
    original_prefill, original_decode = sai.fp8_fp4_mqa_logits, sai.fp8_fp4_paged_mqa_logits
    import vllm.utils.import_utils as import_utils

    def original_has() -> bool:  # vLLM's own check (the name both modules import), looked up at call time
        return import_utils.has_deep_gemm()

    def _use_triton() -> bool:
        reason = triton_indexer_reason()
        if reason is not None:
            logger.info_once("glm5-shim: DSA indexer logits on Triton kernels (%s)", reason)
        return reason is not None

    def fp8_fp4_mqa_logits(*args, **kwargs):
        if _use_triton():
            from glm5_shim.kernels.indexer_logits import mqa_logits

            return mqa_logits(*args, **kwargs)
        return original_prefill(*args, **kwargs)

    def fp8_fp4_paged_mqa_logits(*args, **kwargs):
        if _use_triton():
            from glm5_shim.kernels.indexer_logits import paged_mqa_logits

            return paged_mqa_logits(*args, **kwargs)
        return original_decode(*args, **kwargs)

    def has_deep_gemm_for_op() -> bool:  # the op's constructor: the Triton path needs no DeepGEMM
        return True if _use_triton() else original_has()

    def has_deep_gemm_for_builder() -> bool:  # the decode builder: no DeepGEMM schedule for Triton kernels
        return False if _use_triton() else original_has()

    patch.replace(sai, "fp8_fp4_mqa_logits", fp8_fp4_mqa_logits)
    patch.replace(sai, "fp8_fp4_paged_mqa_logits", fp8_fp4_paged_mqa_logits)
    patch.replace(sai, "has_deep_gemm", has_deep_gemm_for_op)
    patch.replace(idx, "has_deep_gemm", has_deep_gemm_for_builder)


PATCHES = [
    Patch(
        name="indexer",
        target=_SAI,
        replaces=(f"{_SAI}:fp8_fp4_mqa_logits", f"{_SAI}:fp8_fp4_paged_mqa_logits", f"{_SAI}:has_deep_gemm",
                  f"{_IDX}:has_deep_gemm"),
        summary="DSA indexer logits on Triton where DeepGEMM cannot run (not 9.x/10.x, or no CUDA toolkit); "
                "GLM5_SHIM_INDEXER=triton forces it",
        check=_check,
        apply=_apply,
    )
]
