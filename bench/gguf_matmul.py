"""GGUF matmuls at GLM-5's real per-rank shapes: the shim's kernels vs vLLM's ggml kernels vs vLLM on bf16 weights.

    python bench/gguf_matmul.py --out DIR [--quick] [--types Q4_K,Q6_K] [--tokens 1,32,256]

MoE: one layer's routed experts per rank (256 experts, top 8, hidden 6144, expert width 2048 / TP) at TP 8 and
TP 4.  Dense: the per-rank linears of a GLM-5 layer at TP 8 (lm_head, q_a+kv_a, q_b, o_proj, indexer wq_b, shared
expert, dense MLP).  Every timed call must read its weights from HBM: MoE calls cycle through routings drawn
afresh (each call touches other experts), dense calls cycle through enough weight copies to exceed L2.  Each row
is timed as a CUDA graph of the whole cycle (replays / calls = µs a call), after checking the shim's output
against vLLM's bf16 computation on the dequantized weights.

floor = bytes of the distinct weights a call must read / copy bandwidth measured in this run (read + write bytes
per second of a 2 GiB device copy); for large T also the tensor-core floor (2 * flops / dense bf16 peak).

Where the register-MMA decode kernels (register_mma.py) cover the type, MoE rows of decode size and dense rows
of up to 8 tokens are timed on them too, next to the tile kernels (MoE: also the register-MMA kernels in the 2026-12-02
five launches, and both routings of today's two-launch path); ``--parts mma_sweep`` times their launch shapes
(warps x row repeats x programs an SM, ``--mma-sweep-grid``) for the ``--sweep-types`` at ``--mma-sweep-tokens``, each
checked against the default shape's output.

Every MoE and dense row also times its read floor (bench/read_floor.py): the same bytes read in the same launches
with nothing computed.  shim % of read says how much of a miss against the bandwidth floor is the kernel's own work,
and read % floor how much any reader of that access pattern pays (launches, ramp, tail).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import gguf
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.testing  # noqa: E402

from glm5_shim.kernels.gguf import tiles as gm  # noqa: E402
from glm5_shim.kernels.gguf import reference as ref  # noqa: E402
from glm5_shim.kernels.gguf import register_mma as gguf_mma  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import read_floor  # noqa: E402

TYPES = {gguf.GGMLQuantizationType(t).name: t for t in gm.SUPPORTED_TYPES}  # every type the kernels read
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)
HIDDEN, EXPERTS, TOP_K, EXPERT_WIDTH = 6144, 256, 8, 2048
BF16_PEAK = {(9, 0): 989e12, (12, 0): 503e12}  # dense bf16 tensor FLOP/s (H200 SXM; RTX PRO 6000 published)
L2_BYTES = 60 << 20
ALIGN = None  # vLLM's moe_align_block_size when it imports (what serving uses), else the shim's torch version
# per-rank dense linears of one GLM-5 layer at TP 8: name -> (N, K)
DENSE_TP8 = {
    "lm_head": (154880 // 8, HIDDEN),
    "q_a+kv_a": (2048 + 576, HIDDEN),
    "q_b": (64 // 8 * 256, 2048),
    "o_proj": (HIDDEN, 64 // 8 * 256),
    "indexer wq_b": (32 * 128, 2048),
    "shared gate_up": (2 * EXPERT_WIDTH // 8, HIDDEN),
    "shared down": (HIDDEN, EXPERT_WIDTH // 8),
    "dense gate_up": (2 * 12288 // 8, HIDDEN),
    "dense down": (HIDDEN, 12288 // 8),
}


def random_blocks_cuda(qtype: int, shape: tuple[int, ...], k: int, gen: torch.Generator) -> torch.Tensor:
    """Random valid GGUF blocks on the GPU: [*shape, row bytes] uint8 (the tests' generator, on the GPU)."""
    return ref.random_blocks(qtype, shape, k, gen)


def copy_bandwidth() -> float:
    n = 1 << 31
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median") * 1e-3
    src = dst = None
    torch.cuda.empty_cache()
    return 2 * n / t


def graph_us(calls: list, reps: int = 5) -> float:
    """µs per call of a CUDA graph replaying ``calls`` in order (each a no-arg callable)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / len(calls))
    graph.reset()
    return best


def vllm_gguf():
    try:
        from vllm.model_executor.layers.quantization import gguf as vg
        return vg
    except Exception as e:  # noqa: BLE001
        print(f"vLLM's GGUF module does not import: {type(e).__name__}: {e}")
        return None


def vllm_bf16_moe():
    try:
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
        return fused_experts
    except Exception as e:  # noqa: BLE001
        print(f"vLLM's fused_experts does not import: {type(e).__name__}: {e}")
        return None


def dequant_cuda(vg, q: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    from vllm import _custom_ops as ops
    flat = q.reshape(-1, q.shape[-1])
    w = ops.ggml_dequantize(flat, qtype, flat.shape[0], k, torch.bfloat16)
    return w.reshape(*q.shape[:-1], k)


def vllm_align():
    try:
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
        return moe_align_block_size
    except Exception:  # noqa: BLE001
        return None


def routings(t: int, count: int, gen: torch.Generator):
    ids, wts = [], []
    for _ in range(count):
        logits = torch.rand(t, EXPERTS, device="cuda", generator=gen)
        w, i = logits.topk(TOP_K, dim=1)
        ids.append(i.to(torch.int32))
        wts.append((w / w.sum(1, keepdim=True)).float())
    return ids, wts


def rank_experts(name: str, gen: torch.Generator, tp: int = 8):
    """(qtype, w13, w2, bytes of one expert) of one MoE layer's routed experts per rank at TP tp, random blocks."""
    qt = TYPES[name]
    inter = EXPERT_WIDTH // tp
    w13 = random_blocks_cuda(qt, (EXPERTS, 2 * inter), HIDDEN, gen)
    w2 = random_blocks_cuda(qt, (EXPERTS, HIDDEN), inter, gen)
    return qt, w13, w2, w13[0].numel() + w2[0].numel()


def call_inputs(t: int, gen: torch.Generator, expert_bytes: int, bw: float):
    """A cycle of fresh routings for T tokens (enough calls to leave L2), the activations, and the floor µs: the
    distinct experts' bytes a call reads / bandwidth."""
    cycle = max(4, min(64, 4096 // t))
    ids, wts = routings(t, cycle, gen)
    x = (torch.randn(t, HIDDEN, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    floor = sum(int(i.unique().numel()) for i in ids) / cycle * expert_bytes / bw * 1e6
    return ids, wts, x, floor


VLLM_GGUF_MAX_TOKENS = [1 << 30]   # --vllm-gguf-max-tokens: MoE calls past it skip vLLM's GGUF kernels (slow there)
DEQUANT_TUNINGS = [{}]   # the dequantizing MoE's tile shapes timed (--dequant-tunings), {} = MOE_DEQUANT_TUNING
PREFILL_TUNINGS: list[dict] = []   # more prefill-tile shapes timed as arms prefill_tiles1, ... (--prefill-tunings)


def served_tiles(qt: int) -> dict:
    """moe_plan's arguments for the tile tunings serving takes for ``qt`` on this GPU (prefill_pass_tuning)."""
    return dict(qtypes=(qt, qt), capability=tuple(torch.cuda.get_device_capability()))


def dequant_plan(t: int, tuning: dict) -> dict:
    """A dequantizing MoE plan: ``tuning``'s tile keys (MOE_DEQUANT_TUNING), its "dequantize" dict the
    dequantization kernel's (DEQUANT_TUNING), its "chunk_bytes" the scratch a chunk of experts may take
    (MOE_DEQUANT_CHUNK_BYTES: a chunk small enough to stay in L2 is written and read back there)."""
    tun = dict(tuning)
    dq = tun.pop("dequantize", None)
    chunk = {"chunk_bytes": tun.pop("chunk_bytes")} if "chunk_bytes" in tun else {}
    return {**gm.moe_plan(t, TOP_K, EXPERTS, tuning=tun, dequant=True), "dequantize_tuning": dq, **chunk}


def bench_moe(tp: int, type_names, tokens, bw, peak, gen, vg, bf16_moe, rows):
    inter = EXPERT_WIDTH // tp
    for name in type_names:
        qt, w13, w2, expert_bytes = rank_experts(name, gen, tp)
        w13_bf = dequant_cuda(vg, w13, qt, HIDDEN) if vg else None
        w2_bf = dequant_cuda(vg, w2, qt, inter) if vg else None
        packed13 = packed2 = None
        if qt in gguf_mma.PACKERS:
            # the loader's repack (loading/gguf_repack.py: a slice of experts at a time, in place where the row
            # length stays) of this rank's layer of experts, timed: the load-time cost
            from glm5_shim.loading.gguf_repack import _packed_copy

            packed13, packed2 = w13.clone(), w2.clone()
            torch.cuda.synchronize()
            start = time.perf_counter()
            packed13 = _packed_copy(packed13, qt, HIDDEN)
            packed2 = _packed_copy(packed2, qt, inter)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3
            nbytes = w13.numel() + w2.numel()
            rows.append(dict(kind="repack", tp=tp, type=name, bytes=nbytes, ms=ms, gb_s=nbytes / ms / 1e6))
        for t in tokens:
            ids, wts, x, floor = call_inputs(t, gen, expert_bytes, bw)
            xh = x.half()
            flops = 2 * t * TOP_K * (HIDDEN * 2 * inter + inter * HIDDEN)
            tc_floor = flops / peak * 1e6
            row = dict(kind="moe", tp=tp, type=name, T=t, floor_us=floor, tc_floor_us=tc_floor)
            ours = gm.gguf_moe(x, w13, w2, wts[0], ids[0], qt, qt, align=ALIGN)
            if bf16_moe is not None:
                want = bf16_moe(x, w13_bf, w2_bf, wts[0], ids[0])
                row["rel_err_vs_bf16"] = ((ours.float() - want.float()).norm() / want.float().norm()).item()
            row["shim_us"] = graph_us([lambda i=i, w=w: gm.gguf_moe(x, w13, w2, w, i, qt, qt, align=ALIGN)
                                       for i, w in zip(ids, wts)])
            if vg is not None and t <= VLLM_GGUF_MAX_TOKENS[0]:
                try:
                    row["vllm_gguf_us"] = graph_us([
                        lambda i=i, w=w: vg._fused_moe_gguf(xh, w13, w2, w, i, qt, qt, "silu")
                        for i, w in zip(ids, wts)])
                except Exception as e:  # noqa: BLE001
                    row["vllm_gguf_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if bf16_moe is not None:
                row["vllm_bf16_us"] = graph_us([lambda i=i, w=w: bf16_moe(x, w13_bf, w2_bf, w, i)
                                                for i, w in zip(ids, wts)])
            row["shim_pct_floor"] = 100 * floor / row["shim_us"]
            row.update(read_moe(w13, w2, ids, row["shim_us"], floor))
            plan = gm.moe_plan(t, TOP_K, EXPERTS)
            arms = {}
            if gguf_mma.covers(qt, HIDDEN, x.dtype, gguf_mma.KERNEL_TYPES) and not plan["fused_gate"]:  # mma arms
                # tile: the tile kernels; mma_s6: the register-MMA kernels in the 2026-12-02 five launches (align,
                # w13 planes, SiLU of their sum, w2, top-k sum); direct / sorted: today's two-launch epilogues
                # with each routing forced (the default picks by MOE_DIRECT_MAX_TOKENS)
                arms = {"tile": {**plan, "mma": False}, "mma_s6": {**plan, "mma": True, "fused_epilogues": False}}
                if t <= 16:
                    arms.update(mma_direct={**plan, "mma": True, "direct": True},
                                mma_sorted={**plan, "mma": True, "direct": False})
            elif gguf_mma.covers(qt, HIDDEN, x.dtype, gguf_mma.KERNEL_TYPES):
                # above the common decode threshold the plans pick by MMA_MOE_MAX_ROWS_PER_EXPERT (shim_us); the
                # regimes named: the prefill tiles, and the decode regime's register-MMA passes over moe_align's
                # 8-row blocks, an expert's weights read once a block (mma_sorted), and the wider blocks of 16 and
                # 32 rows that multiply each decoded weight by more rows (mma_c16, mma_c32)
                forced = {**gm.moe_plan(t, TOP_K, EXPERTS, decode=True), "mma": True, "direct": False}
                arms = {"prefill_tiles": {**gm.moe_plan(t, TOP_K, EXPERTS, **served_tiles(qt)), "mma": False}}
                if t * TOP_K / EXPERTS <= 64:
                    arms.update(mma_sorted={**forced, "mma_cols": 8}, mma_c16={**forced, "mma_cols": 16})
                if t * TOP_K / EXPERTS <= 128:   # past that, blocks of 32 rows decode a weight 5+ times
                    arms.update(mma_c32={**forced, "mma_cols": 32})
            if t * TOP_K / EXPERTS >= 8:   # the experts dequantized a chunk at a time, 16-bit tiles (each tuning)
                arms.update({f"dequant{i or ''}": dequant_plan(t, tun) for i, tun in enumerate(DEQUANT_TUNINGS)})
                # the prefill tiles in other shapes (larger row blocks decode an expert's weights fewer times)
                arms.update({f"prefill_tiles{i + 1}": {**gm.moe_plan(t, TOP_K, EXPERTS, tuning=tun,
                                                                     **served_tiles(qt)), "mma": False}
                             for i, tun in enumerate(PREFILL_TUNINGS)})
            if packed13 is not None:
                # the same experts repacked at load (gguf_mma.pack, loading/gguf_repack.py), the plan serving takes
                same = gm.gguf_moe(x, packed13, packed2, wts[0], ids[0], qt, qt, align=ALIGN, packed13=True,
                                   packed2=True)
                row["mma_packed_equal"] = bool(torch.equal(same, ours))
                row["mma_packed_us"] = graph_us([lambda i=i, w=w: gm.gguf_moe(x, packed13, packed2, w, i, qt, qt,
                                                                              align=ALIGN, packed13=True, packed2=True)
                                                 for i, w in zip(ids, wts)])
                row["mma_packed_pct_floor"] = 100 * floor / row["mma_packed_us"]
                # past the common decode threshold, the packed weights in each regime: what MMA_MOE_MAX_ROWS_PER_EXPERT
                # (measured on the file's layout) would move to once packing is the default
                rows_per_expert = t * TOP_K / EXPERTS
                packed_arms = {}
                if gm.MOE_DECODE_MAX_ROWS_PER_EXPERT < rows_per_expert <= 64:
                    forced = {**gm.moe_plan(t, TOP_K, EXPERTS, decode=True), "mma": True, "direct": False}
                    packed_arms.update(mma_packed_c16={**forced, "mma_cols": 16},
                                       mma_packed_c32={**forced, "mma_cols": 32},
                                       packed_prefill_tiles={**gm.moe_plan(t, TOP_K, EXPERTS, **served_tiles(qt)),
                                                             "mma": False})
                if rows_per_expert >= 8:
                    packed_arms["packed_dequant"] = dequant_plan(t, DEQUANT_TUNINGS[0])
                for arm, aplan in packed_arms.items():
                    mine = gm.gguf_moe(x, packed13, packed2, wts[0], ids[0], qt, qt, align=ALIGN, plan=aplan,
                                       packed13=True, packed2=True)
                    row[f"{arm}_rel_vs_shim"] = ((mine.float() - ours.float()).norm() / ours.float().norm()).item()
                    row[f"{arm}_us"] = graph_us([lambda i=i, w=w, p=aplan: gm.gguf_moe(
                        x, packed13, packed2, w, i, qt, qt, align=ALIGN, plan=p, packed13=True, packed2=True)
                        for i, w in zip(ids, wts)])
            for arm, aplan in arms.items():   # each arm a whole plan
                mine = gm.gguf_moe(x, w13, w2, wts[0], ids[0], qt, qt, align=ALIGN, plan=aplan)
                row[f"{arm}_rel_vs_shim"] = ((mine.float() - ours.float()).norm() / ours.float().norm()).item()
                row[f"{arm}_us"] = graph_us([lambda i=i, w=w, p=aplan: gm.gguf_moe(x, w13, w2, w, i, qt, qt,
                                                                                    align=ALIGN, plan=p)
                                             for i, w in zip(ids, wts)])
            print(json.dumps(row), flush=True)
            rows.append(row)
        w13 = w2 = w13_bf = w2_bf = packed13 = packed2 = None
        torch.cuda.empty_cache()


def read_moe(w13, w2, ids, shim_us: float, floor: float) -> dict:
    """The read floor of a MoE call (bench/read_floor.py): the distinct experts of each routing read in two launches
    (w13, then w2), nothing computed; the shim's time against it."""
    slots = [read_floor.distinct_experts(i, EXPERTS) for i in ids]
    out13, out2 = read_floor.experts_checksums(w13, EXPERTS), read_floor.experts_checksums(w2, EXPERTS)
    us = graph_us([lambda s=s: (read_floor.read_experts(w13, s, out13), read_floor.read_experts(w2, s, out2))
                   for s in slots])
    return read_columns(us, floor, shim_us)


def read_columns(read_us: float, floor_us: float, shim_us: float) -> dict:
    """A row's read-floor columns: the reader's time, it against the bandwidth floor, the shim's time against it."""
    return {"read_us": read_us, "read_pct_floor": 100 * floor_us / read_us, "shim_pct_read": 100 * read_us / shim_us}


# The tile kernel's row tiles past 16 rows (the plans: one 64-row tile, split planes summed by a second launch):
# 16- or 32-row tiles (the weight re-read per row tile, from L2 after the first) and the kernel summing its own splits
TILE_ROW_ARMS = {"tile_m16r": {"BLOCK_M": 16}, "tile_m32": {"BLOCK_M": 32, "self_reduce": False},
                 "tile_m32r": {"BLOCK_M": 32, "self_reduce": True}, "tile_m64r": {"BLOCK_M": 64, "self_reduce": True}}
# The dense mma arm runs to 64 rows (8 a program, each reading the weight: from L2 after the first), past the plans'
# 8 (gguf_mma.TOKENS): where it beats the tile kernel is what would move that threshold
DENSE_MMA_MAX_ROWS = 64


def bench_dense(type_names, tokens, bw, peak, gen, vg, rows, tile_rows=False):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cap = tuple(torch.cuda.get_device_capability())
    for lname, (n, k) in DENSE_TP8.items():
        for name in type_names:
            qt = TYPES[name]
            one = gm.row_bytes(qt, k) * n
            copies = max(2, min(16, -(-2 * L2_BYTES // one)))
            ws = [random_blocks_cuda(qt, (n,), k, gen) for _ in range(copies)]
            wbf = [dequant_cuda(vg, w, qt, k) for w in ws] if vg else None
            for t in tokens:
                x = (torch.randn(t, k, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
                xh = x.half()
                row = dict(kind="dense", layer=lname, N=n, K=k, type=name, T=t, floor_us=one / bw * 1e6,
                           tc_floor_us=2 * t * n * k / peak * 1e6)
                ours = gm.gguf_linear(x, ws[0], qt)
                if wbf:
                    want = x @ wbf[0].T
                    row["rel_err_vs_bf16"] = ((ours.float() - want.float()).norm() / want.float().norm()).item()
                row["shim_us"] = graph_us([lambda w=w: gm.gguf_linear(x, w, qt) for w in ws] * 2)
                if vg is not None:
                    try:
                        row["vllm_gguf_us"] = graph_us([lambda w=w: vg._fused_mul_mat_gguf(xh, w, qt) for w in ws] * 2)
                    except Exception as e:  # noqa: BLE001
                        row["vllm_gguf_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    row["vllm_bf16_us"] = graph_us([lambda w=w: x @ w.T for w in wbf] * 2)
                row["shim_pct_floor"] = 100 * row["floor_us"] / row["shim_us"]
                outs = [read_floor.weight_checksums(w) for w in ws]
                read_us = graph_us([lambda w=w, o=o: read_floor.read_weight(w, o) for w, o in zip(ws, outs)] * 2)
                row.update(read_columns(read_us, row["floor_us"], row["shim_us"]))
                if gguf_mma.covers(qt, k, x.dtype, gguf_mma.KERNEL_TYPES) and t <= DENSE_MMA_MAX_ROWS:  # mma arm
                    tplan = gm.linear_plan(t, n, k, sms, qtype=qt, capability=cap)   # explicit: the tile kernels
                    tile = gm.gguf_linear(x, ws[0], qt, plan=tplan)
                    table = gm.grid_table(qt, x.device) if qt in gguf_mma.GRID_TYPES else None
                    mine = gguf_mma.linear(x, ws[0], qt, n, sms, grid_table=table)
                    row["mma_rel_err_vs_tile"] = ((mine.float() - tile.float()).norm() / tile.float().norm()).item()
                    row["tile_us"] = graph_us([lambda w=w: gm.gguf_linear(x, w, qt, plan=tplan) for w in ws] * 2)
                    row["mma_us"] = graph_us([lambda w=w: gguf_mma.linear(x, w, qt, n, sms, grid_table=table)
                                              for w in ws] * 2)
                    row["mma_pct_floor"] = 100 * row["floor_us"] / row["mma_us"]
                    if t > gguf_mma.TOKENS:   # the same in 8-row programs (each reading the weight)
                        row["mma8_us"] = graph_us([lambda w=w: gguf_mma.linear(x, w, qt, n, sms, grid_table=table,
                                                                               cols=gguf_mma.TOKENS) for w in ws] * 2)
                if qt in gguf_mma.PACKERS:   # the same bytes repacked at load (gguf_mma.pack), serving's plan
                    packed = [gguf_mma.pack(w, qt) for w in ws]
                    same = gm.gguf_linear(x, packed[0], qt, packed=True)
                    # the file layout's call with the same arithmetic: the register-MMA kernel where the packed
                    # weight takes it (MMA_PACKED_LINEAR_TYPES), else the same plan as ours
                    on_mma = (t <= gm.mma_linear_max_rows(qt)
                              and gm.mma_decode(qt, k, x.dtype, weight=packed[0], linear=True, packed=True))
                    grid = gm.grid_table(qt, x.device) if qt in gguf_mma.GRID_TYPES else None
                    twin = gguf_mma.linear(x, ws[0], qt, n, sms, grid_table=grid) if on_mma else ours
                    row["mma_packed_equal"] = bool(torch.equal(same, twin))
                    row["mma_packed_us"] = graph_us([lambda w=w: gm.gguf_linear(x, w, qt, packed=True)
                                                     for w in packed] * 2)
                    row["mma_packed_pct_floor"] = 100 * row["floor_us"] / row["mma_packed_us"]
                    if not on_mma and t <= DENSE_MMA_MAX_ROWS:   # the register-MMA kernel on the packed weight anyway:
                        # where it beats the plan's tile kernel is what would move MMA_LINEAR_MAX_ROWS for packed types
                        forced = gguf_mma.linear(x, packed[0], qt, n, sms, grid_table=grid, packed=True)
                        row["mma_packed_forced_rel_vs_shim"] = (
                            (forced.float() - ours.float()).norm() / ours.float().norm()).item()
                        row["mma_packed_forced_us"] = graph_us([
                            lambda w=w: gguf_mma.linear(x, w, qt, n, sms, grid_table=grid, packed=True)
                            for w in packed] * 2)
                    packed = None
                if tile_rows and 16 < t <= 64:
                    for arm, tuning in TILE_ROW_ARMS.items():
                        aplan = gm.linear_plan(t, n, k, sms, tuning, qtype=qt, capability=cap)
                        mine = gm.gguf_linear(x, ws[0], qt, plan=aplan)
                        row[f"{arm}_rel_vs_shim"] = ((mine.float() - ours.float()).norm() / ours.float().norm()).item()
                        row[f"{arm}_us"] = graph_us([lambda w=w, p=aplan: gm.gguf_linear(x, w, qt, plan=p)
                                                     for w in ws] * 2)
                print(json.dumps(row), flush=True)
                rows.append(row)
            ws = wbf = None
            torch.cuda.empty_cache()


DEQUANT_SWEEP = ({}, {"steps": 1}, {"steps": 16}, {"BLOCK_N": 64}, {"BLOCK_N": 64, "steps": 16},
                 {"BLOCK_N": 16, "steps": 8}, {"num_warps": 8, "BLOCK_N": 64})


def bench_dequant(types, gen, rows, bw):
    """gguf_dequantize on a prefill MoE chunk's experts (64 of the TP-8 w13 and w2: what _moe_dequantized
    dequantizes per chunk) in each DEQUANT_SWEEP shape ({} = DEQUANT_TUNING): µs and % of the floor (the GGUF bytes
    read plus the bf16 bytes written, at the copy bandwidth)."""
    for name in types:
        qt = TYPES[name]
        for what, n, k in (("w13 x64", 64 * 2 * EXPERT_WIDTH // 8, HIDDEN), ("w2 x64", 64 * HIDDEN, EXPERT_WIDTH // 8)):
            ws = [random_blocks_cuda(qt, (n,), k, gen) for _ in range(2)]
            out = torch.empty(n, k, dtype=torch.bfloat16, device="cuda")
            floor = (ws[0].numel() + out.numel() * 2) / bw * 1e6
            want = gm.gguf_dequantize(ws[0], qt, k, torch.bfloat16, tuning={"steps": 1}).clone()
            for tun in DEQUANT_SWEEP:
                try:
                    us = graph_us([lambda w=w, t=tun: gm.gguf_dequantize(w, qt, k, torch.bfloat16, out=out, tuning=t)
                                   for w in ws] * 2)
                    gm.gguf_dequantize(ws[0], qt, k, torch.bfloat16, out=out, tuning=tun)
                    same = bool(torch.equal(out, want))
                except Exception as e:  # noqa: BLE001
                    us, same = None, f"{type(e).__name__}: {str(e)[:200]}"
                row = dict(kind="dequant", type=name, what=what, N=n, K=k, tuning=tun, us=us, floor_us=floor,
                           pct_floor=100 * floor / us if us else None, equal_to_one_step=same)
                print(json.dumps(row), flush=True)
                rows.append(row)
            ws = out = want = None
            torch.cuda.empty_cache()


def bench_moe_profile(types, tokens, gen, rows):
    """Where a MoE call's time goes: every kernel's device time per call (torch profiler, eager calls of the
    same cycle the timing uses), next to the graph-replayed µs of the whole call; the difference is launch gaps."""
    from torch.profiler import ProfilerActivity, profile
    for name in types:
        qt, w13, w2, expert_bytes = rank_experts(name, gen)
        for t in tokens:
            ids, wts, x, _ = call_inputs(t, gen, expert_bytes, 1.0)
            calls = [lambda i=i, w=w: gm.gguf_moe(x, w13, w2, w, i, qt, qt, align=ALIGN) for i, w in zip(ids, wts)]
            total = graph_us(calls)
            for c in calls:
                c()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for c in calls:
                    c()
                torch.cuda.synchronize()
            per_kernel = {}
            for ev in prof.key_averages():
                dev = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                if dev and ev.count:
                    per_kernel[ev.key[:60]] = round(dev / len(calls), 1)
            row = dict(kind="moe_profile", what=f"moe tp8 {name}", T=t, graph_us=total, kernels_us=per_kernel,
                       kernels_sum_us=round(sum(per_kernel.values()), 1))
            print(json.dumps(row), flush=True)
            rows.append(row)
        w13 = w2 = None
        torch.cuda.empty_cache()


def bench_probe(types, tokens, bw, gen, rows):
    """Place a MoE call's time without hardware counters: the same call with the kernel's PROBE variants — 0: as
    served, 1: Q4_K codes decoded twice, 2: every dot twice (graph µs each); the differences are what one decode and
    one round of dots cost inside the kernel (estimates: the compiler stages the probes' loads differently, see
    _moe_kernel's PROBE)."""
    for name in types:
        qt, w13, w2, expert_bytes = rank_experts(name, gen)
        for t in tokens:
            ids, wts, x, floor = call_inputs(t, gen, expert_bytes, bw)
            row = dict(kind="probe", what=f"moe tp8 {name}", T=t, floor_us=floor)
            for probe in (0, 1, 2):
                plan = {**gm.moe_plan(t, TOP_K, EXPERTS), "probe": probe}
                row[f"probe{probe}_us"] = graph_us(
                    [lambda i=i, w=w: gm.gguf_moe(x, w13, w2, w, i, qt, qt, align=ALIGN, plan=plan)
                     for i, w in zip(ids, wts)])
            print(json.dumps(row), flush=True)
            rows.append(row)
        w13 = w2 = None
        torch.cuda.empty_cache()


def _sweep_point(rows, what, qtype, t, cfg, floor_us, calls, check=None):
    """Time one launch configuration of a sweep (graph-captured ``calls``) of GGUF type ``qtype`` (its name) and
    record it; a configuration that does not compile or launch is recorded without a time.  check: (output of this
    configuration, the default configuration's output) callables; their relative difference is recorded, so a
    faster shape is also a right one."""
    try:
        us_ = graph_us(calls)
    except Exception as e:  # noqa: BLE001
        us_ = None
        print(f"sweep {what} T={t} {cfg}: {type(e).__name__}: {str(e)[:200]}")
    row = dict(kind="sweep", what=what, qtype=qtype, T=t, cfg=cfg, us=us_, floor_us=floor_us)
    if check is not None and us_ is not None:
        got, want = (f().float() for f in check)
        row["rel_diff_vs_default"] = ((got - want).norm() / want.norm()).item()
    print(json.dumps(row), flush=True)
    rows.append(row)


# warps, row repeats, programs an SM, halves in flight (AHEAD), units prefetched into L2 ahead (L2_AHEAD)
MMA_SWEEP_GRID = ((2, 4, 8), (1, 2, 4), (2, 4, 8), (1,), (0,))


def bench_mma_sweep(bw, gen, rows, types=("Q4_K", "Q6_K"), tokens=(1, 32), grid=MMA_SWEEP_GRID):
    """Launch shapes of the register-MMA decode kernels (kernels/gguf_mma.MMA_TUNING): warps, row repeats,
    programs an SM, halves of a super-block in flight and units prefetched into L2 ahead (a shorter grid takes
    MMA_SWEEP_GRID's remaining axes), for the TP-8 MoE
    at each of ``tokens`` and q_a+kv_a / lm_head at T = 1, on the layout serving loads (gguf_mma.pack for PACKERS'
    types).  Each point's output is compared with the default shape's on the same inputs (rel_diff_vs_default)."""
    import itertools
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = tuple(grid) + MMA_SWEEP_GRID[len(grid):]
    cfgs = [dict(num_warps=w, **({"reps": r} if r else {}), ctas_per_sm=c, ahead=a, l2_ahead=p)   # reps 0: the type's
            for w, r, c, a, p in itertools.product(*grid)]
    for name in types:
        qt, w13, w2, expert_bytes = rank_experts(name, gen)
        pk = qt in gguf_mma.PACKERS
        if pk:
            w13, w2 = gguf_mma.pack(w13, qt), gguf_mma.pack(w2, qt)
        layout = " packed" if pk else ""

        def moe(x, w, i, plan):
            return gm.gguf_moe(x, w13, w2, w, i, qt, qt, align=ALIGN, plan=plan, packed13=pk, packed2=pk)

        for t in tokens:
            ids, wts, x, floor = call_inputs(t, gen, expert_bytes, bw)
            base = {**gm.moe_plan(t, TOP_K, EXPERTS), "mma": True}
            want = moe(x, wts[0], ids[0], base).clone()
            for cfg in cfgs:
                plan = {**base, "mma_tuning": cfg}
                _sweep_point(rows, f"mma moe tp8 {name}{layout}", name, t, cfg, floor,
                             [lambda i=i, w=w, p=plan: moe(x, w, i, p) for i, w in zip(ids, wts)],
                             check=(lambda p=plan: moe(x, wts[0], ids[0], p), lambda: want))
        w13 = w2 = None
        torch.cuda.empty_cache()
        lname = "q_a+kv_a" if name == "Q4_K" else "lm_head"
        n, k = DENSE_TP8[lname]
        one = gm.row_bytes(qt, k) * n
        ws = [random_blocks_cuda(qt, (n,), k, gen) for _ in range(max(2, min(16, -(-2 * L2_BYTES // one))))]
        ws = [gguf_mma.pack(w, qt) for w in ws] if pk else ws
        x = (torch.randn(1, k, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
        want = gguf_mma.linear(x, ws[0], qt, n, sms, packed=pk).clone()
        for cfg in cfgs:
            _sweep_point(rows, f"mma {lname} {name}{layout}", name, 1, cfg, one / bw * 1e6,
                         [lambda w=w: gguf_mma.linear(x, w, qt, n, sms, tuning=cfg, packed=pk) for w in ws] * 2,
                         check=(lambda c=cfg: gguf_mma.linear(x, ws[0], qt, n, sms, tuning=c, packed=pk),
                                lambda: want))
        ws = None
        torch.cuda.empty_cache()


LOAD_WIDTH_ROWS = 19392   # lm_head's 19 360 rows at TP 8, rounded up to read_floor.PIECE_ROWS
LOAD_WIDTH_SPLITS = (1, 2, 4)


def bench_load_width(bw, gen, rows, types=tuple(read_floor.PIECE_LAYOUTS)):
    """read_floor.read_pieces on an lm_head-sized weight (K = 6144): each type's code bytes in the file's block
    layout with the loads the register-MMA kernel makes (2-byte where blocks are 2-byte aligned, else 16-byte) and
    packed (a repack at load time) with 2- and 16-byte loads, at 1, 2 and 4 programs a row tile.  % of floor: the
    weight's bytes (file layout: whole blocks, whose cache lines the reads fetch) over the copy bandwidth."""
    k = HIDDEN
    for name in types:
        qt = TYPES[name]
        blocks = gm.row_bytes(qt, k) // read_floor.PIECE_LAYOUTS[name][0]
        for packed in (False, True):
            row_bytes = blocks * read_floor.piece_layout(name, packed)[0]
            one = LOAD_WIDTH_ROWS * row_bytes
            ws = [torch.randint(0, 256, (LOAD_WIDTH_ROWS, row_bytes), dtype=torch.uint8, device="cuda",
                                generator=gen) for _ in range(max(2, min(16, -(-2 * L2_BYTES // one))))]
            for wide in (False, True) if read_floor.wide_loads_fit(name, packed) else (False,):
                for splits in LOAD_WIDTH_SPLITS:
                    outs = [read_floor.read_pieces(w, name, packed, wide, splits) for w in ws]
                    us = graph_us([lambda w=w, o=o: read_floor.read_pieces(w, name, packed, wide, splits, o)
                                   for w, o in zip(ws, outs)] * 2)
                    row = dict(kind="load_width", type=name, layout="packed" if packed else "file",
                               loads=16 if wide else 2, splits=splits, bytes=one, us=us,
                               floor_us=one / bw * 1e6, pct_floor=100 * one / bw * 1e6 / us)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            ws = None
            torch.cuda.empty_cache()


# Dense linears of 33-256 rows (prefill chunks, MTP verify batches, many decoding requests): 2-3x slower than bf16
# weights on the H200 (2026-12-05: lm_head Q8_0 131 µs at 64 rows, 252 at 256, bf16 68 and 89) on the one 64-row
# tile (64 rows) and dequantization + cuBLAS (256).  The sweep's tiles for them: rows x features a program, warps,
# stages; the default plan and, from 65 rows, dequantization too
DENSE_WIDE_TILES = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                    for bm in (64, 128) for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3, 4)
                    if not (bm == bn == 128 and w == 4)]


def bench_sweep(bw, gen, rows, types=("Q4_K",), prefill_tokens=(1024,), decode_tokens=(1, 32), dense=True,
                dense_tokens=(1, 32, 4096), dense_layers=(("q_a+kv_a", "Q4_K"), ("lm_head", "Q6_K"))):
    """Time alternative launch parameters so the tuning constants in kernels/gguf/tiles.py can be chosen: decode
    shapes at each of ``decode_tokens``, prefill tiles (Q4_K only) at each of ``prefill_tokens``, then (dense) the
    dense linears' (``dense_layers``: (layer, type)) at each of ``dense_tokens``: up to 64 rows the decode tiles
    (K split over the GPU), from 33 rows DENSE_WIDE_TILES too, above DENSE_DEQUANT_MIN_M the default plan
    (dequantization + cuBLAS) against the prefill tiles."""
    import itertools
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    decode = [dict(BLOCK_N=bn, num_stages=st, ctas_per_sm=c, num_warps=w)
              for bn, st, c, w in itertools.product((32, 64, 128), (2, 3, 4), (4, 8), (4, 8))
              if not (bn == 128 and w == 4)]
    prefill = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
               for bm, bn, w, st in itertools.product((64, 128), (64, 128), (4, 8), (2,)) if not (bm == bn == 128
                                                                                                     and w == 4)]
    for name in types:
        qt, w13, w2, expert_bytes = rank_experts(name, gen)
        points = [(t, decode) for t in decode_tokens] + [(t, prefill if name == "Q4_K" else []) for t in prefill_tokens]
        for t, cfgs in points:
            ids, wts, x, floor = call_inputs(t, gen, expert_bytes, bw)
            for cfg in cfgs:
                plan = gm.moe_plan(t, TOP_K, EXPERTS, tuning=cfg)
                _sweep_point(rows, f"moe tp8 {name}", name, t, cfg, floor,
                             [lambda i=i, w=w: gm.gguf_moe(x, w13, w2, w, i, qt, qt, align=ALIGN, plan=plan)
                              for i, w in zip(ids, wts)])
        w13 = w2 = None
        torch.cuda.empty_cache()
    for lname, name in dense_layers if dense else ():
        n, k = DENSE_TP8[lname]
        qt = TYPES[name]
        one = gm.row_bytes(qt, k) * n
        ws = [random_blocks_cuda(qt, (n,), k, gen) for _ in range(max(2, min(16, -(-2 * L2_BYTES // one))))]
        for t in dense_tokens:
            x = (torch.randn(t, k, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
            if t <= 64:
                cfgs = decode + (DENSE_WIDE_TILES if t > 32 else [])
            elif t <= 256:
                cfgs = [None] + DENSE_WIDE_TILES
            else:
                cfgs = [None] + (prefill if lname != "o_proj" else [])
            for cfg in cfgs:
                plan = gm.linear_plan(t, n, k, sms, tuning=cfg) if cfg else gm.linear_plan(t, n, k, sms)
                _sweep_point(rows, f"{lname} {name}", name, t, cfg or "dequant+cuBLAS", one / bw * 1e6,
                             [lambda w=w: gm.gguf_linear(x, w, qt, plan=plan) for w in ws] * 2)
        ws = None
        torch.cuda.empty_cache()


_CRASH_SCRIPT = r"""
import sys, torch
sys.path.insert(0, ".")
from bench.gguf_matmul import random_blocks_cuda, routings
from vllm.model_executor.layers.quantization import gguf as vg
from glm5_shim.kernels.gguf import tiles as gm
impl, qt, inter, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gen = torch.Generator(device="cuda").manual_seed(0)
w13 = random_blocks_cuda(qt, (256, 2 * inter), 6144, gen); w2 = random_blocks_cuda(qt, (256, 6144), inter, gen)
ids, wts = routings(t, 1, gen)
x = (torch.randn(t, 6144, device="cuda", generator=gen) * 0.5)
if impl == "vllm":
    y = vg._fused_moe_gguf(x.half(), w13, w2, wts[0], ids[0], qt, qt, "silu")
else:
    y = gm.gguf_moe(x.bfloat16(), w13, w2, wts[0], ids[0], qt, qt)
torch.cuda.synchronize()
print("OK finite=%s" % bool(torch.isfinite(y).all()))
"""


def crash_repro(rows):
    """vLLM's ggml_moe_a8 (T > 64) at TP-1/TP-2 expert shapes, each in its own process (a crash kills the context)."""
    for impl in ("vllm", "shim"):
        for tp in (1, 2):
            for name in ("Q6_K", "Q4_K"):
                proc = subprocess.run([sys.executable, "-c", _CRASH_SCRIPT, impl, str(TYPES[name]),
                                       str(EXPERT_WIDTH // tp), "65"], capture_output=True, text=True, timeout=300,
                                      cwd=pathlib.Path(__file__).resolve().parents[1])
                tail = (proc.stdout + proc.stderr).strip().splitlines()
                result = next((ln for ln in tail if ln.startswith("OK")), None) or (tail[-1][:200] if tail else "")
                row = dict(kind="crash_repro", impl=impl, tp=tp, type=name, T=65, rc=proc.returncode, result=result)
                print(json.dumps(row), flush=True)
                rows.append(row)


def fmt(v, d=0):
    return "—" if v is None else f"{v:.{d}f}"


def markdown(rows, bw, device) -> str:
    out = [f"# GGUF matmuls, {device}, {time.strftime('%Y-%m-%d')}", "",
           f"copy bandwidth {bw / 1e12:.2f} TB/s; µs per call in CUDA graphs (cycled routings / weight copies); "
           "floor = distinct weight bytes / bandwidth; % = floor / shim", ""]
    for tp in (8, 4):
        mo = [r for r in rows if r["kind"] == "moe" and r["tp"] == tp]
        if not mo:
            continue
        out += [f"## Routed experts, TP {tp} (w13 [256, {2 * EXPERT_WIDTH // tp}, 6144], w2 [256, 6144, "
                f"{EXPERT_WIDTH // tp}], top 8)", "",
                "| type | T | shim µs | vLLM GGUF µs | vLLM bf16 µs | floor µs | TC floor µs | shim % floor "
                "| err vs bf16 |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in mo:
            vg_us = fmt(r.get("vllm_gguf_us"), 1) if "vllm_gguf_error" not in r else "crash"
            out.append(f"| {r['type']} | {r['T']} | {fmt(r['shim_us'], 1)} | {vg_us} | {fmt(r.get('vllm_bf16_us'), 1)} "
                       f"| {fmt(r['floor_us'], 1)} | {fmt(r['tc_floor_us'], 1)} | {fmt(r['shim_pct_floor'])} "
                       f"| {fmt(r.get('rel_err_vs_bf16'), 4)} |")
        out.append("")
    de = [r for r in rows if r["kind"] == "dense"]
    if de:
        out += ["## Dense linears, per rank at TP 8", "",
                "| layer [N, K] | type | T | shim µs | vLLM GGUF µs | vLLM bf16 µs | floor µs | shim % floor "
                "| err vs bf16 |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in de:
            vg_us = fmt(r.get("vllm_gguf_us"), 1) if "vllm_gguf_error" not in r else "error"
            out.append(f"| {r['layer']} [{r['N']}, {r['K']}] | {r['type']} | {r['T']} | {fmt(r['shim_us'], 1)} | "
                       f"{vg_us} | {fmt(r.get('vllm_bf16_us'), 1)} | {fmt(r['floor_us'], 1)} | "
                       f"{fmt(r['shim_pct_floor'])} | {fmt(r.get('rel_err_vs_bf16'), 4)} |")
        out.append("")
    lw = [r for r in rows if r["kind"] == "load_width"]
    if lw:
        out += [f"## Load width: code bytes of an lm_head-sized weight [{LOAD_WIDTH_ROWS}, {HIDDEN}] read as the "
                "register-MMA kernel reads them (bench/read_floor.read_pieces)", "",
                "| type | layout | loads (bytes) | programs a row tile | MB | µs | floor µs | % floor |",
                "|---|---|---|---|---|---|---|---|"]
        for r in lw:
            out.append(f"| {r['type']} | {r['layout']} | {r['loads']} | {r['splits']} | {r['bytes'] / 1e6:.1f} | "
                       f"{fmt(r['us'], 1)} | {fmt(r['floor_us'], 1)} | {fmt(r['pct_floor'])} |")
        out.append("")
    rd = [r for r in rows if "read_us" in r]
    if rd:
        out += ["## The read floor: the same weight bytes read in the same launches with nothing computed "
                "(bench/read_floor.py; MoE: distinct experts, w13 then w2; dense: one launch)", "",
                "| what | type | T | floor µs | read µs | read % floor | shim µs | shim % of read |",
                "|---|---|---|---|---|---|---|---|"]
        for r in rd:
            what = f"MoE TP {r['tp']}" if r["kind"] == "moe" else f"{r['layer']} [{r['N']}, {r['K']}]"
            out.append(f"| {what} | {r['type']} | {r['T']} | {fmt(r['floor_us'], 1)} | {fmt(r['read_us'], 1)} | "
                       f"{fmt(r['read_pct_floor'])} | {fmt(r['shim_us'], 1)} | {fmt(r['shim_pct_read'])} |")
        out.append("")
    sw = [r for r in rows if r["kind"] == "sweep"]
    if sw:
        out += ["## Launch-parameter sweep (µs per call; floor µs; relative difference from the default shape's "
                "output)", "", "| what | T | config | µs | % floor | rel. diff |", "|---|---|---|---|---|---|"]
        for r in sorted(sw, key=lambda r: (r["what"], r["T"], r["us"] or 1e9)):
            pct = fmt(100 * r["floor_us"] / r["us"]) if r["us"] else "—"
            diff = f"{r['rel_diff_vs_default']:.1e}" if r.get("rel_diff_vs_default") is not None else "—"
            out.append(f"| {r['what']} | {r['T']} | {r['cfg']} | {fmt(r['us'], 1)} | {pct} | {diff} |")
        out.append("")
    pb = [r for r in rows if r["kind"] == "probe"]
    if pb:
        out += ["## Where the MoE kernel's time goes (graph µs: as served, codes decoded twice, every dot twice)", "",
                "| what | T | floor µs | as served µs | decode twice µs | dots twice µs |", "|---|---|---|---|---|---|"]
        out += [f"| {r['what']} | {r['T']} | {fmt(r['floor_us'], 1)} | {fmt(r['probe0_us'], 1)} | "
                f"{fmt(r['probe1_us'], 1)} | {fmt(r['probe2_us'], 1)} |" for r in pb]
        out.append("")
    pr = [r for r in rows if r["kind"] == "moe_profile"]
    if pr:
        out += ["## Where a MoE call's time goes (device µs per call by kernel, eager; graph µs of the whole call)", "",
                "| what | T | graph µs | kernels µs | by kernel |", "|---|---|---|---|---|"]
        for r in pr:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(r["kernels_us"].items(), key=lambda kv: -kv[1]))
            out.append(f"| {r['what']} | {r['T']} | {fmt(r['graph_us'], 1)} | {r['kernels_sum_us']} | {parts} |")
        out.append("")
    cr = [r for r in rows if r["kind"] == "crash_repro"]
    if cr:
        out += ["## ggml_moe_a8 crash reproduction (T = 65, one process each)", "",
                "| impl | TP | type | rc | result |",
                "|---|---|---|---|---|"]
        out += [f"| {r['impl']} | {r['tp']} | {r['type']} | {r['rc']} | {r['result']} |" for r in cr]
    ma = [r for r in rows if r["kind"] == "moe" and "mma_s6_us" in r]
    if ma:
        out += ["## MoE decode arms (µs): the tile kernels, the register-MMA kernels in the 2026-12-02 five launches, "
                "today's default (shim), and its two routings forced", "",
                "| TP | type | T | tile | mma, 5 launches | **shim** | direct | sorted | floor | shim % floor "
                "| max rel vs shim |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ma:
            rel = max(v for k, v in r.items() if k.endswith("_rel_vs_shim"))
            out.append(f"| {r['tp']} | {r['type']} | {r['T']} | {fmt(r['tile_us'], 1)} | {fmt(r['mma_s6_us'], 1)} | "
                       f"**{fmt(r['shim_us'], 1)}** | {fmt(r.get('mma_direct_us'), 1)} | "
                       f"{fmt(r.get('mma_sorted_us'), 1)} | {fmt(r['floor_us'], 1)} | {fmt(r['shim_pct_floor'])} | "
                       f"{rel:.4f} |")
        out.append("")
    dq = [r for r in rows if r["kind"] == "dequant"]
    if dq:
        out += ["## Dequantization to bf16 (gguf_dequantize; floor = GGUF bytes read + bf16 bytes written)", "",
                "| type | weight [N, K] | tuning | µs | floor µs | % floor | equal to 1-step programs |",
                "|---|---|---|---|---|---|---|"]
        for r in dq:
            out.append(f"| {r['type']} | {r['what']} [{r['N']}, {r['K']}] | {r['tuning'] or 'default'} | "
                       f"{fmt(r['us'], 1)} | {fmt(r['floor_us'], 1)} | {fmt(r['pct_floor'])} | "
                       f"{r['equal_to_one_step']} |")
        out.append("")
    pa = [r for r in rows if r["kind"] == "moe" and ("prefill_tiles_us" in r or "dequant_us" in r)]
    if pa:
        deq = sorted({k[:-3] for r in pa for k in r if k.startswith("dequant") and k.endswith("_us")})
        deq += sorted({k[:-3] for r in pa for k in r if k.startswith("prefill_tiles") and k[13:-3].isdigit()})
        named = [f"{d}: {DEQUANT_TUNINGS[int(d[7:] or 0)] or 'default'}" for d in deq if d.startswith("dequant")]
        named += [f"{d}: {PREFILL_TUNINGS[int(d[13:]) - 1]}" for d in deq if d.startswith("prefill_tiles")]
        out += ["## MoE above the common decode threshold (µs): the plans' choice (shim), the prefill tiles, the "
                "decode regime on the register-MMA kernel (blocks of 8, 16, 32 rows), the experts dequantized a chunk "
                "at a time and other prefill-tile shapes (" + ", ".join(named) + "), and vLLM on bf16 weights", "",
                "| TP | type | T | **shim** | prefill tiles | register-MMA, 8 rows | 16 rows | 32 rows | "
                + "".join(f"{d} | " for d in deq) + "vLLM bf16 | floor | max rel vs shim |",
                "|---|---|---|---|---|---|---|---|" + "---|" * len(deq) + "---|---|---|"]
        for r in pa:
            rel = max(v for k, v in r.items() if k.endswith("_rel_vs_shim"))
            out.append(f"| {r['tp']} | {r['type']} | {r['T']} | **{fmt(r['shim_us'], 1)}** | "
                       f"{fmt(r.get('prefill_tiles_us'), 1)} | {fmt(r.get('mma_sorted_us'), 1)} | "
                       f"{fmt(r.get('mma_c16_us'), 1)} | {fmt(r.get('mma_c32_us'), 1)} | "
                       + "".join(f"{fmt(r.get(d + '_us'), 1)} | " for d in deq)
                       + f"{fmt(r.get('vllm_bf16_us'), 1)} | {fmt(r['floor_us'], 1)} | {rel:.4f} |")
        out.append("")
    tr = [r for r in rows if "tile_m32_us" in r]
    if tr:
        out += ["## Dense linears past 16 rows: the tile kernel's row tiles (m64 = the plans; r = the kernel sums its "
                "own split planes)", "",
                "| layer [N, K] | type | T | plans (m64) µs | " + " | ".join(f"{a[5:]} µs" for a in TILE_ROW_ARMS)
                + " | mma µs | vLLM bf16 µs | floor µs |",
                "|---|---|---|---|" + "---|" * len(TILE_ROW_ARMS) + "---|---|---|"]
        for r in tr:
            out.append(f"| {r['layer']} [{r['N']}, {r['K']}] | {r['type']} | {r['T']} | {fmt(r['shim_us'], 1)} | "
                       + " | ".join(fmt(r[f"{a}_us"], 1) for a in TILE_ROW_ARMS)
                       + f" | {fmt(r.get('mma_us'), 1)} | {fmt(r.get('vllm_bf16_us'), 1)} | {fmt(r['floor_us'], 1)} |")
        out.append("")
    mm = [r for r in rows if "mma_us" in r]
    if mm:
        out += ["## Dense linears: the register-MMA kernel (one launch) next to the tile kernels and vLLM", "",
                "| layer [N, K] | type | T | tile µs | mma µs | mma, 8-row programs µs | vLLM GGUF µs | floor µs "
                "| mma % floor | mma vs tile rel |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in mm:
            out.append(f"| {r['layer']} [{r['N']}, {r['K']}] | {r['type']} | {r['T']} | {fmt(r['tile_us'], 1)} | "
                       f"{fmt(r['mma_us'], 1)} | {fmt(r.get('mma8_us'), 1)} | {fmt(r.get('vllm_gguf_us'), 1)} | "
                       f"{fmt(r['floor_us'], 1)} | "
                       f"{fmt(r['mma_pct_floor'])} | {fmt(r['mma_rel_err_vs_tile'], 4)} |")
        out.append("")
    rp = [r for r in rows if r["kind"] == "repack"]
    if rp:
        out += ["## The loader's repack of one layer's experts (loading/gguf_repack._packed_copy, on the GPU; the "
                "first includes the copy kernels' start)", "",
                "| TP | type | MB | ms | GB/s |", "|---|---|---|---|---|"]
        out += [f"| {r['tp']} | {r['type']} | {r['bytes'] / 1e6:.0f} | {r['ms']:.1f} | {r['gb_s']:.0f} |" for r in rp]
        out.append("")
    pk = [r for r in rows if "mma_packed_us" in r]
    if pk:
        # the plan serving takes on either layout (the shim column of the tables above)
        out += ["## Q8_0 and Q6_K repacked at load (gguf_mma.pack: 16-byte code loads) against the file's blocks, "
                "each on the plan serving takes", "",
                "| what | type | T | file layout µs | packed µs | floor µs | file % floor | packed % floor "
                "| outputs equal |", "|---|---|---|---|---|---|---|---|---|"]
        for r in pk:
            moe = r["kind"] == "moe"
            what = f"MoE TP {r['tp']}" if moe else f"{r['layer']} [{r['N']}, {r['K']}]"
            base, base_pct = r["shim_us"], r["shim_pct_floor"]
            out.append(f"| {what} | {r['type']} | {r['T']} | {fmt(base, 1)} | {fmt(r['mma_packed_us'], 1)} | "
                       f"{fmt(r['floor_us'], 1)} | {fmt(base_pct)} | {fmt(r['mma_packed_pct_floor'])} | "
                       f"{'yes' if r['mma_packed_equal'] else '**no**'} |")
        out.append("")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--parts", default="moe8,moe4,dense,crash",
                    help="moe8 moe4 dense crash dequant probe profile sweep mma_sweep load_width")
    ap.add_argument("--dense-tokens", default="1,8,32,256,4096")
    ap.add_argument("--tile-rows", action="store_true",
                    help="dense rows 17-64: also time the tile kernel's 16/32/64-row tiles with and without self-sums")
    ap.add_argument("--sweep-types", default="Q4_K",
                    help="types whose launch parameters the sweep and mma_sweep parts time")
    ap.add_argument("--mma-sweep-tokens", default="1,32", help="MoE token counts of the mma_sweep part")
    ap.add_argument("--vllm-gguf-max-tokens", type=int, default=1 << 30)
    ap.add_argument("--dequant-tunings", default="[{}]",
                    help="JSON list of tile shapes of the dequantizing MoE to time as arms dequant, dequant1, ...")
    ap.add_argument("--prefill-tunings", default="[]",
                    help="JSON list of prefill-tile shapes (PREFILL_TUNING's keys) to time as arms prefill_tiles1, ...")
    ap.add_argument("--prefill-sweep-tokens", default="1024",
                    help="MoE token counts of the sweep part's prefill tiles ('' for none)")
    ap.add_argument("--dense-sweep-tokens", default="1,32,4096",
                    help="dense linear rows of the sweep part ('' for no dense sweep)")
    ap.add_argument("--dense-sweep-layers", default="q_a+kv_a:Q4_K,lm_head:Q6_K",
                    help="layer:type pairs of the sweep part's dense linears")
    ap.add_argument("--decode-sweep-tokens", default="1,32",
                    help="MoE token counts of the sweep part's decode shapes ('' for none)")
    ap.add_argument("--mma-sweep-grid", default=":".join(",".join(map(str, v)) for v in MMA_SWEEP_GRID),
                    help="mma_sweep's warps:row repeats (0: the type's):programs an SM[:AHEAD[:L2_AHEAD]], "
                         "e.g. 4:0:4:1,2:0,2")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    types = args.types.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    parts = args.parts.split(",")
    DEQUANT_TUNINGS[:] = json.loads(args.dequant_tunings)
    PREFILL_TUNINGS[:] = json.loads(args.prefill_tunings)
    VLLM_GGUF_MAX_TOKENS[0] = args.vllm_gguf_max_tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth()
    cap = torch.cuda.get_device_capability()
    peak = BF16_PEAK.get(cap, 989e12)
    device = torch.cuda.get_device_name()
    print(f"{device} sm_{cap[0]}{cap[1]}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    vg, bf16_moe = vllm_gguf(), vllm_bf16_moe()
    global ALIGN
    ALIGN = vllm_align()
    rows: list[dict] = []
    try:
        if "moe8" in parts:
            bench_moe(8, types, tokens, bw, peak, gen, vg, bf16_moe, rows)
        if "moe4" in parts:
            bench_moe(4, types, tokens, bw, peak, gen, vg, bf16_moe, rows)
        if "dense" in parts:
            bench_dense(types, [int(t) for t in args.dense_tokens.split(",")], bw, peak, gen, vg, rows,
                        tile_rows=args.tile_rows)
        if "load_width" in parts:
            bench_load_width(bw, gen, rows, [t for t in types if t in read_floor.PIECE_LAYOUTS])
        if "dequant" in parts:
            bench_dequant(types, gen, rows, bw)
        if "probe" in parts:
            bench_probe([t for t in args.sweep_types.split(",") if t == "Q4_K"],
                        [int(t) for t in args.tokens.split(",")], bw, gen, rows)
        if "profile" in parts:
            bench_moe_profile(args.sweep_types.split(","), [int(t) for t in args.tokens.split(",")], gen, rows)
        if "sweep" in parts:
            decode_tokens = [int(t) for t in args.decode_sweep_tokens.split(",") if t]
            dense_tokens = [int(t) for t in args.dense_sweep_tokens.split(",") if t]
            bench_sweep(bw, gen, rows, args.sweep_types.split(","),
                        [int(t) for t in args.prefill_sweep_tokens.split(",") if t], decode_tokens,
                        dense=bool(dense_tokens), dense_tokens=dense_tokens,
                        dense_layers=[tuple(p.split(":")) for p in args.dense_sweep_layers.split(",")])
        if "mma_sweep" in parts:
            grid = tuple(tuple(int(v) for v in axis.split(",")) for axis in args.mma_sweep_grid.split(":"))
            bench_mma_sweep(bw, gen, rows, [t for t in args.sweep_types.split(",")
                                            if gguf_mma.covers(TYPES[t], HIDDEN, torch.bfloat16)],
                            tokens=[int(t) for t in args.mma_sweep_tokens.split(",")], grid=grid)
        if "crash" in parts and vg is not None and os.environ.get("GLM5_BENCH_NO_CRASH") is None:
            crash_repro(rows)
    finally:
        (out / "gguf_matmul.json").write_text(json.dumps(dict(device=device, bandwidth=bw, rows=rows), indent=1))
        (out / "gguf_matmul.md").write_text(markdown(rows, bw, device))
        print(markdown(rows, bw, device))


if __name__ == "__main__":
    main()
