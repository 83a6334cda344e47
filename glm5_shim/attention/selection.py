"""What vLLM 0.23 would pick for GLM-5's attention and indexer on a given GPU, computed without touching the GPU.

GLM-5's attention is MLA (head size 576) with DSA sparsity.  Every dense MLA backend rejects ``use_sparse``, so
only the sparse backends matter: FLASHMLA_SPARSE (compute capability 9.x/10.x, bf16 only) and, on 10.x,
FLASHINFER_MLA_SPARSE.  The indexer needs DeepGEMM, which runs on 9.x/10.x only and needs a CUDA toolkit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GLM5_HEAD_SIZE = 576  # MLA: kv_lora 512 + rope 64, the one home of the number (the backend imports it)
# The shim's sparse-MLA backend, in the registry slot vLLM reserves for out-of-tree backends.  Kept here (a module
# that imports nothing at load) because the registry patch runs while vLLM's platform module is half-imported.
SHIM_BACKEND_NAME = "CUSTOM"
SHIM_BACKEND_PATH = "glm5_shim.attention.backend.Glm5SparseMLABackend"


@dataclass
class Choice:
    name: str | None  # None: vLLM would stop
    why: str
    rejected: dict[str, list[str]] = field(default_factory=dict)


def _selector_config(dtype, kv_cache_dtype: str):
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(head_size=GLM5_HEAD_SIZE, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                                   block_size=None, use_mla=True, use_sparse=True)


def native_sparse_mla(capability: tuple[int, int], dtype, kv_cache_dtype: str = "auto") -> Choice:
    """The native sparse-MLA backend vLLM 0.23 would select, or None with every rejection reason."""
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cfg = _selector_config(dtype, kv_cache_dtype)
    candidates = ["FLASHMLA_SPARSE"] + (["FLASHINFER_MLA_SPARSE"] if capability[0] == 10 else [])
    rejected: dict[str, list[str]] = {}
    for name in candidates:
        try:
            reasons = AttentionBackendEnum[name].get_class().validate_configuration(
                device_capability=DeviceCapability(*capability), **cfg._asdict())
        except Exception as exc:  # some backends cannot even be imported without a GPU
            reasons = [f"cannot be checked here ({type(exc).__name__})"]
        if not reasons:
            return Choice(name, f"vLLM's own choice on compute capability {capability[0]}.{capability[1]}")
        rejected[name] = list(reasons)
    return Choice(None, "no native sparse-MLA backend is valid", rejected)


def deepgemm_can_run(capability: tuple[int, int] | None) -> tuple[bool, str]:
    """Whether vLLM's DeepGEMM indexer runs here, and why not: the one rule doctor shows and the indexer patch
    follows (capability None: unknown, only the import is checked)."""
    if capability is not None and capability[0] not in (9, 10):
        return False, f"DeepGEMM runs on compute capability 9.x/10.x only (this is {capability[0]}.{capability[1]})"
    try:
        from vllm.utils.import_utils import has_deep_gemm

        if not has_deep_gemm():
            return False, "DeepGEMM is not importable (it needs a CUDA toolkit: CUDA_HOME or nvcc on PATH)"
    except Exception as exc:
        return False, f"DeepGEMM check failed: {type(exc).__name__}: {exc}"
    return True, "DeepGEMM available"
