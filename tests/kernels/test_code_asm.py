"""The PTX that turns Q4_K/Q5_K code bytes into 16-bit numbers (gguf_matmul._code_asm), and the register-MMA
kernel's IQ2 decode (gguf_mma._decode_asm: grid magnitudes, scales, signs), executed on the CPU.

The interpreter cannot run inline PTX, so tests/kernels/test_gguf_matmul.py exercises the kernels through the
Triton fallback in ``_nibbles``; the GPU tests run the PTX.  This test closes the gap on the CPU: a small executor for
the four instructions the PTX uses (prmt, shl, shr, lop3 — semantics from the PTX ISA) runs the generated text on
every code byte (and, for Q5_K, every qh byte at every shift the kernels pass) and checks each 16-bit output against
2 + n * unit computed here from the float value (numpy's own bf16/fp16 rounding of an exact number)."""
import re

import numpy as np
import pytest

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.gguf import tiles as gm
from glm5_shim.kernels.gguf import register_mma as gguf_mma


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
        elif op == "mov.b32":
            regs[dst] = np.broadcast_to(np.uint32(val(src[0])), np.shape(next(iter(inputs.values())))).copy()
        elif op in ("fma.rn.bf16x2", "fma.rn.f16x2"):
            fp16 = op == "fma.rn.f16x2"
            a, b, c = (_halves(np.asarray(val(t), dtype=np.uint32)) for t in src)
            lo, hi = (_fma16(a[i], b[i], c[i], fp16) for i in range(2))
            regs[dst] = lo | (hi << np.uint32(16))
        elif op == "mul.lo.u32":   # the low 32 bits of the product
            regs[dst] = ((val(src[0]).astype(np.uint64) * np.uint64(val(src[1]))) & np.uint64(0xFFFFFFFF)
                         ).astype(np.uint32)
        else:
            raise AssertionError(f"the PTX uses {op}, which this executor does not know")
    return regs


def _halves(word):
    return word & np.uint32(0xFFFF), word >> np.uint32(16)


def _to_float(bits, fp16: bool):
    bits = np.asarray(bits, dtype=np.uint32)
    if fp16:
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return (bits << np.uint32(16)).view(np.float32).astype(np.float64)


def _round16(v, fp16: bool):
    """float64 values (exact sums) rounded once, to nearest even, to bf16 / fp16 bits (not through float32: that
    would round twice)."""
    v = np.asarray(v, dtype=np.float64)
    man, exp = np.frexp(v)                               # v = man 2**exp, 0.5 <= |man| < 1
    digits = 11 if fp16 else 8
    if fp16:  # below 2**-14 fp16 is subnormal: a fixed quantum of 2**-24
        exp = np.maximum(exp, -13)
    r = np.ldexp(np.rint(np.ldexp(man, digits) * np.ldexp(1.0, np.frexp(v)[1] - exp)), exp - digits)
    if fp16:
        return r.astype(np.float16).view(np.uint16).astype(np.uint32)        # exact: r is an fp16 value
    f32 = r.astype(np.float32).view(np.uint32)
    assert np.all(f32 & 0xFFFF == 0)
    return f32 >> np.uint32(16)


def _fma16(a, b, c, fp16: bool):
    """One 16-bit lane of fma.rn.{bf16,f16}x2: a b + c exact in float64 here (16-bit operands of the magnitudes
    these tests use), then one rounding; the sign of an exact zero as IEEE's round-to-nearest gives it."""
    x, y, z = (_to_float(t, fp16) for t in (a, b, c))
    prod = x * y
    exact = prod + z
    zero_sign = np.where((np.signbit(prod) & np.signbit(z)), -0.0, 0.0)
    return _round16(np.where(exact == 0, zero_sign, exact), fp16)


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


def _pair16(bits):
    return bits | (bits << np.uint32(16))


