"""Q8_0, Q6_K, IQ2_XXS and IQ2_S weights repacked once after loading, so the shim's kernels read their codes in
aligned loads.

The file's Q8_0 (34-byte), Q6_K (210-byte), IQ2_XXS (66-byte) and IQ2_S (82-byte) blocks are only 2-byte aligned;
``kernels/gguf_mma.pack`` moves the same bytes into a layout whose code bytes are 16-byte (IQ2: 8-byte) aligned,
IQ2_XXS's sign words re-encoded on the way (bit-equal products; the measurements are in
``kernels/gguf/routing.LOAD_PACKED_TYPES``).  A repacked weight's type becomes ``packed_type(type)`` in its layer
(``qweight_type.weight_type``, a merged linear's ``shard_weight_type``, a MoE's ``w13_qweight_type`` /
``w2_qweight_type``): vLLM's GGUF methods pass that type to the shim's drop-ins, which read the weight packed and
never hand it to vLLM's kernels.

Only where the shim's kernels compute GGUF matmuls (``GLM5_SHIM_GGUF_KERNELS=shim``, the gguf-kernels patch
applied) and ``GLM5_SHIM_GGUF_PACK`` is on; linears (lm_head included) and experts only: an embedding lookup is
vLLM's and reads the file's layout.  In place where the packed rows are as long as the file's (every Q8_0 weight;
Q6_K at K a multiple of 2048, IQ2_XXS of 1024, IQ2_S of 1024), otherwise (rows padded to 16 or 8 bytes: a TP-8
expert's w2) into a new tensor a
weight at a time: peak memory is the weights plus the largest repacked weight (one layer's experts).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from glm5_shim.kernels.gguf.routing import is_packed, packed_type, packs_at_load

# experts repacked a slice at a time: the scratch pack() makes stays below this
_EXPERT_CHUNK_BYTES = 256 << 20


@dataclass
class RepackTally:
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    by_type: dict[str, int] = field(default_factory=dict)

    def add(self, qtype: int, nbytes: int) -> None:
        import gguf

        self.tensors += 1
        self.bytes += nbytes
        name = gguf.GGMLQuantizationType(qtype).name
        self.by_type[name] = self.by_type.get(name, 0) + 1

    def summary(self) -> str:
        types = ", ".join(f"{n} {name}" for name, n in sorted(self.by_type.items()))
        return (f"repacked {self.tensors} GGUF weights ({types}; {self.bytes / 2**30:.2f} GiB) for aligned code "
                f"loads in {self.seconds:.2f} s (GLM5_SHIM_GGUF_PACK=0 keeps the file's layout)")


def packing_enabled() -> bool:
    """GLM5_SHIM_GGUF_PACK on, and vLLM's GGUF matmuls routed to the shim's drop-ins (which alone read the packed
    layout): checked on the module, not assumed from the settings, so a patch that did not apply means no repack."""
    from glm5_shim import settings
    from glm5_shim.registry import MARKER

    if not settings.gguf_pack() or settings.gguf_kernels_choice() != "shim":
        return False
    import vllm.model_executor.layers.quantization.gguf as vllm_gguf

    return all(getattr(getattr(vllm_gguf, name, None), MARKER, None) == "gguf-kernels"
               for name in ("fused_mul_mat_gguf", "fused_moe_gguf"))


def repack_model(model: torch.nn.Module, device_types: tuple[str, ...] = ("cuda",)) -> RepackTally:
    """Repack every eligible GGUF linear and expert weight of ``model`` (see the module docstring) that lives on a
    device of ``device_types`` (the shim's kernels read GPU weights; the tests repack CPU ones)."""
    from vllm.model_executor.layers.quantization.gguf import GGUFLinearMethod, GGUFMoEMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    tally = RepackTally()
    start = time.perf_counter()
    seen: set[int] = set()
    for _, module in model.named_modules():
        if id(module) in seen:
            continue
        seen.add(id(module))
        method = getattr(module, "quant_method", None)
        if not any(_loaded(p) and p.device.type in device_types for p in module.parameters(recurse=False)):
            continue
        if isinstance(method, GGUFMoEMethod):
            repack_experts(module, tally)
        elif isinstance(method, GGUFLinearMethod):
            if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead):
                continue   # embedding lookups are vLLM's apply_gguf_embedding: the file's layout
            repack_linear(module, tally)
    if tally.tensors and torch.cuda.is_available():
        torch.cuda.synchronize()
    tally.seconds = time.perf_counter() - start
    return tally


