"""GLM-5.2's shared-indexer layers get no indexer weights and no indexer K cache (glm5_shim.attention.shared_indexer).

Target: ``vllm.model_executor.models.deepseek_v2``.  ``DeepseekV2MLAAttention.__init__`` builds ``Indexer(...)`` in
every layer, then decides from the config's IndexCache fields (index_topk_pattern / index_topk_freq /
index_skip_topk_offset) whether the layer skips its top-k.  The module's ``Indexer`` name becomes a subclass of vLLM's
whose construction returns SharedTopkIndexer for the layers that skip, for glm-dsa GGUFs (whose loader leaves those
layers' indexer tensors out; a checkpoint that carries them would have nowhere to put them); every other layer and
model gets vLLM's Indexer, and ``isinstance(x, Indexer)`` keeps its meaning.  ``DeepseekV2MLAAttention.__init__``
is wrapped to check, layer by layer, that the stand-in sits exactly where vLLM skips the indexer: a mismatch stops
start-up.
"""
from __future__ import annotations

import inspect

from glm5_shim.registry import Patch, require_attr, require_params, require_source

_TARGET = "vllm.model_executor.models.deepseek_v2"


def _check(module) -> None:
    indexer = require_attr(module, "Indexer", _TARGET)
    require_params(indexer.__init__, ("self", "vllm_config", "config", "hidden_size", "q_lora_rank", "quant_config",
                                      "cache_config", "topk_indices_buffer", "prefix"), "Indexer.__init__")
    attention = require_attr(module, "DeepseekV2MLAAttention", _TARGET)
    # The premise: the indexer is built through the module-level name, and the skip flag comes from these fields.
    require_source(attention.__init__, "DeepseekV2MLAAttention.__init__", "Indexer(", "index_topk_pattern",
                   "index_topk_freq", "index_skip_topk_offset", "skip_topk=_skip_topk")
    require_attr(module, "extract_layer_index", _TARGET)


def _apply(module, patch: Patch) -> None:
    from glm5_shim.attention.shared_indexer import SharedTopkIndexer, layer_skips_topk
    from glm5_shim.loading.served import serves_glm_gguf

    stock_indexer = module.Indexer
    signature = inspect.signature(stock_indexer.__init__)
    reported = []

    class Indexer(stock_indexer):
        """vLLM's Indexer; a glm-dsa GGUF's layer that reuses the previous full layer's top-k gets
        SharedTopkIndexer instead (returned by __new__: Python then skips __init__)."""

        def __new__(cls, *args, **kwargs):
            if not args and not kwargs:  # copy / unpickle: object.__new__, its state follows
                return super().__new__(cls)
            bound = signature.bind(None, *args, **kwargs)
            config, prefix = bound.arguments["config"], bound.arguments.get("prefix", "")
            # the config's rule first: the file's header is read only for a layer that would skip
            if (layer_skips_topk(config, module.extract_layer_index(prefix))
                    and serves_glm_gguf(bound.arguments["vllm_config"])):
                if not reported:
                    reported.append(True)
                    from vllm.logger import init_logger

                    pattern = getattr(config, "index_topk_pattern", "")
                    init_logger("vllm.glm5_shim.indexer").info(
                        "glm5-shim: %d of %d layers share the previous full layer's DSA top-k (%s): no indexer "
                        "weights or indexer KV cache there", str(pattern).count("S"), len(pattern), pattern)
                return SharedTopkIndexer(config, bound.arguments["topk_indices_buffer"], prefix)
            return super().__new__(cls)

    Indexer.__qualname__, Indexer.__module__ = stock_indexer.__qualname__, stock_indexer.__module__
    Indexer.stock = stock_indexer
    patch.replace(module, "Indexer", Indexer)

    attention = module.DeepseekV2MLAAttention
    stock_init = attention.__init__
    init_signature = inspect.signature(stock_init)

    def __init__(self, *args, **kwargs):
        stock_init(self, *args, **kwargs)
        indexer = getattr(self, "indexer", None)
        if indexer is None:
            return
        vllm_config = init_signature.bind(self, *args, **kwargs).arguments["vllm_config"]
        shared = isinstance(indexer, SharedTopkIndexer)
        skips = bool(getattr(self.mla_attn, "skip_topk", False))
        if shared != skips and (shared or serves_glm_gguf(vllm_config)):
            raise RuntimeError(f"glm5-shim: {getattr(indexer, 'prefix', 'an attention layer')}: vLLM "
                               f"{'skips' if skips else 'runs'} this layer's DSA indexer but the shim built "
                               f"{'no' if shared else 'an'} indexer for it; refusing to start")

    patch.replace(attention, "__init__", __init__)


PATCHES = [
    Patch(
        name="shared-indexer",
        target=_TARGET,
        replaces=(f"{_TARGET}:Indexer", f"{_TARGET}:DeepseekV2MLAAttention.__init__"),
        summary="GLM-5.2 GGUFs: layers that reuse the previous full layer's DSA top-k get no indexer weights and no "
                "indexer KV cache (vLLM 0.23 builds both in every layer)",
        check=_check,
        apply=_apply,
    ),
]
