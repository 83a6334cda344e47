"""GGUF matmuls on the shim's kernels: vLLM's GGUF linear and MoE calls go to ``glm5_shim/kernels/gguf/tiles.py``
in a process that serves a glm-dsa GGUF (GLM-5 or its MTP draft); any other GGUF keeps vLLM's own kernels.

Target: ``vllm.model_executor.layers.quantization.gguf``.  ``GGUFLinearMethod.apply`` and ``GGUFMoEMethod.apply``
call the module globals ``fused_mul_mat_gguf`` and ``fused_moe_gguf`` (vLLM's custom ops); both globals are
replaced with drop-ins that take the shim's custom op for the types it covers (``kernels/gguf/routing.py``) and
vLLM's op for the rest.  ``GGUFLinearMethod.apply`` is replaced too, so a merged linear's shards are read in place
instead of copied on every call.  ``GLM5_SHIM_GGUF_KERNELS=vllm`` leaves all three alone.
"""
from __future__ import annotations


from glm5_shim import settings
from glm5_shim.registry import Patch, TargetMismatch, require, require_attr, require_params, require_source

_TARGET = "vllm.model_executor.layers.quantization.gguf"


def _check(module) -> None:
    if settings.gguf_kernels_choice() == "vllm":
        raise TargetMismatch("GLM5_SHIM_GGUF_KERNELS=vllm: vLLM's ggml kernels are kept")
    for name in ("fused_mul_mat_gguf", "fused_moe_gguf"):
        require(callable(require_attr(module, name, _TARGET)), f"{_TARGET}.{name} is not callable")
    require_params(require_attr(module, "_fused_moe_gguf", _TARGET),
                   ("x", "w1", "w2", "topk_weights", "topk_ids", "qweight_type", "qweight_type2", "activation"),
                   "_fused_moe_gguf")
    require_params(require_attr(module, "_fused_mul_mat_gguf", _TARGET), ("x", "qweight", "qweight_type"),
                   "_fused_mul_mat_gguf")
    linear = require_attr(module, "GGUFLinearMethod", _TARGET)
    require_params(require_attr(linear, "apply", "GGUFLinearMethod"), ("self", "layer", "x", "bias"),
                   "GGUFLinearMethod.apply")
    # The premises: the methods call the module globals (so replacing them reroutes every call), and a merged
    # linear's shards are found by id in shard_offset_map with their type in shard_weight_type.
    require_source(linear.apply, "GGUFLinearMethod.apply", "fused_mul_mat_gguf(", "shard_offset_map[idx]",
                   "shard_weight_type[idx]", why="it calls fused_mul_mat_gguf per shard_offset_map entry")
    moe = require_attr(module, "GGUFMoEMethod", _TARGET)
    require_source(require_attr(moe, "apply", "GGUFMoEMethod"), "GGUFMoEMethod.apply", "fused_moe_gguf(",
                   why="it calls the module global fused_moe_gguf")


def _apply(module, patch: Patch) -> None:
    from glm5_shim.matmul import gguf_ops

    gguf_ops.register_ops()
    patch.replace(module, "fused_mul_mat_gguf", gguf_ops.make_fused_mul_mat(module.fused_mul_mat_gguf))
    patch.replace(module, "fused_moe_gguf", gguf_ops.make_fused_moe(module.fused_moe_gguf))
    linear = module.GGUFLinearMethod
    patch.replace(linear, "apply", gguf_ops.make_linear_apply(linear.apply))
    import gguf
    from vllm.logger import init_logger

    from glm5_shim import settings
    from glm5_shim.kernels.gguf.routing import (MMA_DECODE_TYPES, SHIM_KERNEL_TYPES, VLLM_LINEAR_ROWS_TEXT,
                                                mma_moe_rows_text)

    names = "/".join(gguf.GGMLQuantizationType(t).name for t in SHIM_KERNEL_TYPES)
    mma = "/".join(gguf.GGMLQuantizationType(t).name for t in MMA_DECODE_TYPES)
    decode = (f"decode-sized {mma} MoE products, up to {mma_moe_rows_text(MMA_DECODE_TYPES)} routed rows an expert, "
              "on the register-MMA kernels "
              "(GLM5_SHIM_GGUF_DECODE=tile for the tile kernels)" if settings.gguf_decode_choice() == "mma"
              else "decode on the tile kernels")
    init_logger("vllm.glm5_shim.gguf").info(
        "glm5-shim: a glm-dsa GGUF's matmuls of %s weights run on the shim's Triton kernels (%s; dense linears at "
        "%s and IQ MoE decode of up to 8-32 tokens on vLLM's vector kernels in fp16 or below compute capability 10; "
        "other types on vLLM's ggml kernels; GLM5_SHIM_GGUF_KERNELS=vllm for all on vLLM's); any other GGUF model "
        "keeps vLLM's kernels", names, decode,
        VLLM_LINEAR_ROWS_TEXT)


PATCHES = [
    Patch(
        name="gguf-kernels",
        target=_TARGET,
        replaces=(f"{_TARGET}:fused_mul_mat_gguf", f"{_TARGET}:fused_moe_gguf", f"{_TARGET}:GGUFLinearMethod.apply"),
        summary="a glm-dsa GGUF's linears and MoE experts of the K-quant, legacy and IQ types run on the shim's "
                "Triton kernels (weights read once per call, bf16 or fp16 activations); other types, and every "
                "other GGUF model, keep vLLM's ggml kernels",
        check=_check,
        apply=_apply,
    ),
]
