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


# --- e4m3 -> bf16 without conversions -------------------------------------------------------------------------
# bf16 has fp32's 8-bit exponent: the 7 exponent+mantissa bits of an e4m3 byte shifted left by 4 land on the bf16
# exponent/mantissa fields with the exponent bias 127 instead of 7, i.e. the bf16 number is value * 2**-120
# (subnormals included: both formats' subnormals have exponent field 0).  Callers fold 2**120 back in through
# their scales.  A handful of integer ops per element instead of e4m3 -> f16 -> f32 -> bf16 conversions.
BF16_DECODE_EXPONENT = 120


@triton.jit
def e4m3_bytes_to_bf16_scaled(x):
    """e4m3 bytes (uint8) -> bf16 holding value * 2**-120, exactly; portable integer ops (and the interpreter)."""
    b = x.to(tl.int32) & 0xFF
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 4)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e4m3_bytes_to_bf16_scaled_ptx(x):
    """Same result as :func:`e4m3_bytes_to_bf16_scaled`, four bytes per register at a time: two byte permutes
    spread the bytes to the high byte of each 16-bit lane, then a shift, two masks and an or per pair (all
    integer-pipe instructions present on sm_80 and newer).  ``x`` must be uint8 (four per 32-bit register)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 z, lo, hi, s;
        mov.b32 z, 0;
        prmt.b32 lo, $2, z, 0x1404;
        prmt.b32 hi, $2, z, 0x3424;
        shr.b32 s, lo, 4;
        and.b32 s, s, 0x07F007F0;
        and.b32 lo, lo, 0x80008000;
        or.b32 $0, lo, s;
        shr.b32 s, hi, 4;
        and.b32 s, s, 0x07F007F0;
        and.b32 hi, hi, 0x80008000;
        or.b32 $1, hi, s;
        }""",
        constraints="=r,=r,r", args=[x], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def e4m3_bytes_to_f16_div256_ptx(x):
    """e4m3 bytes (uint8) -> fp16 holding value / 2**8 (the fp16 twin of the bf16 trick: the 7 exponent+mantissa
    bits shifted left by 7 land one bias step low), four bytes per register: two byte permutes, then a shift, two
    masks and an or per pair; integer instructions present on sm_80 and newer."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 z, lo, hi, s;
        mov.b32 z, 0;
        prmt.b32 lo, $2, z, 0x1404;
        prmt.b32 hi, $2, z, 0x3424;
        shr.b32 s, lo, 1;
        and.b32 s, s, 0x3F803F80;
        and.b32 lo, lo, 0x80008000;
        or.b32 $0, lo, s;
        shr.b32 s, hi, 1;
        and.b32 s, s, 0x3F803F80;
        and.b32 hi, hi, 0x80008000;
        or.b32 $1, hi, s;
        }""",
        constraints="=r,=r,r", args=[x], dtype=tl.float16, is_pure=True, pack=4)


def e4m3_bytes_to_bf16_scaled_torch(x):
    """Torch twin of :func:`e4m3_bytes_to_bf16_scaled` (bf16 holding value * 2**-120)."""
    import torch

    b = x.to(torch.int32) & 0xFF
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 4)
    return bits.to(torch.int16).view(torch.bfloat16)
