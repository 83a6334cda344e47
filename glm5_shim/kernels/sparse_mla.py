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

from typing import Optional

import torch
import triton
import triton.language as tl

from glm5_shim.kernels.device import cuda_capability_and_sms
from glm5_shim.kernels.fp8 import e4m3_bytes_decode
from glm5_shim.kernels.sparse_mla_reference import fp8_ds_mla_rope_dtype  # noqa: F401  (part of this API)
from glm5_shim.kernels.sparse_mla_plan import (CPU_DEFAULT_CAPABILITY, CPU_DEFAULT_NUM_SMS, D_LATENT, D_QK, D_ROPE,
                                              D_V, FP8_ROW_BYTES, KV_FORMATS, NO_FP8_DECODE, FwdTile, _compute_name,
                                              _launch_plan, fp8_decode_method)
# The launch planning lives in sparse_mla_plan; the rest of its API is re-exported here, where callers, tests and
# benchmarks have always found it.
from glm5_shim.kernels.sparse_mla_plan import (  # noqa: F401
    COMBINE_BLOCK_D, FP8_DECODES, MAX_SPLITS, SparseMlaKernelConfig, _combine_block_s, choose_num_splits,
    compute_dtype, kernel_configs, select_fwd_tile, workspace_numel)

# The kernels hard-code the geometry as four 128-wide latent chunks and a 64-wide rope (tl.arange needs literals or
# constexprs; the chunks keep each dot's operand at 128 columns)
assert D_LATENT == 4 * 128 and D_V == D_LATENT and D_ROPE == 64 and D_QK == D_LATENT + D_ROPE
FP8_SCALE_OFFSET = tl.constexpr(D_LATENT)  # fp8_ds_mla row: the 4 fp32 scales follow the 512 e4m3 bytes
FP8_ROPE_OFFSET = tl.constexpr(D_LATENT + 4 * 4)  # then the 64 rope values (constexprs: read inside the kernel)
assert FP8_ROW_BYTES == FP8_ROPE_OFFSET + 2 * D_ROPE
# bf16 decodes: q's latent is lifted by 2**64 so q.k products stay far above fp32's underflow; scores get 2**56 and
# P 2**96 (P * scale stays < 2**127 for scales below 2**31), the output 2**24 back: 64 + 56 = 96 + 24 = 120
BF16_Q_F = tl.constexpr(2.0 ** 64)
BF16_QK_F = tl.constexpr(2.0 ** 56)
BF16_PV_F = tl.constexpr(2.0 ** 96)
BF16_OUT_F = tl.constexpr(2.0 ** 24)
LOG2E = 1.4426950408889634  # log2(e): sm_scale * LOG2E puts the scores in the log2 domain the kernels exp2 in
LN2 = tl.constexpr(0.6931471805599453)  # ln(2) = 1 / LOG2E: a log2-domain LSE times LN2 is the natural-log LSE

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
    # tile invariants: tl.arange takes powers of two, and every dot needs at least 16 along each dimension
    tl.static_assert((BLOCK_H & (BLOCK_H - 1)) == 0, "BLOCK_H must be a power of two")
    tl.static_assert(BLOCK_H >= 16, "BLOCK_H is the dots' M: at least 16")
    tl.static_assert((BLOCK_N & (BLOCK_N - 1)) == 0, "BLOCK_N must be a power of two")
    tl.static_assert(BLOCK_N >= 16, "BLOCK_N is QK's N and PV's K: at least 16")
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
                # and this variant issues more (H200 numbers: bench/journal/2026-12-01.md, kernel tuning notes).
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
        lse2 = lse2 * LN2  # callers get a natural log; partials stay in log2
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
    tl.static_assert((BLOCK_S & (BLOCK_S - 1)) == 0, "BLOCK_S must be a power of two")
    tl.static_assert((BLOCK_D & (BLOCK_D - 1)) == 0, "BLOCK_D must be a power of two")
    tl.static_assert(512 % BLOCK_D == 0, "BLOCK_D must divide d_v = 512")
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
        lse = tl.where(has, (m_use + tl.log2(tl.where(has, tot, 1.0))) * LN2, float("-inf"))
        tl.store(lse_ptr + t * stride_lt + h * stride_lh, lse)


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
        cap, sms = cuda_capability_and_sms(dev.index if dev.index is not None else torch.cuda.current_device())
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
    if plan.num_splits == 1:  # the forward kernel writes the result itself (split stride 0)
        fwd_out, fwd_lse, w = out, lse, (os_[0], 0, os_[1], ls[0], 0, ls[1])
    else:
        if workspace is None:
            workspace = torch.empty(plan.ws_numel, dtype=torch.float32, device=dev)
        elif (workspace.dtype != torch.float32 or workspace.numel() < plan.ws_numel
              or not workspace.is_contiguous()):
            raise ValueError(f"workspace must be a contiguous float32 tensor with >= {plan.ws_numel} elements")
        # partial outputs [T, S, H, 512] from the workspace's start (passed as is: same pointer), then LSEs [T, S, H]
        fwd_out, fwd_lse, w = workspace, workspace[plan.n_out:], plan.ws_strides
    _sparse_mla_fwd_kernel[plan.fwd_grid](
        q_nope, q_pe, kv, indices, fwd_out, fwd_lse,
        sm_scale * LOG2E,
        H, K, nb * bs, bs, plan.num_hb, plan.num_splits,
        qs[0], qs[1], ps[0], ps[1],
        stride_kb, stride_kr, indices.stride(0),
        w[0], w[1], w[2],
        w[3], w[4], w[5],
        **plan.fwd_kwargs)
    if plan.num_splits == 1:
        return out, lse
    _sparse_mla_combine_kernel[plan.combine_grid](
        workspace, fwd_lse, out, lse,
        H, plan.num_splits,
        w[0], w[1], w[2],
        w[3], w[4], w[5],
        os_[0], os_[1],
        ls[0], ls[1],
        **plan.combine_kwargs)
    return out, lse
