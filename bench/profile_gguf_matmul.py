#!/usr/bin/env python
"""One GGUF MoE call at GLM-5's TP-8 expert shapes, for a profiler (ncu) to look at.

    ncu --clock-control none -k regex:_mma_moe_kernel --launch-skip 6 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section MemoryWorkloadAnalysis --section InstructionStats \\
        python bench/profile_gguf_matmul.py --type Q4_K --tokens 32

Runs the call 5 times (compile + warm-up + the profiled ones + spares): each call of the plan serving takes
launches a w13 pass then a w2 pass (of ``_mma_moe_kernel`` in the decode regime, ``_moe_kernel`` on the prefill
tiles), so --launch-skip 6 --launch-count 2 profiles the fourth call's two passes.  Weights are random valid blocks
(bench/gguf_matmul.py's), in the layout serving loads (gguf_mma.pack for its PACKERS' types; --file-layout keeps
the file's); routing is uniform top 8 of 256 experts; --ahead / --l2-ahead set the register-MMA kernel's loads
ahead.  The GPU session step ``ncu_gguf`` (bench/gpu_session.sh) runs it and writes the report's text to $OUT.
"""
import argparse
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import torch  # noqa: E402

import gguf_matmul as bench  # noqa: E402  (bench/gguf_matmul.py: shapes, types, routings)
from glm5_shim.kernels.gguf import tiles as gm  # noqa: E402
from glm5_shim.kernels.gguf import register_mma as gguf_mma  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", default="Q4_K", choices=list(bench.TYPES))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--ahead", type=int, default=None, help="the register-MMA kernel's AHEAD (default: its tuning)")
    ap.add_argument("--l2-ahead", type=int, default=None, help="the register-MMA kernel's L2_AHEAD")
    ap.add_argument("--file-layout", action="store_true", help="keep the file's blocks for PACKERS' types")
    a = ap.parse_args()
    qt = bench.TYPES[a.type]
    inter = bench.EXPERT_WIDTH // a.tp
    g = torch.Generator(device="cuda").manual_seed(1)
    w13 = bench.random_blocks_cuda(qt, (bench.EXPERTS, 2 * inter), bench.HIDDEN, g)
    w2 = bench.random_blocks_cuda(qt, (bench.EXPERTS, bench.HIDDEN), inter, g)
    pk = qt in gguf_mma.PACKERS and not a.file_layout
    if pk:
        w13, w2 = gguf_mma.pack(w13, qt), gguf_mma.pack(w2, qt)
    ids, wts = bench.routings(a.tokens, 5, g)
    x = (torch.randn(a.tokens, bench.HIDDEN, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    plan = gm.chosen_moe_plan(a.tokens, bench.TOP_K, x.dtype, w13, w2, qt, qt, (pk, pk))
    for key, value in (("ahead", a.ahead), ("l2_ahead", a.l2_ahead)):
        if value is not None:
            plan = {**plan, "mma_tuning": {**(plan.get("mma_tuning") or {}), key: value}}
    for i, w in zip(ids, wts):
        gm.gguf_moe(x, w13, w2, w, i, qt, qt, plan=plan, packed13=pk, packed2=pk)
    torch.cuda.synchronize()
    print("done", a, "packed" if pk else "file layout", gm.moe_regime(plan), plan)


if __name__ == "__main__":
    main()
