"""Simple numpy quantizers for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (gguf-py only ships dequantizers for the K-quants).

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
Q5_K block (176 bytes, 256 values = 8 sub-blocks of 32):
    d: f16, dmin: f16, scales: 12 bytes packed exactly as in Q4_K, qh: 32 bytes, qs: 128 bytes
    value = d * scale[j] * q - dmin * min[j], q in 0..31
    qs: low 4 bits of q, nibble layout as Q4_K (chunk c: low nibble = sub-block 2c, high = 2c+1)
    qh[l] bit j = bit 4 of q[32j + l]   (one bit plane per sub-block)
Q3_K block (110 bytes, 256 values = 16 sub-blocks of 16):
    hmask: 32 bytes, qs: 64 bytes, scales: 12 bytes (16 six-bit scales u, offset 32), d: f16
    value = d * (u[k // 16] - 32) * (q - 4), q in 0..7
    qs: bits 2s..2s+1 of qs[32h + l] = low 2 bits of q[128h + 32s + l]
    hmask[l] bit b = bit 2 of q[32b + l]
    scales: bytes 0-7  = u[0..7] & 15 | (u[8..15] & 15) << 4
            bytes 8-11 = byte 8+c holds (u[4p + c] >> 4) at bits 2p..2p+1, p = 0..3
Q2_K block (84 bytes, 256 values = 16 sub-blocks of 16):
    scales: 16 bytes (scale[j] | min[j] << 4, both 4-bit), qs: 64 bytes, d: f16, dmin: f16
    value = d * scale[k // 16] * q - dmin * min[k // 16], q in 0..3
    qs: 2-bit layout as Q3_K's qs
"""

from __future__ import annotations

import numpy as np

QK_K = 256
Q4_K_BLOCK_BYTES = 144
Q6_K_BLOCK_BYTES = 210
Q5_K_BLOCK_BYTES = 176
Q3_K_BLOCK_BYTES = 110
Q2_K_BLOCK_BYTES = 84


def _blocks(data: np.ndarray) -> np.ndarray:
    data = np.asarray(data, dtype=np.float32)
    if data.shape[-1] % QK_K != 0:
        raise ValueError(f"last dimension {data.shape[-1]} is not a multiple of {QK_K}")
    return data.reshape(-1, QK_K)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").reshape(-1, 1).view(np.uint8)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape, dtype=np.float32), where=den != 0)


def _scale_min_quants(x: np.ndarray, q_max: int, sc_max: int):
    """Round-to-nearest for value = d * scale * q - dmin * min over sub-blocks x (blocks, subs, size).

    Returns d, dmin (f16-representable float32, per block), scales, mins (uint8 in 0..sc_max, per
    sub-block) and q (uint8 in 0..q_max, per value).
    """
    sub_min = np.minimum(x.min(axis=2), 0.0)                # mins are stored negated, so keep them <= 0
    sub_max = np.maximum(x.max(axis=2), 0.0)
    sub_scale = (sub_max - sub_min) / q_max
    d = (sub_scale.max(axis=1) / sc_max).astype(np.float16).astype(np.float32)
    dmin = ((-sub_min).max(axis=1) / sc_max).astype(np.float16).astype(np.float32)
    scales = np.clip(np.rint(_safe_div(sub_scale, d[:, None])), 0, sc_max).astype(np.uint8)
    mins = np.clip(np.rint(_safe_div(-sub_min, dmin[:, None])), 0, sc_max).astype(np.uint8)
    step = d[:, None] * scales                               # effective per-sub-block scale
    offset = dmin[:, None] * mins
    q = np.clip(np.rint(_safe_div(x + offset[:, :, None], step[:, :, None])), 0, q_max).astype(np.uint8)
    return d, dmin, scales, mins, q


