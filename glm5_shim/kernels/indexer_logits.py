"""Triton DSA lightning-indexer logits for GPUs without DeepGEMM (sm_120/121, sm_89, sm_86, sm_80).

    logit[m, n] = sum_h w[m, h] * relu(q[m, h, :] . k[n, :]) * k_scale[n]

q and k are fp8 e4m3 (head_dim 128), w is fp32 with the q scale and softmax scale already folded in, k has one fp32
scale per token.  Two drop-ins with the exact signatures of vLLM 0.23's DeepGEMM wrappers
(``vllm.utils.deep_gemm``), meant to be bound as module globals of
``vllm.model_executor.layers.sparse_attn_indexer``:

* :func:`mqa_logits`        replaces ``fp8_fp4_mqa_logits``        (prefill, ragged [ks, ke) per query row)
* :func:`paged_mqa_logits`  replaces ``fp8_fp4_paged_mqa_logits``  (decode, K read in place from the paged cache)

Shared inner step (both kernels): one MMA of a key tile against the transposed queries of a small row group,
    S[BLOCK_N keys, G*H] = K[BLOCK_N, 128] @ Qt[128, G*H]
keys are the MMA M dimension and (row, head) pairs the N dimension, so the weighted head reduction runs along the
accumulator's N axis: in-thread adds plus quad shuffles on sm_90 (wgmma splits warps over keys only); on mma.sync
targets Triton may also split columns over warps, which adds one shared-memory step.  Qt stays resident for the
whole loop; only K streams.

Prefill: one program per G-row group (G*H = 128 columns: 4 rows of 32 heads, 2 of 64, 8 of 16), looping over the
group's key range [min ks, max ke) in 64-key tiles (optionally split n_split ways when there are few groups),
heaviest groups launched first.  Decode: a fixed grid (resident CTAs x SMs) over the flattened (request, 64-token
tile) space, each program an equal contiguous slice (see the kernel's comment); next_n rows of a request share
the K tile (G = next_n padded to a power of 2).

FP8: sm_89+ read e4m3 through float8e4nv pointers and use fp8 MMAs (Triton 3.6 turns the fp8 dot on sm_121 into
hardware cvt + f16 MMAs).  sm_80/86 have no fp8 type in Triton, so both operands are decoded from bytes with
integer ops (``fp8.e4m3_bytes_to_f16_div256``: the shift trick without the x256 / sign select of its f32 decode)
and multiplied in fp16; the 2**16 this leaves out is folded into w.  Both are exact products with fp32 sums.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from glm5_shim.kernels.device import cuda_capability_and_sms, device_figures
from glm5_shim.kernels.fp8 import e4m3_bytes_to_f16_div256, native_fp8_supported

HEAD_DIM = 128
SUPPORTED_HEADS = (16, 32, 64)
SUPPORTED_NEXT_N = (1, 2, 3, 4)
DECODE_CTAS_PER_SM = 4       # decode grid per SM when occupancy is unknown (interpreter / query failed)
MAX_DECODE_CTAS_PER_SM = 8   # cap of the occupancy-derived decode grid (see _decode_grid)
_MANUAL_W_SCALE = 65536.0  # (2**8)**2: both decoded operands come out divided by 2**8
_FILL_BLOCK = 1024


# ----------------------------------------------------------------------------------------------------------------
# device helpers
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _as_dot_operand(x, NATIVE: tl.constexpr):
    # Native: x was loaded through a float8e4nv pointer, so the MMA can read it straight from shared memory.
    if NATIVE:
        return x
    else:
        return e4m3_bytes_to_f16_div256(x)


@triton.jit
def _head_reduce(k_op, qt_op, w, BLOCK_N: tl.constexpr, G: tl.constexpr, H: tl.constexpr):
    """[BLOCK_N, D] x [D, G*H] -> sum_h w * relu(.) -> [BLOCK_N, G] (k_scale not applied yet)."""
    s = tl.dot(k_op, qt_op)  # fp32 accumulate
    s = tl.maximum(s, 0.0) * w[None, :]
    return tl.sum(tl.reshape(s, [BLOCK_N, G, H]), axis=2)


# ----------------------------------------------------------------------------------------------------------------
# prefill: ragged [ks, ke) per query row over contiguous K
# ----------------------------------------------------------------------------------------------------------------


# Row count, key count and split count change with every prefill; they enter masks and loop bounds only, so they
# are not specialised (one compiled variant instead of one per "== 1 / % 16 / other" class, compiled mid-serving).
@triton.jit(do_not_specialize=["M", "N", "n_split"])
def _mqa_logits_kernel(
    q_ptr, stride_qm, stride_qh,      # q [M, H, D] e4m3 (float8e4nv pointer if NATIVE, else uint8), d contiguous
    k_ptr, stride_kn,                 # k [N, D] e4m3 (same typing), d contiguous
    kscale_ptr,                       # fp32 [N]
    w_ptr, stride_wm,                 # fp32 [M, H], h contiguous
    ks_ptr, ke_ptr,                   # int32 [M]
    out_ptr, stride_om,               # fp32 [M, N]
    M, N, n_split, w_mult,
    H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, NATIVE: tl.constexpr,
):
    # Heaviest row groups first: with causal ranges the last rows see the most keys (longest-job-first).
    pid_g = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_s = tl.program_id(1)
    GH: tl.constexpr = G * H
    # tile invariants: tl.arange takes powers of two, and the dot needs at least 16 along each dimension
    tl.static_assert((G & (G - 1)) == 0, "G must be a power of two")
    tl.static_assert((GH & (GH - 1)) == 0, "G * H (the dot's N) must be a power of two")
    tl.static_assert(GH >= 16, "G * H (the dot's N) must be at least 16")
    tl.static_assert((BLOCK_N & (BLOCK_N - 1)) == 0, "BLOCK_N must be a power of two")
    tl.static_assert(BLOCK_N >= 16, "BLOCK_N (the dot's M) must be at least 16")
    tl.static_assert((D & (D - 1)) == 0, "D must be a power of two")

    offs_g = tl.arange(0, G)
    rows = pid_g * G + offs_g
    row_ok = rows < M
    ks = tl.maximum(tl.load(ks_ptr + rows, mask=row_ok, other=0), 0)
    ke = tl.minimum(tl.load(ke_ptr + rows, mask=row_ok, other=0), N)
    ke = tl.where(row_ok, ke, 0)
    ks = tl.where(row_ok, ks, N)
    lo = tl.min(ks, axis=0)
    hi = tl.max(ke, axis=0)
    n_tiles = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
    per = tl.cdiv(n_tiles, n_split)
    t0 = pid_s * per
    t1 = tl.minimum(t0 + per, n_tiles)

    if t0 < t1:
        offs_d = tl.arange(0, D)
        offs_c = tl.arange(0, GH)           # column = g * H + h
        c_row = pid_g * G + offs_c // H
        c_ok = c_row < M
        # Out-of-range rows/keys read clamped (real, finite) data instead of masked loads: a masked fp8 load
        # has no constant 'other' in Triton.  Their weights are 0 and their logits are never stored.
        q_off = tl.minimum(c_row, M - 1).to(tl.int64) * stride_qm + (offs_c % H) * stride_qh
        qt = tl.load(q_ptr + q_off[None, :] + offs_d[:, None])
        qt = _as_dot_operand(qt, NATIVE)
        w = tl.load(w_ptr + c_row.to(tl.int64) * stride_wm + offs_c % H, mask=c_ok, other=0.0) * w_mult

        offs_n = tl.arange(0, BLOCK_N)
        out_rows = out_ptr + rows.to(tl.int64) * stride_om
        for t in range(t0, t1):
            n = lo + t * BLOCK_N + offs_n
            n_ok = n < hi
            kb = tl.load(k_ptr + tl.minimum(n, N - 1).to(tl.int64)[:, None] * stride_kn + offs_d[None, :])
            sc = tl.load(kscale_ptr + n, mask=n_ok, other=0.0)
            logit = _head_reduce(_as_dot_operand(kb, NATIVE), qt, w, BLOCK_N, G, H) * sc[:, None]
            keep = (n[:, None] >= ks[None, :]) & (n[:, None] < ke[None, :])
            tl.store(out_rows[None, :] + n[:, None], logit, mask=keep)


# ----------------------------------------------------------------------------------------------------------------
# decode: paged K cache, rows (b, j) for j < next_n, balanced split of the whole (request, context) tile space
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _row_lens(lens_ptr, b, stride_lb, stride_lj, lens_1d, next_n, offs_j):
    """Context length of rows (b, j).  2D [B, next_n] lens: read directly.  1D [B] lens (lens_1d=1, stride_lj=0):
    DeepGEMM's convention for next_n > 1, row j sees L - next_n + j + 1 tokens."""
    ln = tl.load(lens_ptr + b * stride_lb + offs_j * stride_lj, mask=offs_j < next_n, other=0)
    return ln + lens_1d * (offs_j - (next_n - 1))


