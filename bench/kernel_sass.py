"""Offline SASS of the GGUF decode kernels (no GPU): instructions a weight in the K loop, registers, shared memory.

    python bench/kernel_sass.py [--cc 90] [--types Q4_K,Q5_K,Q6_K]

Compiles the MoE decode variants the plans launch — the tile kernels (kernels/gguf/tiles.py, 16 routed rows x 64
features a program, 128 values a loop step) and the register-MMA kernels (kernels/gguf/register_mma.py, 8 rows x 128
features, 256 values a step) — for one target with Triton's own ptxas, disassembles them with its cuobjdump, takes
the K loop (the shortest loop holding a tensor-core instruction) and counts its instructions per weight a thread
decodes per trip.
Budget at full bandwidth: SM issue rate (4 warp-instructions a cycle) x 32 / weights an SM must consume a cycle
(bandwidth / SMs / clock / bytes a weight), for the H200 and the RTX PRO 6000 (GPUS): a kernel above a GPU's budget
is issue-bound there below full bandwidth, at most budget / (instructions a weight) of it.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from glm5_shim.kernels.gguf import tiles as gm  # noqa: E402
from glm5_shim.kernels.gguf import register_mma as gguf_mma  # noqa: E402

# (SMs, clock Hz, memory bandwidth B/s): the H200 as measured on the device machine (4.27 TB/s copy, 1.98 GHz seen
# under load); the others as published (boost clocks): RTX PRO 6000 Blackwell (sm_120), RTX 4090 (sm_89), RTX 3090
# (sm_86), A100 80GB SXM (sm_80)
GPUS = {"H200": (132, 1.98e9, 4.27e12), "RTX PRO 6000": (188, 2.6e9, 1.79e12), "RTX 4090": (128, 2.52e9, 1.01e12),
        "RTX 3090": (82, 1.70e9, 0.936e12), "A100": (108, 1.41e9, 2.04e12)}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_sass(cfg: dict, cc: int) -> tuple[str, str]:
    k = gm.compile_offline(cfg, cc)
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
    # the K loop: the shortest loop that holds a tensor-core instruction (a kernel that sums its own splits has a
    # shorter loop after it, over the split planes); the shortest loop where none does
    def body(loop):
        return [op for a, op, _ in ins if loop[1] <= a <= loop[0]]

    with_mma = [b for b in back if any(op.startswith(("HMMA", "WGMMA", "GMMA")) for op in body(b))]
    lo_hi = min(with_mma or back, key=lambda b: b[0] - b[1])
    return collections.Counter(body(lo_hi))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", type=int, default=90)
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    args = ap.parse_args()
    bytes_a_weight = {t: gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][1] /
                      gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][0] for t in args.types.split(",")}
    gpus = "; ".join(f"{g}: 128 x {sms} x {clk / 1e9:.2f}e9 / ({bw / 1e12:.2f}e12 / bytes a weight)"
                     for g, (sms, clk, bw) in GPUS.items())
    print(f"sm_{args.cc}; budget = instructions an SM can issue a cycle (4 warps x 32 lanes) / weights it must "
          f"consume a cycle at full bandwidth: {gpus}")
    print("| kernel | type | regs | shared B | loop instructions | weights a thread a trip | instr / weight | "
          + " | ".join(f"budget {g}" for g in GPUS) + " | top opcodes |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(GPUS) + "---|")
    configs = {c["name"]: c for c in gm.kernel_configs() + gguf_mma.kernel_configs()}
    for name in args.types.split(","):
        qt = int(gguf.GGMLQuantizationType[name])
        # the variants a decode MoE launches: the tile kernel's, and the register-MMA kernel's w13 pass (sorted
        # routing, SiLU of its own split sums) and its w2 pass summing the top-k slots (one token a program)
        wanted = [("tile", f"moe q{qt} m16 n64")]
        if qt in gguf_mma.KERNEL_TYPES:
            wanted += [("mma w13", f"mma {name.lower()} moe w13, SiLU reduced"),
                       ("mma w2", f"mma {name.lower()} moe top-k sum -> bf16")]
        if qt in gguf_mma.PACKERS:   # the same passes on the layout the loader repacks to (gguf_mma.pack)
            wanted += [("mma w13 packed", f"mma {name.lower()} packed moe w13, SiLU reduced"),
                       ("mma w2 packed", f"mma {name.lower()} packed moe top-k sum -> bf16")]
        missing = [n for _, n in wanted if n not in configs]
        if missing:  # a renamed variant must not vanish from the table silently (it did: the 2026-12-03 rename)
            raise SystemExit(f"no kernel config named {missing} (the configs: {sorted(configs)})")
        budgets = " | ".join(f"{128 * sms * clk / (bw / bytes_a_weight[name]):.1f}" for sms, clk, bw in GPUS.values())
        for label, cfg_name in wanted:
            cfg = configs[cfg_name]
            # the tile kernel: 64 features x 128 values a trip over its warps' threads
            # the register-MMA kernel: a program's 16 x WARPS x REPS features x one super-block (256 values) a trip
            weights = (64 * 128 / (32 * cfg["num_warps"]) if label == "tile"
                       else 16 * cfg["constexprs"]["REPS"] * 256 / 32)
            sass, usage = compile_sass(cfg, args.cc)
            counts = loop_counts(sass)
            total = sum(counts.values())
            regs = re.search(r"REG:(\d+)", usage).group(1)
            shared = re.search(r"SHARED_META:(\d+)", usage).group(1)
            top = ", ".join(f"{op} {n}" for op, n in counts.most_common(6))
            print(f"| {label} | {name} | {regs} | {shared} | {total} | {weights:.0f} | {total / weights:.2f} | "
                  f"{budgets} | {top} |", flush=True)


if __name__ == "__main__":
    main()
