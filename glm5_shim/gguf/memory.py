"""How long a context fits: GPU memory per tensor-parallel rank of a GLM-5 / 5.1 / 5.2 model served by vLLM 0.23.0
with the shim, as a function of --max-model-len L.  Pure Python (no vLLM or torch import), so inspect and doctor can
answer before any GPU memory is taken.

Per rank (MLA keeps one latent per token, replicated on every TP rank; the DSA indexer is replicated too, so every
term below is the same at TP 1, 2, 4 and 8; only the weights shrink with TP):

  KV cache, L tokens  (block-rounded: ceil(L / 64) blocks of 64 tokens)
    MLA latent in EVERY trunk layer: bf16/fp16 (kv_lora + rope) x 2 = 1152 B, or fp8_ds_mla 656 B;
    DSA indexer keys, 128 e4m3 bytes + a 4-byte scale = 132 B: with the shim only in the layers that run their own
    indexer (GLM-5.2: 21 of 78; glm5_shim.patches.shared_indexer), with stock vLLM in every layer.
    The MTP block is not loaded by the shim today: no KV cache, no top-k buffer for it.
  grows with L
    indexer prefill K-gather workspace  40 L tokens x 132 B (+ the 1 MiB radix top-k workspace); one buffer per
                                        rank (vLLM's workspace manager), shared with FlashMLA-sparse's workspace on
                                        the native fp8_ds_mla path: the larger of the two is kept
    indexer decode logits               fp32 [decode tokens, L]: 4 L bytes a decode token, for max_num_seqs decode
                                        tokens run outside CUDA graphs (mixed batches, batches past the largest
                                        graph) plus the largest FULL decode graph's batch, whose copy stays in the
                                        CUDA-graph pool
    indexer expanded block table        max_num_batched_tokens x ceil(L / 64) x 4 B
    block table                         max_num_seqs x ceil(L / 64) x 4 B
    FlashMLA-sparse prefill workspace   5 L x 576 x 2 B, only vLLM's native FlashMLA-sparse with fp8_ds_mla (the
                                        shim's Triton backend has none: its split-K workspace follows the batch)
  fixed (not L)
    rope cos/sin cache                  max_position_embeddings x rope dim x 2 B, one per distinct rope (the shim's
                                        config makes the main and the indexer rope the same one)
    top-k index buffer                  max_num_batched_tokens x index_topk x 4 B
  plus the weights (inspect.weight_bytes_per_gpu) and a reserve for activations, the L-independent part of CUDA
  graphs, the CUDA context and NCCL (an assumption: DEFAULT_RESERVE_BYTES, a parameter).

Everything is counted inside gpu_memory_utilization x GPU memory.  That is conservative: vLLM itself counts the KV
cache, the weights, the workspace and the CUDA-graph pool there, but the block tables, the expanded block table and
the eager decode logits come later and can also use the (1 - utilization) headroom.  A smaller --max-num-seqs buys
context: each decode token less frees 4 B per token of context.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .config import layer_shares_topk

GIB = 1 << 30
MIB = 1 << 20

# --- assumptions (parameters; not from vLLM) ------------------------------------------------------------------------
# RTX PRO 6000 Blackwell: 96 GB, the GPU this table is for (doctor uses the real size of the GPUs it sees).
DEFAULT_GPU_BYTES = 96 * GIB
# Activations of a max_num_batched_tokens forward pass (MoE, sampler), the L-independent part of the CUDA graphs,
# the CUDA context, NCCL and cuBLAS workspaces: not computed, assumed.
DEFAULT_RESERVE_BYTES = 4 * GIB
# --max-model-len is offered in whole multiples of this (the model's own context_length excepted).
CONTEXT_STEP = 1024

# --- vLLM 0.23.0 defaults ---------------------------------------------------------------------------------------------
# vllm/config/cache.py: CacheConfig.gpu_memory_utilization (Field default 0.92).
VLLM_GPU_MEMORY_UTILIZATION = 0.92
# vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER (`vllm serve`): on a GPU
# with >= 70 GiB (and not an A100) max_num_seqs 1024 and max_num_batched_tokens 8192, else 256 and 2048.
# (_set_default_max_num_seqs_and_batched_tokens_args then takes min(max_num_seqs * L, max_num_batched_tokens).)
VLLM_SERVE_LARGE_GPU_BYTES = 70 * GIB
VLLM_SERVE_DEFAULTS_LARGE = (1024, 8192)
VLLM_SERVE_DEFAULTS_SMALL = (256, 2048)
# vllm/config/vllm.py: VllmConfig._set_cudagraph_sizes: max_cudagraph_capture_size is at most 512.  A FULL decode
# graph holds one token a sequence, so its largest batch is min(max_num_seqs, 512): measured on the H200
# (bench/journal/2026-12-01.md long context): at --max-num-seqs 64 the CUDA-graph pool grew by 64 x 4 B a token of
# --max-model-len (0.12 -> 0.34 GiB from 131072 to 1048576), not by 128 x 4 B.
VLLM_CUDAGRAPH_CAPTURE_CAP = 512

# --- sizes in vLLM 0.23.0 -------------------------------------------------------------------------------------------
# vllm/v1/kv_cache_interface.py: MLAAttentionSpec.real_page_size_bytes: kv-cache dtype "auto" is the model dtype
# (bf16, or fp16 for GGUF on Blackwell): head_size (kv_lora + rope) x 2 B a token.
KV_16BIT_BYTES = 2
# vllm/v1/kv_cache_interface.py: MLAAttentionSpec.real_page_size_bytes: fp8_ds_mla is block_size * 656 (kv_lora e4m3
# bytes, one fp32 scale per 128 of them, rope values in 16 bits); flashmla_sparse.py describes the layout.
FP8_DS_MLA_SCALE_GROUP = 128
FP32_BYTES = 4
# vllm/model_executor/models/deepseek_v2.py: Indexer.__init__: k_cache = DeepseekV32IndexerCache(head_dim=index_head_dim
# + index_head_dim // quant_block_size * 4, dtype=uint8), quant_block_size = 128; one vector a token (K only).
INDEXER_QUANT_BLOCK = 128
# vllm/v1/attention/backends/mla/indexer.py: DeepseekV32IndexerBackend.get_supported_kernel_block_sizes ([64]) and
# glm5_shim/attention/backend.py: Glm5SparseMLABackend.get_supported_kernel_block_sizes ([64]): 64-token blocks.
KV_BLOCK_TOKENS = 64
# vllm/v1/attention/backends/mla/indexer.py: get_max_prefill_buffer_size: max_model_len * 40 tokens, gathered as
# (T, head_dim) e4m3 + (T, 4) scale bytes (vllm/model_executor/layers/sparse_attn_indexer.py: _gather_workspace_shapes,
# reserved in the profile run by sparse_attn_indexer).
INDEXER_PREFILL_BUFFER_FACTOR = 40
# vllm/model_executor/layers/sparse_attn_indexer.py: RADIX_TOPK_WORKSPACE_SIZE, reserved together with the gather.
RADIX_TOPK_WORKSPACE_BYTES = 1024 * 1024
# vllm/v1/worker/workspace.py: WorkspaceManager.get_simultaneous rounds every piece up to 256 bytes.
WORKSPACE_ALIGN = 256
# vllm/model_executor/layers/sparse_attn_indexer.py: sparse_attn_indexer, decode: fp8_fp4_paged_mqa_logits(...,
# max_model_len) returns float32 [batch * next_n, max_model_len] (the shim's Triton kernel the same:
# glm5_shim/kernels/indexer_logits.py: paged_mqa_logits_impl).  next_n = 1: no speculative decoding (no MTP).
LOGITS_BYTES = 4
# int32: vllm/v1/attention/backends/mla/indexer.py: DeepseekV32IndexerMetadataBuilder.__init__
# (expanded_block_table_buffer [max_num_batched_tokens, cdiv(max_model_len, block_size)]),
# vllm/v1/worker/block_table.py: BlockTable.__init__ (block_table [max_num_reqs, cdiv(max_model_len, block_size)],
# sized in gpu_model_runner.py: GPUModelRunner.may_reinitialize_input_batch),
# vllm/model_executor/models/deepseek_v2.py: DeepseekV2Model.__init__ (topk_indices_buffer
# [max_num_batched_tokens, index_topk]).
INT32_BYTES = 4
# vllm/v1/attention/backends/mla/flashmla_sparse.py: get_prefill_workspace_size (max_model_len * 5) and
# FlashMLASparseImpl.__init__ (a bf16 [5 L, 576] workspace, with fp8_ds_mla only, plus q_concat
# [max_num_batched_tokens, local heads, 576] bf16, through the same workspace manager).
FLASHMLA_SPARSE_WORKSPACE_FACTOR = 5
# vllm/model_executor/layers/rotary_embedding/base.py: RotaryEmbeddingBase.__init__: cos_sin_cache
# [max_position_embeddings, rotary_dim] in the model dtype; rotary_embedding/__init__.py: get_rope shares one per
# (head_size, rotary_dim, max_position, is_neox_style, rope parameters, dtype).
ROPE_CACHE_BYTES = 2

KV_DTYPES = ("bf16", "fp8_ds_mla")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(n: int) -> int:
    return _cdiv(n, WORKSPACE_ALIGN) * WORKSPACE_ALIGN


# --- KV cache ---------------------------------------------------------------------------------------------------------
def mla_bytes_per_token(config: dict[str, Any], kv_dtype: str) -> int:
    """One layer's MLA latent, bytes a token: 1152 (bf16/fp16) or 656 (fp8_ds_mla) for GLM-5."""
    kv_lora, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    if kv_dtype == "bf16":
        return (kv_lora + rope) * KV_16BIT_BYTES
    if kv_dtype == "fp8_ds_mla":
        return kv_lora + _cdiv(kv_lora, FP8_DS_MLA_SCALE_GROUP) * FP32_BYTES + rope * KV_16BIT_BYTES
    raise ValueError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")


