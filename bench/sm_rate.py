"""Is a GGUF decode kernel bound by memory or by its SMs?  Bytes an SM consumes a clock, from sweeps on two GPUs.

    python bench/sm_rate.py A/gguf_matmul.json B/gguf_matmul.json [--what "mma moe tp8"]

Input: bench/gguf_matmul.py's JSON (``--parts mma_sweep``) from GPUs with the same SMs and clock but different
memory bandwidth (the H200 and the H100 SXM: 132 SMs at 1.98 GHz, 4.27 and 3.02 TB/s).  For each shape both ran
with the type's default launch shape (kernels/gguf_mma.tuning_for), it prints the time on each, their ratio, and the
bytes each SM took a clock (distinct weight bytes / time / SMs / clock).  A memory-bound kernel takes the bandwidth
ratio longer on the slower GPU (1.41x); one bound by its SMs (instruction issue, latency) takes about the same time
and the same bytes a clock on both.  Then, for each GPU of bench/kernel_sass.py's GPUS, the bytes a clock an SM
must take for the GPU to stream at full bandwidth, and the share of the floor the SMs allow there at the measured
rate (the SM ceiling: at 100 % the kernel is bound by memory there, and its latency hiding decides how close it
gets), assuming the same SASS runs at the same rate a clock (the sm_120 and sm_80 loops count within 0.3
instructions a weight of the sm_90 ones, bench/journal/2026-12-03.md).  A projection, not a measurement there.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

_BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_BENCH, ".."), _BENCH]

from kernel_sass import GPUS  # noqa: E402  (SMs, clock, bandwidth) of the H200 and the GPUs the shim targets

# the H200's SMs and clock as GPUS has them (1.98 GHz seen under load); the H100 SXM has the same (published)
SMS, CLOCK = GPUS["H200"][:2]


def row_qtype(row: dict) -> str:
    """The GGUF type a sweep row timed: recorded since 2026-12-07; older files only name it in the label
    ("mma moe tp8 Q6_K packed")."""
    if "qtype" in row:
        return row["qtype"]
    what = row["what"]
    return what.split()[-2] if what.endswith("packed") else what.split()[-1]


def default_cfg(name: str) -> dict:
    """The launch-shape keys of GGUF type ``name`` as the plans take them now (the sweep records them without
    reps)."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma
    import gguf
    t = gguf_mma.tuning_for(int(gguf.GGMLQuantizationType[name]))
    # a key this code's tuning lacks is a knob it does not have: its sweeps' "off" value (stages: no ring)
    return {k: t.get(k, 0) for k in ("num_warps", "ctas_per_sm", "ahead", "l2_ahead", "stages")}


def default_rows(doc: dict, what_prefix: str) -> dict:
    """{(what, T): row} of the sweep rows run with their type's default shape (keys the row lacks: not swept)."""
    out = {}
    for r in doc["rows"]:
        if r.get("kind") != "sweep" or not r["what"].startswith(what_prefix) or r.get("us") is None:
            continue
        want = default_cfg(row_qtype(r))
        if "reps" in r["cfg"] or any(r["cfg"].get(k, want[k]) != v for k, v in want.items()):
            continue
        out[(r["what"], r["T"])] = r
    return out


def table(a: dict, b: dict, what_prefix: str = "mma moe tp8") -> list[str]:
    ra, rb = default_rows(a, what_prefix), default_rows(b, what_prefix)
    gpus = " | ".join(f"{g}: B a clock an SM at full bandwidth / SM ceiling" for g in GPUS)
    lines = [f"| shape | T | µs {a['device']} | µs {b['device']} | ratio | B a clock an SM: {a['device']} / "
             f"{b['device']} | {gpus} |",
             "|---|---|---|---|---|---|" + "---|" * len(GPUS)]
    for key in sorted(ra.keys() & rb.keys()):
        x, y = ra[key], rb[key]
        rate = [r["floor_us"] * d["bandwidth"] / r["us"] / (SMS * CLOCK) for r, d in ((x, a), (y, b))]
        best = max(rate)
        cells = []
        for sms, clk, bw in GPUS.values():
            need = bw / (sms * clk)
            cells.append(f"{need:.1f} / {min(1.0, best / need):.0%}")
        lines.append(f"| {key[0]} | {key[1]} | {x['us']:.1f} | {y['us']:.1f} | {y['us'] / x['us']:.2f} | "
                     f"{rate[0]:.1f} / {rate[1]:.1f} | " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--what", default="mma moe tp8")
    args = ap.parse_args()
    docs = [json.load(open(p)) for p in (args.a, args.b)]
    print("\n".join(table(*docs, what_prefix=args.what)))


if __name__ == "__main__":
    main()
