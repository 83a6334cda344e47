"""Turn a glm-dsa load plan (glm5_shim.gguf.load_plan) into the (name, tensor) stream vLLM's DeepseekV2 model
consumes, and check afterwards that no parameter was left uninitialised.

Like vLLM's own GGUF iterator it yields every ``*.qweight_type`` first, then the data, so fused modules know their
types before their bytes arrive.  The members of a fused module arrive together, in shard order
(LoadPlan.stream_order).  Renames touch only the ``weight`` suffix (vLLM 0.23's ``str.replace`` also
rewrote ``weights_proj``).
"""
from __future__ import annotations

import os
import warnings
from typing import Iterator

import gguf
import numpy as np
import torch

from glm5_shim.gguf.dequant import dequantize
from glm5_shim.gguf.kv_b import check_kv_b, rebuild_kv_b
from glm5_shim.gguf.load_plan import LoadPlan
from glm5_shim.gguf.type_policy import DEQUANTIZE, FLOAT, KEEP, KV_B, REQUANTIZE, REQUANTIZE_TYPE, SKIP

_Q8_0 = gguf.GGMLQuantizationType[REQUANTIZE_TYPE]


def suffix_rename(name: str, new_suffix: str) -> str:
    if not name.endswith(".weight"):
        raise ValueError(f"{name}: only .weight tensors can be GGUF-quantized")
    return name[: -len("weight")] + new_suffix


def _raw(info) -> torch.Tensor:
    """The tensor's bytes as a view of the memory map, not a copy: vLLM's weight loaders narrow it to this rank's
    shard and copy that to the GPU, so at TP N a rank reads its 1/N of a row-split tensor's pages (before, every rank
    copied every tensor whole: a 400 GB file 8 times over at TP 8) and no rank holds a whole tensor in its memory.
    The map is read-only: a write into the view would fault at once, not corrupt the file (none happens: the CPU
    harness loads at TP 1, 2 and 8 run on these views)."""
    with warnings.catch_warnings():  # torch's warning that the array is not writable: it is not written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(info.data)


def _float(info) -> torch.Tensor:
    data = info.data
    if info.type_name == "BF16":
        arr = np.array(data).view(np.uint16)
        return torch.from_numpy(arr.reshape(info.shape)).view(torch.bfloat16)
    return torch.from_numpy(np.array(data).reshape(info.shape))


def _aliases(plan: LoadPlan) -> list[tuple[str, str]]:
    """(gguf tensor, extra HF name): a GGUF without output.weight shares token_embd with lm_head."""
    return [("token_embd.weight", "lm_head.weight")] if plan.tied_embeddings else []


def iter_weights(plan: LoadPlan, progress=None) -> Iterator[tuple[str, torch.Tensor]]:
    aliases = _aliases(plan)
    tensors = plan.stream_order()
    # pass 1: the GGML type of every weight that reaches vLLM quantized
    for t in tensors:
        names = [t.hf_name] + [hf for g, hf in aliases if g == t.gguf_name]
        if t.action == KEEP:
            for name in names:
                yield suffix_rename(name, "qweight_type"), torch.tensor(int(t.info.ggml_type))
        elif t.action == REQUANTIZE:
            yield suffix_rename(t.hf_name, "qweight_type"), torch.tensor(int(_Q8_0))
    # pass 2: the data
    kv_parts: dict[int, dict[str, np.ndarray]] = {}
    where = str(plan.model.path)
    for t in tensors:
        if progress is not None:
            progress.update(1)
        if t.action == SKIP:
            continue
        names = [t.hf_name] + [hf for g, hf in aliases if g == t.gguf_name]
        if t.action == KEEP:
            raw = _raw(t.info)
            for name in names:
                yield suffix_rename(name, "qweight"), raw
        elif t.action == FLOAT:
            value = _float(t.info)
            for name in names:
                yield name, value
        elif t.action == DEQUANTIZE:
            value = torch.from_numpy(dequantize(t.info))
            for name in names:
                yield name, value
        elif t.action == REQUANTIZE:
            q = gguf.quants.quantize(dequantize(t.info), _Q8_0)
            yield suffix_rename(t.hf_name, "qweight"), torch.from_numpy(np.ascontiguousarray(q))
        elif t.action == KV_B:
            layer = t.spec.layer
            part = t.gguf_name.rsplit(".", 2)[-2]  # attn_k_b / attn_v_b / attn_kv_b
            parts = kv_parts.setdefault(layer, {})
            parts[part] = dequantize(t.info)
            kv_b = None
            if "attn_kv_b" in parts:
                kv_b = check_kv_b(parts.pop("attn_kv_b"), plan.config, layer=layer, where=where)
            elif "attn_k_b" in parts and "attn_v_b" in parts:
                kv_b = rebuild_kv_b(parts.pop("attn_k_b"), parts.pop("attn_v_b"), plan.config, layer=layer,
                                    where=where)
            if kv_b is not None:  # plan_load already checked that every layer has its parts
                yield t.hf_name, torch.from_numpy(kv_b)
        else:  # pragma: no cover - the plan only produces the actions above
            raise AssertionError(t.action)


def count_steps(plan: LoadPlan) -> int:
    return len(plan.tensors)


# -- after loading ---------------------------------------------------------------------------------------------
# Parameters vLLM fills itself after loading (or that have no checkpoint counterpart).
_FILLED_BY_VLLM = ("rotary_emb.", "_k_scale", "_v_scale", "_q_scale", "_prob_scale", ".k_scale", ".v_scale",
                   ".q_scale")


def unloaded_parameters(model: torch.nn.Module, loaded: set[str] | None,
                        filled_elsewhere: tuple[str, ...] = ()) -> list[str]:
    """Parameters still uninitialised, or never written by the loader (when the loaded set is known).
    filled_elsewhere: name fragments of parameters something other than the checkpoint fills (the MTP draft's
    embedding and shared head, which vLLM's proposer takes from the target model)."""
    bad = []
    for name, param in model.named_parameters():
        if any(fragment in name for fragment in filled_elsewhere):
            continue
        if isinstance(param, torch.nn.parameter.UninitializedParameter):
            # vLLM's fused GGUF linears collect their shards in data_container and materialise the parameter
            # in process_weights_after_loading; filled containers are loaded.
            if not getattr(param, "data_container", None):
                bad.append(name)
        elif loaded is not None and name not in loaded and not any(m in name for m in _FILLED_BY_VLLM):
            bad.append(name)
    return bad


def check_all_loaded(model: torch.nn.Module, loaded: set[str] | None, source: str | os.PathLike,
                     filled_elsewhere: tuple[str, ...] = ()) -> None:
    bad = unloaded_parameters(model, loaded, filled_elsewhere)
    if bad:
        shown = ", ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
        raise RuntimeError(f"{source}: {len(bad)} model parameter(s) were not loaded from the GGUF, "
                           f"expected every parameter to be: {shown}")
