"""Matmuls on weights kept in llama.cpp's GGUF block formats: a dense linear and a fused MoE (Triton).

Weights stay as the GGUF stores them (vLLM's ``qweight``: uint8 rows of blocks, one row per output feature), no
memory is added, and vLLM's own kernels can still read the same tensors — except Q8_0, Q6_K, IQ2_XXS and IQ2_S
linear and expert weights, which the loader repacks once (``gguf_mma.pack``: the same bytes moved so code loads
are aligned; ``loading/gguf_repack.py``) and every kernel here reads with ``packed=True`` (PACKED).  Every program
walks K in steps of 128 values and turns a step of ``BLOCK_N`` rows into float32 weights in registers — Q4_K/Q5_K with
:func:`_q45_step` (codes to exact numbers by PTX bit operations, one dot per 32-value group; 16-byte aligned rows,
so Triton's pipeliner streams them), the other types with :func:`_load_step` /
:func:`_decode_step` (integers through 2**23-magic floats; step i + 1's loads issued before step i decodes) — casts
them to the activation dtype and feeds ``tl.dot`` with fp32 accumulation.  No int-to-float conversion instruction
is used: it runs at a quarter of the FMA rate.  The weight is rounded once to the activation dtype (bf16: 2**-9
relative, fp16: 2**-12) — the same rounding vLLM's bf16 weights carry; the activations are not quantized (vLLM's
ggml kernels round them to 8 bits first).

Block layouts (``gguf.GGML_QUANT_SIZES``; checked against the ``gguf`` package's dequantizers in the tests):
* Q8_0, 34 B / 32 values: fp16 d, int8 q[32];                          w = d*q
* Q4_K, 144 B / 256: fp16 d, fp16 dmin, 12 B of 6-bit (scale, min) for 8 groups of 32, 128 B of nibbles
  (bytes 32c..32c+31 hold group 2c in their low and group 2c+1 in their high nibbles);  w = d*sc*q - dmin*m
* Q5_K, 176 B / 256: as Q4_K, plus 32 B of high bits before the nibbles (bit g of byte l: group g, value l)
* Q6_K, 210 B / 256: 128 B low nibbles, 64 B 2-bit highs, 16 int8 scales (one per 16 values), fp16 d;
                     w = d*sc*(q - 32)
* Q2_K, 84 B / 256: 16 scale bytes (4-bit scale, 4-bit min per 16 values), 64 B of 2-bit codes, fp16 d, dmin;
                     w = d*sc*q - dmin*m
* Q3_K, 110 B / 256: 32 B high-bit mask, 64 B of 2-bit codes, 12 B of 16 6-bit scales, fp16 d;
                     w = d*(sc - 32)*(q - 4 unless its mask bit is set)
* Q4_0 / Q4_1 / Q5_0 / Q5_1, 18 / 20 / 22 / 24 B / 32: fp16 d, (Q4_1, Q5_1: fp16 m,) (Q5: 32 high bits,) 16 B of
                     nibbles (value l: low nibble of byte l, value 16 + l: high nibble);
                     w = d*(q - 8), d*q + m, d*(q - 16), d*q + m
* IQ4_NL, 18 B / 32: fp16 d, 16 B of nibbles indexing 16 fixed int8 values;  w = d*value
* IQ4_XS, 136 B / 256: fp16 d, 2 B high and 4 B low bits of 8 6-bit scales, 128 B of nibbles as IQ4_NL's;
                     w = d*(sc - 32)*value
* IQ2_XXS, 66 B / 256: fp16 d, then per 32 values 4 grid-index bytes (8 values each) and a 32-bit word: 4 x 7-bit
                     sign indexes and a 4-bit scale s;  w = d*(0.5 + s)/4 * grid value * sign
* IQ2_XS, 74 B / 256: fp16 d, 32 16-bit words (9-bit index into a 512-entry grid, 7-bit sign index), 8 scale
                     bytes (one nibble per 16 values);  w = d*(0.5 + s)/4 * grid value * sign
* IQ2_S, 82 B / 256: fp16 d, 32 grid-index low bytes, 32 sign bytes, 8 bytes of 2 high index bits each (1024-entry
                     grid), 8 scale bytes (a nibble per 16 values);  w = d*(0.5 + s)/4 * grid value * sign
* IQ3_XXS, 98 B / 256: fp16 d, 64 grid-index bytes (4 values each), per 32 values a 32-bit word as IQ2_XXS's;
                     w = d*(0.5 + s)/2 * grid value * sign
* IQ3_S, 110 B / 256: fp16 d, 64 grid-index low bytes, 8 bytes of high index bits (512-entry grid), 32 sign
                     bytes, 4 scale bytes (a nibble per 32 values);  w = d*(1 + 2 s) * grid value * sign
* IQ1_S, 50 B / 256: fp16 d, 32 grid-index low bytes, per 32 values a 16-bit word: 3 high index bits per row of 8
                     (2048-entry grid of -1, 0, 1), a 3-bit scale s, the sign of delta;  w = d*(2 s + 1)*(v +- 1/8)
* IQ1_M, 56 B / 256: 32 index low bytes, 16 bytes of a nibble per row (3 index bits, delta's sign), 4 16-bit words
                     of 3-bit scales per 16 values whose top nibbles make fp16 d;  w = d*(2 s + 1)*(v +- 1/8)
The IQ1/IQ2/IQ3 grids are gguf.quants' own tables (grid_table), held on the device as bytes; a 7-bit sign
index stands for the byte of those 7 bits plus an 8th that makes the parity even (llama.cpp's ksigns).

Two kernels share that step: :func:`_linear_kernel` (x @ W.T, optionally split over K for decode-sized M) and
:func:`_moe_kernel` (rows grouped by expert with the usual (sorted ids, expert of each block, padded count)
routing layout; the w13 pass computes gate and up rows together and stores SiLU(gate)*up, the w2 pass scales by
the routing weight).
"""
from __future__ import annotations

import os

import gguf
import torch
import triton
import triton.language as tl

from glm5_shim import settings
from glm5_shim.kernels.gguf.routing import (K_MULTIPLE, MMA_LINEAR_MAX_ROWS, MMA_LINEAR_TYPES,
                                            MMA_MOE_MAX_BLOCK_ROWS, MMA_MOE_MAX_ROWS_PER_EXPERT,
                                            MMA_PACKED_LINEAR_TYPES, MOE_DECODE_MAX_ROWS_PER_EXPERT,
                                            MOE_DEQUANT_DEFAULT_MIN_ROWS, MOE_DEQUANT_MIN_ROWS_PER_EXPERT,
                                            SHIM_KERNEL_TYPES)
from glm5_shim.kernels import arrivals
from glm5_shim.kernels.gguf import register_mma as gguf_mma
from glm5_shim.kernels.device import cuda_capability_and_sms
from glm5_shim.kernels.gguf.traits import (GRID_TYPES, IQ1_M, IQ1_S, Q4_K, Q6_K, block_bytes, traits_of)

SUPPORTED_TYPES = SHIM_KERNEL_TYPES  # what the kernels read (traits.TILE_TYPES)
_INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")  # the PTX helpers need a GPU
STEP_K = 128  # values of K each program decodes per step (half a K-quant super-block, four Q8_0 blocks)


def row_bytes(qtype: int, k: int, packed: bool = False) -> int:
    """Bytes of a row of k values: the file's blocks, or (packed) gguf_mma.pack's layout of them."""
    if packed:
        return gguf_mma.packed_row_bytes(qtype, k)
    values, nbytes = block_bytes(qtype)
    return k // values * nbytes


# ----------------------------------------------------------------------------------------------------------------
# device helpers
# ----------------------------------------------------------------------------------------------------------------


# IQ4_NL / IQ4_XS: a 4-bit code indexes 16 non-linear int8 values (gguf.quants.IQ4_NL.kvalues), held here as the
# bytes of two 64-bit words (codes 0-7, 8-15) so the lookup is a shift of a constant, not a memory access.
_IQ4_VALUES_LO = tl.constexpr(0xF6EADDCFBFAD9881 - (1 << 64))  # as int64
_IQ4_VALUES_HI = tl.constexpr(0x7159453526190D01)
# IQ1_S / IQ1_M: a row of the -1/0/1 grid is shifted by +-delta (gguf.quants' value: 1/8)
IQ1_DELTA = tl.constexpr(float(gguf.quants.IQ1_S.delta))


@triton.jit
def _exact_float(n, OFFSET: tl.constexpr = 0.0):
    """int32 n in [0, 2**23) -> float32 n - OFFSET, exactly, by the 2**23 magic (an int-to-float conversion runs at a
    fraction of the FMA rate, and the tile layouts repeat per-group scale arithmetic for every weight)."""
    return (n | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)


@triton.jit
def _iq4_values(q):
    """int32 codes 0..15 -> their IQ4 values as float32 (exact)."""
    word = tl.where(q < 8, _IQ4_VALUES_LO, _IQ4_VALUES_HI)
    byte = ((word >> (8 * (q & 7)).to(tl.int64)) & 0xFF).to(tl.int32)   # the value's two's-complement byte
    return _exact_float(byte ^ 0x80, 128.0)


@triton.jit
def _ksign_byte(index):
    """[BN, 4, 4] 7-bit sign indexes -> sign bytes: the 7 bits and an 8th that makes the parity even."""
    p = index ^ (index >> 4)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return index | ((p & 1) << 7)


@triton.jit
def _iq2xxs_all_signs(word):
    """Packed IQ2_XXS sign words (gguf_mma.spread_iq2xxs_signs) with each grid row g's eighth sign, the parity of its
    other seven, at bit 28 + g where the scale was (three xor-folds; the register-MMA kernels' twin, a Gluon function:
    gguf_mma._iq2xxs_all_signs)."""
    signs = word & 0x0FFFFFFF
    p = signs ^ (signs >> 16)
    p = p ^ (p >> 8)
    p = p ^ (p >> 4)
    return signs | ((p & 15) << 28)


@triton.jit
def _signed(scale, sign_byte):
    """scale [BN, 4, 4] float32 (a row of 8 values each), sign bytes [BN, 4, 4] int32 -> [BN, 4, 4, 8] float32: the
    scale with bit j of the byte as the sign of value j, xor-ed into the float's sign bit (no compare or select)."""
    bit31 = (sign_byte[:, :, :, None] << (31 - tl.arange(0, 8))[None, None, None, :]) & -2147483648
    return (scale.to(tl.int32, bitcast=True)[:, :, :, None] ^ bit31).to(tl.float32, bitcast=True)


@triton.jit
def _grid_rows(grid_ptr, index, QTYPE: tl.constexpr):
    """[BN, 4, c] int32 grid indexes -> their grid rows as float32 [BN, 4, c, 8 (IQ1, IQ2) or 4 (IQ3)]: a row is 8
    or 4 value bytes of the uint8 table (grid_table; IQ1's -1, 0, 1 held as v + 1), one vector load a row."""
    W: tl.constexpr = 4 if (QTYPE == 18 or QTYPE == 21) else 8
    OFFSET: tl.constexpr = 1.0 if (QTYPE == 19 or QTYPE == 29) else 0.0  # GRID_IQ1_OFFSET for IQ1
    b = tl.load(grid_ptr + index[:, :, :, None] * W + tl.arange(0, W)[None, None, None, :])
    return _exact_float(b.to(tl.int32), OFFSET)


@triton.jit
def _word32(pairs):
    """[BN, 4, 2] int16 halves (rows only 2-byte aligned) -> [BN, 4] int32 words."""
    lo, hi = tl.split(pairs)
    return (lo.to(tl.int32) & 0xFFFF) | (hi.to(tl.int32) << 16)


