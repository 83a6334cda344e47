"""In float16 the MTP draft's decoder block keeps the scale vLLM's float16 path assumes.

Target: ``vllm.model_executor.models.deepseek_mtp.DeepSeekMultiTokenPredictorLayer.__init__``.  In float16 (what
``--dtype auto`` gives a GGUF on compute capability >= 10, the shim's main target) vLLM's DeepseekV2DecoderLayer
avoids overflow by carrying the residual stream divided by routed_scaling_factor: every layer divides its attention
output, the MoE its output (the shared expert's share; the routed part is left unscaled), the dense MLP its output,
and layer 0 alone divides the residual once (``if self.layer_idx == 0: residual *= 1.0 / ...``).  The MTP layer runs
one such decoder block, ``mtp_block``, built with the layer index num_hidden_layers: its residual (eh_proj's output)
is never divided while its attention and MoE outputs are, so in float16 the draft computes x + (attention + MoE) / 2.5
instead of x + attention + MoE (GLM-5's routed_scaling_factor is 2.5).  Drafts get worse, not wrong (the target
verifies them).  The replacement builds the layer, then gives its block the layer index 0, which that check is the
only reader of (the MoE and the indexer were built from the prefix already): the block then scales its residual like
the trunk's first layer, and its output is the true one divided by the factor, which hnorm (the next draft step) and
shared_head.norm ignore.  Only for the MTP draft of a glm-dsa GGUF; bfloat16 and float32 never read the index.
"""
from __future__ import annotations

import inspect

from glm5_shim.registry import Patch, require, require_attr, require_source

_TARGET = "vllm.model_executor.models.deepseek_mtp"


def _check(module) -> None:
    layer = require_attr(module, "DeepSeekMultiTokenPredictorLayer", _TARGET)
    require_attr(layer, "__init__", "DeepSeekMultiTokenPredictorLayer")
    require_source(require_attr(layer, "forward", "DeepSeekMultiTokenPredictorLayer"),
                   "DeepSeekMultiTokenPredictorLayer.forward", "self.mtp_block(", "residual=None",
                   why="it runs mtp_block from a fresh residual")
    block = require_attr(module, "DeepseekV2DecoderLayer", _TARGET)
    source = require_source(block, "DeepseekV2DecoderLayer", "if self.layer_idx == 0:",
                            "residual *= 1.0 / self.routed_scaling_factor",
                            why="it scales the float16 residual at layer 0")
    require(source.count("self.layer_idx") == 2,
            "DeepseekV2DecoderLayer reads self.layer_idx somewhere else than its float16 residual scaling")


def _apply(module, patch: Patch) -> None:
    from glm5_shim.loading.served import serves_glm_gguf

    cls = module.DeepSeekMultiTokenPredictorLayer
    stock_init = cls.__init__
    signature = inspect.signature(stock_init)

    def __init__(self, *args, **kwargs):
        stock_init(self, *args, **kwargs)
        if serves_glm_gguf(signature.bind(self, *args, **kwargs).arguments["vllm_config"], "draft"):
            self.mtp_block.layer_idx = 0

    patch.replace(cls, "__init__", __init__)


PATCHES = [
    Patch(
        name="mtp-fp16-residual",
        target=_TARGET,
        replaces=(f"{_TARGET}:DeepSeekMultiTokenPredictorLayer.__init__",),
        summary="float16 MTP draft of a glm-dsa GGUF: its decoder block scales the residual like vLLM's first layer "
                "(vLLM 0.23 divides only the block's outputs by routed_scaling_factor there)",
        check=_check,
        apply=_apply,
    ),
]
