"""What the kernel launchers read from a CUDA device, once per device index (no vLLM import).

`pretend` makes them read another GPU's figures instead (kernels/consumer.py: the plans an RTX PRO 6000 chooses,
run on the Hopper test machine); nothing in serving sets it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceFigures:
    capability: tuple[int, int]
    sms: int
    max_threads_per_sm: int
    smem_per_sm: int  # bytes of shared memory one multiprocessor holds (what resident blocks share)


_pretend: DeviceFigures | None = None


def pretend(figures: DeviceFigures | None) -> None:
    """Make every launcher read `figures` as the device's (None: the real device again)."""
    global _pretend
    _pretend = figures


def device_figures(index: int) -> DeviceFigures:
    return _pretend if _pretend is not None else _real_figures(index)


@functools.lru_cache(maxsize=None)
def _real_figures(index: int) -> DeviceFigures:
    props = torch.cuda.get_device_properties(index)
    return DeviceFigures((props.major, props.minor), props.multi_processor_count,
                         props.max_threads_per_multi_processor, props.shared_memory_per_multiprocessor)


def cuda_capability_and_sms(index: int) -> tuple[tuple[int, int], int]:
    """((major, minor) compute capability, streaming multiprocessor count) of CUDA device ``index``."""
    figures = device_figures(index)
    return figures.capability, figures.sms
