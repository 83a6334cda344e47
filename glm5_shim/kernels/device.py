"""What the kernel launchers read from a CUDA device, once per device index (no vLLM import)."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def cuda_capability_and_sms(index: int) -> tuple[tuple[int, int], int]:
    """((major, minor) compute capability, streaming multiprocessor count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count
