"""Portable Triton sparse-MLA (DSA) attention for GLM-5 / DeepSeek-V3.2 geometry.

Per query token ``t`` and head ``h``::

    s_j      = sm_scale * <q[t, h, :576], kv[slot_j, :576]>        for the valid slots j of indices[t]
    out[t,h] = sum_j softmax(s)_j * kv[slot_j, :512]
    lse[t,h] = log(sum_j exp(s_j))                                   (natural log, float32)

One KV head is shared by all query heads (MQA over the 576-wide latent: 512 "nope" + 64 rope).

Design (decode is what matters: one token, 78 layers):

* **split-K**: a program owns one token, ``BLOCK_H`` heads and a share of the top-k list, gathers ``BLOCK_N`` KV
  rows at a time (once for all its heads), and runs an online softmax over them.  With more than one split the
  programs write normalised fp32 partials + a log2-domain LSE to a workspace and a small combine kernel merges
  them with the LSE trick; with one split (prefill) the forward kernel writes the final result itself.
* The split count is a function of shapes and the SM count only (no host sync; CUDA-graph capturable).
* Tiles of a token's list are dealt round-robin to the splits, so the ``-1`` tail of a short-context list is
  spread evenly instead of idling whole programs.
* ``fp8_ds_mla``: the e4m3 latent is decoded exactly into the dots' dtype (bf16 for fp16 queries too, see
  compute_dtype): by the sm_89+ conversion (measured fastest on the H200), below sm_89 by a packed PTX bit trick (a
  byte shifted into bf16's fields is the value times 2**-120; into fp16's, the value / 2**8).  The known power of
  two and the per-128 fp32 scales are folded into the fp32 scores (QK) and into P (PV): ``4 * BLOCK_H`` multiplies
  per gathered row instead of 512.  The rope stays 16-bit: bf16, or fp16 under a float16 model (vLLM's cache writer
  copies k_pe as it is; ``fp8_ds_mla_rope_dtype``).
* Gather latency is hidden by double-buffered ``cp.async`` (bf16 cache, Triton's pipeliner at ``num_stages=5``)
  or by a hand-written register prefetch of the next tile (fp8 cache: Triton will not pipeline a load that feeds
  both dots through the decode; SPLIT_LOADS makes it pipeline them, which measured slower on the H200).
* All dots are 16-bit inputs with fp32 accumulation (mma.sync on sm_80-sm_120, wgmma on sm_90 when a program
  holds 64 heads); the online softmax runs in fp32 in the log2 domain.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from glm5_shim.kernels.sparse_mla_reference import fp8_ds_mla_rope_dtype  # noqa: F401  (part of this API)
from glm5_shim.kernels.fp8 import FP8_DECODES, e4m3_bytes_decode, native_fp8_supported
# tests/gpu/test_sparse_mla_gpu.py imports fp8.py's portable fp16 decode under this module's old name for it
from glm5_shim.kernels.fp8 import e4m3_bytes_to_f16_div256 as _e4m3_to_f16_div256  # noqa: F401

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
D_V = 512
FP8_ROW_BYTES = 656  # 512 e4m3 + 4 fp32 scales + 64 rope values (bf16; fp16 under fp16 queries)
FP8_SCALE_OFFSET = tl.constexpr(512)  # constexpr: read inside the kernel
FP8_ROPE_OFFSET = tl.constexpr(528)
# The FP8_DECODE constexpr names one of fp8.py's FP8_DECODES (value / K_F, the factor folded back through the scales)
NO_FP8_DECODE = "none"  # the constexpr's value for a bf16 cache (one compiled variant, whatever the override)
# bf16 decodes: q's latent is lifted by 2**64 so q.k products stay far above fp32's underflow; scores get 2**56 and
# P 2**96 (P * scale stays < 2**127 for scales below 2**31), the output 2**24 back: 64 + 56 = 96 + 24 = 120
BF16_Q_F = tl.constexpr(2.0 ** 64)
BF16_QK_F = tl.constexpr(2.0 ** 56)
BF16_PV_F = tl.constexpr(2.0 ** 96)
BF16_OUT_F = tl.constexpr(2.0 ** 24)
MAX_SPLITS = 32
KV_FORMATS = ("bf16", "fp8_ds_mla")
LOG2E = 1.4426950408889634

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _to_compute(x, COMPUTE: tl.constexpr):
    """Query values in the dtype the dots take (COMPUTE: "q" keeps q's dtype; see compute_dtype)."""
    y = x
    if COMPUTE == "bf16":
        y = x.to(tl.float32).to(tl.bfloat16)  # fp16 -> fp32 is exact: the bf16 rounding of the fp16 value
    elif COMPUTE == "f32":
        y = x.to(tl.float32)
    return y


@triton.jit
def _load_idx(idx_row, tile, K, BLOCK_N: tl.constexpr):
    offs = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.load(idx_row + offs, mask=offs < K, other=-1)


@triton.jit
def _rows(idx, num_slots, block_size, stride_kb, stride_kr):
    valid = (idx >= 0) & (idx < num_slots)
    slot = tl.where(valid, idx, 0)
    blk = slot // block_size
    # int64: a large fp8 pool passes 2**31 bytes
    row = blk.to(tl.int64) * stride_kb + (slot - blk * block_size).to(tl.int64) * stride_kr
    return valid, row


@triton.jit
def _load_latent(kv_ptr, row, valid, OTHER: tl.constexpr):
    """The 512 latent values (bf16) or bytes (fp8) of the gathered rows as 4 x [BLOCK_N, 128]; masked rows read
    OTHER (only to tell two otherwise identical loads apart, see SPLIT_LOADS: masked rows never contribute)."""
    d = tl.arange(0, 128)
    rp = kv_ptr + row
    m2 = valid[:, None]
    c0 = tl.load(rp[:, None] + d[None, :], mask=m2, other=OTHER)
    c1 = tl.load(rp[:, None] + (128 + d)[None, :], mask=m2, other=OTHER)
    c2 = tl.load(rp[:, None] + (256 + d)[None, :], mask=m2, other=OTHER)
    c3 = tl.load(rp[:, None] + (384 + d)[None, :], mask=m2, other=OTHER)
    return c0, c1, c2, c3


@triton.jit
def _load_tile(kv_ptr, row, valid, IS_FP8: tl.constexpr, ROPE_F16: tl.constexpr):
    """One tile of gathered rows, undecoded: 4 x [BLOCK_N, 128] latent chunks (values, or e4m3 bytes), [BLOCK_N, 64]
    rope and (fp8) 4 x [BLOCK_N] scales (bf16 cache: the scales are dummies).  An fp8 row's rope is fp16 when
    ROPE_F16 (a float16 model: vLLM's writer copies k_pe as is), else bf16."""
    dr = tl.arange(0, 64)
    rp = kv_ptr + row
    m2 = valid[:, None]
    c0, c1, c2, c3 = _load_latent(kv_ptr, row, valid, 0)
    if IS_FP8:
        sp = (rp + FP8_SCALE_OFFSET).to(tl.pointer_type(tl.float32))
        s0 = tl.load(sp, mask=valid, other=0.0)
        s1 = tl.load(sp + 1, mask=valid, other=0.0)
        s2 = tl.load(sp + 2, mask=valid, other=0.0)
        s3 = tl.load(sp + 3, mask=valid, other=0.0)
        if ROPE_F16:
            rope_ptr = (rp + FP8_ROPE_OFFSET).to(tl.pointer_type(tl.float16))
        else:
            rope_ptr = (rp + FP8_ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16))
        kr = tl.load(rope_ptr[:, None] + dr[None, :], mask=m2, other=0.0)
    else:
        s0 = valid.to(tl.float32)
        s1 = s0
        s2 = s0
        s3 = s0
        kr = tl.load(rp[:, None] + (512 + dr)[None, :], mask=m2, other=0)
    return c0, c1, c2, c3, kr, s0, s1, s2, s3


