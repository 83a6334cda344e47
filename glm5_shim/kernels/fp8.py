"""FP8 e4m3 (OCP ``e4m3fn``) helpers shared by the kernels.

Triton has no fp8 type on sm_80/sm_86 (it refuses even a conversion), so kernels that must run there decode the
raw bytes with integer ops.  The trick: shifting the 7 exponent+mantissa bits of an e4m3 byte left by 7 lands
them on the exponent/mantissa fields of an fp16 number whose exponent bias is 15 instead of 7; multiplying by
2**8 restores the value.  Subnormals come out right with the same factor.  The NaN pattern (0x7f/0xff) decodes
to ±480 instead of NaN; vLLM's quantisers never write it.
"""
from __future__ import annotations

import triton
import triton.language as tl

E4M3_MAX = 448.0


@triton.jit
def e4m3_bytes_to_f32(x):
    """Decode a tensor of e4m3 bytes (any integer dtype holding 0..255) to float32 without fp8 hardware."""
    bits = x.to(tl.int32) & 0xFF
    magnitude = ((bits & 0x7F) << 7).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((bits & 0x80) != 0, -magnitude, magnitude)


def e4m3_bytes_to_f32_torch(x):
    """Torch twin of :func:`e4m3_bytes_to_f32` (same bit trick), for references and tests."""
    import torch

    bits = x.to(torch.int32) & 0xFF
    magnitude = ((bits & 0x7F) << 7).to(torch.int16).view(torch.float16).to(torch.float32) * 256.0
    return torch.where((bits & 0x80) != 0, -magnitude, magnitude)


def native_fp8_supported(capability: tuple[int, int]) -> bool:
    """Triton lowers float8e4nv natively on sm_89 and newer; sm_80/86 must decode bytes by hand."""
    return tuple(capability) >= (8, 9)
