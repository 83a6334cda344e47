"""The shim's GGUF kernels as vLLM custom ops, and the drop-ins vLLM's GGUF methods call.

Registered with vLLM's ``direct_register_custom_op`` (cheap dispatch; fake implementations for torch.compile), so
torch.compile and CUDA graphs capture them like vLLM's own ``_fused_mul_mat_gguf`` / ``_fused_moe_gguf``.  Each
drop-in takes the shim's op when :func:`glm5_shim.kernels.gguf.routing.shim_kernel_covers` says so for every
weight of the call and the activations are 16-bit CUDA tensors, and otherwise calls vLLM's op unchanged.
"""
from __future__ import annotations

import threading

import torch

from glm5_shim.kernels.gguf.routing import (VLLM_LINEAR_MAX_ROWS, file_type, gguf_bf16_refused_at, is_packed,
                                            shim_kernel_covers, vllm_decodes, vllm_moe_decode_faster)

_ACT_DTYPES = (torch.float16, torch.bfloat16)
_lock = threading.Lock()
_registered = False


def _linear_op(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int, n: int) -> torch.Tensor:
    from glm5_shim.kernels.gguf.tiles import gguf_linear, row_bytes

    if (x.shape[0] <= VLLM_LINEAR_MAX_ROWS and _vllm_vector_kernel_trusted(x)
            and vllm_decodes(qweight_type)):
        # inside the op: the row count is dynamic to torch.compile, a branch on it outside would specialise
        from vllm.model_executor.layers.quantization.gguf import _fused_mul_mat_gguf

        width = row_bytes(qweight_type, x.shape[-1])
        if qweight.shape[1] != width or not qweight.is_contiguous():
            qweight = qweight[:n, :width].contiguous()  # a padded shard view: vLLM's kernels need exact rows
        return _fused_mul_mat_gguf(x, qweight, qweight_type)
    # a weight repacked at load (loading/gguf_repack.py) is known by its type alone; vLLM's kernels never see it
    return gguf_linear(x, qweight, file_type(qweight_type), n, packed=is_packed(qweight_type))


def _linear_fake(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int, n: int) -> torch.Tensor:
    return torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)


def _vllm_vector_kernel_trusted(x: torch.Tensor) -> bool:
    """Never hand vLLM's ggml kernels bf16 where vLLM's own gate refuses it (gguf_bf16_refused_at)."""
    from glm5_shim.kernels.device import cuda_capability_and_sms

    return x.dtype == torch.float16 or not gguf_bf16_refused_at(cuda_capability_and_sms(x.device.index or 0)[0])


def _moe_op(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor, qtype13: int, qtype2: int) -> torch.Tensor:
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    from glm5_shim.kernels.gguf.tiles import gguf_moe

    if (vllm_moe_decode_faster(qtype13, x.shape[0], qtype2) and _vllm_vector_kernel_trusted(x)
            and vllm_decodes(qtype13, qtype2)):
        # inside the op, like the linear's row test: the token count is dynamic to torch.compile
        from vllm.model_executor.layers.quantization.gguf import _fused_moe_gguf

        return _fused_moe_gguf(x, w13, w2, topk_weights, topk_ids, qtype13, qtype2, "silu")
    return gguf_moe(x, w13, w2, topk_weights, topk_ids, file_type(qtype13), file_type(qtype2),
                    align=moe_align_block_size, packed13=is_packed(qtype13), packed2=is_packed(qtype2))


def _moe_fake(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, qtype13: int, qtype2: int) -> torch.Tensor:
    return torch.empty_like(x)


def register_ops() -> None:
    """torch.ops.vllm.glm5_gguf_linear / glm5_gguf_moe (once per process)."""
    global _registered
    with _lock:
        if _registered:
            return
        from vllm.utils.torch_utils import direct_register_custom_op

        # one implementation for every device type (vLLM would pick its platform's key: CUDA wherever a driver is
        # seen, even with the GPU hidden, and the interpreter tests call these ops on CPU tensors)
        for name, op, fake in (("glm5_gguf_linear", _linear_op, _linear_fake), ("glm5_gguf_moe", _moe_op, _moe_fake)):
            direct_register_custom_op(op_name=name, op_func=op, fake_impl=fake,
                                      dispatch_key="CompositeExplicitAutograd")
        _registered = True