@triton.jit
def _attend_tile(q0, q1, q2, q3, qr, c0, c1, c2, c3, v0, v1, v2, v3, kr, s0, s1, s2, s3, valid,
                 m_i, l_i, acc0, acc1, acc2, acc3, sm_scale_log2,
                 IS_FP8: tl.constexpr, FP8_DECODE: tl.constexpr):
    """Online-softmax update of (m, l, acc) with one gathered tile: c* are the latent chunks for QK, v* the same
    chunks for PV (the same values, possibly from a second load: SPLIT_LOADS)."""
    DT: tl.constexpr = q0.dtype
    # fp32 is the exactness check in tests; on a GPU keep it out of tf32
    PREC: tl.constexpr = "ieee" if DT == tl.float32 else "tf32"
    if IS_FP8:
        # the decoded K is value / K_F (see FP8_DECODES); the factor comes back through the per-128 scales, which
        # belong to KV rows = score columns: scale the partial dots and P's columns, never the elements
        BF16_DECODE: tl.constexpr = (FP8_DECODE == "bf16bits") or (FP8_DECODE == "bf16ptx")
        F16_BITS: tl.constexpr = (FP8_DECODE == "f16bits") or (FP8_DECODE == "f16ptx")
        QK_F: tl.constexpr = 256.0 if F16_BITS else (BF16_QK_F if BF16_DECODE else 1.0)
        PV_F: tl.constexpr = 256.0 if F16_BITS else (BF16_PV_F if BF16_DECODE else 1.0)
        k0 = e4m3_bytes_decode(c0, DT, FP8_DECODE)
        k1 = e4m3_bytes_decode(c1, DT, FP8_DECODE)
        k2 = e4m3_bytes_decode(c2, DT, FP8_DECODE)
        k3 = e4m3_bytes_decode(c3, DT, FP8_DECODE)
        w0 = e4m3_bytes_decode(v0, DT, FP8_DECODE)
        w1 = e4m3_bytes_decode(v1, DT, FP8_DECODE)
        w2 = e4m3_bytes_decode(v2, DT, FP8_DECODE)
        w3 = e4m3_bytes_decode(v3, DT, FP8_DECODE)
        s = tl.dot(q0, tl.trans(k0), input_precision=PREC) * (s0 * QK_F)[None, :]
        s += tl.dot(q1, tl.trans(k1), input_precision=PREC) * (s1 * QK_F)[None, :]
        s += tl.dot(q2, tl.trans(k2), input_precision=PREC) * (s2 * QK_F)[None, :]
        s += tl.dot(q3, tl.trans(k3), input_precision=PREC) * (s3 * QK_F)[None, :]
        if kr.dtype != qr.dtype:
            kr = kr.to(qr.dtype)  # the interpreter's fp32 path only: on a GPU the rope is in q's dtype
        s = tl.dot(qr, tl.trans(kr), s, input_precision=PREC)
    else:
        k0 = c0
        k1 = c1
        k2 = c2
        k3 = c3
        w0 = v0
        w1 = v1
        w2 = v2
        w3 = v3
        s = tl.dot(q0, tl.trans(k0), input_precision=PREC)
        s = tl.dot(q1, tl.trans(k1), s, input_precision=PREC)
        s = tl.dot(q2, tl.trans(k2), s, input_precision=PREC)
        s = tl.dot(q3, tl.trans(k3), s, input_precision=PREC)
        s = tl.dot(qr, tl.trans(kr), s, input_precision=PREC)

    s = tl.where(valid[None, :], s * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a head that has seen no valid slot yet keeps m=-inf; exponentiate against 0 so nothing becomes NaN
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # P's columns carry the per-128 scales (and K_F): fp8 dots run in bf16 or fp32, whose range holds P * scale
    f_pv = PV_F if IS_FP8 else 1.0
    acc0 = acc0 * alpha[:, None]
    acc1 = acc1 * alpha[:, None]
    acc2 = acc2 * alpha[:, None]
    acc3 = acc3 * alpha[:, None]
    if IS_FP8:
        acc0 = tl.dot((p * (s0 * f_pv)[None, :]).to(DT), w0, acc0, input_precision=PREC)
        acc1 = tl.dot((p * (s1 * f_pv)[None, :]).to(DT), w1, acc1, input_precision=PREC)
        acc2 = tl.dot((p * (s2 * f_pv)[None, :]).to(DT), w2, acc2, input_precision=PREC)
        acc3 = tl.dot((p * (s3 * f_pv)[None, :]).to(DT), w3, acc3, input_precision=PREC)
    else:
        pd = p.to(DT)
        acc0 = tl.dot(pd, w0, acc0, input_precision=PREC)
        acc1 = tl.dot(pd, w1, acc1, input_precision=PREC)
        acc2 = tl.dot(pd, w2, acc2, input_precision=PREC)
        acc3 = tl.dot(pd, w3, acc3, input_precision=PREC)
    return m_new, l_i, acc0, acc1, acc2, acc3


# Integer arguments that change with the batch but never with alignment are not specialised (Triton would compile
# a variant per "== 1 / % 16 / other" class of each, on first use, in the middle of serving): the split count and
# the LSE strides that follow it.
@triton.jit(do_not_specialize=["splits", "stride_lt", "stride_ls"])
def _sparse_mla_fwd_kernel(
    q_ptr, qpe_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
    sm_scale_log2,
    H, K, num_slots, block_size, num_hb, splits,
    stride_qt, stride_qh, stride_pt, stride_ph,
    stride_kb, stride_kr,
    stride_it,
    stride_ot, stride_os, stride_oh,
    stride_lt, stride_ls, stride_lh,
    IS_FP8: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    COMPUTE: tl.constexpr,
    WRITE_PARTIAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
    SPLIT_LOADS: tl.constexpr,
):
    # head block fastest so the programs sharing a token's KV rows run side by side (L2 reuse)
    pid = tl.program_id(0)
    hb = pid % num_hb
    rest = pid // num_hb
    split = rest % splits
    t = (rest // splits).to(tl.int64)

    # the fp8 cache's rope is in the model's dtype (fp8_ds_mla_rope_dtype): fp16 with fp16 queries, else bf16
    ROPE_F16: tl.constexpr = q_ptr.dtype.element_ty == tl.float16
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    d = tl.arange(0, 128)
    dr = tl.arange(0, 64)
    q_row = q_ptr + t * stride_qt + heads[:, None] * stride_qh
    q0 = _to_compute(tl.load(q_row + d[None, :], mask=hmask[:, None], other=0.0), COMPUTE)
    q1 = _to_compute(tl.load(q_row + (128 + d)[None, :], mask=hmask[:, None], other=0.0), COMPUTE)
    q2 = _to_compute(tl.load(q_row + (256 + d)[None, :], mask=hmask[:, None], other=0.0), COMPUTE)
    q3 = _to_compute(tl.load(q_row + (384 + d)[None, :], mask=hmask[:, None], other=0.0), COMPUTE)
    # the rope dot keeps q's own dtype on a GPU: it matches the fp8 cache's rope (fp16 with fp16 queries), so that
    # rope needs no conversion; only the interpreter's fp32 path converts it
    qr = tl.load(qpe_ptr + t * stride_pt + heads[:, None] * stride_ph + dr[None, :], mask=hmask[:, None], other=0.0)
    if COMPUTE == "f32":
        qr = qr.to(tl.float32)
    BF16_DECODE: tl.constexpr = IS_FP8 and ((FP8_DECODE == "bf16bits") or (FP8_DECODE == "bf16ptx"))
    if BF16_DECODE:
        # K comes as value * 2**-120: lift the latent q by 2**64 (exact in bf16) so q.k stays far from fp32's
        # underflow; the scores' factor is 2**56 (BF16_QK_F)
        q0 = (q0.to(tl.float32) * BF16_Q_F).to(q0.dtype)
        q1 = (q1.to(tl.float32) * BF16_Q_F).to(q1.dtype)
        q2 = (q2.to(tl.float32) * BF16_Q_F).to(q2.dtype)
        q3 = (q3.to(tl.float32) * BF16_Q_F).to(q3.dtype)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc1 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc2 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc3 = tl.zeros([BLOCK_H, 128], tl.float32)

    n_tiles = tl.cdiv(K, BLOCK_N)
    idx_row = idx_ptr + t * stride_it
    if PREFETCH:
        # Hand-rolled software pipeline in registers (launch with num_stages=1): indices two tiles ahead, rows one
        # tile ahead, so a tile's gather overlaps the previous tile's math.  Used where Triton's pipeliner cannot
        # help: the fp8 bytes are decoded before the dot, so it leaves those loads synchronous.
        n_mine = tl.cdiv(n_tiles - split, splits)
        idx_a = _load_idx(idx_row, split, K, BLOCK_N)
        idx_b = _load_idx(idx_row, split + splits, K, BLOCK_N)
        valid_a, row_a = _rows(idx_a, num_slots, block_size, stride_kb, stride_kr)
        c0, c1, c2, c3, kr, s0, s1, s2, s3 = _load_tile(kv_ptr, row_a, valid_a, IS_FP8, ROPE_F16)
        for it in range(0, n_mine):
            valid_b, row_b = _rows(idx_b, num_slots, block_size, stride_kb, stride_kr)
            n0, n1, n2, n3, nr, t0, t1, t2, t3 = _load_tile(kv_ptr, row_b, valid_b, IS_FP8, ROPE_F16)
            idx_b = _load_idx(idx_row, split + (it + 2) * splits, K, BLOCK_N)
            m_i, l_i, acc0, acc1, acc2, acc3 = _attend_tile(
                q0, q1, q2, q3, qr, c0, c1, c2, c3, c0, c1, c2, c3, kr, s0, s1, s2, s3, valid_a,
                m_i, l_i, acc0, acc1, acc2, acc3, sm_scale_log2, IS_FP8, FP8_DECODE)
            c0, c1, c2, c3, kr, s0, s1, s2, s3 = n0, n1, n2, n3, nr, t0, t1, t2, t3
            valid_a = valid_b
    else:
        # Triton's pipeliner: with num_stages=5 the index load runs 4 tiles ahead and the rows 2 (cp.async,
        # double-buffered); with 3 they are 2 and 1 ahead.
        for tile in range(split, n_tiles, splits):
            idx = _load_idx(idx_row, tile, K, BLOCK_N)
            valid, row = _rows(idx, num_slots, block_size, stride_kb, stride_kr)
            c0, c1, c2, c3, kr, s0, s1, s2, s3 = _load_tile(kv_ptr, row, valid, IS_FP8, ROPE_F16)
            if SPLIT_LOADS:
                # The same latent bytes loaded a second time (L2 hits) for PV.  Triton pipelines (cp.async into
                # shared memory) a load that feeds one dot through the e4m3 decode, but not one that feeds both
                # QK (as K^T) and PV (as V): with one load per dot the fp8 gathers become asynchronous.  No default
                # tile uses it: on the H200 the fp8 kernel is bound by issued instructions, not by gather latency,
                # and this variant issues more (8 heads x 256 tokens: 391 vs 301 us; bench/RESULTS.md 2026-11-30).
                # A tuning option for GPUs where that balance differs (bench/sparse_mla.py --sweep).
                v0, v1, v2, v3 = _load_latent(kv_ptr, row, valid, 1)
            else:
                v0, v1, v2, v3 = c0, c1, c2, c3
            m_i, l_i, acc0, acc1, acc2, acc3 = _attend_tile(
                q0, q1, q2, q3, qr, c0, c1, c2, c3, v0, v1, v2, v3, kr, s0, s1, s2, s3, valid,
                m_i, l_i, acc0, acc1, acc2, acc3, sm_scale_log2, IS_FP8, FP8_DECODE)

    has = l_i > 0.0
    inv_l = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    if BF16_DECODE:
        inv_l = inv_l * BF16_OUT_F  # P carried 2**96, K 2**-120
    o_row = out_ptr + t * stride_ot + split * stride_os + heads[:, None] * stride_oh
    ODT: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(o_row + d[None, :], (acc0 * inv_l[:, None]).to(ODT), mask=hmask[:, None])
    tl.store(o_row + (128 + d)[None, :], (acc1 * inv_l[:, None]).to(ODT), mask=hmask[:, None])
    tl.store(o_row + (256 + d)[None, :], (acc2 * inv_l[:, None]).to(ODT), mask=hmask[:, None])
    tl.store(o_row + (384 + d)[None, :], (acc3 * inv_l[:, None]).to(ODT), mask=hmask[:, None])
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if not WRITE_PARTIAL:
        lse2 = lse2 * 0.6931471805599453  # callers get a natural log; partials stay in log2
    tl.store(lse_ptr + t * stride_lt + split * stride_ls + heads * stride_lh, lse2, mask=hmask)


@triton.jit(do_not_specialize=["splits", "stride_vt", "stride_vs"])
def _sparse_mla_combine_kernel(
    ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, splits,
    stride_wt, stride_ws, stride_wh,
    stride_vt, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_lt, stride_lh,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (token, head, 128-wide slice of d_v): all splits are loaded at once (one L2 round trip)
    pid = tl.program_id(0)
    n_dc: tl.constexpr = 512 // BLOCK_D
    dc = pid % n_dc
    rest = pid // n_dc
    h = rest % H
    t = (rest // H).to(tl.int64)
    s_offs = tl.arange(0, BLOCK_S)
    smask = s_offs < splits
    lse_s = tl.load(ws_lse_ptr + t * stride_vt + s_offs * stride_vs + h * stride_vh, mask=smask,
                    other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse_s - m_use)
    tot = tl.sum(w, 0)
    has = tot > 0.0
    w = w * tl.where(has, 1.0 / tl.where(has, tot, 1.0), 0.0)
    d = dc * BLOCK_D + tl.arange(0, BLOCK_D)
    part = tl.load(ws_out_ptr + t * stride_wt + s_offs[:, None] * stride_ws + h * stride_wh + d[None, :],
                   mask=smask[:, None] & (w[:, None] > 0.0), other=0.0)
    o = tl.sum(part * w[:, None], 0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))
    if dc == 0:
        lse = tl.where(has, (m_use + tl.log2(tl.where(has, tot, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + t * stride_lt + h * stride_lh, lse)


# ---------------------------------------------------------------------------------------------------------------
# Configurations and heuristics
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One compiled variant.  ``kernel`` is "fwd" or "combine"; ``constexprs`` are the kernel's constexpr args."""

    kernel: str
    constexprs: tuple  # sorted (name, value) pairs; hashable
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return dict(self.constexprs)

    def __getitem__(self, key):
        return dict(self.constexprs)[key]


@dataclasses.dataclass(frozen=True)
class FwdTile:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    occupancy: int  # resident programs per SM the split heuristic assumes
    prefetch: bool = False  # hand-rolled register prefetch (PREFETCH constexpr) instead of Triton's pipeliner
    split_loads: bool = False  # fp8: one load of the latent per dot, so Triton's pipeliner takes them (SPLIT_LOADS)


# Tiles per target family, keyed by head class (<=16, <=32, more).  Chosen from offline compiles (shared memory,
# registers, no spills; see tests/kernels/test_compile_targets_sparse_mla.py run as a script) and to be re-tuned
# with `python bench/sparse_mla.py --sweep` on the hardware.
# * bf16 cache: Triton's pipeliner.  num_stages=5 is what double-buffers the gathered rows: with one level of
#   indirection (indices -> rows) Triton gives each load (num_stages-1)//2 tiles of lead, so 3 or 4 stages leave
#   a single row buffer that is refilled only after the tile's math.
# * fp8 cache: Triton's pipeliner leaves a load synchronous when it feeds both dots through the decode (seen in
#   the compiled TTGIR; with one load per dot, SPLIT_LOADS, it pipelines them); these tiles use the kernel's own
#   register prefetch (PREFETCH) with num_stages=1.  On the H200 the fp8 kernel is bound by issued instructions
#   (ncu, 8 heads x 256 tokens: 1.27 IPC, 8 warps per SM, ~170 warp instructions per gathered row against ~95 for
#   the bf16 cache), not by gather latency: split loads measured slower (bench/RESULTS.md 2026-11-30).
# Consumer parts (sm_120/121, sm_8x) are held to 99 KiB of shared memory, mma.sync and 64K registers per SM;
# Hopper/Blackwell-DC get 227 KiB and can hold 64 heads per program (each KV row gathered once per token).
@functools.lru_cache(maxsize=None)  # pure; called on every launch (the dict is shared: do not mutate it)
def _fwd_tiles(capability: tuple[int, int], dtype: torch.dtype, kv_format: str) -> dict[int, FwdTile]:
    cap = tuple(capability)
    fp8 = kv_format == "fp8_ds_mla"
    if dtype == torch.float32:  # interpreter exactness path
        t = FwdTile(16, 16, 4, 1, 1)
        return {16: t, 32: t, 64: t}
    if cap[0] in (9, 10):
        if fp8:
            # 64 rows a tile: ~42 KB of gathers in flight per SM at 4+ TB/s
            t16 = FwdTile(16, 64, 8, 1, 1, prefetch=True)   # 92 KiB, 252 regs
            t32 = FwdTile(32, 32, 8, 1, 1, prefetch=True)   # 74 KiB, 246 regs (64 heads + prefetch spills)
            # H200 sweep, bf16 q, 64 heads: 64 heads/program without the register prefetch (each row gathered and
            # decoded once per token) beats t32 at T=64 (231 vs 260 us) and T=256 (648 vs 1014 us).  132 KiB,
            # 255 regs, no spill with bf16 queries; fp16 ones (bf16 dots too, compute_dtype) spill 168 B: 802.7 vs
            # 644.2 us at 64 x 256 (t32 not measured with them; sm_90 GGUF serving runs bf16).  sm_90 only.
            t64 = FwdTile(64, 32, 8, 3, 1) if cap[0] == 9 and dtype == torch.bfloat16 else t32
            return {16: t16, 32: t32, 64: t64}
        return {16: FwdTile(16, 32, 4, 5, 2),                # 94 KiB, 194 regs
                32: FwdTile(32, 32, 8, 5, 1),                # 113 KiB, 151 regs
                64: FwdTile(64, 32, 8, 5, 1)}                # 185 KiB, 252 regs
    if fp8:
        # 64 rows a tile, as on sm_90: on the H200 as a stand-in (the same mma.sync code at 16 heads) it beats
        # (16, 32) by 24% at 8 heads x 256 tokens (304 vs 399 us) and 21% at 64 tokens (88.5 vs 111.5 us), graph;
        # not measured on sm_120/8x hardware.  92 KiB, 247-255 regs, no spill on sm_120/121/89/86/80.
        t16 = FwdTile(16, 64, 8, 1, 1, prefetch=True)
        t32 = FwdTile(32, 32, 8, 1, 1, prefetch=True)       # 74 KiB, 234 regs
        return {16: t16, 32: t32, 64: t32}
    return {16: FwdTile(16, 32, 4, 5, 1),                    # 94 KiB, 184 regs
            32: FwdTile(32, 16, 8, 5, 1),                    # 75 KiB, 142 regs
            64: FwdTile(32, 16, 8, 5, 1)}


def _head_class(num_heads: int) -> int:
    return 16 if num_heads <= 16 else (32 if num_heads <= 32 else 64)


def compute_dtype(q_dtype: torch.dtype, kv_format: str, on_gpu: bool = True) -> torch.dtype:
    """The dtype the kernel's dots take: the queries' own, except fp16 queries on the fp8_ds_mla cache (what GGUF
    serving runs on sm_100+, sm_120 included).  Those are rounded to bf16 on a GPU: fp16 P * scale leaves fp16's
    range for caches far from unit scale, and keeping it in range took a per-tile rescale that cost ~25% (H200,
    8 heads x 256 tokens: 377 vs 303 us); bf16's rounding (2**-9) is far below the cache's own e4m3 quantisation
    (2**-4 a value).  In the interpreter, whose bf16 dots are wrong, they run in fp32."""
    if kv_format == "fp8_ds_mla" and q_dtype == torch.float16:
        return torch.bfloat16 if on_gpu else torch.float32
    return q_dtype


def _compute_name(q_dtype: torch.dtype, kv_format: str, on_gpu: bool) -> str:
    """The COMPUTE constexpr: "q" (the queries' dtype), "bf16" or "f32"."""
    cdt = compute_dtype(q_dtype, kv_format, on_gpu)
    return "q" if cdt == q_dtype else ("bf16" if cdt == torch.bfloat16 else "f32")


def fp8_decode_method(capability: tuple[int, int], dtype: torch.dtype, on_gpu: bool = True) -> str:
    """The FP8_DECODE the fp8_ds_mla kernel uses for queries of ``dtype`` on ``capability`` (see FP8_DECODES).

    Default: the native conversion from sm_89 on (measured fastest on an H200, bench/RESULTS.md 2026-11-30);
    below sm_89, which has none, the packed PTX bit trick into bf16 (plain Triton in the interpreter).
    ``GLM5_SPARSE_MLA_FP8_DECODE=<method>`` overrides it (benchmarking); a method this case cannot use is refused."""
    if compute_dtype(dtype, "fp8_ds_mla", on_gpu) == torch.float32:
        return "f32"
    # every other case computes in bf16 (fp16 queries included), which all the methods below decode into
    mode = os.environ.get("GLM5_SPARSE_MLA_FP8_DECODE", "auto").strip().lower() or "auto"
    if mode == "auto":
        if native_fp8_supported(capability):
            return "cvt"
        return "bf16ptx" if on_gpu else "bf16bits"
    why = None
    if mode not in FP8_DECODES or mode == "f32":
        why = f"expected auto or one of {', '.join(FP8_DECODES[1:])}"
    elif mode == "cvt" and not native_fp8_supported(capability):
        why = f"cvt needs sm_89 or newer, this is sm_{capability[0]}{capability[1]}"
    elif mode.endswith("ptx") and not on_gpu:
        why = f"{mode} is PTX: GPU only (the interpreter takes {mode[:-3]}bits)"
    if why:
        raise ValueError(f"GLM5_SPARSE_MLA_FP8_DECODE={mode!r}: {why}")
    return mode


def select_fwd_tile(capability, dtype, kv_format, num_heads, num_tokens: Optional[int] = None,
                    topk: Optional[int] = None, num_sms: Optional[int] = None) -> FwdTile:
    """The tile for ``num_heads``' class; given the launch's tokens, top-k and SM count, a decode of so few tokens
    that wide-head programs cannot fill the GPU even at the largest split count takes the 16-head tile instead
    (more, shorter programs: 64 heads at T=1 run as 4 x 32 programs rather than 1 x 32)."""
    tiles = _fwd_tiles(tuple(capability), compute_dtype(dtype, kv_format), kv_format)
    tile = tiles[_head_class(num_heads)]
    if num_tokens is None or topk is None or num_sms is None or tile.block_h <= 16:
        return tile
    max_splits = max(1, min(MAX_SPLITS, triton.cdiv(topk, tile.block_n) // 2))
    if num_tokens * triton.cdiv(num_heads, tile.block_h) * max_splits < num_sms * tile.occupancy:
        return tiles[16]
    return tile


COMBINE_BLOCK_D = 128


def _combine_block_s(num_splits: int) -> int:
    return 8 if num_splits <= 8 else 32


def kernel_configs(capability, dtype, kv_format) -> list[KernelConfig]:
    """Every (kernel, constexprs, num_warps, num_stages) the launch heuristics can pick on ``capability`` for
    query dtype ``dtype`` (bf16/fp16) and ``kv_format``.  fp32 queries are an interpreter-only test path and have
    no GPU configurations.  The fp8 decode is the one :func:`fp8_decode_method` picks on a GPU, so the
    ``GLM5_SPARSE_MLA_FP8_DECODE`` benchmarking override compiles that method's variants instead."""
    cap = tuple(capability)
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv_format!r}")
    if dtype not in (torch.bfloat16, torch.float16):
        return []
    is_fp8 = kv_format == "fp8_ds_mla"
    decode = fp8_decode_method(cap, dtype) if is_fp8 else NO_FP8_DECODE
    compute = _compute_name(dtype, kv_format, True)
    seen, out = set(), []
    for tile in _fwd_tiles(cap, compute_dtype(dtype, kv_format), kv_format).values():
        for partial in (False, True):
            cfg = KernelConfig("fwd", tuple(sorted(dict(
                IS_FP8=is_fp8, FP8_DECODE=decode, COMPUTE=compute, WRITE_PARTIAL=partial, PREFETCH=tile.prefetch,
                SPLIT_LOADS=tile.split_loads,
                BLOCK_H=tile.block_h, BLOCK_N=tile.block_n).items())), tile.num_warps, tile.num_stages)
            if cfg not in seen:
                seen.add(cfg)
                out.append(cfg)
    for bs in (8, 32):
        out.append(KernelConfig("combine", tuple(sorted(dict(BLOCK_S=bs, BLOCK_D=COMBINE_BLOCK_D).items())), 4, 1))
    return out


@functools.lru_cache(maxsize=4096)
def choose_num_splits(num_tokens: int, num_heads: int, topk: int, num_sms: int, block_h: int, block_n: int,
                      occupancy: int = 1, row_bytes: int = 2 * D_QK) -> int:
    """Split count from shapes only (so a CUDA graph captured for a fixed T stays valid).

    Cost in units of "one program gathers and processes one tile of BLOCK_N rows":
    ``waves * (tiles per program + partial write) + combine``, where ``waves = ceil(programs / (SMs *
    occupancy))``, a program's fp32 partial (BLOCK_H x 512) costs half its size in tile bytes, and the combine
    costs a launch (2 tiles) plus streaming every partial twice over all SMs.  Ties go to fewer splits, every
    split keeps at least two tiles (so the gather pipeline has something to overlap), at most MAX_SPLITS."""
    hb = triton.cdiv(num_heads, block_h)
    base = num_tokens * hb
    n_tiles = triton.cdiv(topk, block_n)
    slots = max(1, num_sms * occupancy)
    tile_bytes = float(block_n * row_bytes)
    part_bytes = float(block_h * (D_V + 1) * 4)
    max_s = max(1, min(MAX_SPLITS, n_tiles // 2))
    best, best_cost = 1, None
    for s in range(1, max_s + 1):
        tps = triton.cdiv(n_tiles, s)
        if triton.cdiv(n_tiles, tps) != s:  # same per-program work as a smaller s
            continue
        waves = triton.cdiv(base * s, slots)
        if s == 1:
            cost = float(waves * tps)
        else:
            cost = (waves * (tps + 0.5 * part_bytes / tile_bytes) + 2.0
                    + 2.0 * base * s * part_bytes / (max(1, num_sms) * tile_bytes))
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


@functools.lru_cache(maxsize=64)
def _device_info(index: int):
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


# default target when running on CPU (Triton interpreter): behaves like an sm_120 board
CPU_DEFAULT_CAPABILITY = (12, 0)
CPU_DEFAULT_NUM_SMS = 16


def workspace_numel(num_tokens: int, num_heads: int, num_splits: int) -> int:
    """float32 elements needed for the split partials (out + lse); 0 when num_splits == 1."""
    if num_splits <= 1:
        return 0
    return num_tokens * num_splits * num_heads * (D_V + 1)


# ---------------------------------------------------------------------------------------------------------------
# Launch wrapper
# ---------------------------------------------------------------------------------------------------------------


def _kv_geometry(kv_cache: torch.Tensor, kv_format: str, q_dtype: torch.dtype):
    """Returns (tensor whose data pointer the kernel reads, num_blocks, block_size, block stride, row stride), from
    the shape and strides alone: no views are made (the pointer of a [nb, bs, 1, W] or flat [num_slots, W] cache is
    the same as that of the [nb, bs, W] view)."""
    width = FP8_ROW_BYTES if kv_format == "fp8_ds_mla" else D_QK
    shape, stride = kv_cache.shape, kv_cache.stride()
    nd = len(shape)
    if nd == 4 and shape[2] == 1:  # vLLM/FlashMLA views with a singleton head dim
        nb, bs, w, stride_b, stride_r, stride_w = shape[0], shape[1], shape[3], stride[0], stride[1], stride[3]
    elif nd == 3:
        nb, bs, w, stride_b, stride_r, stride_w = shape[0], shape[1], shape[2], stride[0], stride[1], stride[2]
    elif nd == 2:  # flat [num_slots, W]: one block holding every slot
        nb, bs, w, stride_b, stride_r, stride_w = 1, shape[0], shape[1], 0, stride[0], stride[1]
    else:
        w = stride_w = None
    if w != width:
        raise ValueError(f"kv_cache for kv_format={kv_format!r} must be [num_blocks, block_size, {width}] "
                         f"(or [num_slots, {width}]), got {tuple(kv_cache.shape)}")
    if stride_w != 1:
        raise ValueError("kv_cache rows must be contiguous (last-dim stride 1)")
    kv = kv_cache
    if kv_format == "fp8_ds_mla":
        if kv.dtype != torch.uint8:
            if kv.dtype != torch.float8_e4m3fn:
                raise TypeError(f"fp8_ds_mla kv_cache must be uint8 (or float8_e4m3fn), got {kv.dtype}")
            kv = kv.view(torch.uint8)
        if stride_b % 4 or stride_r % 4 or kv.data_ptr() % 4:
            raise ValueError("fp8_ds_mla rows must start 4-byte aligned (their fp32 scales are read in place)")
    elif kv.dtype != q_dtype:
        raise TypeError(f"kv_format='bf16' needs kv_cache in the query dtype {q_dtype}, got {kv.dtype}")
    if nb <= 1:  # a single block is never stepped over; keep the value the kernel was always specialised on
        stride_b = bs * stride_r
    return kv, nb, bs, stride_b, stride_r


class _Plan(NamedTuple):
    """Everything about a launch that follows from (device, shapes, dtypes, format, overrides): built once per
    distinct key by :func:`_launch_plan`, so a call only checks its tensors, allocates and launches."""

    num_hb: int
    num_splits: int
    fwd_grid: tuple
    fwd_kwargs: dict  # constexprs + num_warps/num_stages
    ws_numel: int
    n_out: int  # float32 elements of the partial outputs at the start of the workspace
    ws_strides: tuple  # (out t, s, h, lse t, s, h) of the workspace's two regions
    combine_grid: tuple
    combine_kwargs: dict


@functools.lru_cache(maxsize=4096)
def _launch_plan(cap, sms, dtype, kv_format, decode, T, H, K, num_splits, tile, compute="q") -> _Plan:
    if tile is None:
        tile = select_fwd_tile(cap, dtype, kv_format, H, T, K, sms)
    num_hb = triton.cdiv(H, tile.block_h)
    n_tiles = triton.cdiv(K, tile.block_n)
    if num_splits is None:
        num_splits = choose_num_splits(T, H, K, sms, tile.block_h, tile.block_n, tile.occupancy,
                                       FP8_ROW_BYTES if kv_format == "fp8_ds_mla" else 2 * D_QK)
    # every split needs a tile, and the combine kernel reads at most MAX_SPLITS partials
    num_splits = max(1, min(int(num_splits), n_tiles, MAX_SPLITS))
    fwd_kwargs = dict(IS_FP8=kv_format == "fp8_ds_mla", FP8_DECODE=decode, COMPUTE=compute,
                      WRITE_PARTIAL=num_splits > 1,
                      BLOCK_H=tile.block_h, BLOCK_N=tile.block_n, PREFETCH=tile.prefetch,
                      SPLIT_LOADS=tile.split_loads,
                      num_warps=tile.num_warps, num_stages=tile.num_stages)
    S = num_splits
    return _Plan(num_hb, S, (T * S * num_hb,), fwd_kwargs, workspace_numel(T, H, S), T * S * H * D_V,
                 (S * H * D_V, H * D_V, D_V, S * H, H, 1), (T * H * (D_V // COMBINE_BLOCK_D),),
                 dict(BLOCK_S=_combine_block_s(S), BLOCK_D=COMBINE_BLOCK_D, num_warps=4, num_stages=1))


def sparse_mla_attention(q, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float, *,
                         kv_format: str, d_v: int = D_V, out: Optional[torch.Tensor] = None,
                         lse: Optional[torch.Tensor] = None, num_splits: Optional[int] = None,
                         workspace: Optional[torch.Tensor] = None, num_sms: Optional[int] = None,
                         capability: Optional[tuple[int, int]] = None, tile: Optional[FwdTile] = None):
    """Sparse MLA attention over per-token top-k KV slots.

    Args:
        q: ``[T, H, 576]`` (bf16/fp16; fp32 only on CPU, for exactness checks), or a tuple
            ``(q_nope [T, H, 512], q_pe [T, H, 64])`` to skip concatenating them.  Last-dim stride 1.
        kv_cache: ``kv_format="bf16"`` (the name covers fp16 too): ``[num_blocks, block_size, 576]`` in q's dtype,
            or flat ``[num_slots, 576]``.  ``kv_format="fp8_ds_mla"``: uint8 ``[num_blocks, block_size, 656]`` =
            512 e4m3 latent bytes, 4 fp32 scales (one per 128 latent values, any positive value), 64 rope values in
            :func:`fp8_ds_mla_rope_dtype` of q's dtype (fp16 for fp16 queries, else bf16: what vLLM's cache writer
            stores, the model's dtype).
            A ``[nb, bs, 1, W]`` view is accepted.  Block stride may exceed ``block_size * row stride``.
        indices: ``[T, K]`` int32 global slots (``block * block_size + offset``).  ``-1`` (and anything outside
            ``[0, num_blocks * block_size)``) is skipped, wherever it sits in the row.
        sm_scale: softmax scale applied to the 576-dim dot products.
        d_v: value width; only 512 (the latent) is supported.
        out: optional ``[T, H, 512]`` output in q's dtype (last-dim stride 1).
        lse: optional ``[T, H]`` float32.
        num_splits: force the split-K factor (1 = no combine).  Default: :func:`choose_num_splits`.
        workspace: optional preallocated float32 tensor with at least :func:`workspace_numel` elements.
        num_sms, capability: override what is read from the device (CPU default: sm_120-like, 16 SMs).
        tile: override the :class:`FwdTile` (tuning/tests).

    Returns:
        ``(out, lse)``: ``out[t, h] = sum_j softmax_j * V_j`` with the softmax over the valid slots only,
        ``lse[t, h] = log(sum_j exp(sm_scale * q.k_j))`` as a **natural** log in float32.  A row with no valid
        slot yields ``out = 0`` and ``lse = -inf``.

    Numerics: 16-bit dot inputs, fp32 accumulation and softmax; P is rounded to q's dtype before PV (as in
    FlashAttention/FlashMLA).  fp8_ds_mla: the e4m3 values are decoded exactly into the dots' dtype, which is q's
    except for fp16 queries: those are rounded to bf16 on a GPU (fp32 in the interpreter), see :func:`compute_dtype`;
    the output is still q's dtype.

    No host synchronisation; the split count depends only on shapes and the SM count, so a call with fixed T is
    CUDA-graph capturable (pass ``workspace``/``out``/``lse`` to keep all memory outside the graph pool).
    """
    # Host cost matters: prefill and mixed steps run this eagerly once per layer.  Everything that depends only on
    # (device, shapes, dtypes, format) comes from the cached _launch_plan; what is left are the checks, the
    # allocations and the launches.
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv_format!r}")
    if d_v != D_V:
        raise NotImplementedError(f"only d_v={D_V} (the MLA latent) is supported, got {d_v}")
    if isinstance(q, (tuple, list)):
        q_nope, q_pe = q
        if q_nope.shape[-1] != D_LATENT or q_pe.shape[-1] != D_ROPE or q_nope.shape[:2] != q_pe.shape[:2]:
            raise ValueError(f"q tuple must be ([T,H,{D_LATENT}], [T,H,{D_ROPE}]), got "
                             f"{tuple(q_nope.shape)}, {tuple(q_pe.shape)}")
        if q_pe.dtype != q_nope.dtype:
            raise TypeError("q_nope and q_pe must share a dtype")
        qs, ps = q_nope.stride(), q_pe.stride()
    else:
        if q.dim() != 3 or q.shape[-1] != D_QK:
            raise ValueError(f"q must be [T, H, {D_QK}], got {tuple(q.shape)}")
        q_nope, q_pe = q, q[..., D_LATENT:]
        qs = ps = q.stride()
    dtype, dev = q_nope.dtype, q_nope.device
    if dtype not in _TL_DTYPES:
        raise TypeError(f"q dtype must be bf16, fp16 or fp32, got {dtype}")
    is_cuda = dev.type == "cuda"
    if dtype == torch.float32 and is_cuda:
        raise TypeError("fp32 queries are an interpreter test path; use bf16 or fp16 on a GPU")
    if qs[-1] != 1 or ps[-1] != 1:
        raise ValueError("q must have last-dim stride 1")
    T, H = q_nope.shape[0], q_nope.shape[1]
    if H < 1:
        raise ValueError("need at least one head")
    if indices.dim() == 3 and indices.shape[1] == 1:
        indices = indices[:, 0, :]
    if indices.dim() != 2 or indices.shape[0] != T:
        raise ValueError(f"indices must be [T={T}, K], got {tuple(indices.shape)}")
    if indices.dtype != torch.int32:
        raise TypeError(f"indices must be int32, got {indices.dtype}")
    if indices.stride(-1) != 1:
        indices = indices.contiguous()
    K = indices.shape[1]
    kv, nb, bs, stride_kb, stride_kr = _kv_geometry(kv_cache, kv_format, dtype)

    if out is None:
        out = torch.empty((T, H, D_V), dtype=dtype, device=dev)
    elif out.shape != (T, H, D_V) or out.dtype != dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be [T, H, {D_V}] {dtype} with last-dim stride 1")
    if lse is None:
        lse = torch.empty((T, H), dtype=torch.float32, device=dev)
    elif lse.shape != (T, H) or lse.dtype != torch.float32:
        raise ValueError("lse must be [T, H] float32")
    if T == 0:
        return out, lse
    if K == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    if is_cuda:
        cap, sms = _device_info(dev.index if dev.index is not None else torch.cuda.current_device())
    else:
        cap, sms = CPU_DEFAULT_CAPABILITY, CPU_DEFAULT_NUM_SMS
    if capability is not None:
        cap = tuple(capability)
    if num_sms is not None:
        sms = num_sms
    # read per call (not cached): the decode override is an environment variable that benchmarks flip
    decode = fp8_decode_method(cap, dtype, is_cuda) if kv_format == "fp8_ds_mla" else NO_FP8_DECODE
    plan = _launch_plan(cap, sms, dtype, kv_format, decode, T, H, K, num_splits, tile,
                        _compute_name(dtype, kv_format, is_cuda))

    os_ = out.stride()
    ls = lse.stride()
    if plan.num_splits == 1:
        _sparse_mla_fwd_kernel[plan.fwd_grid](
            q_nope, q_pe, kv, indices, out, lse,
            sm_scale * LOG2E,
            H, K, nb * bs, bs, plan.num_hb, 1,
            qs[0], qs[1], ps[0], ps[1],
            stride_kb, stride_kr, indices.stride(0),
            os_[0], 0, os_[1],
            ls[0], 0, ls[1],
            **plan.fwd_kwargs)
        return out, lse

    if workspace is None:
        workspace = torch.empty(plan.ws_numel, dtype=torch.float32, device=dev)
    elif workspace.dtype != torch.float32 or workspace.numel() < plan.ws_numel or not workspace.is_contiguous():
        raise ValueError(f"workspace must be a contiguous float32 tensor with >= {plan.ws_numel} elements")
    # partial outputs [T, S, H, 512] from the workspace's start (passed as is: same pointer), then LSEs [T, S, H]
    ws_lse = workspace[plan.n_out:]
    w = plan.ws_strides
    _sparse_mla_fwd_kernel[plan.fwd_grid](
        q_nope, q_pe, kv, indices, workspace, ws_lse,
        sm_scale * LOG2E,
        H, K, nb * bs, bs, plan.num_hb, plan.num_splits,
        qs[0], qs[1], ps[0], ps[1],
        stride_kb, stride_kr, indices.stride(0),
        w[0], w[1], w[2],
        w[3], w[4], w[5],
        **plan.fwd_kwargs)
    _sparse_mla_combine_kernel[plan.combine_grid](
        workspace, ws_lse, out, lse,
        H, plan.num_splits,
        w[0], w[1], w[2],
        w[3], w[4], w[5],
        os_[0], os_[1],
        ls[0], ls[1],
        **plan.combine_kwargs)
    return out, lse