def _loaded(param) -> bool:
    return isinstance(param, torch.Tensor) and not isinstance(param, torch.nn.parameter.UninitializedParameter) \
        and param.dtype == torch.uint8 and param.numel() > 0


def _k_of(row_bytes: int, qtype: int) -> int:
    import gguf

    values, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return row_bytes // nbytes * values


def repack_linear(layer: torch.nn.Module, tally: RepackTally) -> None:
    """A GGUF linear's qweight: a single weight, or a merged one's shards (rows [start, end), their own row bytes
    within the padded width; packed in place where the packed row is as long, else left in the file's layout)."""
    from glm5_shim.kernels.gguf.register_mma import aligned, pack, packed_row_bytes

    qweight, qtype_param = getattr(layer, "qweight", None), getattr(layer, "qweight_type", None)
    if not _loaded(qweight) or qtype_param is None:
        return
    shard_ids = getattr(qweight, "shard_id", None)
    if shard_ids:
        offsets = getattr(qweight, "shard_offset_map", None)
        types = getattr(qtype_param, "shard_weight_type", None)
        if not offsets or types is None:
            return   # one container, no padded weight: vLLM's apply reads it unmerged; left as it is
        for idx, (start, end, width) in offsets.items():
            qtype = types.get(idx)
            if qtype is None or is_packed(qtype):
                continue
            k = _k_of(width, qtype)
            if not packs_at_load(qtype, k) or packed_row_bytes(qtype, k) != width:
                continue
            rows = qweight.data[start:end, :width]
            if not aligned(rows, qtype, packed=True):   # where the packed layout's loads need its rows
                continue
            rows.copy_(pack(rows.contiguous(), qtype))
            types[idx] = packed_type(qtype)
            tally.add(qtype, rows.numel())
        return
    qtype = getattr(qtype_param, "weight_type", None)
    if qtype is None or is_packed(qtype):
        return
    k = _k_of(qweight.shape[-1], qtype)
    if qweight.dim() != 2 or not packs_at_load(qtype, k) or qweight.shape[-1] != _file_row_bytes(qtype, k):
        return
    qweight.data = _packed_copy(qweight.data, qtype, k)
    qtype_param.weight_type = packed_type(qtype)
    tally.add(qtype, qweight.numel())


def repack_experts(layer: torch.nn.Module, tally: RepackTally) -> None:
    """A GGUF MoE's w13 [E, 2I, row bytes of H] and w2 [E, H, row bytes of I], each whole or not at all."""
    for name in ("w13", "w2"):
        weight, qtype_param = getattr(layer, f"{name}_qweight", None), getattr(layer, f"{name}_qweight_type", None)
        if not _loaded(weight) or qtype_param is None or weight.dim() != 3:
            continue
        qtype = getattr(qtype_param, "weight_type", None)
        if qtype is None or is_packed(qtype):
            continue
        k = _k_of(weight.shape[-1], qtype)
        if not packs_at_load(qtype, k) or weight.shape[-1] != _file_row_bytes(qtype, k):
            continue
        weight.data = _packed_copy(weight.data, qtype, k)
        qtype_param.weight_type = packed_type(qtype)
        tally.add(qtype, weight.numel())


def _file_row_bytes(qtype: int, k: int) -> int:
    import gguf

    values, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return k // values * nbytes


def _packed_copy(w: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """w in its packed layout: in place when the row length stays, else a new tensor filled a slice at a time
    (w's leading dimension: experts or rows)."""
    from glm5_shim.kernels.gguf.register_mma import pack, packed_row_bytes

    width = packed_row_bytes(qtype, k)
    out = w if width == w.shape[-1] else torch.empty(*w.shape[:-1], width, dtype=w.dtype, device=w.device)
    per = max(1, _EXPERT_CHUNK_BYTES // max(1, w[0].numel()))
    for i in range(0, w.shape[0], per):
        out[i:i + per].copy_(pack(w[i:i + per].contiguous(), qtype))
    return out
