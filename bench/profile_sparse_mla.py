#!/usr/bin/env python
"""One sparse-MLA call at a GLM-5 shape, for a profiler (ncu) to look at.

    ncu --clock-control none -k regex:_sparse_mla_fwd --launch-skip 3 --launch-count 1 --section ... \\
        python bench/profile_sparse_mla.py --heads 8 --tokens 256 --kv-format fp8_ds_mla [--tile 16,64,8,1,prefetch]

Runs the call 5 times (compile + warm-up + the profiled one + spares).  GLM5_SPARSE_MLA_FP8_DECODE picks the decode.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402,F401  (before anything that may swap in vLLM's placeholder)

from glm5_shim.kernels import sparse_mla as sm  # noqa: E402
from glm5_shim.kernels import sparse_mla_reference as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--kv-format", default="fp8_ds_mla")
    ap.add_argument("--pool", type=int, default=262144)
    ap.add_argument("--tile", default="", help="block_h,block_n,warps,stages[,prefetch][,split]")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = (torch.randn(a.pool // 64, 64, 576, generator=g, device="cuda") * 0.5)
    cache = ref.quantize_fp8_ds_mla(kv) if a.kv_format == "fp8_ds_mla" else kv.to(torch.bfloat16)
    q = (torch.randn(a.tokens, a.heads, 576, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(a.pool, device="cuda", generator=g)[:2048] for _ in range(a.tokens)]).int()
    tile = None
    if a.tile:
        parts = a.tile.split(",")
        bh, bn, w, s = (int(x) for x in parts[:4])
        tile = sm.FwdTile(bh, bn, w, s, 1, prefetch="prefetch" in parts, split_loads="split" in parts)
    for _ in range(5):
        sm.sparse_mla_attention(q, cache, idx, 256 ** -0.5, kv_format=a.kv_format, tile=tile)
    torch.cuda.synchronize()
    print("done", a, tile)


if __name__ == "__main__":
    main()
