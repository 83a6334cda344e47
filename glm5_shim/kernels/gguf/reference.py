"""Float64 references for :mod:`glm5_shim.kernels.gguf.tiles`, and GGUF weights to test it with.

The reference dequantizes with the ``gguf`` package (llama.cpp's own Python dequantizers), not with the kernel's
decoding, and multiplies in float64.  Weights come from real quantizers (``gguf`` for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
the project's K-quant quantizers for Q2_K-Q6_K) or are random valid blocks: every byte random except the fp16 scales,
which are drawn finite and of a sensible size, so every bit pattern of codes and 6-bit scales occurs.
"""
from __future__ import annotations

import gguf
import numpy as np
import torch

from glm5_shim.gguf import kquants
from glm5_shim.gguf.slice.blocks import SCALE_FIELDS
from glm5_shim.kernels.gguf.traits import (IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, Q2_K,
                                           Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, block_bytes)

# the size the fp16 scale fields are drawn around (weights ~ 1e-2); their offsets are slice/blocks.SCALE_FIELDS
_F16_SCALE = {Q8_0: 1e-3, Q4_K: 1e-3, Q5_K: 5e-4, Q6_K: 5e-4, Q2_K: 2e-3, Q3_K: 5e-4, IQ4_NL: 1e-4,
              IQ4_XS: 1e-5, IQ2_XXS: 1e-4, IQ2_XS: 1e-4, IQ2_S: 1e-4, IQ3_XXS: 5e-5, IQ3_S: 1e-4, IQ1_S: 1e-3,
              IQ1_M: 1e-3, Q4_0: 1e-3, Q4_1: 1e-3, Q5_0: 5e-4, Q5_1: 5e-4}
_QUANTIZERS = {Q4_K: kquants.quantize_q4_k, Q5_K: kquants.quantize_q5_k, Q6_K: kquants.quantize_q6_k,
               Q2_K: kquants.quantize_q2_k, Q3_K: kquants.quantize_q3_k}


def dequantize(qweight: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    """[..., row bytes] uint8 -> [..., k] float64, by the ``gguf`` package."""
    values, nbytes = block_bytes(qtype)
    raw = qweight[..., : k // values * nbytes].contiguous().cpu().numpy()
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))
    return torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float64))


def random_blocks(qtype: int, rows: int | tuple[int, ...], k: int, generator: torch.Generator) -> torch.Tensor:
    """[*rows, row bytes] uint8 of random valid blocks (finite positive fp16 scales), on the generator's device."""
    values, nbytes = block_bytes(qtype)
    shape = (rows,) if isinstance(rows, int) else tuple(rows)
    nblocks = k // values
    device = generator.device
    raw = torch.randint(0, 256, (*shape, nblocks, nbytes), dtype=torch.uint8, generator=generator, device=device)
    if qtype == IQ1_M:  # fp16 d spread over the top nibbles of the 4 scale words (bytes 48-55), first word lowest
        scale = (torch.rand(*shape, nblocks, generator=generator, device=device) + 0.5) * _F16_SCALE[qtype]
        bits = scale.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
        for w in range(4):
            high = raw[..., 49 + 2 * w].to(torch.int32)
            raw[..., 49 + 2 * w] = ((high & 0x0F) | (((bits >> (4 * w)) & 0xF) << 4)).to(torch.uint8)
    for off, _role in SCALE_FIELDS.get(gguf.GGMLQuantizationType(qtype).name, ()):  # IQ1_M: none
        scale = (torch.rand(*shape, nblocks, generator=generator, device=device) + 0.5) * _F16_SCALE[qtype]
        raw[..., off:off + 2] = scale.to(torch.float16).view(torch.uint8).view(*shape, nblocks, 2)
    return raw.view(*shape, nblocks * nbytes)


_GGUF_QUANTIZABLE = (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)  # gguf.quants.quantize has these
QUANTIZABLE = (*_GGUF_QUANTIZABLE, *_QUANTIZERS)  # the types a real quantizer exists for here (none for the IQ types)


def quantized_blocks(qtype: int, weight: torch.Tensor) -> torch.Tensor:
    """[rows, k] float -> [rows, row bytes] uint8 by a real quantizer of ``qtype`` (one of QUANTIZABLE)."""
    if qtype not in QUANTIZABLE:
        raise ValueError(f"no quantizer for GGML type {gguf.GGMLQuantizationType(qtype).name} here: use random_blocks")
    w = weight.detach().to(torch.float32).cpu().numpy()
    if qtype in _GGUF_QUANTIZABLE:
        q = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    else:
        q = _QUANTIZERS[qtype](w)
    return torch.from_numpy(np.ascontiguousarray(q, dtype=np.uint8)).reshape(weight.shape[0], -1)


def linear_reference(x: torch.Tensor, qweight: torch.Tensor, qtype: int, n: int | None = None) -> torch.Tensor:
    k = x.shape[1]
    w = dequantize(qweight[: n or qweight.shape[0]], qtype, k)
    return x.double().cpu() @ w.T


def moe_reference(x, w13, w2, topk_weights, topk_ids, qtype13, qtype2) -> torch.Tensor:
    """sum_j weight_j * (SiLU(x Wg^T) * (x Wu^T)) Wd^T over each token's top-k experts, in float64."""
    x64 = x.double().cpu()
    t, h = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(t, h, dtype=torch.float64)
    ids = topk_ids.cpu()
    wts = topk_weights.double().cpu()
    cache = {}
    for e in ids.unique().tolist():
        cache[e] = dequantize(w13[e], qtype13, h), dequantize(w2[e], qtype2, inter)
    for tok in range(t):
        for j in range(ids.shape[1]):
            g_u, down = cache[int(ids[tok, j])]
            gu = g_u @ x64[tok]
            act = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            out[tok] += wts[tok, j] * (down @ act)
    return out


