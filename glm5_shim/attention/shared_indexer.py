"""GLM-5.2's shared-indexer layers in vLLM 0.23: no indexer weights and no indexer K cache where top-k is reused.

A "shared" layer (config.index_topk_pattern "S", vLLM's IndexCache) never calls its indexer: MultiHeadLatentAttention
skips it (skip_topk) and the layer's sparse attention reads the model's one top-k buffer, which the last full layer
wrote in the same forward pass.  vLLM 0.23 still builds a whole Indexer there: wq_b (replicated on every rank), the
fused wk + weights_proj, k_norm, and a DeepseekV32IndexerCache that takes 132 bytes of KV cache per token.  For
GLM-5.2 (57 of 78 layers shared) that is 7.5 GB of KV cache at 1M tokens per rank and weights a GGUF does not have.
SharedTopkIndexer stands in for it: what the attention layers read of an indexer (topk_tokens, topk_indices_buffer)
and nothing else.
"""
from __future__ import annotations

import torch


def layer_skips_topk(config, layer: int) -> bool:
    """vLLM 0.23's IndexCache rule (DeepseekV2MLAAttention.__init__): with index_topk_pattern, layer i skips when
    its letter is "S" (layers past the pattern run their own indexer); without it, when
    max(i - index_skip_topk_offset + 1, 0) is not a multiple of index_topk_freq (default 1: never)."""
    pattern = getattr(config, "index_topk_pattern", None)
    if pattern is not None:
        return 0 <= layer < len(pattern) and pattern[layer] == "S"
    freq = getattr(config, "index_topk_freq", 1)
    offset = getattr(config, "index_skip_topk_offset", 2)
    return max(layer - offset + 1, 0) % freq != 0


class SharedTopkIndexer(torch.nn.Module):
    """The indexer of a layer that reuses the previous full layer's top-k: no parameters, no cache, never called."""

    def __init__(self, config, topk_indices_buffer: torch.Tensor | None, prefix: str):
        super().__init__()
        self.topk_tokens = config.index_topk
        self.topk_indices_buffer = topk_indices_buffer
        self.prefix = prefix

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"glm5-shim: {self.prefix} belongs to a shared-indexer layer (it reuses the previous full "
                           f"layer's top-k) and must never run an indexer")

    def extra_repr(self) -> str:
        return f"shares the previous full layer's top-k ({self.topk_tokens} tokens)"
