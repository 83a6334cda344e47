"""Arrival counters for split-K launches that reduce themselves: each program of a tile writes its float32 partial
sums, counts itself in (an atomic add, acquire-release at GPU scope, after a CTA barrier), and the program that
arrives last sums the tile's planes into the result and sets the counter back to zero.  One launch instead of a
split launch plus a reduction (and, for decode-sized calls, a few microseconds of launch gaps less).

The counters live in one zeroed buffer per device and stream.  A launch leaves every counter it used at zero, so
launches that follow one another on a stream share the buffer, in CUDA graphs too; launches on two streams could
overlap, so each stream gets its own.
"""
from __future__ import annotations

import torch

from glm5_shim import settings

COUNTER_SLOTS = 1 << 16   # tiles one launch may count in (a decode-sized call has a few thousand at most)
_buffers: dict = {}


def counters(device: torch.device) -> torch.Tensor:
    """The int32 [COUNTER_SLOTS] counters of ``device`` for the current stream (zeros at rest)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _buffers.get(key)
    if buf is None:
        buf = _buffers[key] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return buf


def in_kernel(tiles: int) -> bool:
    """Whether a launch of ``tiles`` tiles sums its split planes in its own last programs: GLM5_SHIM_GGUF_SPLITS=kernel
    (the default) and enough counters; otherwise (``launch``, the escape hatch and what the kernels did before, or a
    launch too large to count) a separate launch sums them."""
    return settings.gguf_split_reduce_choice() == "kernel" and tiles <= COUNTER_SLOTS
