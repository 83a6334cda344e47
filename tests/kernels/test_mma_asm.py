"""The PTX of the register-MMA kernels (gguf_mma._decode_asm: code bytes -> weights, two to a register) executed on
the CPU against the weights computed here from the block format.

The interpreter runs the kernels with a Triton stand-in for this PTX (tests/kernels/test_gguf_mma.py); the GPU tests
run the PTX itself.  This test closes the gap on the CPU: the executor of tests/kernels/test_code_asm.py, extended
with mov and the packed 16-bit FMA (a*b + c exact in float64, then rounded once to nearest-even in bf16 / fp16, as
the PTX ISA defines fma.rn), runs the generated text on random code, high-bit and scale registers (both halves of
every register independent) and checks every output half bit for bit."""
import numpy as np
import pytest

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.gguf import register_mma as mma
from tests.kernels import test_code_asm as base


def _round_bits(x: np.ndarray, fp16: bool) -> np.ndarray:
    """float64 -> the 16-bit pattern of its round-to-nearest-even bf16 / fp16 value (normal range)."""
    if fp16:
        return x.astype(np.float16).view(np.uint16).astype(np.uint32)
    m, e = np.frexp(x)                                   # x = m 2**e, |m| in [0.5, 1)
    r = np.ldexp(np.rint(m * 256.0), e - 8)              # 8 significant bits, ties to even
    return (r.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint32)


def _value(bits: np.ndarray, fp16: bool) -> np.ndarray:
    if fp16:
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _fma_pair(fp16):
    def fma(a, b, c):
        out = np.zeros_like(a)
        for shift in (0, 16):
            sh = np.uint32(shift)
            half = [(v >> sh) & np.uint32(0xFFFF) for v in (a, b, c)]
            exact = _value(half[0], fp16) * _value(half[1], fp16) + _value(half[2], fp16)
            out |= _round_bits(exact, fp16) << sh
        return out
    return fma


def run(text: str, inputs: dict, fp16: bool) -> dict:
    """test_code_asm.run_ptx plus mov.b32 and fma.rn.{bf16x2,f16x2}."""
    fma = _fma_pair(fp16)
    plain, regs = [], dict(inputs)
    for line in text.splitlines():
        stripped = line.strip().rstrip(";")
        if stripped.startswith(("mov.b32", "fma.rn.")):
            if plain:
                regs = base.run_ptx("\n".join(plain), regs)
                plain = []
            op, args = stripped.split(None, 1)
            dst, *src = [a.strip() for a in args.split(",")]
            val = [regs[s] if s in regs else np.full_like(next(iter(inputs.values())), int(s, 0)) for s in src]
            if op == "mov.b32":
                regs[dst] = val[0]
            else:
                assert op == ("fma.rn.f16x2" if fp16 else "fma.rn.bf16x2"), op
                regs[dst] = fma(*val)
        else:
            plain.append(line)
    if plain:
        regs = base.run_ptx("\n".join(plain), regs)
    return regs


def _scale_bits(rng, n, fp16, lo=1e-3, hi=2e-2, signed=False):
    v = rng.uniform(lo, hi, size=n) * (rng.choice([-1.0, 1.0], size=n) if signed else 1.0)
    return _round_bits(v, fp16)


def _pairs(rng, n, fp16, **kw):
    return _scale_bits(rng, n, fp16, **kw) | (_scale_bits(rng, n, fp16, **kw) << np.uint32(16))


