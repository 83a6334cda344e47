"""The shim's sparse-MLA attention backend for vLLM 0.23 (registered as ``CUSTOM``).

Built on vLLM's own base classes: ``AttentionBackend`` (what the selector validates), an
``AttentionMetadataBuilder`` (per step: which request each token belongs to, the block table) and a
``SparseMLAAttentionImpl`` (vLLM's MLA layer absorbs W_UK before calling ``forward_mqa`` and applies W_UV after).
The work is two Triton kernels from glm5_shim.kernels: request-local top-k positions → global slots, then split-K
sparse attention over the paged latent cache (bf16/fp16, or ``fp8_ds_mla``: 656 B a token, written by vLLM's own
``concat_and_cache_mla``).

CUDA graphs: the builder declares UNIFORM_BATCH — decode steps run as FULL graphs (every launch depends only on
the padded token count; persistent buffers; no host sync), mixed prefill/decode batches run PIECEWISE.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from vllm.config import VllmConfig
from vllm.config.cache import CacheDType
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    SparseMLAAttentionImpl,
)
from vllm.v1.kv_cache_interface import AttentionSpec

from glm5_shim.attention.selection import GLM5_HEAD_SIZE as HEAD_SIZE
from glm5_shim.attention.selection import SHIM_BACKEND_NAME as BACKEND_NAME
from glm5_shim.kernels.index_convert import convert_to_global_slots
from glm5_shim.kernels.sparse_mla import sparse_mla_attention
FP8_DS_MLA_BYTES = 656  # 512 e4m3 + 4 fp32 scales + 64 rope values in the model's 16-bit dtype
MIN_CAPABILITY = (8, 0)


class Glm5SparseMLABackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto", "float16", "bfloat16", "fp8_ds_mla"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_metadata_cls() -> type["Glm5SparseMLAMetadata"]:
        return Glm5SparseMLAMetadata

    @staticmethod
    def get_builder_cls() -> type["Glm5SparseMLAMetadataBuilder"]:
        return Glm5SparseMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["Glm5SparseMLAImpl"]:
        return Glm5SparseMLAImpl

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [64]  # the DSA indexer's cache uses 64-token blocks; both caches share the block table

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [HEAD_SIZE]

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return (capability.major, capability.minor) >= MIN_CAPABILITY

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if cache_dtype_str == "fp8_ds_mla":
            return (num_blocks, block_size, FP8_DS_MLA_BYTES)
        return (num_blocks, block_size, head_size)


@dataclass
class Glm5SparseMLAMetadata(AttentionMetadata):
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    req_id_per_token: torch.Tensor
    block_size: int = 64
    topk_tokens: int = 2048


class Glm5SparseMLAMetadataBuilder(AttentionMetadataBuilder[Glm5SparseMLAMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.kv_cache_spec = kv_cache_spec
        self.topk_tokens = vllm_config.model_config.hf_config.index_topk
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        # persistent, so that a captured graph keeps reading the same addresses
        self.req_id_per_token = torch.zeros((max_tokens,), dtype=torch.int32, device=device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> Glm5SparseMLAMetadata:
        cm = common_attn_metadata
        num_tokens = cm.num_actual_tokens
        starts = np.asarray(cm.query_start_loc_cpu, dtype=np.int64)
        req_ids = torch.from_numpy(np.repeat(np.arange(len(starts) - 1, dtype=np.int32), np.diff(starts)))
        # pageable source: the copy is staged before build returns, so the next step cannot overwrite it early
        self.req_id_per_token[: len(req_ids)].copy_(req_ids, non_blocking=True)
        self.req_id_per_token[len(req_ids):].zero_()  # padded tokens: request 0, and their top-k rows are all -1
        return Glm5SparseMLAMetadata(
            num_reqs=cm.num_reqs, max_query_len=cm.max_query_len, max_seq_len=cm.max_seq_len,
            num_actual_tokens=num_tokens, query_start_loc=cm.query_start_loc, slot_mapping=cm.slot_mapping,
            block_table=cm.block_table_tensor, req_id_per_token=self.req_id_per_token[:num_tokens],
            block_size=self.kv_cache_spec.block_size, topk_tokens=self.topk_tokens)


class Glm5SparseMLAImpl(SparseMLAAttentionImpl[Glm5SparseMLAMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 topk_indice_buffer: torch.Tensor | None = None, indexer=None, **mla_args) -> None:
        unsupported = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                       "logits_soft_cap": logits_soft_cap}
        for name, value in unsupported.items():
            if value is not None:
                raise NotImplementedError(f"glm5-shim sparse MLA: {name} is not supported (got {value!r})")
        if kv_cache_dtype not in ("auto", "float16", "bfloat16", "fp8_ds_mla"):
            raise ValueError(f"glm5-shim sparse MLA: --kv-cache-dtype {kv_cache_dtype} is not supported; "
                             "use auto (bf16/fp16 latent) or fp8_ds_mla (656 B a token, ~1.75x the tokens)")
        if indexer is None or getattr(indexer, "topk_indices_buffer", None) is None:
            raise ValueError("glm5-shim sparse MLA needs the DSA indexer's top-k buffer (a DeepSeek-V3.2/GLM-5 model)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_format = "fp8_ds_mla" if kv_cache_dtype == "fp8_ds_mla" else "bf16"
        self.kv_lora_rank: int = mla_args["kv_lora_rank"]
        self.topk_indices_buffer: torch.Tensor = indexer.topk_indices_buffer

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: Glm5SparseMLAMetadata,
                    layer: AttentionLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        num_tokens = (q[0] if isinstance(q, tuple) else q).shape[0]
        positions = self.topk_indices_buffer[:num_tokens]
        slots = convert_to_global_slots(positions, attn_metadata.req_id_per_token[:num_tokens],
                                        attn_metadata.block_table, attn_metadata.block_size)
        out, _ = sparse_mla_attention(q, kv_c_and_k_pe_cache, slots, self.scale, kv_format=self.kv_format)
        return out, None