@triton.jit
def _chunk_tile_counts(lens_ptr, c, B, stride_lb, stride_lj, lens_1d, next_n, max_len, offs_sb, offs_j, j_ok,
                       BLOCK_N: tl.constexpr):
    """BLOCK_N-token tiles of requests c .. c+SB-1 (the longest of each request's next_n rows, capped at max_len)."""
    bb = c + offs_sb
    ok = (bb[:, None] < B) & j_ok[None, :]
    ln = tl.load(lens_ptr + bb[:, None] * stride_lb + offs_j[None, :] * stride_lj, mask=ok, other=0)
    ln = ln + lens_1d * (offs_j[None, :] - (next_n - 1))
    lmax = tl.minimum(tl.max(tl.where(ok, ln, 0), axis=1), max_len)
    return tl.cdiv(tl.maximum(lmax, 0), BLOCK_N).to(tl.int64)


# The batch B stays specialised: decode runs in CUDA graphs captured at start-up (every batch class compiles then),
# and with B unspecialised the small-batch rows of bench/indexer.py measured slower (bench/journal/2026-11-30.md).
@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr, stride_qb, stride_qn, stride_qh,   # q [B, next_n, H, D] e4m3 (float8e4nv ptr if NATIVE, else uint8)
    w_ptr, stride_wr,                         # fp32 [B * next_n, H]
    cache_ptr, stride_blk,                    # cache bytes (same typing as q), bytes per physical block
    scale_ptr,                                # the same cache viewed as fp32 (a separate typed pointer keeps
                                              # the scale load pipelinable; a pointer cast is not)
    lens_ptr, stride_lb, stride_lj, lens_1d,  # int32 context lens
    bt_ptr, stride_btb,                       # int32 block table [B, max_blocks]
    out_ptr, stride_or,                       # fp32 [B * next_n, max_model_len]
    B, next_n, max_len, w_mult,
    H: tl.constexpr, NN: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
    SB: tl.constexpr, NATIVE: tl.constexpr,
):
    tl.static_assert(PAGE % BLOCK_N == 0)
    # tile invariants: tl.arange takes powers of two, and the dot needs at least 16 along each dimension
    tl.static_assert((NN & (NN - 1)) == 0, "NN (next_n padded) must be a power of two")
    tl.static_assert(((NN * H) & (NN * H - 1)) == 0, "NN * H (the dot's N) must be a power of two")
    tl.static_assert(NN * H >= 16, "NN * H (the dot's N) must be at least 16")
    tl.static_assert((BLOCK_N & (BLOCK_N - 1)) == 0, "BLOCK_N must be a power of two")
    tl.static_assert(BLOCK_N >= 16, "BLOCK_N (the dot's M) must be at least 16")
    tl.static_assert((D & (D - 1)) == 0, "D must be a power of two")
    tl.static_assert((SB & (SB - 1)) == 0, "SB must be a power of two")
    # The grid is a fixed number of programs (CUDA-graph safe, no host sync).  Every program reads all context
    # lengths, counts the BLOCK_N-token tiles of all requests, and takes an equal contiguous slice of that flat
    # tile space; a slice may start/end inside a request and may span several requests.  So one long row fills
    # the GPU and a batch of unequal rows stays balanced to within one tile.
    pid = tl.program_id(0).to(tl.int64)
    n_prog = tl.num_programs(0)
    offs_sb = tl.arange(0, SB)
    offs_j = tl.arange(0, NN)
    j_ok = offs_j < next_n

    total = tl.zeros([], dtype=tl.int64)
    for c in range(0, B, SB):
        total += tl.sum(_chunk_tile_counts(lens_ptr, c, B, stride_lb, stride_lj, lens_1d, next_n, max_len,
                                           offs_sb, offs_j, j_ok, BLOCK_N), axis=0)
    t_begin = pid * total // n_prog
    t_end = (pid + 1) * total // n_prog

    if t_begin < t_end:
        # Request holding tile t_begin, and the flat index of that request's first tile.
        b = tl.zeros([], dtype=tl.int32)
        first = tl.zeros([], dtype=tl.int64)
        acc = tl.zeros([], dtype=tl.int64)
        for c in range(0, B, SB):
            nt = _chunk_tile_counts(lens_ptr, c, B, stride_lb, stride_lj, lens_1d, next_n, max_len, offs_sb, offs_j,
                                    j_ok, BLOCK_N)
            before = (tl.cumsum(nt, axis=0) + acc) <= t_begin  # a prefix of the rows (cumsum is monotone)
            b += tl.sum(before.to(tl.int32), axis=0)
            first += tl.sum(tl.where(before, nt, 0), axis=0)
            acc += tl.sum(nt, axis=0)

        NH: tl.constexpr = NN * H
        offs_d = tl.arange(0, D)
        offs_c = tl.arange(0, NH)          # column = j * H + h
        c_j = offs_c // H
        c_ok = c_j < next_n
        offs_n = tl.arange(0, BLOCK_N)
        tile = (t_begin - first).to(tl.int32)
        t = t_begin
        while t < t_end:
            lens_b = tl.minimum(_row_lens(lens_ptr, b, stride_lb, stride_lj, lens_1d, next_n, offs_j), max_len)
            lens_b = tl.where(j_ok, lens_b, 0)
            nt_b = tl.cdiv(tl.maximum(tl.max(lens_b, axis=0), 0), BLOCK_N)
            n_here = tl.minimum(nt_b - tile, (t_end - t).to(tl.int32))
            if n_here > 0:
                # padded next_n columns read row next_n - 1 (finite data, weight 0, never stored)
                q_off = b.to(tl.int64) * stride_qb + tl.minimum(c_j, next_n - 1) * stride_qn + (offs_c % H) * stride_qh
                qt = tl.load(q_ptr + q_off[None, :] + offs_d[:, None])
                qt = _as_dot_operand(qt, NATIVE)
                out_row = (b * next_n + offs_j).to(tl.int64)
                w = tl.load(w_ptr + (b * next_n + c_j).to(tl.int64) * stride_wr + offs_c % H, mask=c_ok, other=0.0)
                w = w * w_mult
                bt_row = bt_ptr + b.to(tl.int64) * stride_btb
                last = tile + n_here - 1
                # Scales are prefetched one tile ahead (block ids two ahead) in registers by hand: Triton's
                # pipeliner only stages loads that feed the dot, and a blocking scale load per 8 KB tile would
                # expose one memory latency per iteration.
                blk_s = tl.load(bt_row + (tile * BLOCK_N) // PAGE).to(tl.int64)
                sc_cur = tl.load(scale_ptr + (blk_s * stride_blk + PAGE * D) // 4 + (tile * BLOCK_N) % PAGE + offs_n)
                blk_s = tl.load(bt_row + (tl.minimum(tile + 1, last) * BLOCK_N) // PAGE).to(tl.int64)
                for i in range(tile, tile + n_here):
                    i1 = tl.minimum(i + 1, last)
                    blk_s2 = tl.load(bt_row + (tl.minimum(i + 2, last) * BLOCK_N) // PAGE).to(tl.int64)
                    sc_next = tl.load(scale_ptr + (blk_s * stride_blk + PAGE * D) // 4 + (i1 * BLOCK_N) % PAGE + offs_n)
                    # One physical block per tile (BLOCK_N divides PAGE): no mask needed, a partial tail only
                    # reads stale bytes of an allocated block, and those positions are never stored.
                    blk = tl.load(bt_row + (i * BLOCK_N) // PAGE).to(tl.int64)
                    slot = (i * BLOCK_N) % PAGE + offs_n
                    kb = tl.load(cache_ptr + blk * stride_blk + slot[:, None] * D + offs_d[None, :])
                    logit = _head_reduce(_as_dot_operand(kb, NATIVE), qt, w, BLOCK_N, NN, H) * sc_cur[:, None]
                    p = i * BLOCK_N + offs_n
                    keep = p[:, None] < lens_b[None, :]
                    tl.store(out_ptr + out_row[None, :] * stride_or + p[:, None], logit, mask=keep)
                    sc_cur = sc_next
                    blk_s = blk_s2
            t += tl.maximum(n_here, 0)
            b += 1
            tile = tile * 0


# ----------------------------------------------------------------------------------------------------------------
# clean_logits: -inf outside [lo, hi) of each row (only positions the main kernels never write)
# ----------------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["ncols"])
def _fill_outside_kernel(out_ptr, stride_or, lo_ptr, hi_ptr, ncols, HAS_LO: tl.constexpr, BLOCK: tl.constexpr):
    tl.static_assert((BLOCK & (BLOCK - 1)) == 0, "BLOCK must be a power of two")
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    hi = tl.load(hi_ptr + r)
    if HAS_LO:
        lo = tl.load(lo_ptr + r)
    else:
        lo = 0
    outside = ((cols < lo) | (cols >= hi)) & (cols < ncols)
    tl.store(out_ptr + r.to(tl.int64) * stride_or + cols, tl.full([BLOCK], float("-inf"), tl.float32), mask=outside)


# ----------------------------------------------------------------------------------------------------------------
# configurations
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexerKernelConfig:
    """One compiled variant the launchers can pick: kernel, constexprs, launch options and the argument types
    (for ``triton.compile(ASTSource(...))`` in the offline compile test)."""

    name: str
    kernel: object
    constexprs: dict = field(hash=False)
    num_warps: int
    num_stages: int
    signature: dict = field(hash=False)
    divisible_by_16: tuple = ()  # argument names the runtime normally specialises as multiples of 16


_PREFILL_SIG = {
    "q_ptr": "*e4m3", "stride_qm": "i32", "stride_qh": "i32", "k_ptr": "*e4m3", "stride_kn": "i32",
    "kscale_ptr": "*fp32", "w_ptr": "*fp32", "stride_wm": "i32", "ks_ptr": "*i32", "ke_ptr": "*i32",
    "out_ptr": "*fp32", "stride_om": "i32", "M": "i32", "N": "i32", "n_split": "i32", "w_mult": "fp32",
}
_DECODE_SIG = {
    "q_ptr": "*e4m3", "stride_qb": "i32", "stride_qn": "i32", "stride_qh": "i32", "w_ptr": "*fp32",
    "stride_wr": "i32", "cache_ptr": "*e4m3", "stride_blk": "i32", "scale_ptr": "*fp32", "lens_ptr": "*i32",
    "stride_lb": "i32", "stride_lj": "i32", "lens_1d": "i32", "bt_ptr": "*i32", "stride_btb": "i32", "out_ptr": "*fp32",
    "stride_or": "i32", "B": "i32", "next_n": "i32", "max_len": "i32", "w_mult": "fp32",
}
_FILL_SIG = {"out_ptr": "*fp32", "stride_or": "i32", "lo_ptr": "*i32", "hi_ptr": "*i32", "ncols": "i32"}


def _with_constexprs(sig: dict, constexprs: dict) -> dict:
    """Argument types for ASTSource; '*e4m3' is the e4m3 operand pointer, typed by the FP8 path."""
    e4m3 = "*fp8e4nv" if constexprs.get("NATIVE") else "*u8"
    out = {k: (e4m3 if v == "*e4m3" else v) for k, v in sig.items()}
    out.update({k: "constexpr" for k in constexprs})
    return out


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.lru_cache(maxsize=None)
def prefill_config(native: bool, num_heads: int, block_n: int = 64, num_warps: int = 4,
                   num_stages: int = 3) -> IndexerKernelConfig:
    # G*H = 128 MMA columns (4 rows of 32 heads, 2 of 64, 8 of 16).  64 keys x 128 columns with 4 warps keeps
    # registers ~130-170 and smem 37-53 KB, so 2-3 CTAs share an SM and one's epilogue overlaps another's MMA.
    g = max(1, 128 // num_heads)
    ce = dict(H=num_heads, G=g, D=HEAD_DIM, BLOCK_N=block_n, NATIVE=native)
    return IndexerKernelConfig(
        "mqa_logits", _mqa_logits_kernel, ce, num_warps=num_warps, num_stages=num_stages,
        signature=_with_constexprs(_PREFILL_SIG, ce),
        divisible_by_16=("q_ptr", "k_ptr", "kscale_ptr", "w_ptr", "ks_ptr", "ke_ptr", "out_ptr", "stride_qm",
                         "stride_qh", "stride_kn", "stride_wm"),
    )


@functools.lru_cache(maxsize=None)
def decode_config(native: bool, num_heads: int, next_n: int, page: int = 64,
                  num_stages: int = 7) -> IndexerKernelConfig:
    nn = _next_pow2(next_n)
    ce = dict(H=num_heads, NN=nn, D=HEAD_DIM, BLOCK_N=min(64, page), PAGE=page, SB=256, NATIVE=native)
    return IndexerKernelConfig(
        "paged_mqa_logits", _paged_mqa_logits_kernel, ce, num_warps=4 if nn * num_heads <= 128 else 8,
        # Triton gives a load behind an indirect (block-table) load (num_stages - 1) // 2 buffers: 7 -> 3 K tiles
        # (24 KB) per CTA, two of them in flight while the third is consumed.
        num_stages=num_stages,
        signature=_with_constexprs(_DECODE_SIG, ce),
        divisible_by_16=("q_ptr", "w_ptr", "cache_ptr", "scale_ptr", "lens_ptr", "bt_ptr", "out_ptr", "stride_qb",
                         "stride_qn", "stride_qh", "stride_wr", "stride_blk"),
    )


@functools.lru_cache(maxsize=None)
def fill_config(has_lo: bool) -> IndexerKernelConfig:
    ce = dict(HAS_LO=has_lo, BLOCK=_FILL_BLOCK)
    return IndexerKernelConfig("fill_outside", _fill_outside_kernel, ce, num_warps=4, num_stages=1,
                        signature=_with_constexprs(_FILL_SIG, ce), divisible_by_16=("out_ptr", "lo_ptr", "hi_ptr"))


def kernel_configs(capability) -> list[IndexerKernelConfig]:
    """Every (kernel, constexprs, num_warps, num_stages) the launchers can pick on a device of this capability
    (page size 64, the only indexer block size vLLM uses on CUDA)."""
    native = native_fp8_supported(tuple(capability))
    cfgs = [prefill_config(native, h) for h in SUPPORTED_HEADS]
    next_n_buckets = sorted({_next_pow2(n) for n in SUPPORTED_NEXT_N})
    cfgs += [decode_config(native, h, nn) for h in SUPPORTED_HEADS for nn in next_n_buckets]
    cfgs += [fill_config(True), fill_config(False)]
    return cfgs


# ----------------------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------------------


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _fp8_path_and_sms(t: torch.Tensor, native: bool | None) -> tuple[bool, int]:
    """(use native fp8, SM count).  On CPU (interpreter) default to the native path with a nominal 8 'SMs'."""
    if t.is_cuda:
        cap, sms = cuda_capability_and_sms(t.get_device())  # a CUDA tensor always knows its device index
        return (native_fp8_supported(cap) if native is None else native), sms
    return (True if native is None else native), 8


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _e4m3_operand(t: torch.Tensor, native: bool) -> torch.Tensor:
    """e4m3 data as the kernels take it: float8_e4m3fn for the native path, raw bytes for sm_80/86 (Triton
    refuses fp8-typed pointers' conversions there)."""
    want = torch.float8_e4m3fn if native else torch.uint8
    return t if t.dtype == want else t.view(want)


def _f32_view(cache: torch.Tensor) -> torch.Tensor:
    """The uint8 cache's storage as fp32 from the same base address (for the per-token scales)."""
    assert cache.storage_offset() % 4 == 0 and math.gcd(*cache.stride()[:-1]) % 4 == 0
    return cache.view(torch.float32)


def _check_heads(h: int) -> None:
    if h not in SUPPORTED_HEADS:
        raise NotImplementedError(f"indexer heads {h} not in {SUPPORTED_HEADS}")


def mqa_logits_impl(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits, *, native=None, n_split=None,
                    tile=None):
    """:func:`mqa_logits` with test/bench knobs: ``native`` forces the fp8 path (None: from the device),
    ``n_split`` forces the key-range split per row group (None: heuristic), ``tile`` = (BLOCK_N, num_warps,
    num_stages) overrides the default tile (bench sweeps only; not in :func:`kernel_configs`)."""
    q_fp8, q_sf = q
    if q_sf is not None:
        raise NotImplementedError("FP4 (MXFP4) indexer q is not supported by the Triton indexer")
    k_fp8, k_scale = kv
    M, H, D = q_fp8.shape
    N = k_fp8.shape[0]
    assert D == HEAD_DIM and k_fp8.shape[1] == D, "indexer head_dim must be 128"
    _check_heads(H)
    native, sms = _fp8_path_and_sms(q_fp8, native)
    cfg = prefill_config(native, H) if tile is None else prefill_config(native, H, *tile)
    ce = cfg.constexprs

    q_op = _e4m3_operand(q_fp8 if q_fp8.stride(-1) == 1 else q_fp8.contiguous(), native)
    k_op = _e4m3_operand(k_fp8 if k_fp8.stride(-1) == 1 else k_fp8.contiguous(), native)
    k_scale = k_scale.reshape(-1)
    if k_scale.dtype != torch.float32:
        k_scale = k_scale.view(torch.float32).reshape(-1) if k_scale.dtype == torch.uint8 else k_scale.float()
    weights = weights if weights.stride(-1) == 1 else weights.contiguous()
    ks = cu_seqlen_ks.to(torch.int32)
    ke = cu_seqlen_ke.to(torch.int32)

    out = torch.empty((M, N), dtype=torch.float32, device=q_fp8.device)
    if M == 0 or N == 0:
        return out
    groups = triton.cdiv(M, ce["G"])
    if n_split is None:
        # Few row groups over a long context (chunked prefill): split each group's key range so that the grid
        # still covers ~4 programs per SM.  Many groups: one program per group, heaviest first.
        n_split = max(1, min(triton.cdiv(4 * sms, groups), triton.cdiv(N, 4 * ce["BLOCK_N"])))
    _mqa_logits_kernel[(groups, n_split)](
        q_op, q_op.stride(0), q_op.stride(1), k_op, k_op.stride(0), k_scale, weights, weights.stride(0),
        ks, ke, out, out.stride(0), M, N, n_split, 1.0 if native else _MANUAL_W_SCALE,
        **ce, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if clean_logits:
        _fill_outside(out, ks, ke, N)
    return out


def _fill_outside(out: torch.Tensor, lo: torch.Tensor | None, hi: torch.Tensor, ncols: int) -> None:
    rows = out.shape[0]
    if rows == 0 or ncols == 0:
        return
    cfg = fill_config(lo is not None)
    _fill_outside_kernel[(rows, triton.cdiv(ncols, _FILL_BLOCK))](
        out, out.stride(0), lo if lo is not None else hi, hi, ncols, **cfg.constexprs, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def _lens_view(context_lens: torch.Tensor, batch: int, next_n: int):
    """(tensor, stride_b, stride_j, lens_1d) for the kernel; accepts [B, next_n] (per row) and [B] / [B, 1]
    (one length per request, row j sees L - next_n + j + 1 tokens, DeepGEMM's 1D convention)."""
    cl = context_lens
    if cl.dtype != torch.int32:
        cl = cl.to(torch.int32)
    if cl.dim() == 2:
        if cl.shape[1] == next_n and next_n > 1:
            return cl, cl.stride(0), cl.stride(1), 0
        if cl.shape[1] != 1:  # [B, 1] already points at its last column: no view needed
            cl = cl[:, -1]
    return cl, cl.stride(0), 0, 1


def decode_row_lens(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """Per output row (b * next_n + j) context length, int32 [B * next_n], on device (no sync)."""
    cl, _, _, one_d = _lens_view(context_lens, batch, next_n)
    if not one_d:
        return cl[:batch].reshape(-1).to(torch.int32)
    cl = cl.reshape(-1)  # [B, 1] -> [B]
    j = torch.arange(next_n, device=cl.device, dtype=torch.int32)
    return (cl[:batch, None] - next_n + 1 + j[None, :]).reshape(-1).to(torch.int32)


_DECODE_GRID: dict = {}


def _decode_grid(cfg: IndexerKernelConfig, device: torch.device, sms: int, args, kwargs) -> int:
    """Decode grid size: as many CTAs as fit on the GPU at once (one wave, so the balanced split is not undone
    by a partial second wave), capped at MAX_DECODE_CTAS_PER_SM per SM.  Resolved once per (config, device)
    from the compiled kernel's registers and shared memory; any grid size gives the same result."""
    if device.type != "cuda" or _interpreting():
        return DECODE_CTAS_PER_SM * sms
    key = (device.index, cfg)  # IndexerKernelConfig compares by kernel, constexprs and launch options
    grid = _DECODE_GRID.get(key)
    if grid is None:
        per_sm = DECODE_CTAS_PER_SM
        try:
            with torch.cuda.device(device):
                kernel = _paged_mqa_logits_kernel.warmup(*args, grid=(1,), **kwargs)  # compiles, no launch
                kernel = kernel.result() if hasattr(kernel, "result") else kernel
                kernel._init_handles()
            figures = device_figures(device.index if device.index is not None else torch.cuda.current_device())
            threads = 32 * cfg.num_warps
            by_threads = figures.max_threads_per_sm // threads
            by_regs = 65536 // (max(1, -(-kernel.n_regs // 8) * 8) * threads)  # 64K regs/SM on sm_80..sm_121
            by_smem = figures.smem_per_sm // (kernel.metadata.shared + 1024)  # 1 KB reserved/CTA
            per_sm = max(1, min(by_threads, by_regs, by_smem, MAX_DECODE_CTAS_PER_SM))
        except Exception:  # noqa: BLE001 - any failure here only costs the default grid
            pass
        grid = _DECODE_GRID[key] = per_sm * sms
    return grid


@functools.lru_cache(maxsize=None)
def _decode_launch(native: bool, num_heads: int, next_n: int, page: int, num_stages: int | None):
    """(config, launch kwargs) per decode shape, built once: the launch is on every layer of every step."""
    cfg = decode_config(native, num_heads, next_n, page) if num_stages is None else \
        decode_config(native, num_heads, next_n, page, num_stages)
    return cfg, dict(cfg.constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def paged_mqa_logits_impl(q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len,
                          clean_logits, *, native=None, num_programs=None, num_stages=None):
    """:func:`paged_mqa_logits` with test/bench knobs: ``native`` (None: from the device), ``num_programs``
    (grid size, None: resident CTAs per SM x SMs, see :func:`_decode_grid`) and ``num_stages`` (bench sweeps
    only)."""
    del schedule_metadata  # our kernel schedules itself from context_lens on the device
    q_fp8, q_sf = q
    if q_sf is not None:
        raise NotImplementedError("FP4 (MXFP4) indexer q is not supported by the Triton indexer")
    B, next_n, H, D = q_fp8.shape
    assert D == HEAD_DIM, "indexer head_dim must be 128"
    _check_heads(H)
    if next_n not in SUPPORTED_NEXT_N:
        raise NotImplementedError(f"next_n {next_n} not in {SUPPORTED_NEXT_N}")
    native, sms = _fp8_path_and_sms(q_fp8, native)

    cache = _u8(kv_cache)
    page = cache.shape[1]
    assert cache.shape[-1] == D + 4 and page & (page - 1) == 0, "expected [num_blocks, page, 1, 132] uint8 cache"
    assert cache.stride(0) % 4 == 0, "fp32 scales need a 4-byte aligned block stride"
    cfg, kwargs = _decode_launch(native, H, next_n, page, num_stages)

    q_op = _e4m3_operand(q_fp8 if q_fp8.stride(-1) == 1 else q_fp8.contiguous(), native)
    weights = weights if weights.stride(-1) == 1 else weights.contiguous()
    bt = block_tables if block_tables.dtype == torch.int32 else block_tables.to(torch.int32)
    lens, s_lb, s_lj, one_d = _lens_view(context_lens, B, next_n)

    out = torch.empty((B * next_n, max_model_len), dtype=torch.float32, device=q_fp8.device)
    if B == 0 or max_model_len == 0:
        return out
    qs = q_op.stride()
    args = (q_op, qs[0], qs[1], qs[2], weights, weights.stride(0),
            _e4m3_operand(cache, native), cache.stride(0), _f32_view(cache), lens, s_lb, s_lj, one_d, bt, bt.stride(0),
            out, out.stride(0), B, next_n, max_model_len, 1.0 if native else _MANUAL_W_SCALE)
    if num_programs is None:
        num_programs = _decode_grid(cfg, q_fp8.device, sms, args, kwargs)
    _paged_mqa_logits_kernel[(num_programs,)](*args, **kwargs)
    if clean_logits:
        _fill_outside(out, None, decode_row_lens(context_lens, B, next_n), max_model_len)
    return out


# ----------------------------------------------------------------------------------------------------------------
# public drop-ins (exact vLLM 0.23 wrapper signatures)
# ----------------------------------------------------------------------------------------------------------------


def mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    clean_logits: bool,
) -> torch.Tensor:
    """Drop-in for ``vllm.utils.deep_gemm.fp8_fp4_mqa_logits`` (FP8 path).

    q = (q_fp8 [M, H, 128] e4m3, None), kv = (k_fp8 [N, 128] e4m3, k_scale [N] fp32), weights [M, H] fp32,
    cu_seqlen_ks/ke [M] int32.  Returns [M, N] fp32; entries outside [ks[m], ke[m]) are undefined unless
    clean_logits (then -inf)."""
    return mqa_logits_impl(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)


def paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
    clean_logits: bool,
) -> torch.Tensor:
    """Drop-in for ``vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits`` (FP8 path).

    q = (q_fp8 [B, next_n, H, 128] e4m3, None); kv_cache [num_blocks, 64, 1, 132] uint8 (per block: 64 x 128 fp8
    values, then 64 fp32 scales); weights [B * next_n, H] fp32; context_lens int32 [B, next_n] (row (b, j) sees
    context_lens[b, j] tokens) or [B] / [B, 1] (row j sees L - next_n + j + 1); block_tables [B, max_blocks] int32;
    schedule_metadata ignored.  Returns [B * next_n, max_model_len] fp32, row b * next_n + j; positions at or past
    the row's length are undefined unless clean_logits (then -inf)."""
    return paged_mqa_logits_impl(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                 max_model_len, clean_logits)