# The shim's kernels serve a process's GGUF matmuls only once that process has loaded a glm-dsa GGUF (GLM-5 or its
# MTP draft; patches/gguf_loader.py marks it, before any forward): the kernels are tested and tuned on GLM-5's files
# and shapes, and the shim is active in every vLLM process of its environment, so any other GGUF served there keeps
# vLLM's own kernels, exactly as without the shim (issue #51).
_glm_gguf_loaded = False


def mark_glm_gguf_loaded() -> None:
    global _glm_gguf_loaded
    _glm_gguf_loaded = True


def glm_gguf_loaded() -> bool:
    return _glm_gguf_loaded


def _acts_ok(x: torch.Tensor) -> bool:
    return _glm_gguf_loaded and x.is_cuda and x.dtype in _ACT_DTYPES


def _refuse_packed(x: torch.Tensor, *qtypes: int) -> None:
    """A weight repacked at load can only be read by the shim's kernels: refuse what they do not take."""
    if any(is_packed(t) for t in qtypes):
        raise RuntimeError(f"glm5-shim: a GGUF weight repacked at load (types {[file_type(t) for t in qtypes]}) "
                           f"got {x.dtype} activations on {x.device}; the shim's kernels take float16/bfloat16 on "
                           "CUDA (set GLM5_SHIM_GGUF_PACK=0 to keep the file's layout)")


def make_fused_mul_mat(original):
    """Drop-in for vLLM's ``fused_mul_mat_gguf(x, qweight, qweight_type)``."""

    def fused_mul_mat_gguf(x: torch.Tensor, qweight: torch.Tensor, qweight_type: int) -> torch.Tensor:
        if _acts_ok(x) and shim_kernel_covers(qweight_type, x.shape[-1]):
            return torch.ops.vllm.glm5_gguf_linear(x, qweight, qweight_type, qweight.shape[0])
        _refuse_packed(x, qweight_type)
        return original(x, qweight, qweight_type)

    return fused_mul_mat_gguf


def make_fused_moe(original):
    """Drop-in for vLLM's ``fused_moe_gguf(x, w1, w2, topk_weights, topk_ids, type1, type2, activation)``."""

    def fused_moe_gguf(x, w1, w2, topk_weights, topk_ids, qweight_type, qweight_type2, activation):
        if (activation == "silu" and _acts_ok(x) and shim_kernel_covers(qweight_type, x.shape[-1])
                and shim_kernel_covers(qweight_type2, w1.shape[1] // 2)):
            return torch.ops.vllm.glm5_gguf_moe(x, w1, w2, topk_weights, topk_ids, qweight_type, qweight_type2)
        _refuse_packed(x, qweight_type, qweight_type2)
        return original(x, w1, w2, topk_weights, topk_ids, qweight_type, qweight_type2, activation)

    return fused_moe_gguf


def merged_linear_plan(layer) -> list[tuple[int, int, int]] | None:
    """(row start, row end, ggml type) runs of a merged GGUF linear (q_a+kv_a, gate+up) in output order, adjacent
    shards of one type joined into one run; None when it is not a merged quantized linear."""
    qweight = layer.qweight
    shard_id = getattr(qweight, "shard_id", None)
    offsets = getattr(qweight, "shard_offset_map", None)
    if not shard_id or not offsets:
        return None
    ids = ["q", "k", "v"] if "q" in shard_id else shard_id
    runs: list[tuple[int, int, int]] = []
    for idx in ids:
        start, end, _ = offsets[idx]
        qtype = int(layer.qweight_type.shard_weight_type[idx])
        if runs and runs[-1][1] == start and runs[-1][2] == qtype:
            runs[-1] = (runs[-1][0], end, qtype)
        else:
            runs.append((start, end, qtype))
    return runs


def make_linear_apply(original):
    """Drop-in for ``GGUFLinearMethod.apply``: a merged linear whose shards all run on the shim's kernels is
    computed on views of the padded weight (vLLM copies each shard with ``.contiguous()`` on every call), shards
    of one type in one launch; anything else goes to vLLM's apply."""

    def apply(self, layer, x, bias=None):
        if _acts_ok(x) and getattr(layer.qweight, "shard_id", None):
            runs = merged_linear_plan(layer)
            k = x.shape[-1]
            if runs and all(shim_kernel_covers(qtype, k) for _, _, qtype in runs):
                qweight = layer.qweight
                parts = [torch.ops.vllm.glm5_gguf_linear(x, qweight[start:end], qtype, end - start)
                         for start, end, qtype in runs]
                out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                if bias is not None:
                    out.add_(bias)
                return out
        return original(self, layer, x, bias)

    return apply