def q4k_parts(qweight: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K weight [rows, row bytes] as (s, m, n): group scales s = d sc and mins m = dmin mn ([rows, k / 32],
    float64) and codes n ([rows, k], int), so that w = s n - m per group of 32 (held to the ``gguf`` package by the
    tests).  For error bounds that depend on the parts of w, not on w alone."""
    raw = qweight[:, : k // 256 * 144].cpu().numpy().reshape(qweight.shape[0], k // 256, 144).astype(np.int64)
    d = raw[..., 0:2].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float64)
    dmin = raw[..., 2:4].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float64)
    sb = raw[..., 4:16]
    sc = np.empty(raw.shape[:2] + (8,), dtype=np.int64)
    mn = np.empty_like(sc)
    sc[..., :4], mn[..., :4] = sb[..., 0:4] & 63, sb[..., 4:8] & 63
    sc[..., 4:] = (sb[..., 8:12] & 15) | ((sb[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (sb[..., 8:12] >> 4) | ((sb[..., 4:8] >> 6) << 4)
    qs = raw[..., 16:].reshape(*raw.shape[:2], 4, 32)                        # 32-byte chunk c: groups 2c, 2c + 1
    n = np.stack([qs & 15, qs >> 4], axis=3).reshape(raw.shape[0], k)        # group 2c + nibble, value l
    s = (d[..., None] * sc).reshape(raw.shape[0], -1)
    m = (dmin[..., None] * mn).reshape(raw.shape[0], -1)
    return torch.from_numpy(s), torch.from_numpy(m), torch.from_numpy(n)


def _q5k_as_q4k(qweight: torch.Tensor, k: int) -> torch.Tensor:
    """Q5_K super-blocks with their 32 high-bit bytes dropped: a Q4_K block with the same scales and the low 4 bits
    of each code (for q4k_parts; the bound takes the fifth bit at its largest)."""
    sb = qweight[:, : k // 256 * 176].reshape(qweight.shape[0], k // 256, 176)
    return torch.cat([sb[..., :16], sb[..., 48:]], dim=-1).reshape(qweight.shape[0], -1)


def q2k_parts(qweight: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q2_K weight [rows, row bytes] as (s, m, n): scales s = d sc and mins m = dmin mn per group of 16
    ([rows, k / 16], float64) and 2-bit codes n ([rows, k], int), so that w = s n - m (held to the ``gguf`` package
    by the tests).  Block: 16 scale bytes (scale low nibble, min high), 64 code bytes, d, dmin; value
    128 h + 32 j + l is bits 2j, 2j + 1 of code byte 32 h + l, in group 8 h + 2 j + l // 16."""
    raw = qweight[:, : k // 256 * 84].cpu().numpy().reshape(qweight.shape[0], k // 256, 84).astype(np.int64)
    d = raw[..., 80:82].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float64)
    dmin = raw[..., 82:84].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float64)
    qs = raw[..., 16:80].reshape(*raw.shape[:2], 2, 1, 32)                   # half h, byte l
    n = (qs >> (2 * np.arange(4).reshape(1, 1, 1, 4, 1))) & 3                 # [rows, blocks, h, j, l]
    s = (d[..., None] * (raw[..., :16] & 15)).reshape(raw.shape[0], -1)
    m = (dmin[..., None] * (raw[..., :16] >> 4)).reshape(raw.shape[0], -1)
    return torch.from_numpy(s), torch.from_numpy(m), torch.from_numpy(n.reshape(raw.shape[0], k))


def mma_error_bound(x: torch.Tensor, qweight: torch.Tensor, qtype: int, k: int, unit: float) -> torch.Tensor:
    """Bound on |register-MMA linear - exact| per output [M, N] (register_mma.py's docstring): each weight is
    off by at most u (|s n| + |m| + |w|) (Q4_K, Q5_K, Q2_K: s, m rounded, then w) or 2 u |w| (Q6_K, Q8_0, IQ2_XXS,
    IQ2_S, IQ3_XXS, IQ3_S); float32 sums add K 2**-24 sum |x w|; the output's own rounding u |out| is the caller's
    (its dtype)."""
    w = dequantize(qweight, qtype, k).abs()
    if qtype in (Q4_K, Q5_K):  # the same scales; Q5_K codes n + 16 (fifth bit) bound by |w| + |m| + 16 |s|
        s, m, n = q4k_parts(qweight if qtype == Q4_K else _q5k_as_q4k(qweight, k), k)
        n = n + (16 if qtype == Q5_K else 0)
        per_weight = (s.repeat_interleave(32, 1) * n).abs() + m.repeat_interleave(32, 1).abs() + w
    elif qtype == Q2_K:  # the same with a scale and min a group of 16
        s, m, n = q2k_parts(qweight, k)
        per_weight = (s.repeat_interleave(16, 1) * n).abs() + m.repeat_interleave(16, 1).abs() + w
    elif qtype in (Q6_K, Q8_0, IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S):  # w = s q, q exact, s rounded, then w (IQ: sign exact)
        per_weight = 2 * w
    else:
        raise ValueError(f"no register-MMA kernel for GGML type {qtype}")
    return x.double().abs().cpu() @ (unit * per_weight + k * 2.0 ** -24 * w).T
