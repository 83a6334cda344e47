"""Plain-torch references for :mod:`glm5_shim.kernels.sparse_mla` (no Triton, any device).

* :func:`dequant_fp8_ds_mla` / :func:`quantize_fp8_ds_mla`: the vLLM/FlashMLA ``fp8_ds_mla`` token layout
  (656 bytes: 512 e4m3 latent, 4 fp32 scales - one per 128 latent values -, 64 rope values of 16 bits: bf16, or
  fp16 for a float16 model, see :func:`fp8_ds_mla_rope_dtype`).
* :func:`sparse_mla_reference`: the sparse attention in float64 (or any float dtype), token-chunked so large
  top-k lists fit in memory.
"""
from __future__ import annotations

import torch

D_LATENT = 512
D_ROPE = 64
D_QK = 576
FP8_ROW_BYTES = 656
E4M3_MAX = 448.0


def fp8_ds_mla_rope_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The type of the 64 rope values in an ``fp8_ds_mla`` cache row.  vLLM's cache writer (``concat_and_cache_mla``
    with ``fp8_ds_mla``) quantises the latent but copies k_pe's 16-bit values as they are, so the rope is in the
    model's activation dtype: fp16 under a float16 model (GGUF on compute capability >= 10), bf16 otherwise
    (FlashMLA's layout).  float32 queries (interpreter tests) go with bf16."""
    return torch.float16 if q_dtype == torch.float16 else torch.bfloat16


def _rows_of(kv_cache: torch.Tensor, width: int) -> tuple[torch.Tensor, int]:
    """[nb, bs, W] / [nb, bs, 1, W] / [S, W] -> a [nb, bs, W] view plus num_slots."""
    kv = kv_cache
    if kv.dim() == 4 and kv.shape[2] == 1:
        kv = kv[:, :, 0, :]
    if kv.dim() == 2:
        kv = kv.unsqueeze(0)
    assert kv.dim() == 3 and kv.shape[-1] == width, tuple(kv_cache.shape)
    return kv, kv.shape[0] * kv.shape[1]


def dequant_fp8_ds_mla(kv_u8: torch.Tensor, dtype: torch.dtype = torch.float32,
                       rope_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[..., 656] uint8 -> [..., 576] ``dtype``: latent = e4m3 * scale[i // 128], rope = ``rope_dtype`` as is."""
    assert kv_u8.shape[-1] == FP8_ROW_BYTES, kv_u8.shape
    raw = kv_u8.contiguous().view(torch.uint8)
    lead = raw.shape[:-1]
    latent = raw[..., :D_LATENT].contiguous().view(torch.float8_e4m3fn).to(torch.float64)
    scales = raw[..., D_LATENT:D_LATENT + 16].contiguous().view(torch.float32).to(torch.float64)
    rope = raw[..., D_LATENT + 16:].contiguous().view(rope_dtype).to(torch.float64)
    latent = (latent.view(*lead, 4, 128) * scales.view(*lead, 4, 1)).view(*lead, D_LATENT)
    return torch.cat([latent, rope], dim=-1).to(dtype)


def quantize_fp8_ds_mla(kv: torch.Tensor, scales: torch.Tensor | None = None,
                        generator: torch.Generator | None = None,
                        rope_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[..., 576] float -> [..., 656] uint8 in the fp8_ds_mla layout, the rope stored as ``rope_dtype``.

    ``scales`` ([..., 4] fp32, positive) defaults to amax/448 times a random factor in [1, 1.5): arbitrary fp32
    values, deliberately not powers of two (GLM checkpoints use ``arbitrary_fp32`` scales in vLLM)."""
    assert kv.shape[-1] == D_QK, kv.shape
    lead = kv.shape[:-1]
    lat = kv[..., :D_LATENT].to(torch.float32).reshape(*lead, 4, 128)
    if scales is None:
        amax = lat.abs().amax(dim=-1).clamp_min(1e-6)
        jitter = 1.0 + 0.5 * torch.rand(amax.shape, generator=generator, device=amax.device)
        scales = (amax / E4M3_MAX * jitter).to(torch.float32)
    scales = scales.to(torch.float32).reshape(*lead, 4)
    assert bool((scales > 0).all()), "scales must be positive"
    q = (lat / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.empty(*lead, FP8_ROW_BYTES, dtype=torch.uint8, device=kv.device)
    out[..., :D_LATENT] = q.reshape(*lead, D_LATENT).view(torch.uint8)
    out[..., D_LATENT:D_LATENT + 16] = scales.contiguous().view(torch.uint8).reshape(*lead, 16)
    out[..., D_LATENT + 16:] = kv[..., D_LATENT:].to(rope_dtype).contiguous().view(torch.uint8).reshape(*lead, 128)
    return out


def sparse_mla_reference(q, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float, *,
                         kv_format: str, d_v: int = D_LATENT, dtype: torch.dtype = torch.float64,
                         token_chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention computed in ``dtype`` (float64 by default).

    Same contract as :func:`glm5_shim.kernels.sparse_mla.sparse_mla_attention`: ``indices`` ``[T, K]`` hold global
    slots, entries < 0 or >= num_slots are ignored, softmax is over the valid ones, a row with none gives
    out = 0 and lse = -inf.  An fp8_ds_mla cache's rope is read as :func:`fp8_ds_mla_rope_dtype` of q's dtype.
    Returns ``(out [T, H, d_v], lse [T, H])`` in ``dtype``, lse as a natural log."""
    if isinstance(q, (tuple, list)):
        q = torch.cat([q[0], q[1]], dim=-1)
    if indices.dim() == 3:
        indices = indices[:, 0, :]
    T, H, _ = q.shape
    rope_dtype = fp8_ds_mla_rope_dtype(q.dtype)
    if kv_format == "fp8_ds_mla":
        kv3, num_slots = _rows_of(kv_cache.view(torch.uint8), FP8_ROW_BYTES)
    elif kv_format == "bf16":
        kv3, num_slots = _rows_of(kv_cache, D_QK)
    else:
        raise ValueError(kv_format)
    bs = kv3.shape[1]
    out = torch.zeros(T, H, d_v, dtype=dtype, device=q.device)
    lse = torch.full((T, H), float("-inf"), dtype=dtype, device=q.device)
    for t0 in range(0, T, token_chunk):
        t1 = min(T, t0 + token_chunk)
        idx = indices[t0:t1].long()
        valid = (idx >= 0) & (idx < num_slots)
        slot = torch.where(valid, idx, torch.zeros_like(idx))
        rows = kv3[slot // bs, slot % bs]  # [t, K, W]: honours any block/row strides
        if kv_format == "fp8_ds_mla":
            k = dequant_fp8_ds_mla(rows, dtype, rope_dtype)
        else:
            k = rows.to(dtype)
        qc = q[t0:t1].to(dtype)
        s = torch.einsum("thd,tkd->thk", qc, k) * sm_scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        denom = p.sum(dim=-1, keepdim=True)
        has = denom > 0
        o = torch.einsum("thk,tkd->thd", p, k[..., :d_v]) / torch.where(has, denom, torch.ones_like(denom))
        out[t0:t1] = torch.where(has, o, torch.zeros_like(o))
        lse[t0:t1] = torch.where(has[..., 0], (m + torch.log(torch.where(has, denom, torch.ones_like(denom))))[..., 0],
                                 torch.full_like(denom[..., 0], float("-inf")))
    return out, lse


def sparse_mla_flops(num_tokens: int, num_heads: int, num_valid: int) -> int:
    """Multiply-add FLOPs (x2) of QK (576) and PV (512) over the valid slots."""
    return 2 * num_tokens * num_heads * num_valid * (D_QK + D_LATENT)


def sparse_mla_bytes(num_tokens: int, num_valid: int, kv_format: str, num_heads: int = 0, q_bytes: int = 2) -> int:
    """Compulsory HBM traffic: gathered KV rows + q in + out."""
    row = FP8_ROW_BYTES if kv_format == "fp8_ds_mla" else D_QK * 2
    return (num_tokens * num_valid * row + num_tokens * num_heads * (D_QK + D_LATENT) * q_bytes
            + 4 * num_tokens * num_valid)


__all__ = ["dequant_fp8_ds_mla", "fp8_ds_mla_rope_dtype", "quantize_fp8_ds_mla", "sparse_mla_reference",
           "sparse_mla_flops", "sparse_mla_bytes"]
