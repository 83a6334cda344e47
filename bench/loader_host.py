"""Host work of one TP rank loading a GGUF's quantized tensors: a whole-tensor copy out of the memory map (the loader
before 2026-12-03) against a view of the map (now), each then narrowed to the rank's shard and copied into a
preallocated parameter, as vLLM's GGUF weight loaders do.

    python bench/loader_host.py SLICE.gguf [--tp 8] [--rank 0] [--repeat 2]

The tensors are those the loader hands vLLM as they are stored (the load plan's KEEP), each split as its entry in
glm5_shim's tensor table says (row-parallel: by bytes of a row; column-parallel: by rows; replicated: whole).  The
file's pages are read once before timing (page cache warm, as after the first rank or a previous start), so what is
timed is the host's copying, not the disk.  Prints seconds and GB/s of file bytes for both ways.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glm5_shim.gguf.config import build_hf_config  # noqa: E402
from glm5_shim.gguf.load_plan import plan_tensors  # noqa: E402
from glm5_shim.gguf.reader import open_gguf  # noqa: E402
from glm5_shim.gguf.tensor_map import TP_COLUMN, TP_ROW  # noqa: E402
from glm5_shim.gguf.type_policy import KEEP  # noqa: E402
from glm5_shim.loading.gguf_weights import _raw  # noqa: E402


def shard(t: torch.Tensor, split: str, tp: int, rank: int) -> torch.Tensor:
    """The rank's part of a packed [..., rows, row bytes] tensor: row-parallel by bytes of a row, column-parallel by
    rows, replicated whole."""
    if split not in (TP_ROW, TP_COLUMN):
        return t
    dim = t.dim() - 1 if split == TP_ROW else t.dim() - 2
    size = t.shape[dim] // tp
    return t.narrow(dim, rank * size, size)


def kept(path: str) -> list:
    """(info, split) of every tensor the loader hands vLLM as stored."""
    model = open_gguf(path)
    plan = plan_tensors(model, build_hf_config(model, check_shapes=False))
    return [(t.info, t.spec.tp_split) for t in plan.tensors if t.action == KEEP]


def run(path: str, tp: int, rank: int, copy_whole: bool) -> tuple[float, int]:
    tensors = kept(path)
    t0, nbytes = time.perf_counter(), 0
    for info, split in tensors:
        whole = torch.from_numpy(np.array(info.data)) if copy_whole else _raw(info)  # _raw: the loader's own view
        part = shard(whole, split, tp, rank)
        dst = torch.empty(part.shape, dtype=part.dtype)
        dst.copy_(part)
        nbytes += int(info.data.nbytes)
    return time.perf_counter() - t0, nbytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf")
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    run(args.gguf, 1, 0, copy_whole=False)  # warm the page cache
    print(f"{args.gguf}, TP {args.tp} rank {args.rank}")
    print("| tensors copied | seconds (best of %d) | file GB/s |" % args.repeat)
    print("|---|---|---|")
    for label, whole in (("whole, then the shard (before)", True), ("the shard of a map view (now)", False)):
        best, nbytes = min(run(args.gguf, args.tp, args.rank, whole) for _ in range(args.repeat))
        print(f"| {label} | {best:.2f} | {nbytes / best / 1e9:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
