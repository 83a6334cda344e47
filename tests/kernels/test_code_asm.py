"""The PTX that turns Q4_K/Q5_K code bytes into 16-bit numbers (gguf_matmul._code_asm), executed on the CPU.

The interpreter cannot run inline PTX, so tests/kernels/test_gguf_matmul.py exercises the kernels through the
Triton fallback in ``_nibbles``; the GPU tests run the PTX.  This test closes the gap on the CPU: a small executor for
the four instructions the PTX uses (prmt, shl, shr, lop3 — semantics from the PTX ISA) runs the generated text on
every code byte (and, for Q5_K, every qh byte at every shift the kernels pass) and checks each 16-bit output against
2 + n * unit computed here from the float value (numpy's own bf16/fp16 rounding of an exact number)."""
import re

import numpy as np
import pytest

from glm5_shim.kernels import gguf_matmul as gm


def _prmt(a, b, sel):
    """prmt.b32 (default mode): byte i of the result is byte sel[4i:4i+4] & 7 of {b, a} (a = bytes 0-3)."""
    out = np.zeros_like(a)
    for i in range(4):
        k = (sel >> (4 * i)) & 7
        src = a if k < 4 else b
        out |= ((src >> np.uint32(8 * (k % 4))) & np.uint32(0xFF)) << np.uint32(8 * i)
    return out


def _lop3(a, b, c, lut):
    """lop3.b32: bitwise f(a, b, c) given by its truth table over a = 0xF0, b = 0xCC, c = 0xAA."""
    out = np.zeros_like(a)
    for bits in range(8):
        if (lut >> bits) & 1:
            ma = a if bits & 4 else ~a
            mb = b if bits & 2 else ~b
            mc = c if bits & 1 else ~c
            out |= ma & mb & mc
    return out


def run_ptx(text: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    regs = dict(inputs)

    def val(tok):
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return np.uint32(int(tok, 0))

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        if op == "prmt.b32":
            regs[dst] = _prmt(val(src[0]), val(src[1]), int(src[2], 0))
        elif op == "shl.b32":
            regs[dst] = (val(src[0]) << np.uint32(int(val(src[1])))) & np.uint32(0xFFFFFFFF)
        elif op == "shr.u32":
            regs[dst] = val(src[0]) >> val(src[1]).astype(np.uint32)
        elif op == "lop3.b32":
            regs[dst] = _lop3(val(src[0]), val(src[1]), val(src[2]), int(src[3], 0))
        elif op == "and.b32":
            regs[dst] = val(src[0]) & val(src[1])
        elif op == "mul.lo.u32":   # the low 32 bits of the product
            regs[dst] = ((val(src[0]).astype(np.uint64) * np.uint64(val(src[1]))) & np.uint64(0xFFFFFFFF)
                         ).astype(np.uint32)
        else:
            raise AssertionError(f"the PTX uses {op}, which this executor does not know")
    return regs


def _halves(word):
    return word & np.uint32(0xFFFF), word >> np.uint32(16)


def _expected_bits(n, fp16: bool, width: int):
    """2 + n * 2**(1 - width) in bf16 / fp16 bits, from the float value (not from bit tricks)."""
    value = 2.0 + n.astype(np.float64) * 2.0 ** (1 - width)
    if fp16:
        return value.astype(np.float16).view(np.uint16).astype(np.uint32)
    f32 = value.astype(np.float32).view(np.uint32)
    assert np.all(f32 & 0xFFFF == 0), "2 + n u must be exact in bf16"
    return f32 >> np.uint32(16)


@pytest.mark.parametrize("fp16", [False, True], ids=["bf16", "fp16"])
def test_q4k_code_ptx_gives_every_nibble_exactly(fp16):
    text = gm._code_asm(fp16, False)
    assert set(re.findall(r"^\s*([a-z0-9.]+)", text, re.M)) <= {"prmt.b32", "shl.b32", "shr.u32", "lop3.b32", ".reg"}
    rng = np.random.default_rng(0)
    # every byte value in every byte position: 4 bytes a register
    bytes_ = np.concatenate([np.arange(256), rng.integers(0, 256, 1024)]).astype(np.uint32)
    word = (bytes_ | (np.roll(bytes_, 1) << 8) | (np.roll(bytes_, 2) << 16) | (np.roll(bytes_, 3) << 24))
    regs = run_ptx(text, {"$4": word})
    for out_lo, out_hi, k0 in (("$0", "$2", 0), ("$1", "$3", 2)):
        for half, k in zip(_halves(regs[out_lo]), (k0, k0 + 1)):
            b = (word >> np.uint32(8 * k)) & np.uint32(0xFF)
            np.testing.assert_array_equal(half, _expected_bits(b & np.uint32(15), fp16, 4))
        for half, k in zip(_halves(regs[out_hi]), (k0, k0 + 1)):
            b = (word >> np.uint32(8 * k)) & np.uint32(0xFF)
            np.testing.assert_array_equal(half, _expected_bits(b >> np.uint32(4), fp16, 4))


@pytest.mark.parametrize("fp16", [False, True], ids=["bf16", "fp16"])
def test_q5k_code_ptx_adds_the_fifth_bit_from_qh_at_every_shift(fp16):
    text = gm._code_asm(fp16, True)
    codes = np.repeat(np.arange(256, dtype=np.uint32), 256)
    qh = np.tile(np.arange(256, dtype=np.uint32), 256)
    # byte 0 and byte 2 carry the swept values, bytes 1 and 3 other values: halves must not leak into each other
    code_word = codes | ((255 - codes) << 8) | (codes << 16) | (((codes * 7) & 255) << 24)
    qh_word = qh | (((qh * 3) & 255) << 8) | ((255 - qh) << 16) | (qh << 24)
    for chunk in range(4):  # the kernels shift qh by 2 * chunk
        shift = np.full_like(code_word, 2 * chunk)
        regs = run_ptx(text, {"$4": code_word, "$5": qh_word, "$6": shift})
        for out_lo, out_hi, k0 in (("$0", "$2", 0), ("$1", "$3", 2)):
            for out, is_hi in ((out_lo, False), (out_hi, True)):
                for half, k in zip(_halves(regs[out]), (k0, k0 + 1)):
                    b = (code_word >> np.uint32(8 * k)) & np.uint32(0xFF)
                    h = (qh_word >> np.uint32(8 * k)) & np.uint32(0xFF)
                    nib = (b >> np.uint32(4)) if is_hi else (b & np.uint32(15))
                    bit = (h >> np.uint32(2 * chunk + is_hi)) & np.uint32(1)
                    np.testing.assert_array_equal(half, _expected_bits(nib | (bit << np.uint32(4)), fp16, 5))


def test_the_executor_is_not_vacuous():
    """A wrong mask in the PTX must change the outputs: the check above can fail."""
    text = gm._code_asm(False, False).replace("0x00780078", "0x00700070")
    word = np.arange(256, dtype=np.uint32)
    good = run_ptx(gm._code_asm(False, False), {"$4": word})
    bad = run_ptx(text, {"$4": word})
    assert not np.array_equal(good["$0"], bad["$0"])