@pytest.mark.parametrize("qtype", [traits.IQ2_XXS, traits.IQ2_S], ids=["IQ2_XXS", "IQ2_S"])
@pytest.mark.parametrize("fp16", [False, True], ids=["bf16", "fp16"])
def test_iq2_decode_ptx_gives_each_weight_rounded_once_with_its_sign(qtype, fp16):
    """The IQ2 decode PTX on random grid magnitudes (every byte the grids use, and any byte below 128), sign
    nibbles, scales over six decades: each output is sign * (m s rounded once to the activation dtype), bit for
    bit — the folded bf16 form (one FMA (M + m) s - M s) included."""
    text = gguf_mma._decode_asm(qtype, fp16)
    ops = set(re.findall(r"^\s*([a-z0-9.]+)", text, re.M)) - {".reg"}
    assert ops <= {"mov.b32", "prmt.b32", "lop3.b32", "and.b32", "mul.lo.u32", "fma.rn.bf16x2", "fma.rn.f16x2"}
    rng = np.random.default_rng(qtype * 2 + fp16)
    n = 4096
    mags = rng.choice(np.array([8, 25, 43] + list(range(0, 128)), dtype=np.uint32), size=(2, 4, n))
    words = [m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24) for m in mags]
    nibbles = rng.integers(0, 16, size=(2, n)).astype(np.uint32)
    dt = np.float16 if fp16 else np.float32
    scales = []
    for _ in range(2 if qtype == traits.IQ2_S else 1):
        s = (10.0 ** rng.uniform(-5, 1, n)).astype(dt)
        s_bits = s.view(np.uint16).astype(np.uint32) if fp16 else s.view(np.uint32) >> np.uint32(16)
        scales.append(s_bits)
    regs = {"$4": words[0], "$5": words[1], "$6": nibbles[0] * np.uint32(0x01010101),
            "$7": nibbles[1] * np.uint32(0x01010101)}
    k = 8
    for s_bits in scales:
        regs[f"${k}"] = regs[f"${k + 1}"] = _pair16(s_bits)
        k += 2
    if gguf_mma.IQ_FOLDED[fp16]:   # -M s of each scale, as the kernel passes it (exact in bf16)
        for s_bits in scales:
            neg = _round16(-gguf_mma.MAGIC_BF16.value * _to_float(s_bits, fp16), fp16)
            regs[f"${k}"] = regs[f"${k + 1}"] = _pair16(neg)
            k += 2
    out = run_ptx(text, regs)
    for word_i, outs in ((0, ("$0", "$1")), (1, ("$2", "$3"))):
        s_bits = scales[word_i] if len(scales) == 2 else scales[0]
        for reg_i, reg in enumerate(outs):
            for h, half in enumerate(_halves(out[reg])):
                e = 2 * reg_i + h                                   # element e of the word
                m = mags[word_i][e]
                want = _round16(m * _to_float(s_bits, fp16), fp16)
                want = want ^ (((nibbles[word_i] >> np.uint32(e)) & np.uint32(1)) << np.uint32(15))
                np.testing.assert_array_equal(half, want, err_msg=f"word {word_i} element {e}")


def test_the_iq2_check_can_fail():
    """A wrong magic byte (the folded FMA then subtracts the wrong offset) changes the outputs."""
    good = gguf_mma._decode_asm(traits.IQ2_XXS, False)
    bad = good.replace("0x43434343", "0x42424242")
    assert bad != good
    word = np.arange(64, dtype=np.uint32) * np.uint32(0x01010101)
    regs = {"$4": word, "$5": word, "$6": word & np.uint32(0), "$7": word & np.uint32(0),
            "$8": np.full_like(word, 0x3F803F80), "$9": np.full_like(word, 0x3F803F80),
            "$10": np.full_like(word, 0xC300C300), "$11": np.full_like(word, 0xC300C300)}
    assert not np.array_equal(run_ptx(good, regs)["$0"], run_ptx(bad, regs)["$0"])
