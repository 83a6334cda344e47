"""Simple numpy quantizers for Q4_K and Q6_K (gguf-py only ships dequantizers for the K-quants).

They write the documented ggml block layouts; they are plain round-to-nearest (no search for the
best scales as llama-quantize does), which is all synthetic test models need. The round trip through
gguf.quants.dequantize is checked by the tests.

Q4_K block (144 bytes, 256 values = 8 sub-blocks of 32):
    d: f16, dmin: f16, scales: 12 bytes (8 six-bit scales + 8 six-bit mins), qs: 128 bytes of 4-bit quants
    value = d * scale[j] * q - dmin * min[j]
    qs: for each 64-value chunk c, 32 bytes; low nibble = sub-block 2c, high nibble = sub-block 2c+1
    scales: bytes 0-3  = scale[0..3] low 6 bits | (scale[4..7] >> 4) << 6
            bytes 4-7  = min[0..3]   low 6 bits | (min[4..7]   >> 4) << 6
            bytes 8-11 = scale[4..7] & 15       | (min[4..7] & 15) << 4
Q6_K block (210 bytes, 256 values = 16 sub-blocks of 16):
    ql: 128 bytes (low 4 bits), qh: 64 bytes (high 2 bits), scales: 16 x int8, d: f16
    value = d * scale[k // 16] * (q - 32), q in 0..63
    per 128-value half h: ql[64h + l] = q[l] | q[l+64] << 4, ql[64h + 32 + l] = q[l+32] | q[l+96] << 4,
    qh[32h + l] = q[l]>>4 | (q[l+32]>>4) << 2 | (q[l+64]>>4) << 4 | (q[l+96]>>4) << 6   (q offset by 128h)
"""

from __future__ import annotations

import numpy as np

QK_K = 256
Q4_K_BLOCK_BYTES = 144
Q6_K_BLOCK_BYTES = 210


def _blocks(data: np.ndarray) -> np.ndarray:
    data = np.asarray(data, dtype=np.float32)
    if data.shape[-1] % QK_K != 0:
        raise ValueError(f"last dimension {data.shape[-1]} is not a multiple of {QK_K}")
    return data.reshape(-1, QK_K)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").reshape(-1, 1).view(np.uint8)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape, dtype=np.float32), where=den != 0)


def quantize_q4_k(data: np.ndarray) -> np.ndarray:
    """float array (..., n*256) → uint8 (..., n*144) in Q4_K layout."""
    shape = data.shape
    x = _blocks(data).reshape(-1, 8, 32)
    sub_min = np.minimum(x.min(axis=2), 0.0)                # mins are stored negated, so keep them <= 0
    sub_max = np.maximum(x.max(axis=2), 0.0)
    sub_scale = (sub_max - sub_min) / 15.0
    d = (sub_scale.max(axis=1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-sub_min).max(axis=1) / 63.0).astype(np.float16).astype(np.float32)
    scales = np.clip(np.rint(_safe_div(sub_scale, d[:, None])), 0, 63).astype(np.uint8)
    mins = np.clip(np.rint(_safe_div(-sub_min, dmin[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * scales                               # effective per-sub-block scale
    offset = dmin[:, None] * mins
    q = np.clip(np.rint(_safe_div(x + offset[:, :, None], step[:, :, None])), 0, 15).astype(np.uint8)

    packed_scales = np.empty((x.shape[0], 12), dtype=np.uint8)
    packed_scales[:, 0:4] = (scales[:, 0:4] & 63) | ((scales[:, 4:8] >> 4) << 6)
    packed_scales[:, 4:8] = (mins[:, 0:4] & 63) | ((mins[:, 4:8] >> 4) << 6)
    packed_scales[:, 8:12] = (scales[:, 4:8] & 15) | ((mins[:, 4:8] & 15) << 4)
    pairs = q.reshape(-1, 4, 2, 32)                          # chunk c holds sub-blocks 2c (low) and 2c+1 (high)
    qs = (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(-1, 128)

    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed_scales, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q4_K_BLOCK_BYTES)


def quantize_q6_k(data: np.ndarray) -> np.ndarray:
    """float array (..., n*256) → uint8 (..., n*210) in Q6_K layout."""
    shape = data.shape
    x = _blocks(data).reshape(-1, 16, 16)
    sub_scale = np.abs(x).max(axis=2) / 31.0                 # q - 32 in [-31, 31] never clips
    d = (sub_scale.max(axis=1) / 127.0).astype(np.float16).astype(np.float32)
    scales = np.clip(np.rint(_safe_div(sub_scale, d[:, None])), 0, 127).astype(np.int8)
    step = d[:, None] * scales.astype(np.float32)
    q = (np.clip(np.rint(_safe_div(x, step[:, :, None])), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)

    # q[:, h, g, l] is value 128h + 32g + l of the block.
    ql = np.empty((x.shape[0], 2, 2, 32), dtype=np.uint8)
    ql[:, :, 0, :] = (q[:, :, 0, :] & 15) | ((q[:, :, 2, :] & 15) << 4)
    ql[:, :, 1, :] = (q[:, :, 1, :] & 15) | ((q[:, :, 3, :] & 15) << 4)
    qh = (q[:, :, 0, :] >> 4) | ((q[:, :, 1, :] >> 4) << 2) | ((q[:, :, 2, :] >> 4) << 4) | ((q[:, :, 3, :] >> 4) << 6)

    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), scales.view(np.uint8), _f16_bytes(d)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q6_K_BLOCK_BYTES)
