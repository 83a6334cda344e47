"""Apply a GGUF merged linear's integer shards in shard order, whatever order their weights arrived in.

Target: ``vllm.model_executor.layers.quantization.gguf:GGUFLinearMethod.process_weights_after_loading``.  For a
quantized fused linear (q_a + kv_a, gate + up) vLLM 0.23's ``MergedColumnParallelLinear.weight_loader`` appends
each shard's id to ``qweight.shard_id`` in arrival order, and ``GGUFLinearMethod.apply`` concatenates the shards'
outputs in that list's order (only "q", "k", "v" ids are re-sorted).  llama.cpp's converter writes a block's
tensors in sorted HF-name order (``attn_kv_a_mqa`` before ``attn_q_a``), so a loader that yields tensors in file
order gets ``[kv_a | q_a]`` where the model splits ``[q_a | kv_a]``: wrong answers, silently.  The shim's own
loader yields fused members in shard order; this patch makes the order right for any caller.  Shard offsets are
looked up by id, so sorting the id list changes nothing else.  Float shards are copied by offset and are safe.
"""
from __future__ import annotations


from glm5_shim.registry import Patch, require_attr, require_params, require_source

_TARGET = "vllm.model_executor.layers.quantization.gguf"


def sort_integer_shard_ids(qweight) -> bool:
    """Put an all-integer ``shard_id`` list in ascending order in place; True when it was out of order."""
    ids = getattr(qweight, "shard_id", None)
    if not ids or not all(isinstance(i, int) for i in ids) or ids == sorted(ids):
        return False
    ids.sort()
    return True


def _check(module) -> None:
    cls = require_attr(module, "GGUFLinearMethod", _TARGET)
    require_params(require_attr(cls, "process_weights_after_loading", "GGUFLinearMethod"), ("self", "layer"),
                   "GGUFLinearMethod.process_weights_after_loading")
    # The premise: apply() walks qweight.shard_id and finds each shard by id in shard_offset_map.
    require_source(require_attr(cls, "apply", "GGUFLinearMethod"), "GGUFLinearMethod.apply",
                   "layer.qweight.shard_id", "shard_offset_map[idx]", why="it reads the shards through them")


def _apply(module, patch: Patch) -> None:
    cls = module.GGUFLinearMethod
    original = cls.process_weights_after_loading
    reported = []

    def process_weights_after_loading(self, layer):
        if sort_integer_shard_ids(getattr(layer, "qweight", None)) and not reported:
            reported.append(True)
            from vllm.logger import init_logger

            init_logger("vllm.glm5_shim.gguf").info(
                "glm5-shim: GGUF shards of a fused linear arrived out of shard order (file order); "
                "they are applied in shard order")
        return original(self, layer)

    patch.replace(cls, "process_weights_after_loading", process_weights_after_loading)


PATCHES = [
    Patch(
        name="gguf-shard-order",
        target=_TARGET,
        replaces=(f"{_TARGET}:GGUFLinearMethod.process_weights_after_loading",),
        summary="quantized fused linears (q_a+kv_a, gate+up) apply their shards in shard order, not in the "
                "order the file listed them (llama.cpp writes kv_a before q_a)",
        check=_check,
        apply=_apply,
    ),
]