@pytest.mark.parametrize("fp16", [False, True], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q2_K"])
def test_decode_ptx_gives_every_weight_bit_for_bit(name, fp16):
    qtype = getattr(traits, name)
    rng = np.random.default_rng(qtype + 2 * fp16)
    n = 4096
    bytes_ = rng.integers(0, 256, size=(4, n)).astype(np.uint32)
    bytes_[0, :256] = np.arange(256)                      # every code byte in position 0 and 3 at least once
    bytes_[3, 256:512] = np.arange(256)
    codes = bytes_[0] | (bytes_[1] << 8) | (bytes_[2] << 16) | (bytes_[3] << 24)
    high = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    s = [_pairs(rng, n, fp16) for _ in range(4)]           # scale registers: lo pair 0/1, hi pair 0/1
    neg_m = [_pairs(rng, n, fp16, lo=1e-3, hi=1e-1, signed=True) for _ in range(4)]
    if qtype in (traits.Q4_K, traits.Q2_K):
        regs = {"$4": codes, "$5": s[0], "$6": s[1], "$7": neg_m[0], "$8": neg_m[1], "$9": s[2], "$10": s[3],
                "$11": neg_m[2], "$12": neg_m[3]}
    elif qtype == traits.Q5_K:
        regs = {"$4": codes, "$5": high, "$6": s[0], "$7": s[1], "$8": neg_m[0], "$9": neg_m[1], "$10": s[2],
                "$11": s[3], "$12": neg_m[2], "$13": neg_m[3]}
    else:   # Q6_K: low nibbles and high bits; Q8_0: the codes of the two halves of K ($5 = the second's)
        regs = {"$4": codes, "$5": high, "$6": s[0], "$7": s[1], "$8": s[2], "$9": s[3]}
    out = run(mma._decode_asm(qtype, fp16), regs, fp16)
    for reg, nibble, pair in (("$0", 0, 0), ("$1", 0, 1), ("$2", 1, 0), ("$3", 1, 1)):
        for half in range(2):
            k = 2 * pair + half                                 # the byte of the word
            sh = np.uint32(16 * half)
            b = bytes_[k]
            hb = (high >> np.uint32(8 * k)) & np.uint32(0xFF)
            code = (b >> np.uint32(4)) if nibble else (b & np.uint32(15))
            if qtype == traits.Q2_K:   # the two 2-bit codes of bits 0-1 ("low") and 2-3 ("high"); bits 4-7 ignored
                code = (b >> np.uint32(2 * nibble)) & np.uint32(3)
            sc = _value((s[2 * nibble + pair] >> sh) & np.uint32(0xFFFF), fp16)
            if qtype == traits.Q8_0:   # int8 codes: output 0/1 from $4's bytes, 2/3 from $5's
                src = b if nibble == 0 else hb
                want = sc * np.where(src >= 128, src.astype(np.float64) - 256, src.astype(np.float64))
            elif qtype == traits.Q6_K:   # low nibble + high bits 0-1, high nibble + high bits 4-5; q - 32
                top = (hb >> np.uint32(4 * nibble)) & np.uint32(3)
                want = sc * ((code | (top << np.uint32(4))).astype(np.float64) - 32)
            else:
                if qtype == traits.Q5_K:   # fifth bit: bit 0 (low nibble) / bit 1 (high) of the high-bit byte
                    code = code | (((hb >> np.uint32(nibble)) & np.uint32(1)) << np.uint32(4))
                nm = _value((neg_m[2 * nibble + pair] >> sh) & np.uint32(0xFFFF), fp16)
                want = sc * code.astype(np.float64) + nm
            got = (out[reg] >> sh) & np.uint32(0xFFFF)
            np.testing.assert_array_equal(got, _round_bits(want, fp16), err_msg=f"{name} {reg} half {half}")


@pytest.mark.parametrize("fp16", [False, True], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_S"])
def test_iq2_ptx_gives_every_weight_bit_for_bit(name, fp16):
    """IQ2_XXS, IQ2_S: grid magnitudes (the grids' 8, 25, 43, and any other below 128: bf16's magic number 128 holds
    7 bits) times the scale (IQ2_S: the low and the high half each their own), with the sign nibble's bit e negating
    element e of its word; the sign registers hold the nibble's byte four times, as the kernel packs them."""
    from glm5_shim.kernels.gguf import tiles as gm
    qtype = getattr(traits, name)
    assert gm.grid_table(qtype, __import__("torch").device("cpu")).max() < 128   # what the kernel relies on
    rng = np.random.default_rng(qtype + fp16)
    n = 4096
    mags = rng.integers(0, 128, size=(2, 4, n)).astype(np.uint32)          # [low/high word, element, lane]
    mags[:, :, :3] = np.array([8, 25, 43], dtype=np.uint32)[None, None, :]
    words = [m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24) for m in mags]
    nibbles = rng.integers(0, 16, size=(2, n)).astype(np.uint32)
    nibbles[:, :16] = np.arange(16)
    signs = [nb * np.uint32(0x01010101) for nb in nibbles]               # the byte repeated, as packed
    s = [_pairs(rng, n, fp16) for _ in range(4)]   # IQ2_XXS reads s[0], s[1] for both halves
    regs = {"$4": words[0], "$5": words[1], "$6": signs[0], "$7": signs[1], "$8": s[0], "$9": s[1], "$10": s[2],
            "$11": s[3]}
    if mma.IQ_FOLDED[fp16]:   # the scales' -M s follow them (the kernel computes it exactly: M is a power of two)
        first = 12 if qtype == traits.IQ2_S else 10
        magic = float(mma.MAGIC_BF16.value if hasattr(mma.MAGIC_BF16, "value") else mma.MAGIC_BF16)
        for j, pair in enumerate(s if qtype == traits.IQ2_S else s[:2]):
            halves = [_round_bits(-magic * _value((pair >> np.uint32(sh)) & np.uint32(0xFFFF), fp16), fp16)
                      for sh in (0, 16)]
            regs[f"${first + j}"] = halves[0] | (halves[1] << np.uint32(16))
    out = run(mma._decode_asm(qtype, fp16), regs, fp16)
    for reg, word, pair in (("$0", 0, 0), ("$1", 0, 1), ("$2", 1, 0), ("$3", 1, 1)):
        for half in range(2):
            e = 2 * pair + half
            sh = np.uint32(16 * half)
            sc = _value((s[pair + (2 * word if qtype == traits.IQ2_S else 0)] >> sh) & np.uint32(0xFFFF), fp16)
            neg = (nibbles[word] >> np.uint32(e)) & np.uint32(1)
            want = _round_bits(sc * mags[word, e].astype(np.float64), fp16) | (neg << np.uint32(15))
            got = (out[reg] >> sh) & np.uint32(0xFFFF)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {reg} half {half}")


def test_the_fma_executor_is_not_vacuous():
    """Rounding matters: an FMA that rounded its product first would differ on these inputs."""
    fma = _fma_pair(False)
    a = np.array([0x3F81], dtype=np.uint32)   # 1 + 2**-7
    b = np.array([0x3F82], dtype=np.uint32)   # 1 + 2**-6
    c = np.array([0xBF80], dtype=np.uint32)   # -1: the product's 2**-13 survives only if it is not rounded first
    assert _value(fma(a, b, c) & np.uint32(0xFFFF), False)[0] == 2.0 ** -6 + 2.0 ** -7 + 2.0 ** -13
