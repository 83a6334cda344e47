"""FP8 e4m3 (OCP ``e4m3fn``) helpers shared by the kernels.

Triton has no fp8 type on sm_80/sm_86 (it refuses even a conversion), so kernels that must run there decode the
raw bytes with integer ops.  The trick: shifting the 7 exponent+mantissa bits of an e4m3 byte left by 7 lands
them on the exponent/mantissa fields of an fp16 number whose exponent bias is 15 instead of 7; multiplying by
2**8 restores the value.  Subnormals come out right with the same factor.  The NaN pattern (0x7f/0xff) decodes
to ±480 instead of NaN; vLLM's quantisers never write it.

Every e4m3 decode the kernels run lives here: :func:`e4m3_bytes_decode` (the sparse-MLA kernel, by method) and
:func:`e4m3_bytes_to_f16_div256` (also the indexer's sm_80/86 operands).
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


@triton.jit
def e4m3_bytes_to_f16_div256(x):
    """e4m3 bytes -> fp16 equal to value / 256, exactly (subnormals included).

    Same bit trick as :func:`e4m3_bytes_to_f32` (exponent/mantissa shifted onto fp16's fields, whose bias is 8
    higher), but the sign bit is moved instead of selected and the x256 is left to the caller: 3 integer ops per
    element on the sm_80/86 hot path instead of ~10.  NaN bytes (never written by vLLM) decode to +-480/256.
    """
    b = x.to(tl.int16) & 0xFF
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    return bits.to(tl.float16, bitcast=True)


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


def _spread_shift_mask_ptx(shift: int, mag_mask: int) -> tl.constexpr:
    """PTX for four e4m3 bytes in one register -> two registers of 16-bit pairs: two byte permutes put each byte in
    the high byte of a 16-bit lane (b << 8), then per pair the sign stays at bit 15 and the 7 exponent+mantissa bits
    move down by ``shift`` (masked by ``mag_mask``).  Integer instructions present on sm_80 and newer."""
    lines = ["{", ".reg .b32 z, lo, hi, s;", "mov.b32 z, 0;",
             "prmt.b32 lo, $2, z, 0x1404;", "prmt.b32 hi, $2, z, 0x3424;"]
    for half, out in (("lo", "$0"), ("hi", "$1")):
        lines += [f"shr.b32 s, {half}, {shift};", f"and.b32 s, s, {mag_mask:#010x};",
                  f"and.b32 {half}, {half}, 0x80008000;", f"or.b32 {out}, {half}, s;"]
    return tl.constexpr("\n".join(lines + ["}"]))


_BF16_PTX = _spread_shift_mask_ptx(4, 0x07F007F0)  # bits 14..8 -> 10..4: bf16 exponent/mantissa, value * 2**-120
_F16_PTX = _spread_shift_mask_ptx(1, 0x3F803F80)  # bits 14..8 -> 13..7: fp16 exponent/mantissa, value / 2**8


@triton.jit
def e4m3_bytes_to_bf16_scaled_ptx(x):
    """Same result as :func:`e4m3_bytes_to_bf16_scaled`, four bytes per register at a time (``x`` must be uint8)."""
    return tl.inline_asm_elementwise(asm=_BF16_PTX, constraints="=r,=r,r", args=[x], dtype=tl.bfloat16,
                                     is_pure=True, pack=4)


@triton.jit
def e4m3_bytes_to_f16_div256_ptx(x):
    """e4m3 bytes (uint8) -> fp16 holding value / 2**8 (the fp16 twin of the bf16 trick: the 7 exponent+mantissa
    bits shifted left by 7 land one bias step low), four bytes per register at a time."""
    return tl.inline_asm_elementwise(asm=_F16_PTX, constraints="=r,=r,r", args=[x], dtype=tl.float16,
                                     is_pure=True, pack=4)


def e4m3_bytes_to_bf16_scaled_torch(x):
    """Torch twin of :func:`e4m3_bytes_to_bf16_scaled` (bf16 holding value * 2**-120)."""
    import torch

    b = x.to(torch.int32) & 0xFF
    bits = ((b & 0x80) << 8) | ((b & 0x7F) << 4)
    return bits.to(torch.int16).view(torch.bfloat16)


# --- one decode by name ---------------------------------------------------------------------------------------
# How a kernel turns e4m3 bytes into dot inputs of the dots' dtype (the sparse-MLA kernel's FP8_DECODE constexpr) and
# the factor K_F the decoded value is off by (the caller folds it back in through its scales).  On a GPU the
# sparse-MLA fp8 cache's dots are always bf16 (sparse_mla_plan.compute_dtype: fp16 queries too); the interpreter's
# are fp32.
#   "f32"      float32 (interpreter exactness path), K_F 1
#   "cvt"      Triton's float8e4nv -> f16 conversion, then f16 -> f32 -> bf16 (sm_89+), K_F 1
#   "f16bits"  integer bit trick to fp16 holding value / 2**8, then -> bf16 (any target), K_F 2**8
#   "f16ptx"   the same result from four-bytes-at-a-time PTX (prmt + masks; GPU only)
#   "bf16bits" integer bit trick to bf16 holding value * 2**-120 (any target), K_F 2**-120
#   "bf16ptx"  the same result from four-bytes-at-a-time PTX (GPU only)
FP8_DECODES = ("f32", "cvt", "f16bits", "f16ptx", "bf16bits", "bf16ptx")


@triton.jit
def e4m3_bytes_decode(raw, DT: tl.constexpr, METHOD: tl.constexpr):
    """e4m3 bytes (uint8) -> DT by the method named in METHOD; the result is value / K_F (see FP8_DECODES), which
    the caller folds back in through its scales."""
    if METHOD == "f32":
        return e4m3_bytes_to_f32(raw)
    elif METHOD == "cvt":
        # e4m3 -> f16 is one cvt per pair on sm_89+; Triton's direct e4m3 -> bf16 emits cvt.bf16.f16, which
        # ptxas rejects below sm_90, so bf16 goes through f32
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16).to(tl.float32).to(DT)
    elif METHOD == "f16ptx":
        return e4m3_bytes_to_f16_div256_ptx(raw).to(DT)
    elif METHOD == "bf16bits":
        return e4m3_bytes_to_bf16_scaled(raw)
    elif METHOD == "bf16ptx":
        return e4m3_bytes_to_bf16_scaled_ptx(raw)
    else:  # "f16bits"
        return e4m3_bytes_to_f16_div256(raw).to(DT)
