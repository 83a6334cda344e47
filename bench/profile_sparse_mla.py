#!/usr/bin/env python
"""One sparse-MLA call at a GLM-5 shape, for a profiler (ncu) to look at.

    ncu --clock-control none -k regex:_sparse_mla_fwd --launch-skip 3 --launch-count 1 --section ... \\
        python bench/profile_sparse_mla.py --heads 8 --tokens 256 --kv-format fp8_ds_mla [--tile 16,64,8,1,prefetch]

Runs the call 5 times (compile + warm-up + the profiled one + spares).  GLM5_SPARSE_MLA_FP8_DECODE picks the decode.
"""
import argparse
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import torch  # noqa: E402

import sparse_mla as bench  # noqa: E402  (bench/sparse_mla.py: the benchmark's own inputs and softmax scale)
from glm5_shim.kernels import sparse_mla as sm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--kv-format", default="fp8_ds_mla")
    ap.add_argument("--pool", type=int, default=262144)
    ap.add_argument("--tile", default="", help="block_h,block_n,warps,stages[,prefetch][,split]")
    a = ap.parse_args()
    kv, kv8 = bench.make_pool(a.pool)
    cache = kv8 if a.kv_format == "fp8_ds_mla" else kv
    g = torch.Generator(device="cuda").manual_seed(1)
    q = (torch.randn(a.tokens, a.heads, 576, generator=g, device="cuda") * 0.5).to(bench.QDT)
    idx = bench.make_indices(a.tokens, a.pool, g)
    tile = None
    if a.tile:
        parts = a.tile.split(",")
        bh, bn, w, s = (int(x) for x in parts[:4])
        tile = sm.FwdTile(bh, bn, w, s, 1, prefetch="prefetch" in parts, split_loads="split" in parts)
    for _ in range(5):
        sm.sparse_mla_attention(q, cache, idx, bench.SCALE, kv_format=a.kv_format, tile=tile)
    torch.cuda.synchronize()
    print("done", a, tile)


if __name__ == "__main__":
    main()
