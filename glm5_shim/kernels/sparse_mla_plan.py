"""Launch planning for :mod:`glm5_shim.kernels.sparse_mla`: pure Python, no ``@triton.jit`` code.

* which tile (:class:`FwdTile`) a target, query dtype, cache format and head count get (:func:`select_fwd_tile`),
* the split-K count from shapes and the SM count only (:func:`choose_num_splits`; CUDA-graph capturable),
* the dots' dtype and the e4m3 decode (:func:`compute_dtype`, :func:`fp8_decode_method`),
* every compiled variant a target can pick (:func:`kernel_configs`, compiled offline by the tests),
* everything a launch needs that follows from (device, shapes, dtypes, format, overrides): :func:`_launch_plan`.

:mod:`glm5_shim.kernels.sparse_mla` re-exports these names; the kernels and the launch wrapper stay there.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple, Optional

import torch
import triton

from glm5_shim.kernels.fp8 import FP8_DECODES, native_fp8_supported

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
D_V = 512
FP8_ROW_BYTES = 656  # 512 e4m3 + 4 fp32 scales + 64 rope values (bf16; fp16 under fp16 queries)
# The FP8_DECODE constexpr names one of fp8.py's FP8_DECODES (value / K_F, the factor folded back through the scales)
NO_FP8_DECODE = "none"  # the constexpr's value for a bf16 cache (one compiled variant, whatever the override)
MAX_SPLITS = 32
KV_FORMATS = ("bf16", "fp8_ds_mla")
# default target when running on CPU (Triton interpreter): behaves like an sm_120 board
CPU_DEFAULT_CAPABILITY = (12, 0)
CPU_DEFAULT_NUM_SMS = 16


@dataclasses.dataclass(frozen=True)
class SparseMlaKernelConfig:
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
#   register prefetch (PREFETCH) with num_stages=1.  On the H200 the fp8 kernel is bound by issued instructions,
#   not by gather latency: split loads measured slower (ncu and timings: bench/journal/2026-12-01.md, tuning notes).
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
            # sm_90 only: 64 heads a program without the register prefetch (each row gathered and decoded once per
            # token) beat t32 on the H200 (bench/journal/2026-12-01.md, tuning notes).  132 KiB, 255 regs, no spill
            # with bf16 queries; fp16 ones (bf16 dots too, compute_dtype) spill 168 B and measured slower (t32 not
            # measured with them; sm_90 GGUF serving runs bf16).
            t64 = FwdTile(64, 32, 8, 3, 1) if cap[0] == 9 and dtype == torch.bfloat16 else t32
            return {16: t16, 32: t32, 64: t64}
        return {16: FwdTile(16, 32, 4, 5, 2),                # 94 KiB, 194 regs
                32: FwdTile(32, 32, 8, 5, 1),                # 113 KiB, 151 regs
                64: FwdTile(64, 32, 8, 5, 1)}                # 185 KiB, 252 regs
    if fp8:
        # 64 rows a tile, as on sm_90: beats (16, 32) on the H200 as a stand-in (the same mma.sync code at 16 heads;
        # bench/journal/2026-12-01.md, tuning notes); not measured on sm_120/8x hardware.  92 KiB, 247-255 regs, no
        # spill on sm_120/121/89/86/80.
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
    range for caches far from unit scale, and keeping it in range took a per-tile rescale that measured slower on
    the H200 (bench/journal/2026-12-01.md, tuning notes); bf16's rounding (2**-9) is far below the cache's own e4m3
    quantisation (2**-4 a value).  In the interpreter, whose bf16 dots are wrong, they run in fp32."""
    if kv_format == "fp8_ds_mla" and q_dtype == torch.float16:
        return torch.bfloat16 if on_gpu else torch.float32
    return q_dtype


def _compute_name(q_dtype: torch.dtype, kv_format: str, on_gpu: bool) -> str:
    """The COMPUTE constexpr: "q" (the queries' dtype), "bf16" or "f32"."""
    cdt = compute_dtype(q_dtype, kv_format, on_gpu)
    return "q" if cdt == q_dtype else ("bf16" if cdt == torch.bfloat16 else "f32")


def fp8_decode_method(capability: tuple[int, int], dtype: torch.dtype, on_gpu: bool = True) -> str:
    """The FP8_DECODE the fp8_ds_mla kernel uses for queries of ``dtype`` on ``capability`` (see FP8_DECODES).

    Default: the native conversion from sm_89 on (measured fastest on an H200, bench/journal/2026-11-30.md);
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


def kernel_configs(capability, dtype, kv_format) -> list[SparseMlaKernelConfig]:
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
            cfg = SparseMlaKernelConfig("fwd", tuple(sorted(dict(
                IS_FP8=is_fp8, FP8_DECODE=decode, COMPUTE=compute, WRITE_PARTIAL=partial, PREFETCH=tile.prefetch,
                SPLIT_LOADS=tile.split_loads,
                BLOCK_H=tile.block_h, BLOCK_N=tile.block_n).items())), tile.num_warps, tile.num_stages)
            if cfg not in seen:
                seen.add(cfg)
                out.append(cfg)
    for bs in (8, 32):
        out.append(SparseMlaKernelConfig("combine", tuple(sorted(dict(BLOCK_S=bs, BLOCK_D=COMBINE_BLOCK_D).items())),
                                         4, 1))
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


def workspace_numel(num_tokens: int, num_heads: int, num_splits: int) -> int:
    """float32 elements needed for the split partials (out + lse); 0 when num_splits == 1."""
    if num_splits <= 1:
        return 0
    return num_tokens * num_splits * num_heads * (D_V + 1)


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
