"""Offline SASS of the MoE prefill tiles (kernels/gguf_matmul._moe_kernel, 64 routed rows a block; no GPU).

    python bench/tile_sass.py [--cc 120,90] [--types Q4_K,Q8_0] [--variants base,swap,w8,...]

For each target, type, pass (w13: gate and up in one tile; w2) and layout (the file's; packed for gguf_mma.PACKERS'
types) compiles the served 64x64 four-warp tile and its variants with Triton's own ptxas, and prints per variant:
registers, stack bytes a thread, spill instructions (LDL + STL) in the K loop, and the loop's SASS instructions a
weight and row (loop instructions / weights a thread decodes a trip / rows of the block: the decode's cost against
the MMAs it feeds).  The row marked * is what gguf_matmul.prefill_pass_tuning serves on that target.
"""
import argparse
import os
import re
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernel_sass  # noqa: E402

from glm5_shim.kernels.gguf import tiles as gm  # noqa: E402
from glm5_shim.kernels.gguf import register_mma as gguf_mma  # noqa: E402

VARIANTS = {"base": {}, "swap": dict(SWAP=True), "w8": dict(num_warps=8), "w8 swap": dict(num_warps=8, SWAP=True),
            "n32": dict(BLOCK_N=32), "n32 swap": dict(BLOCK_N=32, SWAP=True), "n32 w8": dict(BLOCK_N=32, num_warps=8),
            "n32 w8 swap": dict(BLOCK_N=32, num_warps=8, SWAP=True),
            "m128 w8": dict(BLOCK_M=128, num_warps=8), "m128 w8 swap": dict(BLOCK_M=128, num_warps=8, SWAP=True)}


def measure(cfg: dict, variant: dict, cc: int) -> dict:
    c = dict(cfg)
    v = dict(variant)
    c["num_warps"] = v.pop("num_warps", c["num_warps"])
    c["constexprs"] = dict(c["constexprs"], **v)
    sass, usage = kernel_sass.compile_sass(c, cc)
    counts = kernel_sass.loop_counts(sass)
    k = c["constexprs"]
    weights = (2 if k["GATED"] else 1) * k["BLOCK_N"] * gm.STEP_K / (32 * c["num_warps"])
    loop = sum(counts.values())
    return dict(regs=int(re.search(r"REG:(\d+)", usage).group(1)), stack=int(re.search(r"STACK:(\d+)", usage).group(1)),
                spills=counts["LDL"] + counts["STL"], per_weight_row=loop / weights / k["BLOCK_M"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", default="120,90")
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q8_0,Q2_K,Q3_K,IQ2_XXS,IQ4_XS")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    names = args.variants.split(",")
    base = {c["name"]: c for c in gm.kernel_configs()}
    print("| target | type | pass | layout | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for cc in (int(c) for c in args.cc.split(",")):
        cap = (cc // 10, cc % 10)
        for tname in args.types.split(","):
            qt = int(gguf.GGMLQuantizationType[tname])
            for packed in (False, True) if qt in gguf_mma.PACKERS else (False,):
                for gated in (True, False):
                    cfg = base[f"moe q{qt} m64 n64{' gated' if gated else ''}{' packed' if packed else ''}"]
                    served = {**gm.PREFILL_TUNING, **gm.prefill_pass_tuning(qt, gated, cap)}
                    cells = []
                    for n in names:
                        r = measure(cfg, VARIANTS[n], cc)
                        full = {**gm.PREFILL_TUNING, "SWAP": False, **VARIANTS[n]}
                        mark = "*" if all(full.get(key) == served.get(key, False) for key in full) else ""
                        cells.append(f"{mark}{r['per_weight_row']:.3f} ({r['spills']} sp, {r['stack']} B)")
                    print(f"| sm_{cc} | {tname} | {'w13' if gated else 'w2'} | {'packed' if packed else 'file'} | "
                          + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