def _pack_scale_min_k4(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """8 six-bit scales and 8 six-bit mins per block → the 12-byte Q4_K/Q5_K scales field."""
    packed = np.empty((scales.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (scales[:, 0:4] & 63) | ((scales[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (mins[:, 0:4] & 63) | ((mins[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (scales[:, 4:8] & 15) | ((mins[:, 4:8] & 15) << 4)
    return packed


def _nibbles_k4(q: np.ndarray) -> np.ndarray:
    """Low 4 bits of q (blocks, 8, 32) → 128 bytes: chunk c holds sub-blocks 2c (low) and 2c+1 (high)."""
    pairs = (q & 15).reshape(-1, 4, 2, 32)
    return (pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)).reshape(-1, 128)


def _bit_planes(bits: np.ndarray) -> np.ndarray:
    """bits (blocks, 8, 32) of 0/1 → 32 bytes: byte l has bits[:, b, l] at bit b (value 32b + l)."""
    shifts = np.arange(8, dtype=np.uint8)[None, :, None]
    return np.bitwise_or.reduce(bits.astype(np.uint8) << shifts, axis=1)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """Low 2 bits of q (blocks, 256) → 64 bytes: bits 2s of byte 32h + l hold value 128h + 32s + l."""
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    return np.bitwise_or.reduce((q.reshape(-1, 2, 4, 32) & 3) << shifts, axis=2).reshape(-1, 64)


def quantize_q4_k(data: np.ndarray) -> np.ndarray:
    """float array (..., n*256) → uint8 (..., n*144) in Q4_K layout."""
    shape = data.shape
    x = _blocks(data).reshape(-1, 8, 32)
    d, dmin, scales, mins, q = _scale_min_quants(x, q_max=15, sc_max=63)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(scales, mins), _nibbles_k4(q)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q4_K_BLOCK_BYTES)


def quantize_q5_k(data: np.ndarray) -> np.ndarray:
    """float array (..., n*256) → uint8 (..., n*176) in Q5_K layout."""
    shape = data.shape
    x = _blocks(data).reshape(-1, 8, 32)
    d, dmin, scales, mins, q = _scale_min_quants(x, q_max=31, sc_max=63)
    qh = _bit_planes(q >> 4)                                 # sub-block j is bit plane j
    out = np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(scales, mins), qh, _nibbles_k4(q)], axis=1
    )
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q5_K_BLOCK_BYTES)


def quantize_q3_k(data: np.ndarray) -> np.ndarray:
    """float array (..., n*256) → uint8 (..., n*110) in Q3_K layout."""
    shape = data.shape
    x = _blocks(data).reshape(-1, 16, 16)
    sub_scale = np.abs(x).max(axis=2) / 3.0                  # q - 4 in [-3, 3] never clips (-4 unused)
    d = (sub_scale.max(axis=1) / 31.0).astype(np.float16).astype(np.float32)
    scales = np.clip(np.rint(_safe_div(sub_scale, d[:, None])), 0, 31).astype(np.uint8)   # signed scale >= 0
    step = d[:, None] * scales
    q = (np.clip(np.rint(_safe_div(x, step[:, :, None])), -4, 3) + 4).astype(np.uint8).reshape(-1, 256)

    u = scales + 32                                          # stored with offset 32, 6 bits
    packed_scales = np.empty((x.shape[0], 12), dtype=np.uint8)
    packed_scales[:, 0:8] = (u[:, 0:8] & 15) | ((u[:, 8:16] & 15) << 4)
    high = (u >> 4).reshape(-1, 4, 4)                        # high[:, p, c] = u[4p + c] >> 4
    packed_scales[:, 8:12] = np.bitwise_or.reduce(high << (2 * np.arange(4, dtype=np.uint8))[None, :, None], axis=1)
    hmask = _bit_planes((q >> 2).reshape(-1, 8, 32))

    out = np.concatenate([hmask, _crumbs(q), packed_scales, _f16_bytes(d)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q3_K_BLOCK_BYTES)


def quantize_q2_k(data: np.ndarray) -> np.ndarray:
    """float array (..., n*256) → uint8 (..., n*84) in Q2_K layout."""
    shape = data.shape
    x = _blocks(data).reshape(-1, 16, 16)
    d, dmin, scales, mins, q = _scale_min_quants(x, q_max=3, sc_max=15)
    out = np.concatenate([scales | (mins << 4), _crumbs(q.reshape(-1, 256)), _f16_bytes(d), _f16_bytes(dmin)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q2_K_BLOCK_BYTES)


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
