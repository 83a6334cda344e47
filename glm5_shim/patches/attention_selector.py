"""vLLM picks the shim's sparse-MLA backend where it has no native one.

Targets:
* ``vllm.v1.attention.backends.registry`` — the shim's backend is registered in the ``CUSTOM`` slot, so
  ``--attention-backend CUSTOM`` names it and vLLM can resolve it in every process.
* ``vllm.platforms.cuda.CudaPlatformBase.get_attn_backend_cls`` — for a sparse MLA layer (GLM-5, DeepSeek-V3.2):
  with GLM5_SHIM_ATTENTION=triton, or when vLLM finds no valid backend ("No valid attention backend found" on
  SM120/121, SM8x, or with fp16 on 9.x/10.x), the shim's backend is returned after vLLM's own validation of it.
  Dense attention, an explicit ``--attention-backend``, and GPUs where a native sparse backend is valid are left
  to vLLM.
"""
from __future__ import annotations

from glm5_shim import settings
from glm5_shim.registry import Patch, require, require_attr, require_params

_NO_BACKEND = "No valid attention backend found"


def _check_registry(registry) -> None:
    enum = require_attr(registry, "AttentionBackendEnum", "vllm.v1.attention.backends.registry")
    require(hasattr(enum, "CUSTOM"), "AttentionBackendEnum has no CUSTOM member")
    require_params(require_attr(registry, "register_backend", "vllm.v1.attention.backends.registry"),
                   ("backend", "class_path"), "register_backend")


def _apply_registry(registry, patch: Patch) -> None:
    from glm5_shim.attention.selection import SHIM_BACKEND_PATH as BACKEND_PATH

    enum = registry.AttentionBackendEnum
    overrides = require_attr(registry, "_ATTN_OVERRIDES", "vllm.v1.attention.backends.registry")
    previous = overrides.get(enum.CUSTOM)
    if previous not in (None, BACKEND_PATH):
        raise RuntimeError(f"AttentionBackendEnum.CUSTOM is already taken by {previous}")
    patch.replace_item(overrides, enum.CUSTOM, BACKEND_PATH, set_with=registry.register_backend)


def _check_selector(cuda) -> None:
    base = require_attr(cuda, "CudaPlatformBase", "vllm.platforms.cuda")
    func = require_attr(base, "get_attn_backend_cls", "CudaPlatformBase")
    require_params(func, ("selected_backend", "attn_selector_config", "num_heads"),
                   "CudaPlatformBase.get_attn_backend_cls")
    require(isinstance(vars(base).get("get_attn_backend_cls"), classmethod),
            "CudaPlatformBase.get_attn_backend_cls is no longer a classmethod")


def _shim_backend(capability, attn_selector_config) -> str:
    from glm5_shim.attention.selection import SHIM_BACKEND_PATH as BACKEND_PATH
    from glm5_shim.attention.backend import Glm5SparseMLABackend

    reasons = Glm5SparseMLABackend.validate_configuration(device_capability=capability,
                                                          **attn_selector_config._asdict())
    if reasons:
        hint = ""
        if "kv_cache_dtype not supported" in reasons and str(attn_selector_config.kv_cache_dtype).startswith("fp8"):
            hint = " (for an fp8 KV cache pass --kv-cache-dtype fp8_ds_mla: 656 B a token, ~1.75x the tokens of bf16)"
        raise ValueError(f"glm5-shim's sparse MLA backend is not valid here: {', '.join(reasons)}{hint}; "
                         f"selector config {attn_selector_config}")
    return BACKEND_PATH


def _apply_selector(cuda, patch: Patch) -> None:
    from vllm.logger import init_logger
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    logger = init_logger("vllm.glm5_shim.attention")
    base = cuda.CudaPlatformBase
    original = base.get_attn_backend_cls.__func__

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        cfg = attn_selector_config
        if not (cfg.use_mla and cfg.use_sparse):
            return original(cls, selected_backend, attn_selector_config, num_heads)
        capability = cls.get_device_capability()
        if selected_backend == AttentionBackendEnum.CUSTOM or (
                selected_backend is None and settings.attention_choice() == "triton"):
            path = _shim_backend(capability, cfg)
            logger.info_once("glm5-shim: using the Triton sparse-MLA backend (%s)",
                             "forced by GLM5_SHIM_ATTENTION=triton" if selected_backend is None
                             else "--attention-backend CUSTOM")
            return path
        if selected_backend is not None:
            return original(cls, selected_backend, attn_selector_config, num_heads)
        try:
            return original(cls, selected_backend, attn_selector_config, num_heads)
        except ValueError as exc:
            if _NO_BACKEND not in str(exc):
                raise
            path = _shim_backend(capability, cfg)
            logger.info_once("glm5-shim: no native sparse-MLA backend is valid on compute capability %s "
                             "(dtype %s, kv cache %s); using the Triton sparse-MLA backend",
                             capability.as_version_str() if capability else "?", cfg.dtype, cfg.kv_cache_dtype)
            return path

    patch.replace(base, "get_attn_backend_cls", classmethod(get_attn_backend_cls))


PATCHES = [
    Patch(
        name="attention-backend-registry",
        target="vllm.v1.attention.backends.registry",
        replaces=("vllm.v1.attention.backends.registry:_ATTN_OVERRIDES[CUSTOM]",),
        summary="registers the shim's Triton sparse-MLA backend as --attention-backend CUSTOM",
        check=_check_registry,
        apply=_apply_registry,
    ),
    Patch(
        name="attention-selector",
        target="vllm.platforms.cuda",
        replaces=("vllm.platforms.cuda:CudaPlatformBase.get_attn_backend_cls",),
        summary="sparse MLA without a valid native backend (SM120/121, SM8x, fp16) uses the shim's Triton backend; "
                "GLM5_SHIM_ATTENTION=triton forces it",
        check=_check_selector,
        apply=_apply_selector,
    ),
]
