"""Offline SASS of the GGUF decode kernels (no GPU): instructions a weight in the K loop, registers, shared memory.

    python bench/kernel_sass.py [--cc 90] [--types Q4_K,Q5_K,Q6_K]

Compiles the MoE decode variants the plans launch — the tile kernels (kernels/gguf_matmul.py, 16 routed rows x 64
features a program, 128 values a loop step) and the register-MMA kernels (kernels/gguf_mma.py, 8 rows x 128
features, 256 values a step) — for one target with Triton's own ptxas, disassembles them with its cuobjdump, takes
the innermost loop (the last backward branch) and counts its instructions per weight a thread decodes per trip.
Budget at full bandwidth: SM issue rate (4 warp-instructions a cycle) x 32 / weights an SM must consume a cycle
(bandwidth / SMs / clock / bytes a weight); H200: 4.27 TB/s, 132 SMs, 1.98 GHz.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import gguf
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from glm5_shim.kernels import gguf_matmul as gm  # noqa: E402
from glm5_shim.kernels import gguf_mma  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_sass(cfg: dict, cc: int) -> tuple[str, str]:
    kernel = cfg["kernel"]
    sig = dict(cfg["signature"], **{k: "constexpr" for k in cfg["constexprs"]})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in cfg["divisible_by_16"]}
    src = (GluonASTSource if cfg.get("gluon") else triton.compiler.ASTSource)(kernel, sig, constexprs=cfg["constexprs"],
                                                                              attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                       options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True).stdout
    return sass, usage + f" SHARED_META:{k.metadata.shared}"


def loop_counts(sass: str) -> collections.Counter:
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)([^;]*);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    back = [(a, int(t.group(1), 16)) for a, op, rest in ins if op == "BRA" and (t := re.search(r"0x([0-9a-f]+)", rest))
            and int(t.group(1), 16) < a]
    lo_hi = min(back, key=lambda b: b[0] - b[1])  # the innermost (shortest) loop
    return collections.Counter(op for a, op, _ in ins if lo_hi[1] <= a <= lo_hi[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", type=int, default=90)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    args = ap.parse_args()
    bytes_a_weight = {t: gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][1] /
                      gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][0] for t in args.types.split(",")}
    print(f"sm_{args.cc}; budget = 128 x 132 x 1.98e9 / (4.27e12 / bytes a weight) instructions a weight (H200)")
    print("| kernel | type | regs | shared B | loop instructions | weights a thread a trip | instr / weight | "
          "budget at 100 % | top opcodes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.types.split(","):
        qt = int(gguf.GGMLQuantizationType[name])
        tile = [c for c in gm.kernel_configs() if c["name"] == f"moe q{qt} m16 n64"][0]
        mma = [c for c in gguf_mma.kernel_configs() if c["name"] == f"mma {name.lower()} moe -> fp32"]
        budget = 128 * 132 * 1.98e9 / (4.27e12 / bytes_a_weight[name])
        for label, cfg, weights in (("tile", tile, 64 * 128 / (32 * tile["num_warps"])),
                                    ("mma", mma[0] if mma else None, gguf_mma.block_rows() * 256 /
                                     (32 * gguf_mma.MMA_TUNING["num_warps"]))):
            if cfg is None:
                continue
            sass, usage = compile_sass(cfg, args.cc)
            counts = loop_counts(sass)
            total = sum(counts.values())
            regs = re.search(r"REG:(\d+)", usage).group(1)
            shared = re.search(r"SHARED_META:(\d+)", usage).group(1)
            top = ", ".join(f"{op} {n}" for op, n in counts.most_common(6))
            print(f"| {label} | {name} | {regs} | {shared} | {total} | {weights:.0f} | {total / weights:.2f} | "
                  f"{budget:.1f} | {top} |", flush=True)


if __name__ == "__main__":
    main()