def indexer_bytes_per_token(config: dict[str, Any]) -> int:
    """One layer's DSA indexer key, bytes a token: 132 for index_head_dim 128."""
    dim = config["index_head_dim"]
    return dim + dim // INDEXER_QUANT_BLOCK * FP32_BYTES


def indexer_layers(config: dict[str, Any], *, shim: bool = True) -> int:
    """Trunk layers that keep an indexer K cache: with the shim the full ones (config indexer_types), else all."""
    layers = config["num_hidden_layers"]
    if not shim:
        return layers
    return sum(not layer_shares_topk(config, layer) for layer in range(layers))


def kv_bytes_per_token(config: dict[str, Any], kv_dtype: str, n_indexer_layers: int | None = None) -> int:
    """KV-cache bytes a token on each rank: MLA in every trunk layer + the indexer in n_indexer_layers."""
    if n_indexer_layers is None:
        n_indexer_layers = indexer_layers(config)
    return (config["num_hidden_layers"] * mla_bytes_per_token(config, kv_dtype)
            + n_indexer_layers * indexer_bytes_per_token(config))


# --- the whole sum ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServeAssumptions:
    """What `vllm serve` is assumed to run with (defaults: vLLM 0.23.0's, on a 96 GB GPU, with the shim)."""
    gpu_bytes: int = DEFAULT_GPU_BYTES
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    max_num_seqs: int | None = None            # None: vllm serve's default for gpu_bytes
    max_num_batched_tokens: int | None = None  # None: vllm serve's default for gpu_bytes
    cuda_graphs: bool = True                   # False: --enforce-eager
    shim: bool = True                          # False: stock vLLM 0.23 (an indexer K cache in every layer)
    native_flashmla: bool = False              # vLLM's FlashMLA-sparse (Hopper / B200), not the shim's Triton backend

    def seqs(self) -> int:
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return serve_batch_defaults(self.gpu_bytes)[0]

    def batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return serve_batch_defaults(self.gpu_bytes)[1]

    def cudagraph_decode_tokens(self) -> int:
        """The largest decode batch captured as a FULL CUDA graph (0 with --enforce-eager)."""
        if not self.cuda_graphs:
            return 0
        return min(self.seqs(), VLLM_CUDAGRAPH_CAPTURE_CAP, self.batched_tokens())

    def budget_bytes(self) -> int:
        """What vLLM may use of each GPU (vllm/v1/worker/utils.py: request_memory: ceil(total * utilization))."""
        return math.ceil(self.gpu_bytes * self.gpu_memory_utilization)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(max_num_seqs=self.seqs(), max_num_batched_tokens=self.batched_tokens(),
                   cudagraph_decode_tokens=self.cudagraph_decode_tokens())
        return out

    def describe(self) -> str:
        return (f"{round(self.gpu_bytes / GIB, 1):g} GiB GPUs, --gpu-memory-utilization "
                f"{self.gpu_memory_utilization:g}, --max-num-seqs {self.seqs()}, --max-num-batched-tokens "
                f"{self.batched_tokens()}" + ("" if self.cuda_graphs else ", --enforce-eager")
                + ("" if self.shim else ", stock vLLM") + (", native FlashMLA-sparse" if self.native_flashmla else "")
                + f"; {round(self.reserve_bytes / GIB, 2):g} GiB assumed for activations/CUDA graphs/context")