@triton.jit
def _load_step(wp, i, QTYPE: tl.constexpr, PACKED: tl.constexpr = False, num_sb=0):
    """Issue the loads of step i (values k in [128 i, 128 i + 128)) of the weight rows at byte pointers ``wp``
    ([BLOCK_N]); :func:`_decode_step` turns them into weights.  Split in two so a loop can issue step i + 1's
    loads before it decodes step i (the scale loads are too small for Triton's async-copy pipeline, and on rows
    only 2-byte aligned — Q6_K, Q8_0 — so are the codes: prefetching hides their latency instead).  PACKED: a row
    of one of gguf_mma.PACKERS' types in gguf_mma.pack's layout (the same bytes moved; num_sb: the row's 256-value
    super-blocks), loaded into the same registers as the file's layout, so :func:`_decode_step` is shared."""
    if QTYPE == 8 and PACKED:  # pack_q8_0: each 256-value group's 8 d (16 bytes), then its 256 codes
        gp = wp + (i // 2) * 272
        b = 4 * (i % 2) + tl.arange(0, 4)                                                    # blocks of the group
        d = tl.load((gp[:, None] + 2 * b[None, :]).to(tl.pointer_type(tl.int16)))          # [BN, 4]
        q = tl.load(gp[:, None, None] + 16 + 32 * b[None, :, None] + tl.arange(0, 32)[None, None, :])
        return d, q, q, q
    elif QTYPE == 16 and PACKED:  # IQ2_XXS's gguf_mma.PLANES: the row's code bytes (64 a super-block), then its d
        gp = wp[:, None] + (i // 2) * 64 + 32 * (i % 2) + 8 * tl.arange(0, 4)[None, :]       # [BN, 4]
        idx = tl.load(gp[:, :, None] + tl.arange(0, 4)[None, None, :])                      # [BN, 4, 4]
        word = tl.load((gp + 4).to(tl.pointer_type(tl.int32)))         # [BN, 4], spread (gguf_mma.pack_iq2_xxs)
        d = tl.load((wp + num_sb * 64 + (i // 2) * 2).to(tl.pointer_type(tl.int16)))        # [BN]
        return d, idx, word, word
    elif QTYPE == 22 and PACKED:  # IQ2_S's gguf_mma.PLANES: (index low bytes, sign bytes) 8 a sub-block, qh + scales, d
        cp = wp[:, None, None] + (i // 2) * 64
        hf = i % 2
        g = tl.arange(0, 4)[None, :, None]
        off = cp + 8 * (4 * hf + g) + tl.arange(0, 4)[None, None, :]                        # [BN, 4, 4]
        lo = tl.load(off)
        sg = tl.load(off + 4)
        hs = tl.load(wp[:, None, None] + num_sb * 64 + (i // 2) * 16 + 4 * hf + g
                     + 8 * tl.arange(0, 2)[None, None, :])                                  # [BN, 4, 2]: qh, sc
        d = tl.load((wp + num_sb * 80 + (i // 2) * 2).to(tl.pointer_type(tl.int16)))
        return d, lo, sg, hs
    elif QTYPE == 8:  # Q8_0: four 34-byte blocks
        bp = wp[:, None] + (4 * i + tl.arange(0, 4))[None, :] * 34                         # [BN, 4]
        d = tl.load(bp.to(tl.pointer_type(tl.int16)))
        q = tl.load(bp[:, :, None] + 2 + tl.arange(0, 32)[None, None, :])                  # [BN, 4, 32]
        return d, q, q, q
    elif QTYPE == 14:  # Q6_K: half a super-block as 8 groups of 16: file blocks of 210 bytes (128 low-nibble and 64
        # high-bit bytes, 16 scales, d), or gguf_mma.PLANES' (a row's code bytes, 192 a super-block, then scales, d)
        if PACKED:
            cp = wp + (i // 2) * 192
            scp = wp + num_sb * 192 + (i // 2) * 16
            dp = wp + num_sb * 208 + (i // 2) * 2
        else:
            cp = wp + (i // 2) * 210
            scp = cp + 192
            dp = cp + 208
        hf = i % 2
        s = tl.arange(0, 8)[None, :, None]
        l16 = tl.arange(0, 16)[None, None, :]
        p3 = cp[:, None, None]
        ql = tl.load(p3 + 64 * hf + 32 * ((s // 2) % 2) + 16 * (s % 2) + l16)              # [BN, 8, 16]
        qh = tl.load(p3 + 128 + 32 * hf + 16 * (s % 2) + l16)
        sc = tl.load(scp[:, None] + 8 * hf + tl.arange(0, 8)[None, :])                      # [BN, 8]
        d = tl.load(dp.to(tl.pointer_type(tl.int16)))                                      # [BN]
        return d, ql, qh, sc
    elif QTYPE == 10:  # Q2_K: half an 84-byte super-block: 32 code bytes (4 x 2 bits), 8 scale bytes, d and dmin
        sbp = wp + (i // 2) * 84
        hf = i % 2
        qs = tl.load(sbp[:, None] + 16 + 32 * hf + tl.arange(0, 32)[None, :])                # [BN, 32]
        sc = tl.load(sbp[:, None] + 8 * hf + tl.arange(0, 8)[None, :])                      # [BN, 8]
        dd = tl.load((sbp + 80).to(tl.pointer_type(tl.int16))[:, None] + tl.arange(0, 2)[None, :])  # [BN, 2]
        return dd, qs, sc, sc
    elif QTYPE == 2 or QTYPE == 3 or QTYPE == 6 or QTYPE == 7:  # Q4_0 / Q4_1 / Q5_0 / Q5_1: four 32-value blocks
        BYTES: tl.constexpr = 18 if QTYPE == 2 else (20 if QTYPE == 3 else (22 if QTYPE == 6 else 24))
        bp = wp[:, None] + (4 * i + tl.arange(0, 4))[None, :] * BYTES                      # [BN, 4]
        # the header as 4 16-bit halves (d, then m and/or the two halves of qh; Q4_0 reads 6 code bytes unused)
        hdr = tl.load(bp.to(tl.pointer_type(tl.int16))[:, :, None] + tl.arange(0, 4)[None, None, :])
        q = tl.load(bp[:, :, None] + (BYTES - 16) + tl.arange(0, 16)[None, None, :])       # [BN, 4, 16]
        return hdr, q, q, q
    elif QTYPE == 20:  # IQ4_NL: four 18-byte blocks (fp16 d, 16 code bytes)
        bp = wp[:, None] + (4 * i + tl.arange(0, 4))[None, :] * 18                         # [BN, 4]
        d = tl.load(bp.to(tl.pointer_type(tl.int16)))
        q = tl.load(bp[:, :, None] + 2 + tl.arange(0, 16)[None, None, :])                  # [BN, 4, 16]
        return d, q, q, q
    elif QTYPE == 23:  # IQ4_XS: half a 136-byte super-block: 64 code bytes, 2 scale_l bytes, scale_h, d
        sbp = wp + (i // 2) * 136
        hf = i % 2
        q = tl.load(sbp[:, None, None] + 8 + 64 * hf + 16 * tl.arange(0, 4)[None, :, None]
                    + tl.arange(0, 16)[None, None, :])                                      # [BN, 4, 16]
        dh = tl.load(sbp.to(tl.pointer_type(tl.int16))[:, None] + tl.arange(0, 2)[None, :])  # [BN, 2]: d, scales_h
        sl = tl.load(sbp[:, None] + 4 + 2 * hf + tl.arange(0, 2)[None, :])                  # [BN, 2]
        return dh, q, sl, sl
    elif QTYPE == 16:  # IQ2_XXS: half a 66-byte super-block: 4 x (4 grid-index bytes, a 32-bit sign/scale word)
        sbp = wp + (i // 2) * 66
        gp = sbp[:, None] + 2 + 32 * (i % 2) + 8 * tl.arange(0, 4)[None, :]                 # [BN, 4]
        idx = tl.load(gp[:, :, None] + tl.arange(0, 4)[None, None, :])                      # [BN, 4, 4]
        word = tl.load((gp + 4).to(tl.pointer_type(tl.int16))[:, :, None] + tl.arange(0, 2)[None, None, :])
        d = tl.load(sbp.to(tl.pointer_type(tl.int16)))                                      # [BN]
        return d, idx, word, word
    elif QTYPE == 17:  # IQ2_XS: half a 74-byte super-block: 16 index/sign words, 4 scale bytes
        sbp = wp + (i // 2) * 74
        hf = i % 2
        q = tl.load((sbp + 2 + 32 * hf).to(tl.pointer_type(tl.int16))[:, None, None]
                    + 4 * tl.arange(0, 4)[None, :, None] + tl.arange(0, 4)[None, None, :])   # [BN, 4, 4]
        sc = tl.load(sbp[:, None] + 66 + 4 * hf + tl.arange(0, 4)[None, :])                 # [BN, 4]
        d = tl.load(sbp.to(tl.pointer_type(tl.int16)))
        return d, q, sc, sc
    elif QTYPE == 22:  # IQ2_S: half an 82-byte super-block: 16 index low bytes, 16 sign bytes, 4 qh, 4 scales
        sbp = wp + (i // 2) * 82
        hf = i % 2
        g = tl.arange(0, 4)[None, :, None]
        off = sbp[:, None, None] + 16 * hf + 4 * g + tl.arange(0, 4)[None, None, :]         # [BN, 4, 4]
        lo = tl.load(off + 2)
        sg = tl.load(off + 34)
        hs = tl.load(sbp[:, None, None] + 66 + 4 * hf + g + 8 * tl.arange(0, 2)[None, None, :])  # [BN, 4, 2]: qh, sc
        d = tl.load(sbp.to(tl.pointer_type(tl.int16)))
        return d, lo, sg, hs
    elif QTYPE == 18:  # IQ3_XXS: half a 98-byte super-block: 32 grid-index bytes, 4 sign/scale words
        sbp = wp + (i // 2) * 98
        hf = i % 2
        g = tl.arange(0, 4)[None, :, None]
        idx = tl.load(sbp[:, None, None] + 2 + 32 * hf + 8 * g + tl.arange(0, 8)[None, None, :])  # [BN, 4, 8]
        word = tl.load((sbp + 66 + 16 * hf).to(tl.pointer_type(tl.int16))[:, None, None] + 2 * g
                       + tl.arange(0, 2)[None, None, :])                                    # [BN, 4, 2]
        d = tl.load(sbp.to(tl.pointer_type(tl.int16)))
        return d, idx, word, word
    elif QTYPE == 21:  # IQ3_S: half a 110-byte super-block: 32 index low bytes, 4 qh, 16 sign bytes, 2 scales
        sbp = wp + (i // 2) * 110
        hf = i % 2
        g = tl.arange(0, 4)[None, :, None]
        idx = tl.load(sbp[:, None, None] + 2 + 32 * hf + 8 * g + tl.arange(0, 8)[None, None, :])  # [BN, 4, 8]
        sg = tl.load(sbp[:, None, None] + 74 + 16 * hf + 4 * g + tl.arange(0, 4)[None, None, :])  # [BN, 4, 4]
        which = tl.arange(0, 2)[None, None, :]
        hs = tl.load(sbp[:, None, None] + tl.where(which == 0, 66 + 4 * hf + g, 106 + 2 * hf + g // 2))  # qh, sc
        d = tl.load(sbp.to(tl.pointer_type(tl.int16)))
        return d, idx, sg, hs
    elif QTYPE == 19:  # IQ1_S: half a 50-byte super-block: 16 grid-index low bytes, 4 16-bit high/scale words
        sbp = wp + (i // 2) * 50
        hf = i % 2
        lo = tl.load(sbp[:, None, None] + 2 + 16 * hf + 4 * tl.arange(0, 4)[None, :, None]
                     + tl.arange(0, 4)[None, None, :])                                      # [BN, 4, 4]
        qh = tl.load((sbp + 34 + 8 * hf).to(tl.pointer_type(tl.int16))[:, None] + tl.arange(0, 4)[None, :])
        d = tl.load(sbp.to(tl.pointer_type(tl.int16)))
        return d, lo, qh, qh
    elif QTYPE == 29:  # IQ1_M: half a 56-byte super-block: 16 index low bytes, 8 qh bytes, the 4 scale words
        sbp = wp + (i // 2) * 56
        hf = i % 2
        g = tl.arange(0, 4)[None, :, None]
        ll = tl.arange(0, 4)[None, None, :]
        lo = tl.load(sbp[:, None, None] + 16 * hf + 4 * g + ll)                              # [BN, 4, 4]
        qh = tl.load(sbp[:, None, None] + 32 + 8 * hf + 2 * g + ll // 2)                     # row l's byte
        wp16 = (sbp + 48).to(tl.pointer_type(tl.int16))[:, None]
        words = tl.load(wp16 + tl.arange(0, 4)[None, :])                                   # [BN, 4]: d's nibbles
        scw = tl.load(wp16 + 2 * hf + tl.arange(0, 4)[None, :] // 2)                       # group g's scale word
        return words, lo, qh, scw
    elif QTYPE == 11:  # Q3_K: half a 110-byte super-block (2-byte aligned rows: byte loads)
        sbp = wp + (i // 2) * 110
        hf = i % 2
        hm = tl.load(sbp[:, None] + tl.arange(0, 32)[None, :])                              # [BN, 32] high bits
        qs = tl.load(sbp[:, None] + 32 + 32 * hf + tl.arange(0, 32)[None, :])               # [BN, 32]
        t = tl.arange(0, 8)[None, :, None]
        which = tl.arange(0, 2)[None, None, :]
        sc = tl.load(sbp[:, None, None] + 96 + tl.where(which == 0, t, 8 + t % 4))  # [BN, 8, 2]: bytes t, 8 + t % 4
        d = tl.load((sbp + 108).to(tl.pointer_type(tl.int16)))                              # [BN]
        return d, qs, hm, sc
    else:
        tl.static_assert(False, "Q4_K/Q5_K are decoded by _q45_header / _q45_codes / _q45_weights")


# Q4_K/Q5_K codes become exact numbers by bit operations alone (no int-to-float conversion: that runs at a quarter of
# the FMA rate and made the first kernels issue-bound).  A b-bit code n is put in the top mantissa bits of the 16-bit
# number 2.0 (bits 0x4000 in bf16 and fp16 alike), which is then CODE_OFFSET + n * unit, unit = 2**(1 - b): 4-bit
# codes are 2 + n/8, 5-bit codes 2 + n/16, in either dtype.  The offset is only 16x (32x) the code's unit, so
# removing it after a float32 dot costs ~4-5 bits of float32's 24, not 7-10 as codes in the low mantissa bits would
# (bf16 128 + n, fp16 1024 + n).
CODE_OFFSET = tl.constexpr(2.0)
CODE_INV_UNIT_Q4 = tl.constexpr(8.0)
CODE_INV_UNIT_Q5 = tl.constexpr(16.0)


def _code_asm(fp16: bool, q5: bool) -> str:
    """PTX: 4 code bytes ($4; Q5: 4 qh bytes $5, shifted right by $6) -> low nibbles ($0, $1) and high nibbles
    ($2, $3) of bytes 0-3 as 16-bit numbers 2 + n * unit, two to a register.  prmt spreads bytes b0 b1 (b2 b3) into
    the two halves of a register; a shift puts a nibble at the top of the mantissa; lop3 masks it and ors in 2.0."""
    width = 5 if q5 else 4
    top = 10 if fp16 else 7                        # mantissa bits: the code occupies [top - width, top)
    lo_shift = top - width                         # low nibble sits at bit 0 of its byte
    hi_shift = top - width - 4                     # high nibble at bit 4
    mask = ((1 << 4) - 1) << lo_shift
    mask2 = mask | (mask << 16)

    def shift(dst, src, k):
        return f"shl.b32 {dst}, {src}, {k};" if k >= 0 else f"shr.u32 {dst}, {src}, {-k};"

    lines = [".reg .b32 t0, t1, u0, u1, u2, u3;", "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;",
             shift("u0", "t0", lo_shift), shift("u1", "t1", lo_shift), shift("u2", "t0", hi_shift),
             shift("u3", "t1", hi_shift)]
    outs = ("$0", "$1", "$2", "$3")
    if not q5:
        lines += [f"lop3.b32 {o}, {u}, {mask2:#010x}, 0x40004000, 0xEA;"
                  for o, u in zip(outs, ("u0", "u1", "u2", "u3"))]
    else:
        fifth = 1 << (top - 1)                     # the code's bit 4
        f2 = fifth | (fifth << 16)
        lines += [".reg .b32 h, h0, h1, v0, v1, v2, v3;", "shr.u32 h, $5, $6;", "prmt.b32 h0, h, 0, 0x4140;",
                  "prmt.b32 h1, h, 0, 0x4342;",
                  # qh bit 0 -> the low nibble's fifth bit, bit 1 -> the high nibble's
                  shift("v0", "h0", top - 1), shift("v1", "h1", top - 1),
                  shift("v2", "h0", top - 2), shift("v3", "h1", top - 2)]
        for o, u, v in zip(outs, ("u0", "u1", "u2", "u3"), ("v0", "v1", "v2", "v3")):
            lines += [f"lop3.b32 {u}, {u}, {mask2:#010x}, 0x40004000, 0xEA;",
                      f"lop3.b32 {o}, {v}, {f2:#010x}, {u}, 0xEA;"]
    return "{\n" + "\n".join(lines) + "\n}"


_CODE_ASM_BF16 = tl.constexpr(_code_asm(False, False))
_CODE_ASM_FP16 = tl.constexpr(_code_asm(True, False))
_CODE5_ASM_BF16 = tl.constexpr(_code_asm(False, True))
_CODE5_ASM_FP16 = tl.constexpr(_code_asm(True, True))


@triton.jit
def _nibbles(codes, qh, shift, BF16: tl.constexpr, Q5: tl.constexpr):
    """Code bytes [..., 32] -> (low nibbles, high nibbles) as 2 + n * unit in bf16 (BF16) or fp16, exactly (unit
    1/8; Q5: 1/16 with the fifth bit from (qh >> shift) bit 0 (low) and bit 1 (high)).  The interpreter cannot run
    PTX: it builds the same bits with Triton's integer ops (the GPU tests hold the PTX to the same references)."""
    if _INTERPRET:
        TOP: tl.constexpr = 7 if BF16 else 10
        WIDTH: tl.constexpr = 5 if Q5 else 4
        c = codes.to(tl.int32)
        lo = c & 15
        hi = c >> 4
        if Q5:
            hb = qh.to(tl.int32) >> shift
            lo = lo | ((hb & 1) << 4)
            hi = hi | ((hb & 2) << 3)
        lo = ((lo << (TOP - WIDTH)) | 0x4000).to(tl.int16)
        hi = ((hi << (TOP - WIDTH)) | 0x4000).to(tl.int16)
        if BF16:
            return lo.to(tl.bfloat16, bitcast=True), hi.to(tl.bfloat16, bitcast=True)
        else:
            return lo.to(tl.float16, bitcast=True), hi.to(tl.float16, bitcast=True)
    elif BF16:
        if Q5:
            return tl.inline_asm_elementwise(_CODE5_ASM_BF16, "=r,=r,=r,=r,r,r,r,r,r,r", [codes, qh, shift],
                                             (tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_CODE_ASM_BF16, "=r,=r,=r,=r,r", [codes],
                                             (tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        if Q5:
            return tl.inline_asm_elementwise(_CODE5_ASM_FP16, "=r,=r,=r,=r,r,r,r,r,r,r", [codes, qh, shift],
                                             (tl.float16, tl.float16), is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_CODE_ASM_FP16, "=r,=r,=r,=r,r", [codes],
                                             (tl.float16, tl.float16), is_pure=True, pack=4)


@triton.jit
def _decode_step(raw, i, grid_ptr, QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, PACKED: tl.constexpr = False):
    """The loads of :func:`_load_step` as float32 weights [BLOCK_N, 128] in natural k order (``grid_ptr``: the
    type's grid table for IQ1/IQ2/IQ3 types, unread otherwise)."""
    if QTYPE == 16 and PACKED:
        # packed IQ2_XXS: sign i = 2 j + e of row l at bit 4 j + l + 16 e of the group's word (gguf_mma.
        # IQ2XXS_SIGN_MOVES), the rows' eighth signs (their parities) put at bits 28 + l, where the scale was
        d, idx, word, _ = raw                                                                # word [BN, 4]
        half_s = _exact_float((word >> 28) & 15, -0.5)
        db = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None] * (half_s * 0.25)
        signs = _iq2xxs_all_signs(word)
        row = tl.arange(0, 4)[None, None, :, None]
        val = tl.arange(0, 8)[None, None, None, :]
        bit31 = (signs[:, :, None, None] << (31 - (4 * (val >> 1) + row + 16 * (val & 1)))) & -2147483648
        scale = tl.broadcast_to(db[:, :, None, None], (BLOCK_N, 4, 4, 8))
        v = tl.reshape(_grid_rows(grid_ptr, idx.to(tl.int32), QTYPE), (BLOCK_N, 4, 4, 8))
        w = v * (scale.to(tl.int32, bitcast=True) ^ bit31).to(tl.float32, bitcast=True)
    elif QTYPE == 16 or QTYPE == 18:
        # IQ2_XXS / IQ3_XXS: group g of 32 values = 4 sign groups l of 8; its word holds sign index l at bits 7 l and
        # the scale s at bits 28-31; IQ2_XXS: 4 grid rows of 8 values, IQ3_XXS: 8 rows of 4
        d, idx, pairs, _ = raw
        word = _word32(pairs)                                                                # [BN, 4]
        half_s = _exact_float((word >> 28) & 15, -0.5)
        db = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None] * (half_s * (0.25 if QTYPE == 16 else 0.5))
        signs = _ksign_byte((word[:, :, None] >> (7 * tl.arange(0, 4))[None, None, :]) & 127)  # [BN, 4, 4]
        v = tl.reshape(_grid_rows(grid_ptr, idx.to(tl.int32), QTYPE), (BLOCK_N, 4, 4, 8))
        w = v * _signed(tl.broadcast_to(db[:, :, None], (BLOCK_N, 4, 4)), signs)
    elif QTYPE == 17:
        # IQ2_XS: word l of group g: grid row (low 9 bits) and sign index (high 7); scale nibble l // 2 of byte g
        d, q, sc, _ = raw
        qi = q.to(tl.int32) & 0xFFFF
        v = _grid_rows(grid_ptr, qi & 511, QTYPE)                                            # [BN, 4, 4, 8]
        nib = (sc.to(tl.int32)[:, :, None] >> (4 * (tl.arange(0, 4) // 2))[None, None, :]) & 15
        db = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None, None] * (_exact_float(nib, -0.5) * 0.25)
        w = v * _signed(db, _ksign_byte(qi >> 9))
    elif QTYPE == 22:
        # IQ2_S: row l of group g: low byte l | bits 2l..2l+1 of qh byte g << 8; sign byte l; scale nibble l // 2
        d, lo, sg, hs = raw
        qh, sc = tl.split(hs)
        ll = tl.arange(0, 4)[None, None, :]
        idx = lo.to(tl.int32) | (((qh.to(tl.int32)[:, :, None] >> (2 * ll)) & 3) << 8)
        v = _grid_rows(grid_ptr, idx, QTYPE)                                                 # [BN, 4, 4, 8]
        nib = (sc.to(tl.int32)[:, :, None] >> (4 * (ll // 2))) & 15
        db = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None, None] * (_exact_float(nib, -0.5) * 0.25)
        w = v * _signed(db, sg.to(tl.int32))
    elif QTYPE == 21:
        # IQ3_S: row m of group g: low byte m | bit m of qh byte g << 8 (4 values); sign byte l covers rows 2l, 2l + 1;
        # scale nibble g % 2 of byte g // 2, w = d (1 + 2 s) v
        d, idx, sg, hs = raw
        qh, sc = tl.split(hs)
        m = tl.arange(0, 8)[None, None, :]
        full = idx.to(tl.int32) | (((qh.to(tl.int32)[:, :, None] >> m) & 1) << 8)           # [BN, 4, 8]
        v = tl.reshape(_grid_rows(grid_ptr, full, QTYPE), (BLOCK_N, 4, 4, 8))
        nib = (sc.to(tl.int32) >> (4 * (tl.arange(0, 4) % 2))[None, :]) & 15                # [BN, 4]
        db = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None] * _exact_float(1 + 2 * nib)
        w = v * _signed(tl.broadcast_to(db[:, :, None], (BLOCK_N, 4, 4)), sg.to(tl.int32))
    elif QTYPE == 19:
        # IQ1_S: row l of group g: low byte l | bits 3l..3l+2 of word g << 8; word bits 12-14: scale s, bit 15: the
        # sign of delta; w = d (2 s + 1) (v + delta)
        d, lo, qh, _ = raw
        hw = qh.to(tl.int32) & 0xFFFF                                                        # [BN, 4]
        idx = lo.to(tl.int32) | (((hw[:, :, None] >> (3 * tl.arange(0, 4))[None, None, :]) & 7) << 8)
        v = _grid_rows(grid_ptr, idx, QTYPE)                                                 # [BN, 4, 4, 8]
        delta = tl.where((hw & 0x8000) != 0, -IQ1_DELTA, IQ1_DELTA)
        dl = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None] * _exact_float(2 * ((hw >> 12) & 7) + 1)
        w = dl[:, :, None, None] * (v + delta[:, :, None, None])
    elif QTYPE == 29:
        # IQ1_M: row l of group g (ib = 4 hf + g): low byte l | low 3 bits of its nibble (nibble l % 2 of qh byte
        # 2 ib + l // 2) << 8, nibble bit 3: delta's sign; its scale: number 2 ib + l // 2 of the 16 3-bit scales,
        # bits 3 t of word 2 hf + g // 2 with t = (2 g + l // 2) % 4; d: the top nibbles of the words, first lowest
        words, lo, qh, scw = raw
        wi = words.to(tl.int32) & 0xFFFF                                                     # [BN, 4]
        dbits = tl.sum(((wi >> 12) & 15) << (4 * tl.arange(0, 4))[None, :], axis=1)
        d = dbits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)                  # [BN]
        g = tl.arange(0, 4)[None, :, None]
        ll = tl.arange(0, 4)[None, None, :]
        nib = (qh.to(tl.int32) >> (4 * (ll % 2))) & 15                                       # [BN, 4, 4]
        idx = lo.to(tl.int32) | ((nib & 7) << 8)
        v = _grid_rows(grid_ptr, idx, QTYPE)
        delta = tl.where((nib & 8) != 0, -IQ1_DELTA, IQ1_DELTA)
        sc = ((scw.to(tl.int32)[:, :, None] & 0xFFFF) >> (3 * ((2 * g + ll // 2) % 4))) & 7  # [BN, 4, 4]
        dl = d[:, None, None] * _exact_float(2 * sc + 1)
        w = dl[:, :, :, None] * (v + delta[:, :, :, None])
    elif QTYPE == 2 or QTYPE == 3 or QTYPE == 6 or QTYPE == 7:
        # value 16 h + l of a block: nibble h of code byte l (| bit 16 h + l of qh << 4 for Q5_0/Q5_1)
        hdr, q, _, _ = raw
        even, odd = tl.split(tl.reshape(hdr, (BLOCK_N, 4, 2, 2)))
        h0, h2 = tl.split(even)
        h1, h3 = tl.split(odd)
        d = h0.to(tl.float16, bitcast=True).to(tl.float32)[:, :, None, None]
        qi = q.to(tl.int32)
        n = tl.permute(tl.join(qi & 15, qi >> 4), (0, 1, 3, 2))                              # [BN, 4, 2, 16]
        if QTYPE == 6 or QTYPE == 7:
            if QTYPE == 6:
                qh = (h1.to(tl.int32) & 0xFFFF) | (h2.to(tl.int32) << 16)
            else:
                qh = (h2.to(tl.int32) & 0xFFFF) | (h3.to(tl.int32) << 16)
            pos = 16 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 16)[None, None, None, :]
            n = n | (((qh[:, :, None, None] >> pos) & 1) << 4)
        ZERO: tl.constexpr = 8.0 if QTYPE == 2 else (16.0 if QTYPE == 6 else 0.0)  # Q4_0 q - 8, Q5_0 q - 16
        w = d * _exact_float(n, ZERO)
        if QTYPE == 3 or QTYPE == 7:
            w = w + h1.to(tl.float16, bitcast=True).to(tl.float32)[:, :, None, None]        # + m
    elif QTYPE == 8:
        d, q, _, _ = raw
        # int8 q -> float32 without a conversion instruction: q + 128 is q's byte with its top bit flipped
        qf = _exact_float(q.to(tl.int32) ^ 0x80, 128.0)
        w = d.to(tl.float16, bitcast=True).to(tl.float32)[:, :, None] * qf
    elif QTYPE == 10:
        # Q2_K: value 32 j + 16 h + l of the half = bits 2j of code byte 16 h + l, scale byte 2 j + h (low nibble:
        # scale, high nibble: min); w = d * scale * q - dmin * min
        dd, qs, sc, _ = raw
        d16, m16 = tl.split(dd)
        d = d16.to(tl.float16, bitcast=True).to(tl.float32)
        dmin = m16.to(tl.float16, bitcast=True).to(tl.float32)
        j = tl.arange(0, 4)[None, :, None, None]
        q = (tl.reshape(qs, (BLOCK_N, 1, 2, 16)).to(tl.int32) >> (2 * j)) & 3                 # [BN, 4, 2, 16]
        qf = _exact_float(q)
        sc3 = tl.reshape(sc, (BLOCK_N, 4, 2)).to(tl.int32)
        dl = d[:, None, None] * _exact_float(sc3 & 15)
        ml = dmin[:, None, None] * _exact_float(sc3 >> 4)
        w = dl[:, :, :, None] * qf - ml[:, :, :, None]
    elif QTYPE == 11:
        # Q3_K: value 32 j + 16 h + l of half hf = bits 2j of code byte 16 h + l, minus 4 unless bit 4 hf + j of
        # high-mask byte 16 h + l is set; scale 8 hf + 2 j + h of 16 6-bit scales (low 4 bits: bytes 0-7, low
        # nibbles for hf = 0, high for hf = 1; top 2 bits: bits 4 hf + 2 (t // 4) of byte 8 + t % 4, t = 2 j + h),
        # minus 32; w = d * scale * q
        d, qs, hm, sc = raw
        hf = i % 2
        j = tl.arange(0, 4)[None, :, None, None]
        # the code's 2 bits and its high bit at bit 2 as one select and one mask (2 LOP3s): q + 4 hb, then - 4
        low2 = tl.reshape(qs, (BLOCK_N, 1, 2, 16)).to(tl.int32) >> (2 * j)
        high4 = (tl.reshape(hm, (BLOCK_N, 1, 2, 16)).to(tl.int32) << 2) >> (4 * hf + j)
        q3 = ((low2 & 3) | (high4 & ~3)) & 7
        qf = _exact_float(q3, 4.0)                                                           # q - 4 + 4 hb
        lo8, hx = tl.split(sc.to(tl.int32))                                                  # [BN, 8] each
        t = tl.arange(0, 8)[None, :]
        low = (lo8 >> (4 * hf)) & 15
        high = (hx >> (4 * hf + 2 * (t // 4))) & 3
        scale = _exact_float(low | (high << 4), 32.0)
        dl = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None, None] * tl.reshape(scale, (BLOCK_N, 4, 2))
        w = dl[:, :, :, None] * qf
    elif QTYPE == 20:
        # IQ4_NL: value 16 h + l of each block = the table value of nibble h of code byte l; w = d * value
        d, q, _, _ = raw
        qi = q.to(tl.int32)
        v = _iq4_values(tl.join(qi & 15, qi >> 4))                                           # [BN, 4, 16, 2]
        w = d.to(tl.float16, bitcast=True).to(tl.float32)[:, :, None, None] * tl.permute(v, (0, 1, 3, 2))
    elif QTYPE == 23:
        # IQ4_XS: group g of half hf (ib = 4 hf + g) as IQ4_NL's block layout, scale
        # ((scales_l[ib / 2] >> 4 (ib % 2)) & 15 | ((scales_h >> 2 ib) & 3) << 4) - 32; w = d * scale * value
        dh, q, sl, _ = raw
        hf = i % 2
        d16, sh16 = tl.split(dh)
        d = d16.to(tl.float16, bitcast=True).to(tl.float32)
        sh = sh16.to(tl.int32) & 0xFFFF
        low = tl.reshape((sl.to(tl.int32)[:, :, None] >> (4 * tl.arange(0, 2))[None, None, :]) & 15, (BLOCK_N, 4))
        high = (sh[:, None] >> (2 * (4 * hf + tl.arange(0, 4)))[None, :]) & 3
        dl = d[:, None] * _exact_float(low | (high << 4), 32.0)                              # [BN, 4]
        qi = q.to(tl.int32)
        v = _iq4_values(tl.join(qi & 15, qi >> 4))                                           # [BN, 4, 16, 2]
        w = dl[:, :, None, None] * tl.permute(v, (0, 1, 3, 2))
    elif QTYPE == 14:
        d, ql, qh, sc = raw
        s = tl.arange(0, 8)[None, :, None]
        q = ((ql >> (4 * (s // 4)).to(tl.uint8)) & 15) | (((qh >> (2 * (s // 2)).to(tl.uint8)) & 3) << 4)
        scale = d.to(tl.float16, bitcast=True).to(tl.float32)[:, None] * sc.to(tl.int8, bitcast=True).to(tl.float32)
        w = scale[:, :, None] * _exact_float(q.to(tl.int32), 32.0)                           # q - 32
    else:
        tl.static_assert(False, "Q4_K/Q5_K are decoded by _q45_header / _q45_codes / _q45_weights")
    return tl.reshape(w, (BLOCK_N, 128))


@triton.jit
def _weight_tile(wp, i, grid_ptr, QTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Values k in [128 i, 128 i + 128) of BLOCK_N weight rows whose first bytes are at ``wp`` ([BLOCK_N] uint8
    pointers), as float32 [BLOCK_N, 128] in natural k order."""
    return _decode_step(_load_step(wp, i, QTYPE), i, grid_ptr, QTYPE, BLOCK_N)


@triton.jit
def _q45_scales(w0, w1, w2, w3, hf, INV_UNIT: tl.constexpr, F32: tl.constexpr):
    """(S = s / unit, C = 2 S + m — or m for F32) of the 4 groups of step half ``hf`` of Q4_K/Q5_K super-blocks
    whose first 16 bytes are the words w0..w3 ([BN] int32), as [BN, 2, 2] tiles indexed (chunk, nibble): group
    4 hf + 2 chunk + nibble.  w0 = fp16 d | fp16 dmin; the 12 bytes s[0..11] (w1-w3) pack groups 0-3 in the low 6
    bits of s[0..3] (scales) and s[4..7] (mins), groups 4-7 in the nibbles of s[8..11] with their top 2 bits in the
    high bits of s[0..3] / s[4..7]; s = d * scale and m = dmin * min are exact in float32.  Decoded here, in a
    compact tile, then moved to the dot's layout: decoded there, every column's scales cost 8 threads each."""
    j = 2 * tl.arange(0, 2)[None, :, None] + tl.arange(0, 2)[None, None, :]
    b1 = (w1[:, None, None] >> (8 * j)) & 255
    b2 = (w2[:, None, None] >> (8 * j)) & 255
    b3 = (w3[:, None, None] >> (8 * j)) & 255
    sc = tl.where(hf == 0, b1 & 63, (b3 & 15) | ((b1 >> 6) << 4))
    mn = tl.where(hf == 0, b2 & 63, (b3 >> 4) | ((b2 >> 6) << 4))
    d = (w0 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = ((w0 >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    s = d[:, None, None] * sc.to(tl.float32) * INV_UNIT  # exact: a power of 2
    m = dmin[:, None, None] * mn.to(tl.float32)
    if F32:
        return s, m
    else:
        return s, s * CODE_OFFSET + m  # tensor first: the interpreter keeps constexpr * tensor a constexpr


@triton.jit
def _pick(t, cc: tl.constexpr, h: tl.constexpr):
    """t[:, cc, h] of a [BN, 2, 2] tile."""
    t0, t1 = tl.split(t)
    if h == 0:
        u = t0
    else:
        u = t1
    u0, u1 = tl.split(u)
    if cc == 0:
        return u0
    else:
        return u1


@triton.jit
def _q45_header(wp, i, QTYPE: tl.constexpr, F32: tl.constexpr):
    """Step i of Q4_K / Q5_K rows at ``wp`` ([BN]): (super-block pointers, half hf, S, C) with :func:`_q45_scales`'
    [BN, 2, 2] scale tiles for the step's 4 groups."""
    SB: tl.constexpr = 144 if QTYPE == 12 else 176
    INV_UNIT: tl.constexpr = CODE_INV_UNIT_Q4 if QTYPE == 12 else CODE_INV_UNIT_Q5
    sbp = wp + (i // 2) * SB
    hp = sbp.to(tl.pointer_type(tl.int32))
    hf = i % 2
    s4, c4 = _q45_scales(tl.load(hp), tl.load(hp + 1), tl.load(hp + 2), tl.load(hp + 3), hf, INV_UNIT, F32)
    return sbp, hf, s4, c4


@triton.jit
def _q45_codes(sbp, hf, cc: tl.constexpr, QTYPE: tl.constexpr, BF16: tl.constexpr, PROBE: tl.constexpr = 0):
    """The codes of 32-byte chunk c = 2 hf + cc of the super-blocks at ``sbp`` as (groups 2c, 2c + 1), [BN, 32]
    each, exact 16-bit numbers 2 + n u (:func:`_nibbles`)."""
    QS: tl.constexpr = 16 if QTYPE == 12 else 48
    c = hf * 2 + cc
    codes = tl.load(sbp[:, None] + QS + 32 * c + tl.arange(0, 32)[None, :])
    if QTYPE == 13:
        qh = tl.load(sbp[:, None] + 16 + tl.arange(0, 32)[None, :])
        lo, hi = _nibbles(codes, qh, 2 * c, BF16, True)
    else:
        lo, hi = _nibbles(codes, codes, 0, BF16, False)
        if PROBE == 1:  # bench probe: decode twice (other bytes, so the second is not folded into the first)
            lo2, hi2 = _nibbles(codes ^ 0x11, codes, 0, BF16, False)
            lo = (lo.to(tl.float32) + lo2.to(tl.float32)).to(lo.dtype)
            hi = (hi.to(tl.float32) + hi2.to(tl.float32)).to(hi.dtype)
    return lo, hi


@triton.jit
def _q45_weights(q, big_s, big_c, F32: tl.constexpr):
    """Float32 weights [BN, 32] of one group from its codes ``q`` and its S, C ([BN], picked from
    :func:`_q45_scales`' tiles): w = S q - C, one FMA with an exact product (C rounded once, 2**-24); F32 (float32
    activations, tests): (q - 2) S - m, exact to 2**-24."""
    if F32:
        return (q.to(tl.float32) - CODE_OFFSET) * big_s[:, None] - big_c[:, None]
    else:
        return q.to(tl.float32) * big_s[:, None] - big_c[:, None]


@triton.jit
def _tile_dot(a, w, acc, DOT_PRECISION: tl.constexpr, SWAP: tl.constexpr):
    """acc + a @ w.T (a: [BM, K] activations, w: [BN, K] decoded weights), or with SWAP its transpose
    acc.T + w @ a.T, the decoded weights as the dot's left operand: on mma.sync targets (sm_80-89, sm_120/121) that
    spares their transposing layout change (the 64x64 Q4_K prefill tile on sm_120: 3035 -> 1356 SASS instructions
    a K step; prefill_pass_tuning, linear_tile_tuning)."""
    if SWAP:
        acc = tl.dot(w.to(a.dtype), tl.trans(a), acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(a, tl.trans(w.to(a.dtype)), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _tile_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A zero float32 accumulator in :func:`_tile_dot`'s orientation: [BM, BN], or [BN, BM] with SWAP."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def _tile_rows(acc, SWAP: tl.constexpr):
    """A :func:`_tile_dot` accumulator back in row order ([BM, BN])."""
    if SWAP:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _q45_step(acc, xp, m_ok, wp, i, QTYPE: tl.constexpr, BF16: tl.constexpr, F32: tl.constexpr,
              DOT_PRECISION: tl.constexpr, PROBE: tl.constexpr = 0, SWAP: tl.constexpr = False):
    """acc += x[:, 128 i : 128 i + 128] @ W[:, 128 i : 128 i + 128].T for Q4_K / Q5_K rows at ``wp`` ([BN]); xp:
    [BM, 32] pointers to each row's first 32 activations.  One dot per group of 32 values (scale s, min m:
    w = s n - m), on the codes as the exact numbers q = 2 + n u (:func:`_nibbles`): w = S q - C with S = s / u and
    C = 2 S + m is one float32 FMA (:func:`_q45_weights`), then w is rounded once to the activation dtype (2**-9
    bf16, 2**-12 fp16) — the rounding vLLM's bf16 weights carry.

    (Applying S and C to each group's dot result instead — exact codes in the dot, no weight rounded — compiled to
    379 SASS instructions a step against 557 here, yet measured 9 % (Q4_K) to 38 % (Q5_K) slower at 32 tokens on
    the H200: bench/journal/2026-12-02.md.)"""
    sbp, hf, s4, c4 = _q45_header(wp, i, QTYPE, F32)
    for cc in tl.static_range(2):
        lo, hi = _q45_codes(sbp, hf, cc, QTYPE, BF16, PROBE)
        for h in tl.static_range(2):
            if h == 0:
                q = lo
            else:
                q = hi
            big_s = _pick(s4, cc, h)
            big_c = _pick(c4, cc, h)
            a = tl.load(xp + 128 * i + 32 * (2 * cc + h), mask=m_ok[:, None], other=0.0)
            wf = _q45_weights(q, big_s, big_c, F32)
            acc = _tile_dot(a, wf, acc, DOT_PRECISION, SWAP)
            if PROBE == 2:  # bench probe: every dot twice
                acc = _tile_dot(a, wf, acc, DOT_PRECISION, SWAP)
    return acc


# ----------------------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _last_to_arrive(counter, arrivals):
    """Count this program in at ``counter`` (kernels/arrivals.py); True for the last of ``arrivals`` programs.  The
    barrier first: every thread's plane stores happen before the release, and the acquire makes the others' visible
    to the program that reads them all."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == arrivals - 1


@triton.jit
def _reset(counter):
    """The last program sets its tile's counter back to zero, ready for the next launch."""
    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _linear_kernel(x_ptr, w_ptr, grid_ptr, out_ptr, final_ptr, counter_ptr, M, N, stride_xm, stride_wn, stride_os,
                   stride_om, stride_fm, steps_per_split, num_steps, QTYPE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, REDUCE: tl.constexpr,
                   PACKED: tl.constexpr = False, SWAP: tl.constexpr = False):
    """out[s, m, n] = sum over the K steps of split s of x[m, k] * W[n, k]  (one split: out is x @ W.T).  REDUCE:
    out holds float32 planes, and the last program of each tile to finish (kernels/arrivals.py) writes their sum
    to final.  SWAP: the tile computed transposed, weights as the dot's left operand (:func:`_tile_dot`)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)  # clamped rows: every weight load is in bounds, unmasked
    wp = w_ptr + rows * stride_wn
    xp = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + tl.arange(0, 128)[None, :]
    acc = _tile_acc(BLOCK_M, BLOCK_N, SWAP)
    first = pid_s * steps_per_split
    last = tl.minimum(first + steps_per_split, num_steps)
    if QTYPE == 12 or QTYPE == 13:  # 16-byte aligned blocks: Triton's pipeliner streams them (num_stages)
        xq = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + tl.arange(0, 32)[None, :]
        for i in range(first, last):
            acc = _q45_step(acc, xq, m_ok, wp, i, QTYPE, x_ptr.dtype.element_ty == tl.bfloat16,
                            x_ptr.dtype.element_ty == tl.float32, DOT_PRECISION, 0, SWAP)
    else:
        raw = _load_step(wp, first, QTYPE, PACKED, num_steps // 2)
        for i in range(first, last):
            nxt = _load_step(wp, tl.minimum(i + 1, last - 1), QTYPE, PACKED, num_steps // 2)  # in flight: i decodes
            a = tl.load(xp + i * 128, mask=m_ok[:, None], other=0.0)
            acc = _tile_dot(a, _decode_step(raw, i, grid_ptr, QTYPE, BLOCK_N, PACKED), acc, DOT_PRECISION, SWAP)
            raw = nxt
    acc = _tile_rows(acc, SWAP)
    op = out_ptr + pid_s * stride_os + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    mask = m_ok[:, None] & (offs_n < N)[None, :]
    tl.store(op, acc.to(out_ptr.dtype.element_ty), mask=mask)
    if REDUCE:
        splits = tl.num_programs(2)
        tile = pid_m * tl.num_programs(1) + pid_n
        if _last_to_arrive(counter_ptr + tile, splits):
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for sp in range(splits):
                total += tl.load(op + (sp - pid_s) * stride_os, mask=mask, other=0.0, cache_modifier=".cg")
            fp = final_ptr + offs_m.to(tl.int64)[:, None] * stride_fm + offs_n[None, :]
            tl.store(fp, total.to(final_ptr.dtype.element_ty), mask=mask)
            _reset(counter_ptr + tile)


@triton.jit
def _dequant_kernel(w_ptr, grid_ptr, out_ptr, N, stride_wn, stride_on, num_steps, steps_per_program,
                    QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, PACKED: tl.constexpr = False):
    """out[n, 128 i : 128 i + 128] = the weights of step i of row n, in out's dtype (grid: row blocks x runs of
    steps_per_program steps; a run's next step loads while this one decodes and stores)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    first = tl.program_id(1) * steps_per_program
    last = tl.minimum(first + steps_per_program, num_steps)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    wp = w_ptr + rows * stride_wn
    ok = (offs_n < N)[:, None]
    orow = out_ptr + rows[:, None] * stride_on
    if QTYPE == 12 or QTYPE == 13:  # the matmuls' own decode, one 32-value group at a time (Triton pipelines)
        F32: tl.constexpr = out_ptr.dtype.element_ty == tl.float32
        for i in range(first, last):
            sbp, hf, s4, c4 = _q45_header(wp, i, QTYPE, F32)
            for cc in tl.static_range(2):
                lo, hi = _q45_codes(sbp, hf, cc, QTYPE, out_ptr.dtype.element_ty == tl.bfloat16)
                for h in tl.static_range(2):
                    if h == 0:
                        q = lo
                    else:
                        q = hi
                    w = _q45_weights(q, _pick(s4, cc, h), _pick(c4, cc, h), F32)
                    op = orow + i * 128 + 32 * (2 * cc + h) + tl.arange(0, 32)[None, :]
                    tl.store(op, w.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        raw = _load_step(wp, first, QTYPE, PACKED, num_steps // 2)
        for i in range(first, last):
            nxt = _load_step(wp, tl.minimum(i + 1, last - 1), QTYPE, PACKED, num_steps // 2)  # in flight: i decodes
            w = _decode_step(raw, i, grid_ptr, QTYPE, BLOCK_N, PACKED)
            tl.store(orow + i * 128 + tl.arange(0, 128)[None, :], w.to(out_ptr.dtype.element_ty), mask=ok)
            raw = nxt


@triton.jit
def _moe_block(N, num_padded_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(row block, feature tile, whether the block is past the routed rows) of program_id(0) in a MoE tile grid
    (row blocks x cdiv(N, BLOCK_N) feature tiles; blocks from num_padded on hold no rows)."""
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // num_n
    return pid_m, tl.program_id(0) % num_n, pid_m * BLOCK_M >= tl.load(num_padded_ptr)


@triton.jit
def _moe_store(acc, acc_u, out_ptr, route_w_ptr, ids, ok, offs_n, N, stride_om, GATED: tl.constexpr,
               ROUTE_WEIGHTED: tl.constexpr):
    """A MoE tile's epilogue: SiLU(acc) * acc_u (GATED), times each row's routing weight (ROUTE_WEIGHTED), stored
    to rows ids of out (valid rows, features < N)."""
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_u
    if ROUTE_WEIGHTED:
        acc = acc * tl.load(route_w_ptr + ids, mask=ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + ids[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=ok[:, None] & (offs_n < N)[None, :])


@triton.jit
def _moe_kernel(x_ptr, w_ptr, grid_ptr, out_ptr, route_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                final_ptr, counter_ptr, N, num_steps, steps_per_split, num_valid, a_row_div, stride_xm, stride_we,
                stride_wn, stride_os, stride_om, stride_fm, QTYPE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, GATED: tl.constexpr, ROUTE_WEIGHTED: tl.constexpr,
                DOT_PRECISION: tl.constexpr, REDUCE: tl.constexpr = False, PROBE: tl.constexpr = 0,
                PACKED: tl.constexpr = False, SWAP: tl.constexpr = False):
    """One (block of BLOCK_M routed rows of one expert) x (BLOCK_N output features) x (K split) tile.

    PROBE (bench/gguf_matmul.py --parts probe only; 0 in serving, where it compiles to the same SASS): Q4_K codes
    decoded twice (1) or every dot done twice (2) — what each adds to the call's time places it without hardware
    counters.  The loads are the same, but the compiler stages them differently (offline, sm_90: 12 KiB of shared
    memory for either probe against 18.5 KiB served), so read the differences as estimates.

    GATED (w13, unsplit): weight rows n and N + n are gate and up; stores SiLU(gate) * up.  Otherwise stores the
    product (times the row's routing weight when ROUTE_WEIGHTED) to split plane program_id(1) of out; REDUCE (w13
    split over K, float32 planes of N = gate and up rows): the last of the programs of a gate tile and its up tile
    N / 2 on to finish (kernels/arrivals.py) writes SiLU of the planes' gate sum times their up sum to final.  Row r
    of the sorted layout reads activation row r // a_row_div (top_k for w13: every routed copy of a token reads the
    token) and writes output row r."""
    pid_s = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n, past_rows = _moe_block(N, num_padded_ptr, BLOCK_M, BLOCK_N)
    if past_rows:
        return
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    ok = ids < num_valid
    ids = tl.where(ok, ids, 0).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    w_exp = w_ptr + expert * stride_we
    wp_g = w_exp + rows * stride_wn
    wp_u = w_exp + (rows + N) * stride_wn
    xp = x_ptr + (ids // a_row_div)[:, None] * stride_xm + tl.arange(0, 128)[None, :]
    acc = _tile_acc(BLOCK_M, BLOCK_N, SWAP)
    acc_u = _tile_acc(BLOCK_M, BLOCK_N, SWAP)
    first = pid_s * steps_per_split
    last = tl.minimum(first + steps_per_split, num_steps)
    if QTYPE == 12 or QTYPE == 13:  # 16-byte aligned blocks: Triton's pipeliner streams them (num_stages)
        BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
        F32: tl.constexpr = x_ptr.dtype.element_ty == tl.float32
        xq = x_ptr + (ids // a_row_div)[:, None] * stride_xm + tl.arange(0, 32)[None, :]
        for i in range(first, last):
            acc = _q45_step(acc, xq, ok, wp_g, i, QTYPE, BF16, F32, DOT_PRECISION, PROBE, SWAP)
            if GATED:
                acc_u = _q45_step(acc_u, xq, ok, wp_u, i, QTYPE, BF16, F32, DOT_PRECISION, PROBE, SWAP)
    else:
        num_sb = num_steps // 2
        raw_g = _load_step(wp_g, first, QTYPE, PACKED, num_sb)
        raw_u = _load_step(wp_u, first, QTYPE, PACKED, num_sb) if GATED else raw_g
        for i in range(first, last):
            nxt = tl.minimum(i + 1, last - 1)  # step i + 1's loads in flight while i decodes
            nxt_g = _load_step(wp_g, nxt, QTYPE, PACKED, num_sb)
            nxt_u = _load_step(wp_u, nxt, QTYPE, PACKED, num_sb) if GATED else nxt_g
            a = tl.load(xp + i * 128, mask=ok[:, None], other=0.0)
            acc = _tile_dot(a, _decode_step(raw_g, i, grid_ptr, QTYPE, BLOCK_N, PACKED), acc, DOT_PRECISION, SWAP)
            if GATED:
                acc_u = _tile_dot(a, _decode_step(raw_u, i, grid_ptr, QTYPE, BLOCK_N, PACKED), acc_u, DOT_PRECISION,
                                  SWAP)
            raw_g = nxt_g
            raw_u = nxt_u
    acc = _tile_rows(acc, SWAP)
    acc_u = _tile_rows(acc_u, SWAP)
    _moe_store(acc, acc_u, out_ptr + pid_s * stride_os, route_w_ptr, ids, ok, offs_n, N, stride_om, GATED,
               ROUTE_WEIGHTED)
    if REDUCE:   # the planes are written: count this program in; the last of the gate/up tile pair gates the sums
        half_n = num_n // 2
        tile = pid_m * half_n + pid_n % half_n
        if _last_to_arrive(counter_ptr + tile, 2 * tl.num_programs(1)):
            f = (pid_n % half_n) * BLOCK_N + tl.arange(0, BLOCK_N)
            half_mask = ok[:, None] & (f < N // 2)[None, :]
            gp = out_ptr + ids[:, None] * stride_om + f[None, :]
            g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for sp in range(tl.num_programs(1)):
                g += tl.load(gp + sp * stride_os, mask=half_mask, other=0.0, cache_modifier=".cg")
                u += tl.load(gp + sp * stride_os + N // 2, mask=half_mask, other=0.0, cache_modifier=".cg")
            tl.store(final_ptr + ids[:, None] * stride_fm + f[None, :],
                     (g / (1.0 + tl.exp(-g)) * u).to(final_ptr.dtype.element_ty), mask=half_mask)
            _reset(counter_ptr + tile)


@triton.jit
def _moe_dense_kernel(x_ptr, w_ptr, out_ptr, route_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, N, K,
                      num_valid, a_row_div, expert_base, num_experts_here, stride_xm, stride_we, stride_wn, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
                      ROUTE_WEIGHTED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The tile MoE's pass with weights already in the activation dtype (w [experts here, rows, K]: the dequantized
    experts expert_base .. expert_base + num_experts_here - 1; blocks of other experts return at once).  Same
    routing layout and outputs as :func:`_moe_kernel`: GATED stores SiLU(gate) * up of rows n and N + n, otherwise
    the product (times the routing weight when ROUTE_WEIGHTED).  K is a multiple of BLOCK_K."""
    pid_m, pid_n, past_rows = _moe_block(N, num_padded_ptr, BLOCK_M, BLOCK_N)
    if past_rows:
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64) - expert_base
    if (expert < 0) | (expert >= num_experts_here):
        return
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    ok = ids < num_valid
    ids = tl.where(ok, ids, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    xp = x_ptr + (ids // a_row_div)[:, None] * stride_xm + offs_k[None, :]
    wp = w_ptr + expert * stride_we + rows[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(xp + k0, mask=ok[:, None], other=0.0)
        acc = tl.dot(a, tl.trans(tl.load(wp + k0)), acc, input_precision=DOT_PRECISION)
        if GATED:
            acc_u = tl.dot(a, tl.trans(tl.load(wp + N * stride_wn + k0)), acc_u, input_precision=DOT_PRECISION)
    _moe_store(acc, acc_u, out_ptr, route_w_ptr, ids, ok, offs_n, N, stride_om, GATED, ROUTE_WEIGHTED)


@triton.jit
def _silu_mul_splits_kernel(part_ptr, act_ptr, splits, inter, stride_ps, stride_pr, stride_ar, BLOCK: tl.constexpr):
    """act[r, j] = SiLU(sum_s part[s, r, j]) * sum_s part[s, r, inter + j]: the split-K partial sums of a decode
    MoE call's w13 pass, reduced and gated in one launch (torch took five).  Grid: (routed rows, column blocks)."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    base = part_ptr + r * stride_pr + cols
    g = tl.zeros((BLOCK,), tl.float32)
    u = tl.zeros((BLOCK,), tl.float32)
    for sp in range(splits):
        g += tl.load(base + sp * stride_ps, mask=ok, other=0.0)
        u += tl.load(base + sp * stride_ps + inter, mask=ok, other=0.0)
    tl.store(act_ptr + r * stride_ar + cols, (g / (1.0 + tl.exp(-g)) * u).to(act_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------------------


# The IQ1/IQ2/IQ3 grids: gguf.quants' tables (llama.cpp's, decoded by the gguf package), rows of 8 (IQ1, IQ2) or 4
# (IQ3) small integers, held on the device as their bytes (IQ1's -1, 0, 1 plus GRID_IQ1_OFFSET, which _grid_rows
# takes off again).
_GRID_QUANTS = {t: getattr(gguf.quants, traits_of(t).name) for t in GRID_TYPES}
GRID_IQ1_OFFSET = 1
_grid_tables: dict[tuple[int, torch.device], torch.Tensor] = {}


def _grid_bytes(qtype: int) -> torch.Tensor:
    """gguf.quants' grid of ``qtype`` as uint8 [entries, row width]: the values (IQ1: + GRID_IQ1_OFFSET), checked
    to be whole numbers that fit a byte."""
    quant = _GRID_QUANTS[qtype]
    if qtype in (IQ1_S, IQ1_M) and float(quant.delta) != IQ1_DELTA.value:
        raise ValueError(f"gguf.quants.{quant.__name__}.delta is {quant.delta}, the kernels use {IQ1_DELTA.value}")
    quant.init_grid()
    grid = torch.from_numpy(quant.grid.reshape(quant.grid_shape).astype("float64"))
    grid = grid + (GRID_IQ1_OFFSET if qtype in (IQ1_S, IQ1_M) else 0)
    if not (torch.equal(grid, grid.round()) and grid.min() >= 0 and grid.max() <= 255):
        raise ValueError(f"gguf.quants.{quant.__name__}.grid holds values the kernels cannot hold as bytes "
                         f"(from {grid.min().item()} to {grid.max().item()})")
    return grid.to(torch.uint8)


def grid_table(qtype: int, device: torch.device) -> torch.Tensor:
    """The uint8 grid rows of an IQ1/IQ2/IQ3 type on ``device`` (made on the first call: vLLM's profile run makes it
    before CUDA graphs are captured, and a capture that would have to copy it is refused)."""
    if qtype not in _GRID_QUANTS:
        raise ValueError(f"GGUF type {qtype} has no grid (the IQ1/IQ2/IQ3 types do: {tuple(_GRID_QUANTS)})")
    table = _grid_tables.get((qtype, device))
    if table is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"GGUF grid table of type {qtype} requested first during CUDA graph capture: run the "
                               "model once before capturing (vLLM's profile run does)")
        table = _grid_tables[(qtype, device)] = _grid_bytes(qtype).to(device)
    return table


def _grid_arg(qtype: int, weight: torch.Tensor) -> torch.Tensor:
    """The kernels' grid_ptr: the type's grid table, or for a type without one the weight itself (never read)."""
    return grid_table(qtype, weight.device) if qtype in _GRID_QUANTS else weight


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # 16-bit dots ignore it; fp32 ones must not use tf32


def _check_weight(w: torch.Tensor, qtype: int, k: int, what: str, packed: bool = False) -> None:
    if qtype not in SUPPORTED_TYPES:
        raise ValueError(f"{what}: GGUF type {qtype} has no shim kernel (supported: {SUPPORTED_TYPES})")
    if packed and int(qtype) not in gguf_mma.PACKERS:
        raise ValueError(f"{what}: GGUF type {qtype} has no packed layout (PACKERS: {tuple(gguf_mma.PACKERS)})")
    if w.dtype != torch.uint8:
        raise ValueError(f"{what}: expected uint8 GGUF blocks, found {w.dtype}")
    if k % K_MULTIPLE:
        raise ValueError(f"{what}: K={k} is not a multiple of {K_MULTIPLE}")
    if w.shape[-1] < row_bytes(qtype, k, packed) or w.stride(-1) != 1:
        raise ValueError(f"{what}: rows of {w.shape[-1]} bytes (stride {w.stride(-1)}), expected "
                         f"{row_bytes(qtype, k, packed)} contiguous bytes for K={k}{' packed' if packed else ''}")
    if w.data_ptr() % 2 or any(st % 2 for st in w.stride()[:-1]):  # the kernels read scales as 16-bit words
        raise ValueError(f"{what}: rows start at odd byte addresses (address {w.data_ptr()}, strides {w.stride()}), "
                         "expected 2-byte aligned rows")


CPU_NUM_SMS = 16  # what the plans assume in the interpreter


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_NUM_SMS
    return cuda_capability_and_sms(_device_index(device))[1]


def _capability(device: torch.device) -> tuple[int, int] | None:
    """The device's compute capability; None for the interpreter (CPU tensors)."""
    return cuda_capability_and_sms(_device_index(device))[0] if device.type == "cuda" else None


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _split(tiles: int, steps: int, num_sms: int, ctas_per_sm: int) -> tuple[int, int]:
    """(splits, steps per split) so that tiles x splits covers the GPU ctas_per_sm times (decode is bound by how
    many bytes are in flight: every SM must be streaming weights)."""
    split = max(1, min(steps, triton.cdiv(ctas_per_sm * num_sms, tiles)))
    per_split = triton.cdiv(steps, split)
    return triton.cdiv(steps, per_split), per_split


# Tuning, measured on the H200 (bench/gguf_matmul.py --parts sweep; bench/journal/).  Decode: small row
# tiles, K split to fill the GPU.  Prefill: square tiles big enough that decoding a weight tile costs less than
# its MMAs; above DENSE_DEQUANT_MIN_M rows a dense linear dequantizes its weight to the activation dtype in
# row chunks and lets cuBLAS multiply (the decode cost is then paid once per weight, not once per row tile).
DECODE_TUNING = dict(BLOCK_N=64, num_warps=4, num_stages=3, ctas_per_sm=4)
PREFILL_TUNING = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
DENSE_DEQUANT_MIN_M = 128
# The prefill tiles tuned per pass to the weight's type and the target's tensor cores (plan["w13"] / plan["w2"]:
# prefill_pass_tuning; dense tiles: linear_tile_tuning), from Triton 3.6's own ptxas offline (bench/tile_sass.py,
# bench/journal/2026-12-06.md).  On the mma.sync targets (sm_80-89, sm_120/121) Q4_K's tile decodes in a layout the
# dot's right operand must be transposed from: with the weights as the left operand (SWAP) its K loop takes 1356
# SASS instructions a step on sm_120 instead of 3035.  Q6_K's gate/up tile (two accumulators and two steps of raw
# weights in flight) spilled 6 KB a thread there (3067 spill instructions a step); in 32-feature blocks, 8 warps and
# SWAP it spills nothing (1022 instructions).  Not timed on an mma.sync GPU.  sm_90 (the H200, wgmma) keeps the
# 64x64 four-warp tile: measured there (2026-12-06, TP-8 MoE, 2048 tokens) SWAP took 1508 µs against 1418 (Q4_K), and
# 8 warps, which end Q8_0's spills, 2410 against 2285 (file layout) and 1721 against 1684 (packed).
PREFILL_MAX_STACK = 512  # bytes a thread the tuned tiles may keep on the stack (the 64x64 Q6_K tile: 6 KB on sm_120)


def linear_tile_tuning(qtype: int, capability: tuple[int, int] | None) -> dict:
    """The dense tile linear's override for ``qtype`` on a GPU of ``capability`` (None: the interpreter): Q4_K on
    mma.sync targets with the weights as the dot's left operand (sm_120 loop instructions a step: 64-row tiles 1541 ->
    689, 32 rows 769 -> 648, 16 rows 704 -> 572); Q6_K, Q8_0, Q3_K, IQ2_XXS gain under 10 % there."""
    return {"SWAP": True} if int(qtype) == Q4_K and mma_sync_target(capability) else {}


def mma_sync_target(capability: tuple[int, int] | None) -> bool:
    """Whether ``tl.dot`` lowers to mma.sync on a GPU of this capability: sm_80-89 and sm_120/121, the targets the
    tuned tiles are for (None: the interpreter, tuned as one).  sm_90 (wgmma) and sm_100 (tcgen05) keep the untuned
    tiles: the tuning was derived from mma.sync SASS, and on the H200 it measured slower."""
    return capability is None or capability[0] in (8, 12)


def prefill_pass_tuning(qtype: int, gated: bool, capability: tuple[int, int] | None) -> dict:
    """The prefill-tile pass's overrides of PREFILL_TUNING for weights of ``qtype`` (gated: the w13 pass) on a GPU of
    ``capability`` (None: the interpreter, tuned as an mma.sync target)."""
    if not mma_sync_target(capability):
        return {}
    if int(qtype) == Q4_K:
        return {"SWAP": True}
    if int(qtype) == Q6_K and gated:
        return {"BLOCK_N": 32, "num_warps": 8, "SWAP": True}
    return {}


# Tile linears whose split planes the kernel sums itself (kernels/arrivals.py): 16- and 32-row tiles.  H200,
# 2026-12-03, 32 rows, µs, 32-row self-summing tiles against one 64-row tile and a sum launch: Q4_K lm_head 77 / 108,
# q_a+kv_a 17.1 / 24.5, o_proj 14.6 / 21.5, dense down 13.1 / 18.6; Q6_K 7-15 % faster (17 of 18 TP-8 shapes faster;
# 16-row tiles, which re-read the weight, lost on the large Q6_K shapes: lm_head 313 against 154)
SELF_REDUCING_MAX_BLOCK_M = 32
DEQUANT_CHUNK_BYTES = 64 << 20


def linear_plan(m: int, n: int, k: int, num_sms: int, tuning: dict | None = None, qtype: int | None = None,
                capability: tuple[int, int] | None = None) -> dict:
    """Launch plan of :func:`gguf_linear` for an M x N x K call (pure: the tests and the bench use it).  With
    ``qtype``, a tile plan carries linear_tile_tuning(qtype, capability) under the explicit ``tuning``."""
    steps = k // STEP_K
    if m > DENSE_DEQUANT_MIN_M and not tuning:
        return dict(dequant=True)
    if qtype is not None:
        tuning = {**linear_tile_tuning(qtype, capability), **(tuning or {})}
    if m <= 16:
        t = {**DECODE_TUNING, "BLOCK_M": 16, **(tuning or {})}
    elif m <= 32:
        t = {**DECODE_TUNING, "BLOCK_M": 32, **(tuning or {})}
    elif m <= 64:   # 33-64 rows: one 64-row tile (32-row tiles there not measured)
        t = {**DECODE_TUNING, "BLOCK_M": 64, **(tuning or {})}
    else:
        t = {**PREFILL_TUNING, "ctas_per_sm": 1, **(tuning or {})}
    tiles = triton.cdiv(m, t["BLOCK_M"]) * triton.cdiv(n, t["BLOCK_N"])
    split, per_split = _split(tiles, steps, num_sms, t["ctas_per_sm"]) if m <= 64 else (1, steps)
    return dict(dequant=False, BLOCK_M=t["BLOCK_M"], BLOCK_N=t["BLOCK_N"], num_warps=t["num_warps"],
                num_stages=t["num_stages"], split=split, steps_per_split=per_split,
                self_reduce=t.get("self_reduce", t["BLOCK_M"] <= SELF_REDUCING_MAX_BLOCK_M),
                SWAP=t.get("SWAP", False))


# Dequantization to 16 bits (dense prefill linears, prefill MoEs): rows a program, 128-value steps a program.
# H200, 2026-12-04, 64 TP-8 experts' w13 / w2 to bf16, % of the floor (GGUF bytes read + bf16 written): 4 steps
# 69 / 80 (Q4_K), 74 / 71 (Q6_K), 73 / 77 (IQ2_XXS), 70 / 74 (Q8_0); one step 65 / 69, 68 / 58, 62 / 70, 72 / 73;
# 16 steps, 64 rows, 8 warps no better (bench/results/2026-12-04-s13-dequant.md)
DEQUANT_TUNING = dict(BLOCK_N=32, steps=4, num_warps=4, num_stages=3)


def gguf_dequantize(qweight: torch.Tensor, qtype: int, k: int, dtype: torch.dtype,
                    out: torch.Tensor | None = None, tuning: dict | None = None, packed: bool = False
                    ) -> torch.Tensor:
    """[N, row bytes] GGUF blocks (packed: in gguf_mma.pack's layout) -> [N, k] in ``dtype`` (each weight rounded
    once)."""
    n = qweight.shape[0]
    _check_weight(qweight, qtype, k, "gguf_dequantize weight", packed)
    out = torch.empty(n, k, dtype=dtype, device=qweight.device) if out is None else out
    if n:
        t = {**DEQUANT_TUNING, **(tuning or {})}
        steps = k // STEP_K
        per = min(steps, t["steps"])
        _dequant_kernel[(triton.cdiv(n, t["BLOCK_N"]), triton.cdiv(steps, per))](
            qweight, _grid_arg(qtype, qweight), out, n, qweight.stride(0), out.stride(0), steps, per, QTYPE=qtype,
            BLOCK_N=t["BLOCK_N"], PACKED=packed, num_warps=t["num_warps"], num_stages=t["num_stages"])
    return out


def gguf_linear(x: torch.Tensor, qweight: torch.Tensor, qtype: int, n: int | None = None,
                plan: dict | None = None, packed: bool = False) -> torch.Tensor:
    """``x @ W.T`` for a GGUF weight ``qweight`` ([N, row bytes] uint8; rows may be padded wider, as vLLM pads
    merged linears; packed: in gguf_mma.pack's layout).  x: [M, K] float16/bfloat16/float32; returns [M, N] in
    x's dtype."""
    m, k = x.shape
    n = qweight.shape[0] if n is None else n
    _check_weight(qweight, qtype, k, "gguf_linear weight", packed)
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if (plan is None and m <= mma_linear_max_rows(qtype)
            and mma_decode(qtype, k, x.dtype, weight=qweight, linear=True, packed=packed)):
        return gguf_mma.linear(x, qweight, qtype, n, _num_sms(x.device), grid_table=_grid_arg(qtype, qweight),
                               packed=packed)
    if plan is None:
        plan = linear_plan(m, n, k, _num_sms(x.device), qtype=qtype, capability=_capability(x.device))
    if plan["dequant"]:
        rows = max(32, DEQUANT_CHUNK_BYTES // (k * x.element_size()) // 32 * 32)
        scratch = torch.empty(min(rows, n), k, dtype=x.dtype, device=x.device)
        for n0 in range(0, n, rows):
            n1 = min(n, n0 + rows)
            w = gguf_dequantize(qweight[n0:n1], qtype, k, x.dtype, out=scratch[: n1 - n0], packed=packed)
            if n1 - n0 == n:
                torch.matmul(x, w.T, out=out)
            else:  # a column slice of out is not contiguous: matmul cannot write it in place
                out[:, n0:n1].copy_(x @ w.T)
        return out
    split = plan["split"]
    dst = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, plan["BLOCK_M"]), triton.cdiv(n, plan["BLOCK_N"]), split)
    # the tile's last program sums the planes for 16- and 32-row tiles (H200, q_a+kv_a Q4_K: at 1 row 13.4 µs against
    # 15.5 with a sum launch, at 32 rows 17.1 against 18.8); 64-row tiles keep the sum launch (at 32 rows 34 µs a call
    # against 24 in slice a, 2026-12-03; 25.4 against 24.5 in the 2026-12-03 bench)
    reduce = split > 1 and plan["self_reduce"] and arrivals.in_kernel(grid[0] * grid[1])
    _linear_kernel[grid](x, qweight, _grid_arg(qtype, qweight), dst, out,
                         arrivals.counters(x.device) if reduce else out, m, n, x.stride(0), qweight.stride(0),
                         dst.stride(0) if split > 1 else 0, dst.stride(-2), out.stride(0), plan["steps_per_split"],
                         k // STEP_K, QTYPE=qtype, BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"],
                         DOT_PRECISION=_dot_precision(x.dtype), REDUCE=reduce, PACKED=packed,
                         SWAP=plan.get("SWAP", False), num_warps=plan["num_warps"], num_stages=plan["num_stages"])
    if split > 1 and not reduce:
        out.copy_(dst.sum(0))
    return out


def mma_linear_max_rows(qtype: int) -> int:
    """Up to how many rows a dense linear of this type runs on the register-MMA kernel when mma_decode allows it
    (routing.MMA_LINEAR_MAX_ROWS; else one program's rows)."""
    return MMA_LINEAR_MAX_ROWS.get(int(qtype), gguf_mma.TOKENS)


def mma_decode(qtype: int, k: int, dtype: torch.dtype, mma: bool | None = None,
               weight: torch.Tensor | None = None, linear: bool = False, packed: bool = False) -> bool:
    """Whether a decode-sized product of this weight runs on the register-MMA kernels (kernels/gguf/register_mma.py):
    GLM5_SHIM_GGUF_DECODE=mma (the default; or ``mma``), a type and dtype they cover (a dense ``linear``: one of
    routing.MMA_LINEAR_TYPES, or of MMA_PACKED_LINEAR_TYPES when ``packed``), and rows aligned as they
    load them."""
    wanted = settings.gguf_decode_choice() == "mma" if mma is None else mma
    # mma=True (a plan's explicit ask: the bench, the tests) takes every type the kernel computes
    types = gguf_mma.KERNEL_TYPES if mma is True else gguf_mma.MMA_TYPES
    linear_types = MMA_PACKED_LINEAR_TYPES if packed else MMA_LINEAR_TYPES
    return (wanted and gguf_mma.covers(qtype, k, dtype, types)
            and (not linear or mma is True or int(qtype) in linear_types)
            and (weight is None or gguf_mma.aligned(weight, qtype, packed)))


def mma_moe_block_rows(rows: float, qtype13: int, qtype2: int) -> int:
    """moe_align's block on the register-MMA kernels for ``rows`` rows an expert (gguf_mma.cols_for), at most
    routing.MMA_MOE_MAX_BLOCK_ROWS of either type."""
    cap = min(MMA_MOE_MAX_BLOCK_ROWS.get(int(q), gguf_mma.COLUMN_BLOCKS[-1]) for q in (qtype13, qtype2))
    return min(gguf_mma.cols_for(rows), cap)


def moe_align(topk_ids: torch.Tensor, block_m: int, num_experts: int):
    """Routed rows grouped by expert, each expert's group padded to whole ``block_m`` blocks, in torch ops with
    no host synchronisation (CUDA-graph safe, fixed output sizes).

    Returns (sorted_ids, expert_ids, num_padded): sorted_ids[j] is a flat (token * top_k + slot) index or the
    pad value topk_ids.numel(); expert_ids[b] the expert of block b; num_padded the used length (1-element)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    cap = min(pairs + num_experts * (block_m - 1), pairs * block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=flat.device) - first_of_expert[sorted_experts]
    sorted_ids = torch.full((cap,), pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[starts[sorted_experts] + rank] = order.to(torch.int32)
    blocks = torch.arange(triton.cdiv(cap, block_m), device=flat.device) * block_m
    expert_ids = torch.searchsorted(ends, blocks, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


SILU_BLOCK = 512
# Up to here a register-MMA decode MoE routes each (token, slot) pair on its own (no align launch, the top-k sum in
# the w2 launch); an expert that two pairs share is read twice, rare while pairs << experts
MOE_DIRECT_MAX_TOKENS = 4


def moe_plan(num_tokens: int, top_k: int, num_experts: int, tuning: dict | None = None,
             decode: bool | None = None, dequant: bool = False, qtypes: tuple[int, int] | None = None,
             capability: tuple[int, int] | None = None) -> dict:
    """Launch plan of :func:`gguf_moe`.  While experts see a few rows each (decode) the w13 pass is split over K
    like a decode linear (SiLU applied after the split sum); once experts are shared by many tokens, 16-row
    blocks waste the MMAs, so rows come in larger blocks and gate/up are fused with SiLU in one tile.  ``decode``
    forces the regime (the bench's A/B of the two above the threshold); ``dequant`` takes the prefill regime with
    the experts dequantized (:func:`_moe_dequantized`).  With ``qtypes`` (w13's, w2's), a prefill-tile plan carries
    each pass's prefill_pass_tuning on a GPU of ``capability`` ("w13", "w2"; an explicit ``tuning`` of the same
    keys wins)."""
    if dequant:   # tuning: MOE_DEQUANT_TUNING's keys; a plan may add "chunk_bytes" (MOE_DEQUANT_CHUNK_BYTES)
        return {"dequant": True, "dequant_tuning": dict(tuning or {})}
    rows_per_expert = num_tokens * top_k / num_experts
    if decode if decode is not None else rows_per_expert <= MOE_DECODE_MAX_ROWS_PER_EXPERT:
        t = {**DECODE_TUNING, "BLOCK_M": 16, "fused_gate": False, **(tuning or {})}
    else:
        t = {**PREFILL_TUNING, "fused_gate": True, "ctas_per_sm": 1, **(tuning or {})}
        if qtypes is not None:
            for name, qtype, gated in (("w13", qtypes[0], True), ("w2", qtypes[1], False)):
                t[name] = {**prefill_pass_tuning(qtype, gated, capability), **t.get(name, {})}
    return t


# Prefill-sized MoEs (many rows an expert): each pass dequantizes its experts to the activation dtype, a chunk of
# experts at a time (at most MOE_DEQUANT_CHUNK_BYTES of scratch, or one expert's weights if they are larger), and
# multiplies them in 16-bit tiles (_moe_dense_kernel), so a weight is decoded once a call however many row blocks
# its expert has.  From how many routed rows an expert: routing.MOE_DEQUANT_MIN_ROWS_PER_EXPERT.
# Tile shape: H200, TP 8, 2026-12-03, µs at T = 8192 with 64x64 / 128x64 (8 warps) / 128x128 (8 warps, 3 stages; 96
# KiB of shared memory on sm_120) / the same in 2 stages: Q4_K 3802 / 3591 / 3430 / 4215, Q6_K 3951 / 3747 / 3593 /
# 4389, IQ2_XXS 3688 / 3500 / 3335 / 4130 (and the same order at 4096)
MOE_DEQUANT_CHUNK_BYTES = 512 << 20
MOE_DEQUANT_TUNING = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)


def _moe_dequantized(x, w13, w2, topk_weights, topk_ids, qtype13, qtype2, plan: dict, align, out,
                     packed: tuple[bool, bool]) -> torch.Tensor:
    """gguf_moe on experts dequantized a chunk at a time (see MOE_DEQUANT_CHUNK_BYTES)."""
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    pairs = t * top_k
    tun = {**MOE_DEQUANT_TUNING, **(plan.get("dequant_tuning") or {})}
    sorted_ids, expert_ids, num_padded = align(topk_ids, tun["BLOCK_M"], e)
    per_expert = max(two_i * h, h * inter)
    chunk = max(1, min(e, plan.get("chunk_bytes", MOE_DEQUANT_CHUNK_BYTES) // (per_expert * x.element_size())))
    chunk = -(-e // -(-e // chunk))   # as many chunks, evenly filled (256 experts: 4 x 64, not 85, 85, 85, 1)
    scratch = torch.empty(chunk * per_expert, dtype=x.dtype, device=x.device)
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    down = torch.empty(pairs, h, dtype=x.dtype, device=x.device)  # rounded once before the top-k sum
    route_w = topk_weights.reshape(-1)
    for w, qtype, k, n_out, a, dst, gated, pk in ((w13, qtype13, h, inter, x, act, True, packed[0]),
                                                  (w2, qtype2, inter, h, act, down, False, packed[1])):
        rows = w.shape[1]
        grid = (expert_ids.numel() * triton.cdiv(n_out, tun["BLOCK_N"]),)
        for start in range(0, e, chunk):
            n = min(chunk, e - start)
            wd = scratch[:n * rows * k].view(n, rows, k)
            gguf_dequantize(w[start:start + n].reshape(n * rows, w.shape[2]), qtype, k, x.dtype,
                            out=wd.view(n * rows, k), tuning=plan.get("dequantize_tuning"), packed=pk)
            _moe_dense_kernel[grid](a, wd, dst, route_w, sorted_ids, expert_ids, num_padded, n_out, k, pairs,
                                    top_k if gated else 1, start, n, a.stride(0), wd.stride(0), wd.stride(1),
                                    dst.stride(0), BLOCK_M=tun["BLOCK_M"], BLOCK_N=tun["BLOCK_N"],
                                    BLOCK_K=tun["BLOCK_K"], GATED=gated, ROUTE_WEIGHTED=not gated,
                                    DOT_PRECISION=_dot_precision(a.dtype), num_warps=tun["num_warps"],
                                    num_stages=tun["num_stages"])
    return torch.sum(down.view(t, top_k, h), dim=1, out=out)


def gguf_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor, qtype13: int, qtype2: int, *, align=None, plan: dict | None = None,
             packed13: bool = False, packed2: bool = False) -> torch.Tensor:
    """Routed experts with SiLU: sum over the top-k slots of weight * (SiLU(x W_gate^T) * (x W_up^T)) W_down^T.

    x [T, H]; w13 [E, 2I, row bytes of H] (gate rows then up rows); w2 [E, H, row bytes of I]; topk_* [T, top_k].
    packed13 / packed2: that weight is in gguf_mma.pack's layout (gguf_mma.PACKERS).
    ``align(topk_ids, block_m, num_experts)`` may replace :func:`moe_align` (vLLM's CUDA op does the same)."""
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    _check_weight(w13, qtype13, h, "gguf_moe w13", packed13)
    _check_weight(w2, qtype2, inter, "gguf_moe w2", packed2)
    out = torch.empty_like(x)
    if t == 0:
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    packed = (packed13, packed2)
    plan = plan or chosen_moe_plan(t, top_k, x.dtype, w13, w2, qtype13, qtype2, packed)
    if plan.get("dequant"):
        return _moe_dequantized(x, w13, w2, topk_weights, topk_ids, qtype13, qtype2, plan, align or moe_align, out,
                                packed)
    if not plan["fused_gate"]:
        return _moe_decode(x, w13, w2, topk_weights, topk_ids, qtype13, qtype2, plan, align or moe_align, out,
                           packed)
    bm = plan["BLOCK_M"]
    sorted_ids, expert_ids, num_padded = (align or moe_align)(topk_ids, bm, e)
    pairs = t * top_k
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    _tile_pass(x, w13, qtype13, act, (sorted_ids, expert_ids, num_padded), plan, n=inter, split=1,
               per_split=h // STEP_K, num_valid=pairs, a_row_div=top_k, gated=True, packed=packed13,
               tuning=plan.get("w13"))
    down = torch.empty(pairs, h, dtype=x.dtype, device=x.device)  # rounded once before the top-k sum
    _tile_pass(act, w2, qtype2, down, (sorted_ids, expert_ids, num_padded), plan, n=h, split=1,
               per_split=inter // STEP_K, num_valid=pairs, route_w=topk_weights.reshape(-1), packed=packed2,
               tuning=plan.get("w2"))
    return torch.sum(down.view(t, top_k, h), dim=1, out=out)


def chosen_moe_plan(num_tokens: int, top_k: int, dtype: torch.dtype, w13: torch.Tensor, w2: torch.Tensor,
                    qtype13: int, qtype2: int, packed: tuple[bool, bool] = (False, False)) -> dict:
    """The plan gguf_moe takes for this call: the register-MMA (decode) regime where it covers both passes, else
    the experts dequantized or the prefill tiles, by the rows an expert gets."""
    e, two_i, _ = w13.shape
    h, inter = w2.shape[1], two_i // 2
    rows = num_tokens * top_k / e
    mma = _mma_regime(rows, dtype, w13, w2, qtype13, qtype2, h, inter, packed)
    return moe_plan(num_tokens, top_k, e, decode=mma, dequant=not mma and _dequant_regime(rows, dtype, qtype13, qtype2),
                    qtypes=(qtype13, qtype2), capability=_capability(w13.device))


def moe_regime(plan: dict) -> str:
    """A plan's regime in words (reports and profiles)."""
    if plan.get("dequant"):
        return "experts dequantized, 16-bit tiles"
    return "decode (register MMA where it covers the weight)" if not plan["fused_gate"] else "prefill tiles"


def _dequant_regime(rows_per_expert: float, dtype: torch.dtype, qtype13: int, qtype2: int) -> bool:
    """True where a MoE this size dequantizes its experts (routing.MOE_DEQUANT_MIN_ROWS_PER_EXPERT: the
    larger of its two types' thresholds); 16-bit activations only (MOE_DEQUANT_TUNING's tiles are sized for them:
    in float32 they would not fit sm_120's shared memory)."""
    threshold = max(MOE_DEQUANT_MIN_ROWS_PER_EXPERT.get(int(q), MOE_DEQUANT_DEFAULT_MIN_ROWS)
                    for q in (qtype13, qtype2))
    return dtype in (torch.float16, torch.bfloat16) and rows_per_expert >= threshold


def _mma_regime(rows_per_expert: float, dtype, w13, w2, qtype13: int, qtype2: int, h: int, inter: int,
                packed: tuple[bool, bool] = (False, False)) -> bool | None:
    """True where a MoE past the common decode threshold stays in the decode regime because both its passes run
    on the register-MMA kernels and routing.MMA_MOE_MAX_ROWS_PER_EXPERT says they are faster there; None
    (moe_plan decides by the common threshold) otherwise."""
    if rows_per_expert <= MOE_DECODE_MAX_ROWS_PER_EXPERT:
        return None
    limit = min(MMA_MOE_MAX_ROWS_PER_EXPERT.get(int(q), 0) for q in (qtype13, qtype2))
    mma = (mma_decode(qtype13, h, dtype, weight=w13, packed=packed[0])
           and mma_decode(qtype2, inter, dtype, weight=w2, packed=packed[1]))
    return True if mma and rows_per_expert <= limit else None


def _tile_pass(a, w, qtype: int, out, route, plan: dict, *, n: int, split: int, per_split: int, num_valid: int,
               a_row_div: int = 1, gated: bool = False, route_w=None, final=None, packed: bool = False,
               tuning: dict | None = None) -> None:
    """One launch of the tile MoE kernel over moe_align's blocks of plan["BLOCK_M"] rows: gated (w13 unsplit, n =
    I: out = the activations), a product (out rows, times route_w when given) or, with final, w13 split over K
    (float32 planes out [split, rows, n = 2 I], gated by the last program of each gate/up tile pair into final).
    tuning: this pass's overrides of the plan (a prefill plan's "w13" / "w2": prefill_pass_tuning)."""
    sorted_ids, expert_ids, num_padded = route
    plan = {**plan, **(tuning or {})}
    bn = plan["BLOCK_N"]
    grid = (expert_ids.numel() * triton.cdiv(n, bn), split)
    _moe_kernel[grid](
        a, w, _grid_arg(qtype, w), out, route_w if route_w is not None else a, sorted_ids, expert_ids, num_padded,
        final if final is not None else out, arrivals.counters(a.device) if final is not None else out, n,
        a.shape[1] // STEP_K, per_split, num_valid, a_row_div, a.stride(0), w.stride(0), w.stride(1),
        out.stride(0) if out.dim() == 3 else 0, out.stride(-2), final.stride(0) if final is not None else 0,
        QTYPE=qtype, BLOCK_M=plan["BLOCK_M"], BLOCK_N=bn, GATED=gated, ROUTE_WEIGHTED=route_w is not None,
        DOT_PRECISION=_dot_precision(a.dtype), REDUCE=final is not None, PROBE=plan.get("probe", 0), PACKED=packed,
        SWAP=plan.get("SWAP", False), num_warps=plan["num_warps"], num_stages=plan["num_stages"])


def _moe_decode(x, w13, w2, topk_weights, topk_ids, qtype13, qtype2, plan: dict, align, out,
                packed: tuple[bool, bool] = (False, False)) -> torch.Tensor:
    """The decode MoE (experts see a few rows each), each pass on the register-MMA kernel where it covers the
    weight (mma_decode), else on the tile kernel:

    * w13 split over K, the last program of each tile writing SiLU(gate) * up of the split sums (one launch;
      plan["fused_epilogues"] = False: the 2026-12-02 float32 planes and a SiLU launch, for the bench);
    * w2 times the routing weights, then the top-k sum.
    Up to MOE_DIRECT_MAX_TOKENS tokens (or plan["direct"]) the register-MMA passes skip the routing layout: w13
    takes one routed pair a block and w2 one token a block, summing its top-k slots itself (the call is then two
    launches).  Otherwise routed rows come in moe_align's blocks: of 8, 16 or 32 for the register-MMA kernel
    (gguf_mma.cols_for, or plan["mma_cols"]), of plan["BLOCK_M"] for the tile kernel."""
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    pairs = t * top_k
    num_sms = _num_sms(x.device)
    packed13, packed2 = packed
    mma13 = mma_decode(qtype13, h, x.dtype, plan.get("mma"), w13, packed=packed13)
    mma2 = mma_decode(qtype2, inter, x.dtype, plan.get("mma"), w2, packed=packed2)
    tuning13 = gguf_mma.tuning_for(qtype13, plan.get("mma_tuning"))
    tuning2 = gguf_mma.tuning_for(qtype2, plan.get("mma_tuning"))
    fused = plan.get("fused_epilogues", True)
    direct = fused and plan.get("direct", t <= MOE_DIRECT_MAX_TOKENS)
    # rows of a sorted block on the register MMA: for twice the mean rows an expert (experts' shares of a uniform
    # routing spread around the mean; routing's 2026-12-03 table: 16-row blocks fastest at 8 rows an expert)
    cols = plan.get("mma_cols") or mma_moe_block_rows(2 * pairs / e, qtype13, qtype2)
    routes: dict[int, tuple] = {}

    def sorted_route(block_m: int) -> tuple:
        if block_m not in routes:
            routes[block_m] = align(topk_ids, block_m, e)
        return routes[block_m]

    ids_flat = topk_ids.reshape(-1)
    ids_flat = ids_flat if ids_flat.dtype == torch.int32 else ids_flat.to(torch.int32)
    route_w = topk_weights.reshape(-1)
    # blocks that hold rows: one a routed pair (direct), or at most one partly filled block per pair or expert (the
    # count the wide blocks' measurements were taken with; with 16/32-row blocks an expert past 32 rows has more, so
    # K is split more than that fills the GPU: not measured against the exact count)
    busy = pairs if direct else min(pairs, e)
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    if mma13:
        bn = gguf_mma.block_rows(tuning13)
        split, per = gguf_mma.splits(busy * -(-two_i // bn), h // 256, num_sms, tuning13)
        if direct:
            route, blocks, routing = (None, ids_flat, None, None), pairs, gguf_mma.PAIRS.value
        else:
            route, routing = (*sorted_route(cols), None), gguf_mma.SORTED.value
            blocks = route[1].numel()
        part = torch.empty(split, pairs, two_i, dtype=torch.float32, device=x.device)
        gated = fused and inter % bn == 0
        gguf_mma.launch(x, w13, part, qtype=qtype13, n=two_i, num_valid=pairs, num_blocks=blocks, split=split,
                        sb_per_split=per, a_row_div=top_k, route=route, routing=routing,
                        final=act if gated else None, gated=gated, grid_table=_grid_arg(qtype13, w13),
                        tuning=tuning13, cols=gguf_mma.TOKENS if direct else cols, packed=packed13)
    else:
        split, per = _split(busy * triton.cdiv(two_i, plan["BLOCK_N"]), h // STEP_K, num_sms, plan["ctas_per_sm"])
        part = torch.empty(split, pairs, two_i, dtype=torch.float32, device=x.device)
        route = sorted_route(plan["BLOCK_M"])
        gated = (fused and inter % plan["BLOCK_N"] == 0
                 and arrivals.in_kernel(route[1].numel() * triton.cdiv(inter, plan["BLOCK_N"])))
        _tile_pass(x, w13, qtype13, part, route, plan, n=two_i, split=split, per_split=per,
                   num_valid=pairs, a_row_div=top_k, final=act if gated else None, packed=packed13)
    if not gated:   # the w13 launch left its split planes: SiLU(gate) * up of their sums in a launch of its own
        _silu_mul_splits_kernel[(pairs, triton.cdiv(inter, SILU_BLOCK))](
            part, act, split, inter, part.stride(0), part.stride(1), act.stride(0), BLOCK=SILU_BLOCK, num_warps=4)
    if mma2 and direct:
        units = top_k * (inter // 256)
        split, per = gguf_mma.splits(t * -(-h // gguf_mma.block_rows(tuning2)), units, num_sms, tuning2)
        dst = out if split == 1 else torch.empty(split, t, h, dtype=torch.float32, device=x.device)
        gguf_mma.launch(act, w2, dst, qtype=qtype2, n=h, num_valid=t, num_blocks=t, split=split, sb_per_split=per,
                        route=(None, ids_flat, None, route_w), routing=gguf_mma.TOKEN_SUM.value, top_k=top_k,
                        final=None if split == 1 else out, grid_table=_grid_arg(qtype2, w2), tuning=tuning2,
                        packed=packed2)
        return out
    down = torch.empty(pairs, h, dtype=x.dtype, device=x.device)  # rounded once before the top-k sum
    if mma2:
        route = sorted_route(cols)
        gguf_mma.launch(act, w2, down, qtype=qtype2, n=h, num_valid=pairs, num_blocks=route[1].numel(), split=1,
                        sb_per_split=inter // 256, route=(*route, route_w), grid_table=_grid_arg(qtype2, w2),
                        tuning=tuning2, cols=cols, packed=packed2)
    else:
        _tile_pass(act, w2, qtype2, down, sorted_route(plan["BLOCK_M"]), plan, n=h, split=1,
                   per_split=inter // STEP_K, num_valid=pairs, route_w=route_w, packed=packed2)
    return torch.sum(down.view(t, top_k, h), dim=1, out=out)


# ----------------------------------------------------------------------------------------------------------------
# every compiled variant (for the offline compile test: tests/kernels/test_compile_targets_gguf_matmul.py)
# ----------------------------------------------------------------------------------------------------------------

_LINEAR_SIG = {"x_ptr": "*bf16", "w_ptr": "*u8", "grid_ptr": "*u8", "out_ptr": "*bf16", "final_ptr": "*bf16",
               "counter_ptr": "*i32", "M": "i32", "N": "i32", "stride_xm": "i32", "stride_wn": "i32",
               "stride_os": "i32", "stride_om": "i32", "stride_fm": "i32", "steps_per_split": "i32",
               "num_steps": "i32"}
_SILU_SIG = {"part_ptr": "*fp32", "act_ptr": "*bf16", "splits": "i32", "inter": "i32", "stride_ps": "i32",
             "stride_pr": "i32", "stride_ar": "i32"}
_DEQUANT_SIG = {"w_ptr": "*u8", "grid_ptr": "*u8", "out_ptr": "*bf16", "N": "i32", "stride_wn": "i32",
                "stride_on": "i32", "num_steps": "i32", "steps_per_program": "i32"}
_MOE_SIG = {"x_ptr": "*bf16", "w_ptr": "*u8", "grid_ptr": "*u8", "out_ptr": "*bf16", "route_w_ptr": "*fp32",
            "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32", "final_ptr": "*bf16",
            "counter_ptr": "*i32", "N": "i32", "num_steps": "i32", "steps_per_split": "i32", "num_valid": "i32",
            "a_row_div": "i32", "stride_xm": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_os": "i32",
            "stride_om": "i32", "stride_fm": "i32"}


_MOE_DENSE_SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "route_w_ptr": "*fp32",
                  "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32", "N": "i32", "K": "i32",
                  "num_valid": "i32", "a_row_div": "i32", "expert_base": "i32", "num_experts_here": "i32",
                  "stride_xm": "i32", "stride_we": "i32", "stride_wn": "i32", "stride_om": "i32"}


def compile_offline(cfg: dict, cc: int):
    """One configuration of kernel_configs() or register_mma.kernel_configs() compiled for sm_{cc} without a GPU
    (the offline compile tests, bench/kernel_sass.py, bench/kernel_ptx.py): Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = cfg["kernel"]
    sig = dict(cfg["signature"], **{k: "constexpr" for k in cfg["constexprs"]})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in cfg["divisible_by_16"]}
    source = GluonASTSource if cfg.get("gluon") else triton.compiler.ASTSource
    return triton.compile(source(kernel, sig, constexprs=cfg["constexprs"], attrs=attrs),
                          target=GPUTarget("cuda", cc, 32),
                          options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))


def kernel_configs() -> list[dict]:
    """Every (kernel, constexprs, warps, stages) the plans above launch, with bf16 activations: name, kernel,
    signature, constexprs, num_warps, num_stages, divisible_by_16 (argument names the runtime specialises)."""
    cfgs = []
    for qt in SUPPORTED_TYPES:
        # every tile linear untuned, and again as the mma.sync targets run it (linear_tile_tuning; family "mma":
        # compiled for those targets only)
        tuned = linear_tile_tuning(qt, None)
        tunings = [{}] + ([tuned] if tuned else [])
        for bm, t, reduce in ((16, DECODE_TUNING, False), (16, DECODE_TUNING, True), (32, DECODE_TUNING, False),
                              (32, DECODE_TUNING, True), (64, DECODE_TUNING, False),
                              (PREFILL_TUNING["BLOCK_M"], PREFILL_TUNING, False)):
            for tun in tunings:
                sig = {**_LINEAR_SIG, "out_ptr": "*fp32"} if reduce else _LINEAR_SIG
                cfgs.append(dict(name=f"linear q{qt} m{bm} s{t['num_stages']}{' split-K reduced' if reduce else ''}"
                                      f"{' mma' if tun else ''}", kernel=_linear_kernel, signature=sig,
                                 constexprs=dict(QTYPE=qt, BLOCK_M=bm, BLOCK_N=t["BLOCK_N"], DOT_PRECISION="tf32",
                                                 REDUCE=reduce, **tun),
                                 num_warps=t["num_warps"], num_stages=t["num_stages"],
                                 divisible_by_16=("x_ptr", "w_ptr", "grid_ptr", "out_ptr", "stride_xm", "stride_om"),
                                 **({"family": "mma"} if tun else {})))
        cfgs.append(dict(name=f"dequant q{qt}", kernel=_dequant_kernel, signature=_DEQUANT_SIG,
                         constexprs=dict(QTYPE=qt, BLOCK_N=DEQUANT_TUNING["BLOCK_N"]),
                         num_warps=DEQUANT_TUNING["num_warps"], num_stages=DEQUANT_TUNING["num_stages"],
                         divisible_by_16=("w_ptr", "grid_ptr", "out_ptr", "stride_on")))
        prefill = moe_plan(4096, 8, 256, qtypes=(qt, qt), capability=None)   # as an mma.sync target tunes it
        for p in (moe_plan(1, 8, 256), prefill):   # decode (w13 split over K), prefill (the untuned tiles)
            decode = not p["fused_gate"]
            # (BLOCK_N, GATED, ROUTE_WEIGHTED, REDUCE): w13 (decode: planes, gated by the reduction; also unreduced
            # for the SiLU launch when I is not a multiple of BLOCK_N), w2
            variants = ([(p["BLOCK_N"], False, False, True), (p["BLOCK_N"], False, False, False)] if decode
                        else [(p["BLOCK_N"], True, False, False)]) + [(p["BLOCK_N"], False, True, False)]
            for bn, gated, weighted, reduce in variants:
                planes = decode and not weighted
                name = (f"moe q{qt} m{p['BLOCK_M']} n{bn}{' gated' if gated else ''}"
                        f"{' split-K' if planes else ''}{' reduced' if reduce else ''}")
                cfgs.append(dict(name=name, kernel=_moe_kernel,
                                 signature={**_MOE_SIG, "out_ptr": "*fp32"} if planes else _MOE_SIG,
                                 num_warps=p["num_warps"], num_stages=p["num_stages"],
                                 constexprs=dict(QTYPE=qt, BLOCK_M=p["BLOCK_M"], BLOCK_N=bn, GATED=gated,
                                                 ROUTE_WEIGHTED=weighted, DOT_PRECISION="tf32", REDUCE=reduce),
                                 divisible_by_16=("x_ptr", "w_ptr", "grid_ptr", "out_ptr", "stride_xm", "stride_om")))
        # the prefill tiles tuned per pass for the mma.sync targets (prefill_pass_tuning; family "mma"), at most
        # PREFILL_MAX_STACK bytes of stack a thread
        for gated in (True, False):
            tun = prefill["w13" if gated else "w2"]
            if not tun:
                continue
            c = {**prefill, **tun}
            cfgs.append(dict(name=f"moe q{qt} prefill {'w13' if gated else 'w2'} mma", kernel=_moe_kernel,
                             signature=_MOE_SIG, num_warps=c["num_warps"], num_stages=c["num_stages"],
                             family="mma", max_stack=PREFILL_MAX_STACK,
                             constexprs=dict(QTYPE=qt, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], GATED=gated,
                                             ROUTE_WEIGHTED=not gated, DOT_PRECISION="tf32", REDUCE=False,
                                             SWAP=c.get("SWAP", False)),
                             divisible_by_16=("x_ptr", "w_ptr", "grid_ptr", "out_ptr", "stride_xm", "stride_om")))
    # weights repacked at load (gguf_mma.PACKERS' types): every tile variant again on their layout
    cfgs += [dict(c, name=f"{c['name']} packed", constexprs=dict(c["constexprs"], PACKED=True)) for c in list(cfgs)
             if c["constexprs"]["QTYPE"] in gguf_mma.PACKERS]
    t = MOE_DEQUANT_TUNING
    for gated in (True, False):
        cfgs.append(dict(name=f"moe 16-bit weights{' gated' if gated else ' weighted'}", kernel=_moe_dense_kernel,
                         signature=_MOE_DENSE_SIG, num_warps=t["num_warps"], num_stages=t["num_stages"],
                         constexprs=dict(BLOCK_M=t["BLOCK_M"], BLOCK_N=t["BLOCK_N"], BLOCK_K=t["BLOCK_K"],
                                         GATED=gated, ROUTE_WEIGHTED=not gated, DOT_PRECISION="tf32"),
                         divisible_by_16=("x_ptr", "w_ptr", "out_ptr", "K", "stride_xm", "stride_we", "stride_wn",
                                          "stride_om")))
    cfgs.append(dict(name="silu_mul splits", kernel=_silu_mul_splits_kernel, signature=_SILU_SIG,
                     constexprs=dict(BLOCK=SILU_BLOCK), num_warps=4, num_stages=3,
                     divisible_by_16=("part_ptr", "act_ptr", "stride_ps", "stride_pr", "stride_ar")))
    return gguf_mma.with_default_constexprs(cfgs)