def serve_batch_defaults(gpu_bytes: int) -> tuple[int, int]:
    """`vllm serve`'s (max_num_seqs, max_num_batched_tokens) for a GPU of this size (A100s excepted)."""
    return VLLM_SERVE_DEFAULTS_LARGE if gpu_bytes >= VLLM_SERVE_LARGE_GPU_BYTES else VLLM_SERVE_DEFAULTS_SMALL


def rope_caches(config: dict[str, Any]) -> int:
    """Distinct rope cos/sin caches: the main rope is never neox-style; the indexer's is unless
    indexer_rope_interleave (vllm/model_executor/models/deepseek_v2.py: DeepseekV2MLAAttention.__init__)."""
    return 1 if config.get("indexer_rope_interleave", False) else 2


def memory_needed(config: dict[str, Any], max_model_len: int, kv_dtype: str, weight_bytes: int, tp: int = 1,
                  assume: ServeAssumptions = ServeAssumptions()) -> dict[str, int]:
    """Bytes each rank needs with --max-model-len L and one L-token sequence in the KV cache, item by item."""
    L = max_model_len
    seqs, tokens = assume.seqs(), assume.batched_tokens()
    blocks = _cdiv(L, KV_BLOCK_TOKENS)
    n_indexer = indexer_layers(config, shim=assume.shim)
    index_key = indexer_bytes_per_token(config)
    head = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    # One workspace buffer per rank: the largest request made of it.
    gather = INDEXER_PREFILL_BUFFER_FACTOR * L
    workspace = (_align(gather * config["index_head_dim"]) + _align(gather * (index_key - config["index_head_dim"]))
                 + _align(RADIX_TOPK_WORKSPACE_BYTES))
    if assume.native_flashmla:
        q_concat = _align(tokens * (config["num_attention_heads"] // tp) * head * KV_16BIT_BYTES)
        prefill = (_align(FLASHMLA_SPARSE_WORKSPACE_FACTOR * L * head * KV_16BIT_BYTES)
                   if kv_dtype == "fp8_ds_mla" else 0)
        workspace = max(workspace, q_concat + prefill)
    need = {
        "weights": weight_bytes,
        "reserve": assume.reserve_bytes,
        "kv_cache": blocks * KV_BLOCK_TOKENS * kv_bytes_per_token(config, kv_dtype, n_indexer),
        "workspace": workspace,
        "decode_logits": (seqs + assume.cudagraph_decode_tokens()) * L * LOGITS_BYTES,
        "indexer_block_table": tokens * blocks * INT32_BYTES,
        "block_table": seqs * blocks * INT32_BYTES,
        "rope_cache": rope_caches(config) * config["max_position_embeddings"] * config["qk_rope_head_dim"]
                      * ROPE_CACHE_BYTES,
        "topk_buffer": tokens * config["index_topk"] * INT32_BYTES,
    }
    need["total"] = sum(need.values())
    return need


@dataclass(frozen=True)
class ContextFit:
    tp: int
    kv_dtype: str
    max_model_len: int | None  # None: not even CONTEXT_STEP tokens fit
    capped: bool               # max_model_len is the model's own context_length
    why: str                   # one line when max_model_len is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def longest_context(config: dict[str, Any], weight_bytes: int, kv_dtype: str, tp: int = 1,
                    assume: ServeAssumptions = ServeAssumptions()) -> ContextFit:
    """The largest --max-model-len (a multiple of CONTEXT_STEP, at most the model's context_length) whose
    memory_needed fits in the budget, or why none does."""
    budget = assume.budget_bytes()
    context = config["max_position_embeddings"]

    def fits(L: int) -> bool:
        return memory_needed(config, L, kv_dtype, weight_bytes, tp, assume)["total"] <= budget

    if fits(context):
        return ContextFit(tp, kv_dtype, context, True, "")
    lo, hi = 0, (context - 1) // CONTEXT_STEP  # in steps: lo fits (0 = nothing), hi + 1 does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CONTEXT_STEP):
            lo = mid
        else:
            hi = mid - 1
    if lo:
        return ContextFit(tp, kv_dtype, lo * CONTEXT_STEP, False, "")
    fixed = memory_needed(config, 0, kv_dtype, weight_bytes, tp, assume)
    if weight_bytes + assume.reserve_bytes > budget:
        why = (f"weights {weight_bytes / GIB:.1f} GiB + reserve {assume.reserve_bytes / GIB:g} GiB > "
               f"{budget / GIB:.1f} GiB usable")
    else:
        why = (f"{(budget - fixed['total']) / GIB:.2f} GiB left after the weights, less than {CONTEXT_STEP} tokens "
               f"need")
    return ContextFit(tp, kv_dtype, None, False, why)


def context_table(config: dict[str, Any], weight_bytes_per_gpu: dict[int, int],
                  assume: ServeAssumptions = ServeAssumptions()) -> dict[str, Any]:
    """longest_context for every TP size and KV dtype, as plain data (inspect's and doctor's JSON)."""
    rows = []
    for tp, weights in sorted((int(k), v) for k, v in weight_bytes_per_gpu.items()):
        row: dict[str, Any] = {"tp": tp, "weight_bytes": weights}
        for kv_dtype in KV_DTYPES:
            fit = longest_context(config, weights, kv_dtype, tp, assume)
            row[kv_dtype] = fit.max_model_len
            if fit.max_model_len is None:
                row["why"] = fit.why
        rows.append(row)
    return {"assumptions": assume.as_dict(), "context_length": config["max_position_embeddings"],
            "kv_bytes_per_token": {d: kv_bytes_per_token(config, d, indexer_layers(config, shim=assume.shim))
                                   for d in KV_DTYPES},
            "rows": rows}


def format_context_table(table: dict[str, Any], indent: str = "  ") -> list[str]:
    """A few plain lines: one per TP size."""
    a = table["assumptions"]
    assume = ServeAssumptions(**{k: a[k] for k in ("gpu_bytes", "gpu_memory_utilization", "reserve_bytes",
                                                   "max_num_seqs", "max_num_batched_tokens", "cuda_graphs",
                                                   "shim", "native_flashmla")})
    lines = [f"longest --max-model-len, one sequence ({assume.describe()}):"]
    context = table["context_length"]

    def cell(n: int | None) -> str:
        if n is None:
            return "does not fit"
        return f"{n}" + (" (model max)" if n == context else "")

    for row in table["rows"]:
        if row["bf16"] is None and row["fp8_ds_mla"] is None:
            lines.append(f"{indent}TP{row['tp']}: does not fit ({row['why']})")
        else:
            lines.append(f"{indent}TP{row['tp']}: bf16 KV {cell(row['bf16'])}, fp8_ds_mla KV {cell(row['fp8_ds_mla'])}")
    return lines
