"""Decode-sized GGUF matmuls with the weights fed to tensor cores straight from registers (Gluon; Q4_K, Q5_K, Q6_K,
Q8_0, IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S, Q2_K).

Why: the tile kernels of :mod:`tiles` decode a weight tile in one register layout and ``tl.dot`` wants it in
another, so every decoded weight went through shared memory and a barrier, and each weight cost ~8 SASS
instructions: decode ran at 12-30 % of the memory floor (bench/journal/).  Here the weight is the MMA's A operand
(rows = output features, 16 a warp and instruction; the N side is 8 routed tokens, mma.m16n8k16 — or 16 / 32 tokens,
2 / 4 instructions on the same weight fragment: COLS), and each thread loads exactly the bytes its A fragments need:

* a thread holds, for rows r and r + 8 of its warp's 16, 16 contiguous code bytes p = 16 slot .. 16 slot + 15 of
  the 64 code bytes of a half super-block (128 values): Q4_K one 16-byte load a row, Q6_K (2-byte aligned blocks)
  eight 2-byte loads of its low nibbles and eight of its high bits;
* the K order of the dot is not the file's: the products of a dot can be summed in any order, so the kernel sums
  over a permutation of K chosen so that those bytes *are* the thread's fragments (k = bits of p rearranged:
  :data:`A_ORDER`), and loads the activations in the same permuted order (:data:`X_ORDER`, 16-byte loads too);
* both permutations are reshape + permute of register-resident tensors, and the conversion to the MMA operand
  layouts is asserted trivial at compile time (no data moves; the offline compiles in CI would fail otherwise).

Byte p's low nibble is value p of the half in Q6_K (its high nibble value 64 + p; the top 2 bits from bits 2 (p >>
5) and 4 + 2 (p >> 5) of high-bit byte p & 31), and value 32 (2 chunk) + (p & 31) in Q4_K (high nibble: the next
group of 32; chunk = p >> 5).  Q2_K keeps Q4_K's order: slot s's 16 bytes are code bytes 16 (s % 2) on of the half,
shifted right by 4 (s // 2), their bits 0-1 ("low nibble") and 2-3 ("high") values 64 (s // 2) + l and 32 more, with
a scale and min a group of 16 (the bytes' two groups a code pair).  Codes become exact small integers by bit
operations (prmt, shift, lop3: the code in the low mantissa bits of 128.0 (bf16) or 1024.0 (fp16), then that offset
subtracted exactly), and the weight is one packed 16-bit FMA a pair: Q4_K w = s n - m per group of 32 (s = d sc, m =
dmin mn; Q2_K of 16), Q6_K w = s (q - 32) per group of 16 (s = d sc).  s and m are rounded to the activation dtype,
then w.  Error of a weight against the GGUF value, u the dtype's unit roundoff (bf16 2**-8, fp16 2**-11): |dw| <= u
(|s n| + |m| + |w|) (Q6_K and the IQ types: 2 u |w|), + O(u**2) — the bound the tests hold the kernels to
(gguf_matmul_reference.mma_error_bound).  Activations are not quantized; sums are float32.

One kernel serves a dense linear (tokens are rows of x) and a MoE pass (rows grouped by expert with the usual
(sorted ids, expert of each block of 8, padded count) layout; a w2 pass scales by the routing weight).  K is split
over ``program_id(1)`` for decode-sized calls; partial sums go to float32 planes the caller adds.  Loads of the
next half super-block are issued before the current one is decoded (Gluon has no automatic pipeliner).

IQ2_XXS, IQ2_S: a thread's 32 values are one sub-block (4 grid rows of 8), each grid row one 8-byte gather from the
grid table, the row's sign byte (IQ2_XXS: 7 bits and their parity, a popc) multiplied into the 16-bit sign bits, and
one FMA a weight pair for magic number and scale together in bf16 (X_ORDER_IQ, _iq_asm).  Offline SASS (sm_90, w13 /
w2 pass): 5.3 / 5.9 instructions a weight for IQ2_XXS, 5.1 / 5.8 for IQ2_S, from 7.5 / 7.8 and 6.4 / 7.0 (2026-12-05).
Packed IQ2_XXS (what serving loads) has its sign words re-encoded at load so that each register's two signs are one
shift from their bits (spread_iq2xxs_signs, _iq_weights_spread): 3.7 / 4.3 (sm_90 and sm_120), from 5.1 / 5.8.

Split-K launches can sum their own splits (EPILOGUE, kernels/arrivals.py), and a MoE pass can skip the routing
layout (ROUTING: PAIRS for w13, TOKEN_SUM for w2 with the top-k sum inside), so a decode MoE is two launches.

GPU-tested on the H200 (tests/gpu/test_gguf_mma_gpu.py) and 1.1-5x faster than the tile kernels' MoE decode there
(bench/journal/2026-12-02.md, 2026-12-03.md): the plans in :mod:`tiles` use it by default
(``GLM5_SHIM_GGUF_DECODE=tile`` for the tile kernels); dense linears only for routing.MMA_LINEAR_TYPES.
"""

import gguf
import triton.language as tl
from triton.runtime.jit import constexpr_function

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.gguf.routing import MMA_DECODE_TYPES
from glm5_shim.kernels.gguf.traits import IQ2_S, IQ2_XXS, IQ3_S, IQ3_XXS, Q2_K, Q4_K, Q5_K, Q6_K, Q8_0
from glm5_shim.kernels import arrivals
from glm5_shim.kernels.gluon_compat import INTERPRET_K, DistributedLinearLayout, NVMMADistributedLayout, gl, jit, mma_v2

MMA_TYPES = MMA_DECODE_TYPES          # what the plans run here (routing: GPU-tested and measured faster)
KERNEL_TYPES = traits.REGISTER_MMA_TYPES    # what the kernel computes
GRID_TYPES = traits.ids(grid=True, register_mma=True)   # launches take the grid table (tiles.grid_table)
IQ_TYPES = GRID_TYPES             # decoded by _iq_weights (a sub-block of 32 values a thread)
TOKENS = 8                         # the MMA's N: routed rows (MoE) or activation rows (linear) a program multiplies
COLUMN_BLOCKS = (8, 16, 32)        # what a program's N may be (COLS): a decoded weight is multiplied by that many rows
SB_VALUES = gl.constexpr(256)      # values of a K-quant super-block
# Super-blocks the device code steps through (gguf.GGML_QUANT_SIZES; its byte counts are literals there): Q4_K 144 B:
# d, dmin, 12 scale bytes, 128 code bytes; Q5_K 176 B: the same with 32 high-bit bytes before the codes; Q6_K 210 B:
# 128 bytes of low nibbles, 64 of high bits, 16 int8 scales, d; Q8_0 272 B: 8 blocks of (d, 32 int8 codes);
# IQ2_XXS 66 B: d, then per 32 values 4 grid indices (bytes) and a word of 4 x 7 sign bits and a 4-bit scale;
# IQ2_S 82 B: d, 32 bytes of the grid indices' low 8 bits, 32 sign bytes, 8 bytes of their high 2 bits, 8 scale
# bytes (a nibble per 16 values); Q2_K 84 B: 16 scale bytes (scale and min nibbles a group of 16), 64 code bytes
# (value 128 h + 32 j + l: bits 2j, 2j + 1 of byte 32 h + l), d, dmin

# Dimension orders of the two permutations (see the module docstring).  A: codes [rows, 4, 4, 4] viewed as bits
# (row, p5, p4, p3, p2, p1, p0) of the byte p, reordered so that dimension j + 1 is bit 5 - j of the dot's k:
# k = (p3 p2 p1 p5 p4 p0).  X: activations [COLS, 128] viewed as (token, v6, ..., v0) of the value v, reordered to
# (k bits 5..0, token, nibble) with the same k: Q4_K v = 64 p5 + 32 nibble + (p & 31), Q6_K v = 64 nibble + p.
A_ORDER = gl.constexpr((0, 3, 4, 5, 1, 2, 6))
X_ORDER_Q4K = gl.constexpr((4, 5, 6, 1, 3, 7, 0, 2))
X_ORDER_Q6K = gl.constexpr((4, 5, 6, 2, 3, 7, 0, 1))
# IQ2_XXS: the thread of slot s holds the 32 values of sub-block s of the half, position q = p & 15 giving value
# 32 s + q (grid rows 0-1 of the sub-block: "low nibble") and 32 s + 16 + q (rows 2-3: "high")
X_ORDER_IQ = gl.constexpr((4, 5, 6, 1, 2, 7, 0, 3))

# How a MoE pass's COLS columns are routed (see _mma_kernel), and what a program does with its sums
SORTED = gl.constexpr(0)       # a block of moe_align's sorted ids, one expert
PAIRS = gl.constexpr(1)        # one routed (token, slot) pair: no align launch
TOKEN_SUM = gl.constexpr(2)    # one token, over all its top-k slots: the top-k sum inside the w2 pass
STORE = gl.constexpr(0)        # write out
REDUCE = gl.constexpr(1)       # write a float32 split plane; the tile's last program sums the planes into final
REDUCE_SILU = gl.constexpr(2)  # the same over a gate tile and its up tile, into SiLU(gate) * up

# 16-bit constants, two to a register: the magic number whose low mantissa bits take a code, 1.0, and minus the
# offset to remove (Q4_K: the magic number; Q6_K: magic + 32, so the result is q - 32)
_MAGIC = {False: 0x4300, True: 0x6400}              # bf16 128.0, fp16 1024.0
MAGIC_BF16 = gl.constexpr(128.0)                     # _MAGIC[False]'s value
_ONE = {False: 0x3F80, True: 0x3C00}
_NEG = {(False, Q4_K): 0xC300, (True, Q4_K): 0xE400,    # -128, -1024
        (False, Q2_K): 0xC300, (True, Q2_K): 0xE400,
        (False, Q5_K): 0xC300, (True, Q5_K): 0xE400,
        (False, Q6_K): 0xC320, (True, Q6_K): 0xE420,    # -160, -1056
        (False, Q8_0): 0xBF80, (True, Q8_0): 0xE480,    # -1 (bf16: x - y, see _decode_asm), -1152
        (False, IQ2_XXS): 0xC300, (True, IQ2_XXS): 0xE400,
        (False, IQ2_S): 0xC300, (True, IQ2_S): 0xE400}


def _pair(h: int) -> str:
    return f"{h | (h << 16):#010x}"


def _decode_asm(qtype: int, fp16: bool) -> str:
    """PTX for 4 code bytes (Q5_K, Q6_K: and their 4 high-bit bytes) -> the weights of their low nibbles ($0, $1)
    and high nibbles ($2, $3), two to a register.  Q4_K inputs: codes $4, s_lo $5 $6, -m_lo $7 $8, s_hi $9 $10,
    -m_hi $11 $12.  Q5_K: codes $4, high-bit bytes shifted so that bit 0 is the low nibble's fifth bit and bit 1 the
    high nibble's $5, then as Q4_K from $6.  Q6_K inputs: low nibbles $4, high-bit bytes shifted right by
    2 (p >> 5) $5, s_lo $6 $7, s_hi $8 $9.  Q8_0: the int8 codes of the two halves of K ($4 -> $0 $1, $5 -> $2 $3),
    their blocks' d ($6 $7, $8 $9).  prmt spreads bytes b0 b1 (b2 b3) into the two halves of a register, lop3 masks a
    code and ors in the magic number, one FMA with 1.0 removes it (exact), one more applies the scale."""
    fma = "fma.rn.f16x2" if fp16 else "fma.rn.bf16x2"
    magic, one, neg = _pair(_MAGIC[fp16]), _pair(_ONE[fp16]), _pair(_NEG[(fp16, qtype)])
    if qtype in (IQ2_XXS, IQ2_S):
        return _iq_asm(fma, magic, one, neg, two_scales=qtype == IQ2_S, folded=IQ_FOLDED[fp16])
    lines = [".reg .b32 t0, t1, u0, u1, u2, u3, one, neg;", f"mov.b32 one, {one};", f"mov.b32 neg, {neg};",
             "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;"]
    if qtype in (Q4_K, Q2_K):   # Q2_K: the byte's two 2-bit codes (bits 0-1 and 2-3, pre-shifted by the caller)
        mask, shift = ("0x000F000F", 4) if qtype == Q4_K else ("0x00030003", 2)
        lines += [f"lop3.b32 u0, t0, {mask}, {magic}, 0xEA;", f"lop3.b32 u1, t1, {mask}, {magic}, 0xEA;",
                  f"shr.u32 t0, t0, {shift};", f"shr.u32 t1, t1, {shift};",
                  f"lop3.b32 u2, t0, {mask}, {magic}, 0xEA;", f"lop3.b32 u3, t1, {mask}, {magic}, 0xEA;"]
        scale = [("$5", "$7"), ("$6", "$8"), ("$9", "$11"), ("$10", "$12")]
    elif qtype == Q5_K:
        lines += [".reg .b32 g0, g1, a0, a1;", "prmt.b32 g0, $5, 0, 0x4140;", "prmt.b32 g1, $5, 0, 0x4342;",
                  # low nibble | (high-bit bit 0) << 4
                  "shl.b32 a0, g0, 4;", "shl.b32 a1, g1, 4;",
                  f"lop3.b32 a0, a0, 0x00100010, {magic}, 0xEA;", f"lop3.b32 a1, a1, 0x00100010, {magic}, 0xEA;",
                  "lop3.b32 u0, t0, 0x000F000F, a0, 0xEA;", "lop3.b32 u1, t1, 0x000F000F, a1, 0xEA;",
                  # high nibble | (high-bit bit 1) << 3
                  "shr.u32 t0, t0, 4;", "shr.u32 t1, t1, 4;", "shl.b32 a0, g0, 3;", "shl.b32 a1, g1, 3;",
                  f"lop3.b32 a0, a0, 0x00100010, {magic}, 0xEA;", f"lop3.b32 a1, a1, 0x00100010, {magic}, 0xEA;",
                  "lop3.b32 u2, t0, 0x000F000F, a0, 0xEA;", "lop3.b32 u3, t1, 0x000F000F, a1, 0xEA;"]
        scale = [("$6", "$8"), ("$7", "$9"), ("$10", "$12"), ("$11", "$13")]
    elif qtype == Q8_0:
        lines += ["prmt.b32 u2, $5, 0, 0x4140;", "prmt.b32 u3, $5, 0, 0x4342;", "mov.b32 u0, t0;", "mov.b32 u1, t1;"]
        if fp16:   # 1024 + (q ^ 0x80) = 1024 + 128 + q: removed below with -1152
            lines += [f"lop3.b32 u{j}, u{j}, 0x00800080, {magic}, 0xBE;" for j in range(4)]
        else:      # bf16 holds 128 + 7 bits only: 128 + (q & 127) minus (128 or 256 by the sign bit) = q, exactly
            lines += [".reg .b32 y0, y1, y2, y3;"]
            lines += [f"lop3.b32 y{j}, u{j}, 0x00800080, {magic}, 0xEA;" for j in range(4)]
            lines += [f"lop3.b32 u{j}, u{j}, 0x007F007F, {magic}, 0xEA;" for j in range(4)]
        zero = _pair(0x8000)
        lines += [f"mov.b32 t0, {zero};"]
        scale = [("$6", "t0"), ("$7", "t0"), ("$8", "t0"), ("$9", "t0")]
        for j, (s_reg, c_reg) in enumerate(scale):
            remove = f"{fma} u{j}, u{j}, one, neg;" if fp16 else f"{fma} u{j}, y{j}, neg, u{j};"
            lines += [remove, f"{fma} ${j}, u{j}, {s_reg}, {c_reg};"]
        return "{\n" + "\n".join(lines) + "\n}"
    else:
        lines += [".reg .b32 g0, g1, a0, a1;", "prmt.b32 g0, $5, 0, 0x4140;", "prmt.b32 g1, $5, 0, 0x4342;",
                  # low nibble | (high bits 0-1 of the high-bit byte) << 4
                  "shl.b32 a0, g0, 4;", "shl.b32 a1, g1, 4;",
                  f"lop3.b32 a0, a0, 0x00300030, {magic}, 0xEA;", f"lop3.b32 a1, a1, 0x00300030, {magic}, 0xEA;",
                  "lop3.b32 u0, t0, 0x000F000F, a0, 0xEA;", "lop3.b32 u1, t1, 0x000F000F, a1, 0xEA;",
                  # high nibble | high bits 4-5, in place
                  "shr.u32 t0, t0, 4;", "shr.u32 t1, t1, 4;",
                  f"lop3.b32 a0, g0, 0x00300030, {magic}, 0xEA;", f"lop3.b32 a1, g1, 0x00300030, {magic}, 0xEA;",
                  "lop3.b32 u2, t0, 0x000F000F, a0, 0xEA;", "lop3.b32 u3, t1, 0x000F000F, a1, 0xEA;"]
        zero = _pair(0x8000)
        lines += [f"mov.b32 t0, {zero};"]
        scale = [("$6", "t0"), ("$7", "t0"), ("$8", "t0"), ("$9", "t0")]
    for j, (s_reg, c_reg) in enumerate(scale):
        lines += [f"{fma} u{j}, u{j}, one, neg;", f"{fma} ${j}, u{j}, {s_reg}, {c_reg};"]
    return "{\n" + "\n".join(lines) + "\n}"


def _iq_asm(fma: str, magic: str, one: str, neg: str, two_scales: bool, folded: bool) -> str:
    """IQ2_XXS, IQ2_S: grid magnitudes of the low ($4) and high ($5) words, their sign nibbles in the low bits of $6,
    $7 (bit e: element e of the word negative), the scale $8 $9 (IQ2_S: of the low half; the high half's $10 $11)
    -> weights ($0 $1 low, $2 $3 high).  A magnitude m is exact in the magic number's mantissa (M + m: a prmt puts
    its byte under the magic number's high byte), the scale
    multiplies it (one rounding), and its sign bit is xor-ed in: the sign nibble times 0x40008000 puts elements 0
    and 1 at bits 15 and 31 (0x10002000: elements 2 and 3), what the mask 0x80008000 keeps of it.

    folded (bf16): the scale's -M s follows the scales ($10 $11; IQ2_S: $12 $13 low, $14 $15 high) and one FMA
    (M + m) s - M s = m s takes the magic number out and scales: computed exactly before its one rounding, the same
    bits as the two steps (M s is exact: a power of two times a bf16).  fp16 keeps two steps: M s = 1024 s could
    overflow fp16."""
    scales = ("$8", "$9", "$10", "$11") if two_scales else ("$8", "$9", "$8", "$9")
    offsets = ("$12", "$13", "$14", "$15") if two_scales else ("$10", "$11", "$10", "$11")
    lines = _iq_scaled_magnitudes(fma, magic, one, neg, scales, offsets if folded else None, ", sg, m")
    for signs, (a, b), (oa, ob) in (("$6", ("u0", "u1"), ("$0", "$1")), ("$7", ("u2", "u3"), ("$2", "$3"))):
        lines += [f"and.b32 sg, {signs}, 15;",
                  "mul.lo.u32 m, sg, 0x40008000;", f"lop3.b32 {oa}, {a}, m, 0x80008000, 0x78;",
                  "mul.lo.u32 m, sg, 0x10002000;", f"lop3.b32 {ob}, {b}, m, 0x80008000, 0x78;"]
    return "{\n" + "\n".join(lines) + "\n}"


IQ_FOLDED = {False: True, True: False}    # whether the IQ decode folds the magic number into the scale's FMA


def _iq_scaled_magnitudes(fma: str, magic: str, one: str, neg: str, scales: tuple, offsets: tuple | None,
                          extra_regs: str = "") -> list[str]:
    """The IQ asm's first part: the grid magnitudes of words $4 (low) and $5 (high) under the magic number (u0..u3,
    two to a register) and scaled, unsigned: by scales[j] in one FMA with offsets[j] (-M s: folded), or by removing
    M first (offsets None)."""
    # the magic number's high byte in every byte: one prmt puts two magnitude bytes under it (M + m, m < 256)
    high = int(magic, 16) >> 8 & 0xFF
    lines = [f".reg .b32 u0, u1, u2, u3, one, neg, zero{extra_regs}, mb;", f"mov.b32 one, {one};",
             f"mov.b32 neg, {neg};", f"mov.b32 zero, {_pair(0x8000)};", f"mov.b32 mb, {high * 0x01010101:#010x};"]
    for src, (a, b) in (("$4", ("u0", "u1")), ("$5", ("u2", "u3"))):
        lines += [f"prmt.b32 {a}, {src}, mb, 0x4140;", f"prmt.b32 {b}, {src}, mb, 0x4342;"]
    for j, s_reg in enumerate(scales):
        if offsets:
            lines += [f"{fma} u{j}, u{j}, {s_reg}, {offsets[j]};"]
        else:
            lines += [f"{fma} u{j}, u{j}, one, neg;", f"{fma} u{j}, u{j}, {s_reg}, zero;"]
    return lines


def _iq_spread_asm(fma: str, magic: str, one: str, neg: str, folded: bool) -> str:
    """Packed IQ2_XXS (signs re-encoded at load: spread_iq2xxs_signs): as _iq_asm with one scale ($22 $23; folded:
    its -M s $24 $25), but each output register's two signs arrive already at bits 15 and 31 of its mask ($6, $10,
    $14, $18: output $0..$3; a mask operand is 4 int32 registers of one value, the first read), so the sign is one
    lop3 a register: out = u ^ (mask & 0x80008000)."""
    lines = _iq_scaled_magnitudes(fma, magic, one, neg, ("$22", "$23", "$22", "$23"),
                                  ("$24", "$25", "$24", "$25") if folded else None)
    for j, mask in enumerate(("$6", "$10", "$14", "$18")):
        lines += [f"lop3.b32 ${j}, u{j}, {mask}, 0x80008000, 0x78;"]
    return "{\n" + "\n".join(lines) + "\n}"


_ASM_Q4K_BF16 = gl.constexpr(_decode_asm(Q4_K, False))
_ASM_Q4K_FP16 = gl.constexpr(_decode_asm(Q4_K, True))
_ASM_Q5K_BF16 = gl.constexpr(_decode_asm(Q5_K, False))
_ASM_Q5K_FP16 = gl.constexpr(_decode_asm(Q5_K, True))
_ASM_Q6K_BF16 = gl.constexpr(_decode_asm(Q6_K, False))
_ASM_Q8_BF16 = gl.constexpr(_decode_asm(Q8_0, False))
_ASM_Q8_FP16 = gl.constexpr(_decode_asm(Q8_0, True))
_ASM_Q6K_FP16 = gl.constexpr(_decode_asm(Q6_K, True))
_ASM_IQ2XXS_BF16 = gl.constexpr(_decode_asm(IQ2_XXS, False))
_ASM_IQ2XXS_FP16 = gl.constexpr(_decode_asm(IQ2_XXS, True))
_ASM_IQ2S_BF16 = gl.constexpr(_decode_asm(IQ2_S, False))
_ASM_IQ2S_FP16 = gl.constexpr(_decode_asm(IQ2_S, True))
_ASM_IQ2XXS_SPREAD_BF16 = gl.constexpr(_iq_spread_asm("fma.rn.bf16x2", _pair(_MAGIC[False]), _pair(_ONE[False]),
                                                      _pair(_NEG[(False, IQ2_XXS)]), IQ_FOLDED[False]))
_ASM_IQ2XXS_SPREAD_FP16 = gl.constexpr(_iq_spread_asm("fma.rn.f16x2", _pair(_MAGIC[True]), _pair(_ONE[True]),
                                                      _pair(_NEG[(True, IQ2_XXS)]), IQ_FOLDED[True]))
# 4 outputs; lo, hi, 4 masks of 4 registers, the scale pair (bf16: and its -M s pair)
_SPREAD_CONSTRAINTS_BF16 = gl.constexpr("=r,=r,=r,=r" + ",r" * 22)
_SPREAD_CONSTRAINTS_FP16 = gl.constexpr("=r,=r,=r,=r" + ",r" * 20)
_ASM_Q2K_BF16 = gl.constexpr(_decode_asm(Q2_K, False))
_ASM_Q2K_FP16 = gl.constexpr(_decode_asm(Q2_K, True))


@constexpr_function  # called while the kernel compiles (a plain function there would be refused), or on the host
def layouts(num_warps: int, reps: int, qtype: int = Q4_K, cols: int = TOKENS) -> tuple:
    """(codes [BN, 4, 4, 4], activations [cols, 128], accumulator [BN, cols]) layouts for BN = 16 * num_warps * reps
    rows and cols (8, 16 or 32) activation rows.

    Codes are indexed (row, slot, word, byte) with the half super-block's code byte p = 16 slot + 4 word + byte.
    Their layout is the MMA A operand's (as Triton 3.6 builds it for these warps) with k replaced by the byte p that
    A_ORDER maps it to: registers p0-p3 (16 contiguous bytes), row + 8, the row repeats; lanes p4, p5 (the slot)
    and rows 0-2; warps the 16-row blocks.  The activations' is the B operand's likewise: registers v0-v3 and the
    nibble's bit (Q4_K v5, Q6_K v6), lanes the two bits of p4 and p5 (Q4_K v4 v6, Q6_K v4 v5) and the 8 tokens;
    past 8 tokens, registers the token's higher bits (last, as the B operand repeats its tile along N after K);
    every warp holds the whole tile."""
    if num_warps & (num_warps - 1) or reps & (reps - 1):
        raise ValueError(f"num_warps={num_warps} and reps={reps} must be powers of two")
    if cols not in COLUMN_BLOCKS:
        raise ValueError(f"cols={cols}: a program multiplies one of {COLUMN_BLOCKS} activation rows")
    bn = 16 * num_warps * reps
    warp_rows = [[16 << j, 0, 0, 0] for j in range(num_warps.bit_length() - 1)]
    rep_rows = [[16 * num_warps << j, 0, 0, 0] for j in range(reps.bit_length() - 1)]
    codes = DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0], [8, 0, 0, 0]] + rep_rows,
        lane_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=warp_rows, block_bases=[], shape=[bn, 4, 4, 4])
    # which bit of the value v the "nibble" and the slot's bits p4, p5 are (see X_ORDER_*)
    nibble, p4, p5 = {Q6_K: ([0, 64], [0, 16], [0, 32]), Q8_0: ([0, 64], [0, 16], [0, 32]),
                      **{t: ([0, 16], [0, 32], [0, 64]) for t in IQ_TYPES}}.get(qtype, ([0, 32], [0, 16], [0, 64]))
    acts = DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], nibble] + [[8 << j, 0] for j in range(cols.bit_length() - 4)],
        lane_bases=[p4, p5, [1, 0], [2, 0], [4, 0]],
        warp_bases=[[0, 0]] * (num_warps.bit_length() - 1), block_bases=[], shape=[cols, 128])
    acc = NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    return codes, acts, acc


@constexpr_function
def _layout(num_warps, reps, qtype, which, cols=TOKENS):
    """layouts(...)[which], built while the kernel compiles: the kernel's own parameters stay plain numbers, which
    Triton's compile hooks serialise as JSON (vLLM sets one after warm-up; a layout object there fails the launch)."""
    return layouts(num_warps, reps, qtype, cols)[which]


# ----------------------------------------------------------------------------------------------------------------
# device code
# ----------------------------------------------------------------------------------------------------------------


@jit
def _broadcast_like(t, like):
    """[BN, 4] -> like's shape [BN, 4, 4, 4] (t's dtype)."""
    return gl.broadcast(gl.expand_dims(gl.expand_dims(t, 2), 3), like)[0]


@jit
def _bytes(words, L4: tl.constexpr):
    """Words [BN, 4, 4] int32 -> their bytes [BN, 4, 4, 4] uint8 (for the compiler: the asm takes the 4 bytes of a
    word packed in one register again, and LLVM folds the round trip away)."""
    shift = 8 * gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))
    return ((gl.expand_dims(words, 3) >> gl.expand_dims(gl.expand_dims(gl.expand_dims(shift, 0), 1), 2))
            & 255).to(gl.uint8)


@jit
def _scaled_pairs(dd, sl, ml, sh, mh, BF16: tl.constexpr):
    """(s, -m) of a low and a high group under the super-block's d and dmin (the fp16 halves of the int32 dd):
    s = d sc and m = dmin mn are exact in float32, then rounded to the activation dtype."""
    d = (dd & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    dmin = ((dd >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    if BF16:
        dt: tl.constexpr = gl.bfloat16
    else:
        dt: tl.constexpr = gl.float16
    return ((d * sl.to(gl.float32)).to(dt), (-(dmin * ml.to(gl.float32))).to(dt),
            (d * sh.to(gl.float32)).to(dt), (-(dmin * mh.to(gl.float32))).to(dt))


@jit
def _q4k_scales(h0, h1, h2, h3, slot, HF: tl.constexpr, BF16: tl.constexpr):
    """(s, -m) of the low and high group of each [BN, 4] slot of half HF of the Q4_K super-blocks whose first 16
    bytes are h0..h3 ([BN, 4] int32, the same in every slot of a row).  The slot's chunk c = 2 HF + slot // 2 holds
    groups 2c (low nibbles) and 2c + 1 (high).  Groups 0-3 take their 6-bit scale and min from the low bits of
    bytes 0-3 / 4-7; groups 4-7 from the nibbles of bytes 8-11 with their top 2 bits in the high bits of bytes
    0-3 / 4-7.  s = d sc and m = dmin mn are exact in float32, then rounded to the activation dtype."""
    jj = 2 * (slot // 2)
    if HF == 0:
        sl = (h1 >> (8 * jj)) & 63
        ml = (h2 >> (8 * jj)) & 63
        sh = (h1 >> (8 * jj + 8)) & 63
        mh = (h2 >> (8 * jj + 8)) & 63
    else:
        sl = ((h3 >> (8 * jj)) & 15) | (((h1 >> (8 * jj + 6)) & 3) << 4)
        ml = ((h3 >> (8 * jj + 4)) & 15) | (((h2 >> (8 * jj + 6)) & 3) << 4)
        sh = ((h3 >> (8 * jj + 8)) & 15) | (((h1 >> (8 * jj + 14)) & 3) << 4)
        mh = ((h3 >> (8 * jj + 12)) & 15) | (((h2 >> (8 * jj + 14)) & 3) << 4)
    return _scaled_pairs(h0, sl, ml, sh, mh, BF16)


@jit
def _q2k_scales(sw, dd, slot, BF16: tl.constexpr):
    """(s, -m) of the low and high code pair of each [BN, 4] slot of a Q2_K half: the slot's bytes hold values
    32 c + (p & 31) (c = 2 (slot // 2) low, c + 1 high) in groups of 16, 2 c + slot % 2 and two groups on, whose
    scale bytes are bytes slot % 2 and slot % 2 + 2 of the scale word sw (scale low nibble, min high nibble);
    dd: the d, dmin word.  s = d sc and m = dmin mn exact in float32, then rounded to the activation dtype."""
    lo = (sw >> (8 * (slot % 2))) & 255
    hi = (sw >> (8 * (slot % 2) + 16)) & 255
    return _scaled_pairs(dd, lo & 15, lo >> 4, hi & 15, hi >> 4, BF16)


@jit
def _weights(QTYPE: tl.constexpr, codes, high, a_lo, b_lo, a_hi, b_hi, BF16: tl.constexpr):
    """Code bytes [BN, 4, 4, 4] (Q5_K, Q6_K: with their high-bit bytes shifted into place, ``high``) -> (low-nibble
    weights, high-nibble weights) in the activation dtype.  Q4_K, Q5_K: w = s n - m with (a, b) = (s, -m) of the
    byte's group; Q6_K: w = s (q - 32) with a = s (b unused)."""
    if INTERPRET_K:  # the same numbers without PTX (exact in float32 but in rare cases of the s n - m subtraction)
        c = codes.to(gl.int32)
        if QTYPE == 10:
            w_lo = (c & 3).to(gl.float32) * _broadcast_like(a_lo, c) + _broadcast_like(b_lo, c)
            w_hi = ((c >> 2) & 3).to(gl.float32) * _broadcast_like(a_hi, c) + _broadcast_like(b_hi, c)
        elif QTYPE == 12 or QTYPE == 13:
            n_lo = c & 15
            n_hi = c >> 4
            if QTYPE == 13:
                hb = high.to(gl.int32)
                n_lo = n_lo | ((hb & 1) << 4)
                n_hi = n_hi | ((hb & 2) << 3)
            w_lo = n_lo.to(gl.float32) * _broadcast_like(a_lo, c) + _broadcast_like(b_lo, c)
            w_hi = n_hi.to(gl.float32) * _broadcast_like(a_hi, c) + _broadcast_like(b_hi, c)
        elif QTYPE == 8:
            w_lo = codes.to(gl.int8, bitcast=True).to(gl.float32) * _broadcast_like(a_lo, c)
            w_hi = high.to(gl.int8, bitcast=True).to(gl.float32) * _broadcast_like(a_hi, c)
        else:
            hb = high.to(gl.int32)
            q_lo = ((c & 15) | ((hb & 3) << 4)) - 32
            q_hi = ((c >> 4) | (((hb >> 4) & 3) << 4)) - 32
            w_lo = q_lo.to(gl.float32) * _broadcast_like(a_lo, c)
            w_hi = q_hi.to(gl.float32) * _broadcast_like(a_hi, c)
        return w_lo.to(a_lo.dtype), w_hi.to(a_lo.dtype)
    else:
        if QTYPE == 12 or QTYPE == 10:
            args = [codes, _broadcast_like(a_lo, codes), _broadcast_like(b_lo, codes),
                    _broadcast_like(a_hi, codes), _broadcast_like(b_hi, codes)]
            cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r"
            if QTYPE == 10:
                if BF16:
                    asm: tl.constexpr = _ASM_Q2K_BF16
                else:
                    asm: tl.constexpr = _ASM_Q2K_FP16
            elif BF16:
                asm: tl.constexpr = _ASM_Q4K_BF16
            else:
                asm: tl.constexpr = _ASM_Q4K_FP16
        elif QTYPE == 13:
            args = [codes, high, _broadcast_like(a_lo, codes), _broadcast_like(b_lo, codes),
                    _broadcast_like(a_hi, codes), _broadcast_like(b_hi, codes)]
            cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r"
            if BF16:
                asm: tl.constexpr = _ASM_Q5K_BF16
            else:
                asm: tl.constexpr = _ASM_Q5K_FP16
        else:
            args = [codes, high, _broadcast_like(a_lo, codes), _broadcast_like(a_hi, codes)]
            cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r"
            if QTYPE == 8:
                if BF16:
                    asm: tl.constexpr = _ASM_Q8_BF16
                else:
                    asm: tl.constexpr = _ASM_Q8_FP16
            elif BF16:
                asm: tl.constexpr = _ASM_Q6K_BF16
            else:
                asm: tl.constexpr = _ASM_Q6K_FP16
        return gl.inline_asm_elementwise(asm, cons, args, (a_lo.dtype, a_lo.dtype), is_pure=True, pack=4)


@jit
def _sign_byte(index):
    """llama.cpp's ksigns: a 7-bit sign index with its parity as bit 7 (the eighth sign makes the count even); on
    the GPU one popc (the parity by xor-folding took six instructions, and was done for each half of a row)."""
    if INTERPRET_K:
        p = index ^ (index >> 4)
        p = p ^ (p >> 2)
        p = p ^ (p >> 1)
    else:
        p = gl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [index], dtype=gl.int32, is_pure=True, pack=1)
    return index | ((p & 1) << 7)


@jit
def _word_rows(L4: tl.constexpr):
    """([1, 1, 4] tensors) the grid row within its half (word >> 1) and the half of that row (word & 1) that each
    code word w of a sub-block's low half covers (the high half: rows 2 + (w >> 1))."""
    LWORD: tl.constexpr = gl.SliceLayout(3, L4)
    word = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LWORD))), 0), 1)
    return word >> 1, word & 1


@jit
def _per_row(t, BN: tl.constexpr):
    """[BN, 4, 4] values of each code word, the same in both words of a grid row -> [BN, 4, 2] one a row (the
    words' registers split in two: the other half's instructions are dead code)."""
    first, _ = gl.split(gl.reshape(t, [BN, 4, 2, 2]))
    return first


@jit
def _per_word(lo, hi, BN: tl.constexpr, L4: tl.constexpr):
    """[BN, 4, 2] row values (lo: the row's first word, hi: its second) -> [BN, 4, 4] by code word (word 2 r + h),
    in the registers the words came from (asserted: no data moves)."""
    return gl.convert_layout(gl.reshape(gl.join(lo, hi), [BN, 4, 4]), gl.SliceLayout(3, L4), assert_trivial=True)


@jit
def _iq2xxs_weights(aux0, aux1, d, grid_ptr, BN: tl.constexpr, L4: tl.constexpr, BF16: tl.constexpr,
                    SPREAD: tl.constexpr = False):
    """The 32 weights of sub-block slot of each row ([BN, 4] index and sign/scale words, d) as (low, high)
    [BN, 4, 4, 4]: word w of the low half is bytes 4 (w & 1) .. + 3 of grid row w >> 1 (high: row 2 + (w >> 1));
    scale d (0.5 + top 4 bits) / 4 rounded to the activation dtype.  SPREAD: aux1 as spread_iq2xxs_signs left it."""
    row_lo, half = _word_rows(L4)
    a0 = gl.expand_dims(aux0, 2)
    lo0, lo1 = _grid_row_words(grid_ptr, _per_row((a0 >> (8 * row_lo)) & 255, BN))        # [BN, 4, 2] each
    hi0, hi1 = _grid_row_words(grid_ptr, _per_row((a0 >> (8 * row_lo + 16)) & 255, BN))
    d32 = d.to(gl.float16, bitcast=True).to(gl.float32)
    scale = d32 * (0.5 + ((aux1 >> 28) & 15).to(gl.float32)) * 0.25
    if SPREAD:
        return _iq_weights_spread(_per_word(lo0, lo1, BN, L4), _per_word(hi0, hi1, BN, L4),
                                  _iq2xxs_all_signs(aux1), scale, row_lo, half, L4, BF16)
    a1 = gl.expand_dims(aux1, 2)
    s_lo = _sign_byte(_per_row((a1 >> (7 * row_lo)) & 127, BN))                  # the rows' 8 sign bits
    s_hi = _sign_byte(_per_row((a1 >> (7 * row_lo + 14)) & 127, BN))
    return _iq_weights(_per_word(lo0, lo1, BN, L4), _per_word(hi0, hi1, BN, L4), s_lo, s_hi, scale, scale, BN, L4,
                       BF16, False)


@jit
def _iq2xxs_all_signs(word):
    """A spread sign word (spread_iq2xxs_signs) with each grid row g's eighth sign, the parity of its other seven,
    at bit 28 + g where the scale was: three xor-folds compute all four rows' parities at once.  (The tile kernels'
    twin, a Triton function: gguf_matmul._iq2xxs_all_signs.)"""
    signs = word & 0x0FFFFFFF
    p = signs ^ (signs >> 16)
    p = p ^ (p >> 8)
    p = p ^ (p >> 4)
    return signs | ((p & 15) << 28)


@jit
def _iq_weights_spread(lo, hi, signs, scale, row_lo, half, L4: tl.constexpr, BF16: tl.constexpr):
    """_iq_weights for packed IQ2_XXS: magnitude words [BN, 4, 4], the sub-block's 32 signs [BN, 4] (value 8 g +
    2 j + e's at bit 4 j + g + 16 e: _iq2xxs_all_signs), the float32 scale [BN, 4].  The output register of values
    (j, e = 0, 1) of row g has its signs one left shift of the word away, by 15 - 4 j - g (to bits 15 and 31)."""
    s3 = gl.expand_dims(signs, 2)
    g = row_lo
    m0 = s3 << (15 - 8 * half - g)          # low word, values 0, 1 of its 4: j = 2 half
    m1 = s3 << (11 - 8 * half - g)          # values 2, 3: j = 2 half + 1
    m2 = s3 << (13 - 8 * half - g)          # high word: row g + 2
    m3 = s3 << (9 - 8 * half - g)
    if BF16:
        dt: tl.constexpr = gl.bfloat16
    else:
        dt: tl.constexpr = gl.float16
    sc = scale.to(dt)
    lo_b = _bytes(lo, L4)
    hi_b = _bytes(hi, L4)
    if INTERPRET_K:   # the same numbers without PTX: byte b's sign is bit 15 + 16 (b & 1) of mask b >> 1
        byte = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, 4), 0), 1), 2)
        at = 15 + 16 * (byte & 1)
        neg_lo = (gl.where(byte < 2, gl.expand_dims(m0, 3), gl.expand_dims(m1, 3)) >> at) & 1
        neg_hi = (gl.where(byte < 2, gl.expand_dims(m2, 3), gl.expand_dims(m3, 3)) >> at) & 1
        s32 = _broadcast_like(sc, lo_b).to(gl.float32)
        return ((lo_b.to(gl.float32) * s32 * (1.0 - 2.0 * neg_lo.to(gl.float32))).to(dt),
                (hi_b.to(gl.float32) * s32 * (1.0 - 2.0 * neg_hi.to(gl.float32))).to(dt))
    else:
        args = [lo_b, hi_b, gl.broadcast(gl.expand_dims(m0, 3), lo_b)[0], gl.broadcast(gl.expand_dims(m1, 3), lo_b)[0],
                gl.broadcast(gl.expand_dims(m2, 3), lo_b)[0], gl.broadcast(gl.expand_dims(m3, 3), lo_b)[0],
                _broadcast_like(sc, lo_b)]
        if BF16:  # folded (_iq_spread_asm): -M s, exact
            args = args + [_broadcast_like((sc.to(gl.float32) * -MAGIC_BF16).to(dt), lo_b)]
            asm: tl.constexpr = _ASM_IQ2XXS_SPREAD_BF16
            cons: tl.constexpr = _SPREAD_CONSTRAINTS_BF16
        else:
            asm: tl.constexpr = _ASM_IQ2XXS_SPREAD_FP16
            cons: tl.constexpr = _SPREAD_CONSTRAINTS_FP16
        return gl.inline_asm_elementwise(asm, cons, args, (sc.dtype, sc.dtype), is_pure=True, pack=4)


@jit
def _iq2s_weights(qsw, sgw, qh, sc, d, grid_ptr, BN: tl.constexpr, L4: tl.constexpr, BF16: tl.constexpr):
    """IQ2_S's 32 weights of sub-block slot of each row, as _iq2xxs_weights: grid row l's index is byte l of the
    low-bits word | bits 2l, 2l + 1 of qh above them (1024 rows), its signs byte l of the sign word, and the low
    half (rows 0-1) takes the scale byte's low nibble, the high half its high nibble."""
    row_lo, half = _word_rows(L4)
    q3 = gl.expand_dims(qsw, 2)
    g3 = gl.expand_dims(sgw, 2)
    h3 = gl.expand_dims(qh, 2)
    lo0, lo1 = _grid_row_words(grid_ptr, _per_row(((q3 >> (8 * row_lo)) & 255) | (((h3 >> (2 * row_lo)) & 3) << 8),
                                                  BN))
    hi0, hi1 = _grid_row_words(grid_ptr, _per_row(((q3 >> (8 * row_lo + 16)) & 255)
                                                  | (((h3 >> (2 * row_lo + 4)) & 3) << 8), BN))
    s_lo = _per_row((g3 >> (8 * row_lo)) & 255, BN)
    s_hi = _per_row((g3 >> (8 * row_lo + 16)) & 255, BN)
    d32 = d.to(gl.float16, bitcast=True).to(gl.float32)
    return _iq_weights(_per_word(lo0, lo1, BN, L4), _per_word(hi0, hi1, BN, L4), s_lo, s_hi,
                       d32 * (0.5 + (sc & 15).to(gl.float32)) * 0.25,
                       d32 * (0.5 + ((sc >> 4) & 15).to(gl.float32)) * 0.25, BN, L4, BF16, True)


@jit
def _iq3_grid_words(grid_ptr, index):
    """IQ3's grid rows (4 magnitude bytes: one 32-bit word, one 4-byte gather each) of ``index`` [BN, 4, 4]."""
    return gl.load(grid_ptr.to(gl.pointer_type(gl.int32)) + index)


@jit
def _iq3xxs_weights(q0, q1, aux, d, grid_ptr, BN: tl.constexpr, L4: tl.constexpr, BF16: tl.constexpr):
    """IQ3_XXS's 32 weights of sub-block slot of each row: its 8 grid indexes (words q0: rows 0-3, the low half;
    q1: rows 4-7), a grid row of 4 values each, so word w of a half is row w (high: 4 + w); its sign/scale word aux
    as IQ2_XXS's (four 7-bit sign indexes of 8 values, with parity; scale d (0.5 + top 4 bits) / 2)."""
    row_lo, half = _word_rows(L4)
    w = 2 * row_lo + half
    lo = _iq3_grid_words(grid_ptr, (gl.expand_dims(q0, 2) >> (8 * w)) & 255)        # [BN, 4, 4] magnitude words
    hi = _iq3_grid_words(grid_ptr, (gl.expand_dims(q1, 2) >> (8 * w)) & 255)
    a = gl.expand_dims(aux, 2)
    s_lo = _sign_byte(_per_row((a >> (7 * row_lo)) & 127, BN))                   # 8 sign bits a group of 8 values
    s_hi = _sign_byte(_per_row((a >> (7 * row_lo + 14)) & 127, BN))
    d32 = d.to(gl.float16, bitcast=True).to(gl.float32)
    scale = d32 * (0.5 + ((aux >> 28) & 15).to(gl.float32)) * 0.5
    return _iq_weights(lo, hi, s_lo, s_hi, scale, scale, BN, L4, BF16, False)


@jit
def _iq3s_weights(q0, q1, qh, sgw, sc, d, grid_ptr, BN: tl.constexpr, L4: tl.constexpr, BF16: tl.constexpr):
    """IQ3_S's 32 weights of sub-block slot of each row: grid row r's index is byte r of the words q0 (rows 0-3),
    q1 (rows 4-7) | bit r of qh above them (512 rows of 4 values: word w of a half is row w, high 4 + w); the sign
    word sgw is a byte of explicit signs a group of 8 values; scale d (1 + 2 nibble sc)."""
    row_lo, half = _word_rows(L4)
    w = 2 * row_lo + half
    h3 = gl.expand_dims(qh, 2)
    lo = _iq3_grid_words(grid_ptr, ((gl.expand_dims(q0, 2) >> (8 * w)) & 255) | (((h3 >> w) & 1) << 8))
    hi = _iq3_grid_words(grid_ptr, ((gl.expand_dims(q1, 2) >> (8 * w)) & 255) | (((h3 >> (4 + w)) & 1) << 8))
    g3 = gl.expand_dims(sgw, 2)
    s_lo = _per_row((g3 >> (8 * row_lo)) & 255, BN)
    s_hi = _per_row((g3 >> (8 * row_lo + 16)) & 255, BN)
    d32 = d.to(gl.float16, bitcast=True).to(gl.float32)
    scale = d32 * (1.0 + 2.0 * sc.to(gl.float32))
    return _iq_weights(lo, hi, s_lo, s_hi, scale, scale, BN, L4, BF16, False)


@jit
def _grid_row_words(grid_ptr, index):
    """The two 32-bit words (magnitude bytes 0-3, 4-7) of grid rows ``index``: one 8-byte load a row (as two 32-bit
    registers: an int64 load's halves, shifted apart, cost the byte unpacking six PRMTs a row in SASS)."""
    p = grid_ptr + index * 8
    if INTERPRET_K:
        w = p.to(gl.pointer_type(gl.int32))
        return gl.load(w), gl.load(w + 1)
    else:
        return gl.inline_asm_elementwise("ld.global.nc.v2.b32 {$0, $1}, [$2];", "=r,=r,l", [p],
                                         dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@jit
def _iq_weights(lo, hi, s_lo, s_hi, scale_lo, scale_hi, BN: tl.constexpr, L4: tl.constexpr, BF16: tl.constexpr,
                TWO_SCALES: tl.constexpr):
    """Magnitude words [BN, 4, 4] of the low and high halves (4 grid bytes each), the sign bytes of their groups of
    8 values [BN, 4, 2], float32 scales [BN, 4] -> (low, high) weights [BN, 4, 4, 4] in the activation dtype (the
    scales rounded to it first, then the product).  IQ2 grid rows are 8 bytes: one 8-byte gather each
    (_grid_row_words; two 4-byte gathers before: the IQ decode is bound by its gathers, each of which touches up to
    32 cache lines of the table)."""
    sw_lo = _per_word(s_lo & 15, s_lo >> 4, BN, L4)                              # sign nibble of each word
    sw_hi = _per_word(s_hi & 15, s_hi >> 4, BN, L4)
    if BF16:
        dt: tl.constexpr = gl.bfloat16
    else:
        dt: tl.constexpr = gl.float16
    sc_lo = scale_lo.to(dt)
    sc_hi = scale_hi.to(dt)
    lo_b = _bytes(lo, L4)
    hi_b = _bytes(hi, L4)
    if INTERPRET_K:   # the same numbers without PTX
        byte = gl.arange(0, 4)
        e = gl.expand_dims(gl.expand_dims(gl.expand_dims(byte, 0), 1), 2)
        sign_lo = 1.0 - 2.0 * ((gl.expand_dims(sw_lo, 3) >> e) & 1).to(gl.float32)
        sign_hi = 1.0 - 2.0 * ((gl.expand_dims(sw_hi, 3) >> e) & 1).to(gl.float32)
        return ((lo_b.to(gl.float32) * _broadcast_like(sc_lo, lo_b).to(gl.float32) * sign_lo).to(dt),
                (hi_b.to(gl.float32) * _broadcast_like(sc_hi, lo_b).to(gl.float32) * sign_hi).to(dt))
    else:
        sg_lo = gl.broadcast(gl.expand_dims(sw_lo, 3), lo_b)[0].to(gl.uint8)
        sg_hi = gl.broadcast(gl.expand_dims(sw_hi, 3), lo_b)[0].to(gl.uint8)
        args = [lo_b, hi_b, sg_lo, sg_hi, _broadcast_like(sc_lo, lo_b)]
        if TWO_SCALES:
            args = args + [_broadcast_like(sc_hi, lo_b)]
        if BF16:  # folded (_iq_asm): -M s of each scale, exact
            args = args + [_broadcast_like((sc_lo.to(gl.float32) * -MAGIC_BF16).to(dt), lo_b)]
            if TWO_SCALES:
                args = args + [_broadcast_like((sc_hi.to(gl.float32) * -MAGIC_BF16).to(dt), lo_b)]
        if TWO_SCALES:
            if BF16:
                asm: tl.constexpr = _ASM_IQ2S_BF16
                cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r"
            else:
                asm: tl.constexpr = _ASM_IQ2S_FP16
                cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r,r,r"
        else:
            if BF16:   # one scale a sub-block: IQ2_XXS's, IQ3_XXS's, IQ3_S's
                asm: tl.constexpr = _ASM_IQ2XXS_BF16
                cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r,r,r"
            else:
                asm: tl.constexpr = _ASM_IQ2XXS_FP16
                cons: tl.constexpr = "=r,=r,=r,=r,r,r,r,r,r,r"
        return gl.inline_asm_elementwise(asm, cons, args, (sc_lo.dtype, sc_lo.dtype), is_pure=True, pack=4)


@jit
def _half_dot(acc, w_lo, w_hi, xt, QTYPE: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, COLS: tl.constexpr):
    """acc [BN, COLS] += W . x over one half super-block: weights [BN, 4, 4, 4] by code byte (low and high nibbles),
    activations xt [COLS, 128] (value v of the half at column v), in the permuted K order of the module docstring."""
    A_DOT: tl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    B_DOT: tl.constexpr = gl.DotOperandLayout(operand_index=1, parent=ACC, k_width=2)
    if QTYPE == 14 or QTYPE == 8:
        xb = gl.permute(gl.reshape(xt, [COLS, 2, 2, 2, 2, 2, 2, 2]), X_ORDER_Q6K.value)
    elif QTYPE == 16 or QTYPE == 22 or QTYPE == 18 or QTYPE == 21:
        xb = gl.permute(gl.reshape(xt, [COLS, 2, 2, 2, 2, 2, 2, 2]), X_ORDER_IQ.value)
    else:
        xb = gl.permute(gl.reshape(xt, [COLS, 2, 2, 2, 2, 2, 2, 2]), X_ORDER_Q4K.value)
    x_lo, x_hi = gl.split(gl.reshape(xb, [64, COLS, 2]))
    for nib in gl.static_range(2):
        if nib == 0:
            w = w_lo
            xk = x_lo
        else:
            w = w_hi
            xk = x_hi
        a = gl.reshape(gl.permute(gl.reshape(w, [BN, 2, 2, 2, 2, 2, 2]), A_ORDER.value), [BN, 64])
        a = gl.convert_layout(a, A_DOT, assert_trivial=True)
        b = gl.convert_layout(xk.to(w.dtype), B_DOT, assert_trivial=True)
        acc = mma_v2(a, b, acc)
    return acc


@jit
def _word16(p):
    """The 32-bit words at 16-bit pointers p (rows only 2-byte aligned): two 16-bit loads each."""
    return (gl.load(p).to(gl.int32) & 0xFFFF) | (gl.load(p + 1).to(gl.int32) << 16)


@jit
def _load_half(QTYPE: tl.constexpr, rowp, slot, word, act_p, x_ok, sb, HF: tl.constexpr, BN: tl.constexpr,
               L4: tl.constexpr, PACKED: tl.constexpr, num_sb):
    """The loads of half HF of super-block sb: (code words or low-nibble words [BN, 4, 4], then Q4_K/Q5_K header
    words and Q5_K high-bit words, or Q6_K high-bit words and scales, then activations [COLS, 128]).  rowp: [BN, 1]
    byte pointers to the weight rows."""
    xt = gl.load(act_p + sb * 256 + 128 * HF, mask=x_ok, other=0.0)
    if QTYPE == 12 or QTYPE == 13:
        if QTYPE == 12:
            base = (rowp + sb * 144).to(gl.pointer_type(gl.int32))      # 16-byte aligned rows and blocks
            code_word = 4
        else:
            base = (rowp + sb * 176).to(gl.pointer_type(gl.int32))
            code_word = 12
        head = base + slot * 0                                          # [BN, 4]
        words = gl.expand_dims(gl.expand_dims(word, 0), 1)
        codes = gl.load(gl.expand_dims(head + code_word + 16 * HF + 4 * slot, 2) + words)
        if QTYPE == 13:
            high = gl.load(gl.expand_dims(head + 4 + 4 * (slot % 2), 2) + words)   # high bits of values p & 31
        else:
            high = codes
        # the 16 header bytes of each row, one 16-byte load, as the words h0..h3 ([BN, 4] each)
        LSLOT: tl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, L4))
        h02, h13 = gl.split(gl.reshape(gl.load(gl.expand_dims(head, 2) + words), [BN, 4, 2, 2]))
        h0, h2 = gl.split(h02)
        h1, h3 = gl.split(h13)
        h0 = gl.convert_layout(h0, LSLOT, assert_trivial=True)   # the same registers, named as the scales want
        h1 = gl.convert_layout(h1, LSLOT, assert_trivial=True)
        h2 = gl.convert_layout(h2, LSLOT, assert_trivial=True)
        h3 = gl.convert_layout(h3, LSLOT, assert_trivial=True)
        return codes, h0, h1, h2, h3, high, xt
    elif QTYPE == 10:
        # Q2_K (84-byte blocks, 4-byte aligned: 16 scale bytes, 64 code bytes, d, dmin): half HF's 32 code bytes
        # hold values 32 c + l in bits 2c, 2c + 1 of byte l; the slot's byte p is byte p & 31, shifted right by 4
        # for slots 2-3 (codes c = 2, 3) so that the decode takes bits 0-1 (low) and 2-3 (high) of every byte
        base = (rowp + sb * 84).to(gl.pointer_type(gl.int32))
        head = base + slot * 0                                          # [BN, 4]
        words = gl.expand_dims(gl.expand_dims(word, 0), 1)
        codes = gl.load(gl.expand_dims(head + 4 + 8 * HF + 4 * (slot % 2), 2) + words)
        codes = codes >> gl.expand_dims(4 * (slot // 2), 2)
        sw = gl.load(head + 2 * HF + slot // 2)                         # scale bytes 8 HF + 4 (slot // 2) ..
        dd = gl.load(head + 20)
        return codes, sw, dd, codes, codes, codes, xt
    elif QTYPE == 16 and PACKED:
        # IQ2_XXS's PLANES: the row's 64-byte code blocks first, sub-block 4 HF + slot's 8 bytes one aligned load
        # (its two words: the grid indices, the signs and scale); then the rows' d
        aux = gl.load((rowp + sb * 64 + 8 * (4 * HF + slot)).to(gl.pointer_type(gl.int64)))   # [BN, 4]
        aux0 = aux.to(gl.int32)
        aux1 = (aux >> 32).to(gl.int32)
        d = gl.load((rowp + num_sb * 64 + sb * 2 + slot * 0).to(gl.pointer_type(gl.int16)))
        return aux0, aux1, d, aux0, aux0, aux0, xt
    elif QTYPE == 16:
        # sub-block 4 HF + slot: 4 grid indices, then signs and scale (2-byte aligned blocks: 16-bit loads)
        base = rowp + sb * 66
        ap = (base + 2 + 8 * (4 * HF + slot)).to(gl.pointer_type(gl.int16))      # [BN, 4]
        aux0 = _word16(ap)
        aux1 = _word16(ap + 2)
        d = gl.load((base + slot * 0).to(gl.pointer_type(gl.int16)))
        return aux0, aux1, d, aux0, aux0, aux0, xt
    elif QTYPE == 22 and PACKED:
        # IQ2_S's PLANES: sub-block 4 HF + slot's index low bytes and sign bytes one aligned 8-byte load; its qh and
        # scale bytes from the row's second plane; then the rows' d
        ib = 4 * HF + slot
        pair = gl.load((rowp + sb * 64 + 8 * ib).to(gl.pointer_type(gl.int64)))
        qsw = pair.to(gl.int32)
        sgw = (pair >> 32).to(gl.int32)
        hs = rowp + num_sb * 64 + sb * 16 + ib
        qh = gl.load(hs).to(gl.int32)
        sc = gl.load(hs + 8).to(gl.int32)
        d = gl.load((rowp + num_sb * 80 + sb * 2 + slot * 0).to(gl.pointer_type(gl.int16)))
        return qsw, sgw, qh, sc, d, qsw, xt
    elif QTYPE == 22:
        # sub-block ib = 4 HF + slot: index low bytes and sign bytes of its 4 grid rows (16-bit loads), the index
        # high bits and the two scales (a byte each)
        base = rowp + sb * 82
        ib = 4 * HF + slot
        qp = (base + 2 + 4 * ib).to(gl.pointer_type(gl.int16))
        sp = (base + 34 + 4 * ib).to(gl.pointer_type(gl.int16))
        qsw = _word16(qp)
        sgw = _word16(sp)
        qh = gl.load(base + 66 + ib).to(gl.int32)
        sc = gl.load(base + 74 + ib).to(gl.int32)
        d = gl.load((base + slot * 0).to(gl.pointer_type(gl.int16)))
        return qsw, sgw, qh, sc, d, qsw, xt
    elif QTYPE == 18 or QTYPE == 21:
        # IQ3_XXS (98-byte blocks) and IQ3_S (110), 2-byte aligned (16-bit loads): sub-block ib = 4 HF + slot's 8 grid
        # indexes (low bytes), one a grid row of 4 values (words q0: rows 0-3, q1: rows 4-7); then IQ3_XXS its
        # sign/scale word from the 32 bytes after the indexes; IQ3_S its qh byte (bit r: row r's ninth index bit),
        # its 4 sign bytes (one a group of 8 values), its scale nibble
        BYTES: tl.constexpr = 98 if QTYPE == 18 else 110
        base = rowp + sb * BYTES
        ib = 4 * HF + slot
        qp = (base + 2 + 8 * ib).to(gl.pointer_type(gl.int16))
        q0 = _word16(qp)
        q1 = _word16(qp + 2)
        d = gl.load((base + slot * 0).to(gl.pointer_type(gl.int16)))
        if QTYPE == 18:
            aux = _word16((base + 66 + 4 * ib).to(gl.pointer_type(gl.int16)))
            return q0, q1, aux, d, d, d, xt
        else:
            qh = gl.load(base + 66 + ib).to(gl.int32)
            sgw = _word16((base + 74 + 4 * ib).to(gl.pointer_type(gl.int16)))
            sc = (gl.load(base + 106 + ib // 2).to(gl.int32) >> (4 * (ib % 2))) & 15
            return q0, q1, qh, sgw, sc, d, xt
    elif QTYPE == 8 and PACKED:
        # Q8_0_PACKED (pack_q8_0): the group's 8 scales, then its 256 codes: each slot's 16 code bytes one aligned
        # 16-byte load; values 64 j + p of the half (j = 0, 1) are code p & 31 of block 4 HF + 2 j + p5
        group = rowp + sb * 272
        blk = 4 * HF + slot // 2                                                # the block of j = 0, [1, 4]
        cp = (gl.expand_dims(group + 16 + 32 * blk + 16 * (slot % 2), 2)).to(gl.pointer_type(gl.int32)) \
            + gl.expand_dims(gl.expand_dims(word, 0), 1)
        c0 = gl.load(cp)
        c1 = gl.load(cp + 16)                                                   # 2 blocks (64 bytes) on
        d0 = gl.load((group + 2 * blk).to(gl.pointer_type(gl.int16)))
        d1 = gl.load((group + 2 * blk + 4).to(gl.pointer_type(gl.int16)))
        return c0, c1, d0, d1, d0, c0, xt
    elif QTYPE == 8:
        # values 64 j + p of the half (j = 0, 1) are code 2 + (p & 31) of block 4 HF + 2 j + p5: 2-byte aligned
        base = rowp + sb * 272 + 34 * (4 * HF + slot // 2)                   # the block of j = 0, [BN, 4]
        cp = (gl.expand_dims(base + 2 + 16 * (slot % 2), 2) + gl.expand_dims(gl.expand_dims(4 * word, 0), 1)
              ).to(gl.pointer_type(gl.int16))
        c0 = _word16(cp)
        c1 = _word16(cp + 34)   # 2 blocks on
        d0 = gl.load(base.to(gl.pointer_type(gl.int16)))
        d1 = gl.load((base + 68).to(gl.pointer_type(gl.int16)))
        return c0, c1, d0, d1, d0, c0, xt
    elif QTYPE == 14 and PACKED:
        # Q6_K's PLANES: a row's code bytes (each super-block's 128 low-nibble and 64 high-bit bytes)
        # first, 16-byte aligned: a slot's 16 low-nibble and 16 high-bit bytes are one load each; then the rows'
        # scales (16 a super-block), then their d
        codes = rowp + sb * 192
        ql = (gl.expand_dims(codes + 64 * HF + 16 * slot, 2)).to(gl.pointer_type(gl.int32)) \
            + gl.expand_dims(gl.expand_dims(word, 0), 1)
        qh = (gl.expand_dims(codes + 128 + 32 * HF + 16 * (slot % 2), 2)).to(gl.pointer_type(gl.int32)) \
            + gl.expand_dims(gl.expand_dims(word, 0), 1)
        low = gl.load(ql)
        high = gl.load(qh)
        scales = rowp + num_sb * 192 + sb * 16
        sc_lo = gl.load(scales + 8 * HF + slot)
        sc_hi = gl.load(scales + 4 + 8 * HF + slot)
        d = gl.load((rowp + num_sb * 208 + sb * 2 + slot * 0).to(gl.pointer_type(gl.int16)))
        return low, high, sc_lo, sc_hi, d, low, xt
    else:
        base = rowp + sb * 210                                          # 2-byte aligned blocks: 16-bit loads
        ql = (gl.expand_dims(base + 64 * HF + 16 * slot, 2) + gl.expand_dims(gl.expand_dims(4 * word, 0), 1)
              ).to(gl.pointer_type(gl.int16))
        qh = (gl.expand_dims(base + 128 + 32 * HF + 16 * (slot % 2), 2)
              + gl.expand_dims(gl.expand_dims(4 * word, 0), 1)).to(gl.pointer_type(gl.int16))
        low = _word16(ql)
        high = _word16(qh)
        sc_lo = gl.load(base + 192 + 8 * HF + slot)                     # int8 scale of values 16 slot ..
        sc_hi = gl.load(base + 196 + 8 * HF + slot)                     # .. and of 64 + 16 slot ..
        d = gl.load((base + 208 + slot * 0).to(gl.pointer_type(gl.int16)))
        return low, high, sc_lo, sc_hi, d, low, xt


@jit
def _consume_half(acc, QTYPE: tl.constexpr, stage, slot, HF: tl.constexpr, BN: tl.constexpr, L4: tl.constexpr,
                  ACC: tl.constexpr, BF16: tl.constexpr, grid_ptr, COLS: tl.constexpr, PACKED: tl.constexpr):
    w0, w1, w2, w3, w4, w5, xt = stage
    if QTYPE == 16:   # PACKED: its sign words were spread at load (pack_iq2_xxs)
        w_lo, w_hi = _iq2xxs_weights(w0, w1, w2, grid_ptr, BN, L4, BF16, PACKED)
    elif QTYPE == 22:
        w_lo, w_hi = _iq2s_weights(w0, w1, w2, w3, w4, grid_ptr, BN, L4, BF16)
    elif QTYPE == 18:
        w_lo, w_hi = _iq3xxs_weights(w0, w1, w2, w3, grid_ptr, BN, L4, BF16)
    elif QTYPE == 21:
        w_lo, w_hi = _iq3s_weights(w0, w1, w2, w3, w4, w5, grid_ptr, BN, L4, BF16)
    elif QTYPE == 10:
        a_lo, b_lo, a_hi, b_hi = _q2k_scales(w1, w2, slot, BF16)
        w_lo, w_hi = _weights(QTYPE, _bytes(w0, L4), w0, a_lo, b_lo, a_hi, b_hi, BF16)
    elif QTYPE == 12 or QTYPE == 13:
        a_lo, b_lo, a_hi, b_hi = _q4k_scales(w1, w2, w3, w4, slot, HF, BF16)
        if QTYPE == 13:  # bit 2c of high-bit byte l is value l's fifth bit in group 2c: to bits 0 (low), 1 (high)
            high = w5 >> gl.expand_dims(2 * (2 * HF + slot // 2), 2)
        else:
            high = w5
        w_lo, w_hi = _weights(QTYPE, _bytes(w0, L4), _bytes(high, L4), a_lo, b_lo, a_hi, b_hi, BF16)
    elif QTYPE == 8:
        if BF16:
            dt: tl.constexpr = gl.bfloat16
        else:
            dt: tl.constexpr = gl.float16
        a_lo = w2.to(gl.float16, bitcast=True).to(dt)
        a_hi = w3.to(gl.float16, bitcast=True).to(dt)
        w_lo, w_hi = _weights(QTYPE, _bytes(w0, L4), _bytes(w1, L4), a_lo, a_lo, a_hi, a_hi, BF16)
    else:
        if BF16:
            dt: tl.constexpr = gl.bfloat16
        else:
            dt: tl.constexpr = gl.float16
        d = w4.to(gl.float16, bitcast=True).to(gl.float32)
        a_lo = (d * w2.to(gl.int8, bitcast=True).to(gl.float32)).to(dt)
        a_hi = (d * w3.to(gl.int8, bitcast=True).to(gl.float32)).to(dt)
        high = w1 >> gl.expand_dims(2 * (slot // 2), 2)                 # bits 2 (p >> 5) to bits 0-1 (and 4-5)
        w_lo, w_hi = _weights(QTYPE, _bytes(w0, L4), _bytes(high, L4), a_lo, a_lo, a_hi, a_hi, BF16)
    return _half_dot(acc, w_lo, w_hi, xt, QTYPE, BN, ACC, COLS)


@jit
def _pick(vec, lanes, j):
    """vec[j] of a small register vector (every thread holds all of it), as a scalar."""
    return gl.sum(gl.where(lanes == j, vec, 0), axis=0)


@jit
def _prefetch_l2(p, NBYTES: tl.constexpr):
    """Ask L2 for the cache lines of NBYTES bytes from each of the byte pointers p (the GPU only: the interpreter
    has no cache)."""
    if not INTERPRET_K:
        for off in gl.static_range(0, NBYTES, 128):
            gl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [p + off], dtype=gl.int32,
                                      is_pure=False, pack=1)
        gl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [p + (NBYTES - 1)],
                                  dtype=gl.int32, is_pure=False, pack=1)


@jit
def _unit(u, rowp, act_p, ids_vec, rw_vec, lanes, rows_off, w_ptr, stride_we, stride_xm, sb_per_expert,
          ROUTING: tl.constexpr):
    """(weight row pointers, activation pointers, super-block, routing weight) of unit u of the program's K loop:
    super-block u of the one weight, or (TOKEN_SUM) super-block u % sb_per_expert of the expert of top-k slot
    u // sb_per_expert, against that slot's activation row."""
    if ROUTING == TOKEN_SUM:
        j = u // sb_per_expert
        e = _pick(ids_vec, lanes, j).to(gl.int64)
        return (gl.expand_dims(w_ptr + e * stride_we + rows_off, 1), act_p + j * stride_xm, u - j * sb_per_expert,
                _pick(rw_vec, lanes, j))
    return rowp, act_p, u, 1.0


@jit
def _mma_kernel(x_ptr, w_ptr, out_ptr, route_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, final_ptr,
                counter_ptr, grid_ptr, num_valid, N, num_units, units_per_split, sb_per_expert, num_splits, a_row_div,
                top_k, stride_xm, stride_we, stride_wn, stride_os, stride_om, stride_fm,
                QTYPE: tl.constexpr, WARPS: tl.constexpr, REPS: tl.constexpr, MOE: tl.constexpr,
                ROUTE_WEIGHTED: tl.constexpr, ROUTING: tl.constexpr, EPILOGUE: tl.constexpr, TOPK: tl.constexpr,
                COLS: tl.constexpr, PACKED: tl.constexpr, AHEAD: tl.constexpr = 1, L2_AHEAD: tl.constexpr = 0,
                UNIT_BYTES: tl.constexpr = 0):
    """out[s, row, n] = sum over the units of split s of x[row', k] * W[n, k] for the COLS columns of block
    program_id(0) // cdiv(N, BN) and the BN output features of program_id(0) % cdiv(N, BN):

    * dense (not MOE): columns = rows COLS b .. COLS b + COLS - 1 of x, units = super-blocks of K;
    * SORTED: columns = sorted_ids' block b (moe_align layout in blocks of COLS, expert expert_ids[b]), x row =
      id // a_row_div;
    * PAIRS (COLS 8): column 0 = routed pair b (expert expert_ids[b], topk_ids flattened), x row = b // a_row_div;
    * TOKEN_SUM (COLS 8): column 0 = token b; units = (top-k slot, super-block) pairs: slot j's expert
      expert_ids[b top_k + j] against x row b top_k + j, each slot's sum times its routing weight (the top-k sum of
      a w2 pass).

    Times the routing weight of the column when ROUTE_WEIGHTED.  Columns >= num_valid are neither read nor written.
    PACKED: a Q8_0 or Q6_K weight in pack's layout (16-byte code loads) rather than the file's.
    AHEAD: halves of a super-block whose loads are in flight while one is decoded (1: the next half; 2: the next
    unit's two halves, one more half of registers for twice the bytes in flight).
    L2_AHEAD: > 0 prefetches each row's UNIT_BYTES (a super-block's, or its code plane's where packed) of the unit
    that many units on into L2 (prefetch.global.L2: no register holds them, nothing waits for them), so that the
    loads find them there.
    EPILOGUE: STORE writes out (a split plane, or the result); REDUCE and REDUCE_SILU write float32 planes, and the
    last program to finish a tile (arrival counted at counter_ptr, reset to 0 by it) sums the planes into final —
    REDUCE_SILU: a pair of tiles, gate rows f and up rows N / 2 + f, into SiLU(gate) * up."""
    BF16: tl.constexpr = x_ptr.dtype.element_ty == gl.bfloat16
    L4: tl.constexpr = _layout(WARPS, REPS, QTYPE, 0)
    LX: tl.constexpr = _layout(WARPS, REPS, QTYPE, 1, COLS)
    ACC: tl.constexpr = _layout(WARPS, REPS, QTYPE, 2, COLS)
    BN: tl.constexpr = 16 * WARPS * REPS
    LWORD: tl.constexpr = gl.SliceLayout(3, L4)     # [BN, 4, 4] words of code bytes
    LSLOT: tl.constexpr = gl.SliceLayout(2, LWORD)  # [BN, 4] one value a row and slot (scales, header words)
    pid = gl.program_id(0)
    pid_s = gl.program_id(1)
    num_n = gl.cdiv(N, BN)
    pid_m = pid // num_n
    pid_n = pid % num_n
    w_base = w_ptr
    if MOE:
        if ROUTING == SORTED:
            if pid_m * COLS >= gl.load(num_padded_ptr):
                return
            w_base = w_ptr + gl.load(expert_ids_ptr + pid_m).to(gl.int64) * stride_we
        elif ROUTING == PAIRS:
            w_base = w_ptr + gl.load(expert_ids_ptr + pid_m).to(gl.int64) * stride_we
    r1 = gl.arange(0, BN, layout=gl.SliceLayout(1, LSLOT))
    slot = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LSLOT)), 0)
    word = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LWORD)))
    rows_off = gl.minimum(pid_n * BN + r1, N - 1).to(gl.int64) * stride_wn  # clamped: every weight load in bounds
    rowp = gl.expand_dims(w_base + rows_off, 1)
    # activation rows [COLS, 128]: the columns' ids, which are valid, the x row each reads
    tok_x = gl.arange(0, COLS, layout=gl.SliceLayout(1, LX))
    val_x = gl.arange(0, 128, layout=gl.SliceLayout(0, LX))
    if MOE and ROUTING == SORTED:
        ids_x = gl.load(sorted_ids_ptr + pid_m * COLS + tok_x)
        ok_x = ids_x < num_valid
    elif MOE:
        ids_x = pid_m + tok_x * 0
        ok_x = (tok_x == 0) & (ids_x < num_valid)
    else:
        ids_x = pid_m * COLS + tok_x
        ok_x = ids_x < num_valid
    if ROUTING == TOKEN_SUM:
        x_rows = gl.where(ok_x, ids_x, 0).to(gl.int64) * top_k
        LK: tl.constexpr = gl.BlockedLayout([TOPK], [32], [WARPS], [0])
        lanes = gl.arange(0, TOPK, layout=LK)
        ids_vec = gl.load(expert_ids_ptr + pid_m * top_k + lanes, mask=lanes < top_k, other=0)
        rw_vec = gl.load(route_w_ptr + pid_m * top_k + lanes, mask=lanes < top_k, other=0.0).to(gl.float32)
    else:
        x_rows = gl.where(ok_x, ids_x, 0).to(gl.int64) // a_row_div
        lanes = pid_m
        ids_vec = pid_m
        rw_vec = pid_m
    act_p = x_ptr + gl.expand_dims(x_rows * stride_xm, 1) + gl.expand_dims(val_x, 0)
    x_ok = gl.expand_dims(ok_x, 1)

    first = pid_s * units_per_split
    last = gl.minimum(first + units_per_split, num_units)
    acc = gl.zeros([BN, COLS], gl.float32, layout=ACC)
    total = gl.zeros([BN, COLS], gl.float32, layout=ACC)   # TOKEN_SUM: the slots' weighted sums
    rp, ap, sb, rw = _unit(first, rowp, act_p, ids_vec, rw_vec, lanes, rows_off, w_ptr, stride_we, stride_xm,
                           sb_per_expert, ROUTING)
    stage0 = _load_half(QTYPE, rp, slot, word, ap, x_ok, sb, 0, BN, L4, PACKED, sb_per_expert)
    if AHEAD == 2:
        stage1 = _load_half(QTYPE, rp, slot, word, ap, x_ok, sb, 1, BN, L4, PACKED, sb_per_expert)
    for u in range(first, last):
        if L2_AHEAD > 0:
            rpp, app, sbp, rwp = _unit(gl.minimum(u + L2_AHEAD, last - 1), rowp, act_p, ids_vec, rw_vec, lanes,
                                       rows_off, w_ptr, stride_we, stride_xm, sb_per_expert, ROUTING)
            _prefetch_l2(rpp + sbp * UNIT_BYTES, UNIT_BYTES)
        rp, ap, sb, rw = _unit(u, rowp, act_p, ids_vec, rw_vec, lanes, rows_off, w_ptr, stride_we, stride_xm,
                               sb_per_expert, ROUTING)
        rpn, apn, sbn, rwn = _unit(gl.minimum(u + 1, last - 1), rowp, act_p, ids_vec, rw_vec, lanes, rows_off,
                                   w_ptr, stride_we, stride_xm, sb_per_expert, ROUTING)
        if AHEAD == 2:
            # issue the next unit's two halves, then decode this unit's two
            next0 = _load_half(QTYPE, rpn, slot, word, apn, x_ok, sbn, 0, BN, L4, PACKED, sb_per_expert)
            next1 = _load_half(QTYPE, rpn, slot, word, apn, x_ok, sbn, 1, BN, L4, PACKED, sb_per_expert)
            acc = _consume_half(acc, QTYPE, stage0, slot, 0, BN, L4, ACC, BF16, grid_ptr, COLS, PACKED)
            acc = _consume_half(acc, QTYPE, stage1, slot, 1, BN, L4, ACC, BF16, grid_ptr, COLS, PACKED)
            stage0 = next0
            stage1 = next1
        else:
            # issue the second half's loads, decode the first; issue the next unit's first half, decode the second
            stage1 = _load_half(QTYPE, rp, slot, word, ap, x_ok, sb, 1, BN, L4, PACKED, sb_per_expert)
            acc = _consume_half(acc, QTYPE, stage0, slot, 0, BN, L4, ACC, BF16, grid_ptr, COLS, PACKED)
            stage0 = _load_half(QTYPE, rpn, slot, word, apn, x_ok, sbn, 0, BN, L4, PACKED, sb_per_expert)
            acc = _consume_half(acc, QTYPE, stage1, slot, 1, BN, L4, ACC, BF16, grid_ptr, COLS, PACKED)
        if ROUTING == TOKEN_SUM:   # a slot ends (or the split does): its sum joins the total, weighted
            done = (sb == sb_per_expert - 1) | (u == last - 1)
            total = total + acc * gl.where(done, rw, 0.0)
            acc = acc * gl.where(done, 0.0, 1.0)
    if ROUTING == TOKEN_SUM:
        acc = total

    feat = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, ACC))
    tok_c = gl.arange(0, COLS, layout=gl.SliceLayout(0, ACC))
    if MOE and ROUTING == SORTED:
        ids_c = gl.load(sorted_ids_ptr + pid_m * COLS + tok_c)
        ok_c = ids_c < num_valid
    elif MOE:
        ids_c = pid_m + tok_c * 0
        ok_c = (tok_c == 0) & (ids_c < num_valid)
    else:
        ids_c = pid_m * COLS + tok_c
        ok_c = ids_c < num_valid
    ids_c = gl.where(ok_c, ids_c, 0).to(gl.int64)
    if ROUTE_WEIGHTED:
        acc = acc * gl.expand_dims(gl.load(route_w_ptr + ids_c, mask=ok_c, other=0.0).to(gl.float32), 0)
    col_off = gl.expand_dims(ids_c * stride_om, 0)
    op = out_ptr + pid_s * stride_os + col_off + gl.expand_dims(feat, 1)
    mask = gl.expand_dims(ok_c, 0) & gl.expand_dims(feat < N, 1)
    gl.store(op, acc.to(out_ptr.dtype.element_ty), mask=mask)
    if EPILOGUE != STORE:
        # the planes of this program are written; count it in (release: every thread's stores first), and the
        # last of the tile's programs (acquire: their planes are visible) sums them
        gl.thread_barrier()
        if EPILOGUE == REDUCE:
            tile = pid
            n_arrivals = num_splits
        else:
            half_n = num_n // 2
            tile = pid_m * half_n + pid_n % half_n
            n_arrivals = 2 * num_splits
        if gl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == n_arrivals - 1:
            out_col = gl.expand_dims(ids_c * stride_fm, 0)
            if EPILOGUE == REDUCE:
                total = gl.zeros([BN, COLS], gl.float32, layout=ACC)
                for s in range(num_splits):
                    total += gl.load(op + (s - pid_s) * stride_os, mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(final_ptr + out_col + gl.expand_dims(feat, 1), total.to(final_ptr.dtype.element_ty),
                         mask=mask)
            else:
                f = (pid_n % half_n) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, ACC))
                half_mask = gl.expand_dims(ok_c, 0) & gl.expand_dims(f < N // 2, 1)
                gp = out_ptr + col_off + gl.expand_dims(f, 1)
                g = gl.zeros([BN, COLS], gl.float32, layout=ACC)
                up = gl.zeros([BN, COLS], gl.float32, layout=ACC)
                for s in range(num_splits):
                    g += gl.load(gp + s * stride_os, mask=half_mask, other=0.0, cache_modifier=".cg")
                    up += gl.load(gp + s * stride_os + N // 2, mask=half_mask, other=0.0, cache_modifier=".cg")
                gl.store(final_ptr + out_col + gl.expand_dims(f, 1),
                         (g / (1.0 + gl.exp(-g)) * up).to(final_ptr.dtype.element_ty), mask=half_mask)
            gl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed", scope="gpu")   # ready for the next launch


def _renamed(fn, name: str):
    """The Python function fn under another name (Triton names the compiled kernel after it).  The annotations
    travel too: they are what makes a parameter a constexpr (without them WARPS, QTYPE... became run-time scalars
    and the launch failed to compile, while offline compiles, which name the constexprs, passed)."""
    import types
    copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__module__, copy.__doc__ = name, fn.__module__, fn.__doc__
    copy.__annotations__, copy.__kwdefaults__ = dict(fn.__annotations__), fn.__kwdefaults__
    return copy


# The same kernel, named for MoE passes: a profile (bench/slice_parts/kernels.py) tells a MoE's launches from dense
# linears' by the kernel's name, which is all a CUDA graph's trace keeps (the interpreter re-reads the source, which
# names it _mma_kernel: there it is the same object)
_mma_moe_kernel = _mma_kernel if INTERPRET_K.value else jit(_renamed(_mma_kernel.fn, "_mma_moe_kernel"))


# ----------------------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------------------

# Launch shape: 4 warps x `reps` row repeats = 16 x 4 x reps output features a program, K split so programs cover
# the GPU ctas_per_sm times.  The 2026-12-03 sweeps on the H200 (bench/gguf_matmul.py --parts mma_sweep):
# 64-row programs (reps 1) against 128-row ones, TP-8 MoE at T = 1 / 8 / 32 and one dense shape at 1 row:
#   Q4_K 16 / 15 / 16 % faster (and 27 % on q_a+kv_a; 8 warps or 2-8 programs an SM did not beat 4 warps x 4),
#   Q5_K 19 / 4 / 1.5 %, Q8_0 9 / 2 / 2 % (lm_head 8 and 13 %): reps 1;
#   Q6_K 8 % faster at T = 1 but 2-2.5 % slower at 8 and 32, IQ2_XXS / IQ2_S within -7..+4 %: left at 128 rows.
# The outputs agree with the 128-row ones within 8e-4 relative (split sums in another order).
# Loads ahead, 2026-12-06 (bench/journal/; the same sweep on an H200 and an H100, TP-8 MoE at T = 1-64): AHEAD=2 (the
# next unit's two halves in flight) Q2_K 2-11 % faster at T >= 8 on both, Q4_K 0-5 % on the H200 and 4-13 % on the
# H100 (same output bit for bit); Q6_K (packed) -6..+5 %, IQ2_XXS -4..+1 %: left at 1.  Under ncu (H200, Q4_K, 32
# tokens) the w13 pass waits on loads 58 % of its stall cycles at 5.4 warps a scheduler and 44 % of DRAM bandwidth;
# IQ2_XXS issues on 61-65 % of cycles with the SM's pipes 69-75 % busy, DRAM at 19-21 %: bound by its decode's
# instructions, which more loads in flight do not shorten.  L2_AHEAD (L2 prefetch) 0-12 % slower: off.  More K
# splits (ctas_per_sm 8-32) mixed within +-8 %: 4.
MMA_TUNING = dict(num_warps=4, reps=2, ctas_per_sm=4, ahead=1, l2_ahead=0)
MMA_TUNING_BY_TYPE = {Q4_K: dict(reps=1, ahead=2), Q5_K: dict(reps=1), Q8_0: dict(reps=1), Q2_K: dict(ahead=2)}


def tuning_for(qtype: int, tuning: dict | None = None) -> dict:
    """The launch shape of ``qtype``'s programs: MMA_TUNING, its type's measured change, then ``tuning``'s keys."""
    return {**MMA_TUNING, **MMA_TUNING_BY_TYPE.get(int(qtype), {}), **(tuning or {})}


def ahead_for(tuning: dict, cols: int, routing: int) -> int:
    """The AHEAD a launch takes: its tuning's, but 1 for programs wider than TOKENS rows and for the top-k sum (with
    2 they spill: 32-row programs on every target, Q4_K's top-k sum on sm_80 and sm_120, 2026-12-06)."""
    if tuning["ahead"] not in (1, 2):
        raise ValueError(f"ahead={tuning['ahead']}: the kernel loads 1 (the next half) or 2 (the next unit) ahead")
    return tuning["ahead"] if cols == TOKENS and routing != TOKEN_SUM.value else 1


def block_rows(tuning: dict) -> int:
    """Output features a program computes (tuning: a whole launch shape, see tuning_for)."""
    return 16 * tuning["num_warps"] * tuning["reps"]


def splits(tiles: int, num_sb: int, num_sms: int, tuning: dict) -> tuple[int, int]:
    """(splits, super-blocks per split) so that tiles x splits covers the GPU ctas_per_sm times."""
    split = max(1, min(num_sb, -(-tuning["ctas_per_sm"] * num_sms // max(tiles, 1))))
    per = -(-num_sb // split)
    return -(-num_sb // per), per


# A program's activation rows (COLS) by the rows it would otherwise share a weight tile with: up to 8, 8; then the
# wider blocks, each decoded weight multiplied by up to 32 rows (prefill-sized MoEs, dense linears of 9-32 rows)
def cols_for(rows: float) -> int:
    """The COLUMN_BLOCKS entry for ``rows`` activation rows a weight tile (MoE: routed rows an expert, on average)."""
    return next((c for c in COLUMN_BLOCKS if rows <= c), COLUMN_BLOCKS[-1])


def covers(qtype: int, k: int, dtype, types: tuple = MMA_TYPES) -> bool:
    """True when the plans run a weight of ``qtype`` with input width k for ``dtype`` activations here (types:
    KERNEL_TYPES for what the kernel can compute at all)."""
    import torch
    return int(qtype) in types and k % SB_VALUES.value == 0 and dtype in (torch.bfloat16, torch.float16)


# bytes: Q4_K/Q5_K rows are read as int32 words, the others int16
ROW_ALIGN = {Q4_K: 4, Q5_K: 4, Q2_K: 4, Q6_K: 2, Q8_0: 2, IQ2_XXS: 2, IQ2_S: 2, IQ3_XXS: 2, IQ3_S: 2}


# pack's layouts: each thread's code bytes are one 16-byte load (IQ2: its 8 bytes of a sub-block, one 8-byte load)
PACKED_ROW_ALIGN = {Q8_0: 16, Q6_K: 16, IQ2_XXS: 8, IQ2_S: 8}


def aligned(w, qtype: int, packed: bool = False) -> bool:
    """Whether the rows (and experts) of w start where the kernel's loads need them to."""
    a = PACKED_ROW_ALIGN[int(qtype)] if packed else ROW_ALIGN[int(qtype)]
    return w.data_ptr() % a == 0 and all(st % a == 0 for st in w.stride()[:-1])


def launch(x, w, out, *, qtype: int, n: int, num_valid: int, num_blocks: int, split: int, sb_per_split: int,
           a_row_div: int = 1, route=None, routing: int = 0, final=None, gated: bool = False, top_k: int = 1,
           grid_table=None, tuning: dict | None = None, cols: int = TOKENS, packed: bool = False) -> None:
    """One launch: x [rows, K] (bf16/fp16), w [N, row bytes] (linear) or [E, N, row bytes] (with route), out
    [split, out rows, N] float32 partial sums (split > 1, or final given) or [out rows, N].

    route: None for a dense linear (rows cols b .. cols b + cols - 1 of x for block b), or (sorted_ids, expert_ids,
    num_padded, route weights or None) for a MoE pass — routing SORTED: moe_align's layout in blocks of cols rows
    (each decoded weight multiplied by all of them); PAIRS: one
    routed pair a block, expert_ids = topk_ids flattened (sorted_ids, num_padded None); TOKEN_SUM: one token a block
    summed over its top_k slots (expert_ids = topk_ids flattened, route weights required), sb_per_split then counts
    (slot, super-block) units.  final: the launch's result [out rows, N] (gated: [out rows, N / 2], SiLU(gate) * up),
    written by the last program of each tile from the planes in out.  packed: w is in pack's layout (PACKERS)."""
    if packed and int(qtype) not in PACKERS:
        raise ValueError(f"packed weights are {'/'.join(gguf.GGMLQuantizationType(t).name for t in PACKERS)} only, "
                         f"not {gguf.GGMLQuantizationType(qtype).name}")
    t = tuning_for(qtype, tuning)
    bn = block_rows(t)
    moe = route is not None
    if cols not in COLUMN_BLOCKS or (cols != TOKENS and routing != SORTED.value):
        raise ValueError(f"cols={cols}: {COLUMN_BLOCKS} rows a program with SORTED routing or a dense linear, "
                         f"{TOKENS} otherwise")
    sorted_ids, expert_ids, num_padded, route_w = route if moe else (None, None, None, None)
    num_sb = x.shape[1] // SB_VALUES.value
    units = top_k * num_sb if routing == TOKEN_SUM.value else num_sb
    grid = (num_blocks * -(-n // bn), split)
    if final is not None and gated and n % (2 * bn):
        raise ValueError(f"a gated launch needs gate and up tiles of {bn} rows: N = {n}")
    # summed below, in separate launches: GLM5_SHIM_GGUF_SPLITS=launch, or more tiles than counters
    separate = final is not None and not arrivals.in_kernel(grid[0] // 2 if gated else grid[0])
    epilogue = STORE.value if final is None or separate else (REDUCE_SILU.value if gated else REDUCE.value)
    counter = arrivals.counters(x.device) if epilogue != STORE.value else out
    (_mma_moe_kernel if moe else _mma_kernel)[grid](
        x, w, out, route_w if route_w is not None else out, sorted_ids if sorted_ids is not None else out,
        expert_ids if expert_ids is not None else out, num_padded if num_padded is not None else out,
        final if final is not None else out, counter, grid_table if grid_table is not None else w, num_valid, n,
        units, sb_per_split, num_sb, split, a_row_div, top_k, x.stride(0), w.stride(0) if moe else 0, w.stride(-2),
        out.stride(0) if out.dim() == 3 else 0, out.stride(-2), final.stride(0) if final is not None else 0,
        QTYPE=qtype, WARPS=t["num_warps"],
        REPS=t["reps"], MOE=moe, ROUTE_WEIGHTED=route_w is not None and routing != TOKEN_SUM.value,
        ROUTING=routing, EPILOGUE=epilogue, TOPK=max(2, 1 << (top_k - 1).bit_length()), COLS=cols, PACKED=packed,
        AHEAD=ahead_for(t, cols, routing),
        L2_AHEAD=t["l2_ahead"], UNIT_BYTES=unit_bytes(qtype, packed), num_warps=t["num_warps"])
    if separate:
        _sum_planes(out, final, gated)


def _sum_planes(planes, final, gated: bool) -> None:
    """What the reducing epilogues compute, in separate launches: final = the planes' sum over the splits (gated:
    SiLU of the gate half's sum times the up half's, in float32 as the kernel does)."""
    import torch
    total = planes.sum(0)
    if gated:
        half = total.shape[1] // 2
        total = torch.nn.functional.silu(total[:, :half]) * total[:, half:]
    final.copy_(total)


def linear(x, qweight, qtype: int, n: int, num_sms: int, tuning: dict | None = None, grid_table=None,
           cols: int | None = None, packed: bool = False):
    """x [M, K] @ W[:n].T for a weight of one of MMA_TYPES [>= n, row bytes]: M rows in blocks of cols (default
    cols_for(M)), K split to fill the GPU, the split sums added by the last program of each tile (one launch).
    packed: a weight in pack's layout (PACKERS)."""
    import torch
    m, k = x.shape
    tuning = tuning_for(qtype, tuning)
    cols = cols or cols_for(m)
    num_blocks = -(-m // cols)
    tiles = num_blocks * -(-n // block_rows(tuning))
    split, per = splits(tiles, k // SB_VALUES.value, num_sms, tuning)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if split == 1:
        launch(x, qweight, out, qtype=qtype, n=n, num_valid=m, num_blocks=num_blocks, split=1, sb_per_split=per,
               grid_table=grid_table, tuning=tuning, cols=cols, packed=packed)
    else:
        part = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
        launch(x, qweight, part, qtype=qtype, n=n, num_valid=m, num_blocks=num_blocks, split=split,
               sb_per_split=per, final=out, grid_table=grid_table, tuning=tuning, cols=cols, packed=packed)
    return out


# Q8_0_PACKED: Q8_0's bytes regrouped so that the kernel's code loads are 16-byte aligned.  The file's 34-byte blocks
# (fp16 d, 32 int8 codes) are only 2-byte aligned, so a thread's 16 code bytes took eight 2-byte loads (the 2026-12-04
# table: Q8_0 at 27-36 % of its read floor, below Q4_K's 16-byte-aligned blocks although its decode is cheaper).
# Packed, each group of 8 blocks (256 values, 272 bytes: the same size) holds its 8 d first (16 bytes), then its 256
# codes in block order.  Exact: the same bytes, moved.  Measured on the H200 (2026-12-05): Q8_0 MoE decode at 42-75 %
# of the bandwidth floor against 24-36 % in the file's layout; serving repacks at load (loading/gguf_repack.py).
Q8_0_GROUP_BLOCKS, Q8_0_BLOCK_BYTES = 8, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][1]


def pack_q8_0(w):
    """A Q8_0 weight [..., row bytes] (K a multiple of 256) in the packed layout above; same shape and dtype."""
    import torch
    group = Q8_0_GROUP_BLOCKS * Q8_0_BLOCK_BYTES
    if w.dtype != torch.uint8 or w.shape[-1] % group:
        raise ValueError(f"pack_q8_0: a uint8 Q8_0 weight with rows of whole {group}-byte groups (K a multiple of "
                         f"{SB_VALUES.value}), got {w.dtype} rows of {w.shape[-1]} bytes")
    blocks = w.reshape(*w.shape[:-1], -1, Q8_0_GROUP_BLOCKS, Q8_0_BLOCK_BYTES)
    scales = blocks[..., :2].reshape(*blocks.shape[:-2], 2 * Q8_0_GROUP_BLOCKS)
    codes = blocks[..., 2:].reshape(*blocks.shape[:-2], 32 * Q8_0_GROUP_BLOCKS)
    return torch.cat([scales, codes], -1).reshape(w.shape).contiguous()


def unpack_q8_0(w):
    """pack_q8_0's inverse: the file's Q8_0 layout again."""
    import torch
    group = w.reshape(*w.shape[:-1], -1, Q8_0_GROUP_BLOCKS * Q8_0_BLOCK_BYTES)
    scales = group[..., :2 * Q8_0_GROUP_BLOCKS].reshape(*group.shape[:-1], Q8_0_GROUP_BLOCKS, 2)
    codes = group[..., 2 * Q8_0_GROUP_BLOCKS:].reshape(*group.shape[:-1], Q8_0_GROUP_BLOCKS, 32)
    return torch.cat([scales, codes], -1).reshape(w.shape).contiguous()


# Row-planar packed layouts (Q6_K, IQ2_XXS, IQ2_S): the file's blocks are only 2-byte aligned, so a thread's code
# bytes took 2-byte loads.  Packed, a row holds its super-blocks' bytes regrouped in planes: each plane is the same
# bytes of every super-block of the row (PLANES: the block offsets it takes, in order), the code plane first, 8- or
# 16-byte aligned wherever a row starts; then the scale planes; the row padded to PACKED_ROW_ALIGN.  Exact: the same
# bytes, moved.
#   Q6_K (210 B): 128 low-nibble + 64 high-bit bytes (a slot's 16 of each one 16-byte load), 16 int8 scales, d;
#   IQ2_XXS (66 B): 8 sub-blocks of (4 grid-index bytes, the sign/scale word, its signs re-encoded: pack_iq2_xxs):
#   one 8-byte load a sub-block; d;
#   IQ2_S (82 B): 8 sub-blocks of (4 grid-index low bytes, 4 sign bytes): one 8-byte load a sub-block; the 8 qh bytes
#   and the 8 scale bytes; d.
# (The kernels' offsets into each plane are in gguf_matmul._load_step and _load_half; tests pin them to these.)
PLANES = {
    Q6_K: (tuple(range(0, 192)), tuple(range(192, 208)), (208, 209)),
    IQ2_XXS: (tuple(range(2, 66)), (0, 1)),
    IQ2_S: (tuple(b for j in range(8) for b in (*range(2 + 4 * j, 6 + 4 * j), *range(34 + 4 * j, 38 + 4 * j))),
            tuple(range(66, 82)), (0, 1)),
}


def _block_bytes(qtype: int) -> int:
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)][1]


def unit_bytes(qtype: int, packed: bool = False) -> int:
    """Bytes a row holds for one super-block (256 values) in its first plane: a K-quant's super-block, Q8_0's 8
    blocks, an IQ type's block; packed planar layouts (PLANES) their code plane (the plane that follows it starts
    after all of the row's)."""
    q = int(qtype)
    if packed and q in PLANES:
        return len(PLANES[q][0])
    return _block_bytes(q) * (SB_VALUES.value // gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(q)][0])


for _qt, _planes in PLANES.items():   # every byte of the block in exactly one plane
    assert sorted(b for p in _planes for b in p) == list(range(_block_bytes(_qt))), _qt


def planar_row_bytes(qtype: int, k: int) -> int:
    """Bytes of a packed row of k values (a multiple of 256) of a PLANES type."""
    align = PACKED_ROW_ALIGN[int(qtype)]
    return -(-(k // SB_VALUES.value) * _block_bytes(qtype) // align) * align


def pack_planar(w, qtype: int):
    """A weight [..., row bytes] of a PLANES type in its packed layout: [..., planar_row_bytes(K)]."""
    import torch
    nbytes, name = _block_bytes(qtype), gguf.GGMLQuantizationType(qtype).name
    if w.dtype != torch.uint8 or w.shape[-1] % nbytes:
        raise ValueError(f"pack {name}: a uint8 {name} weight with rows of whole {nbytes}-byte super-blocks, got "
                         f"{w.dtype} rows of {w.shape[-1]} bytes")
    nsb = w.shape[-1] // nbytes
    blocks = w.reshape(*w.shape[:-1], nsb, nbytes)
    parts = [blocks[..., list(plane)].reshape(*w.shape[:-1], -1) for plane in PLANES[int(qtype)]]
    parts.append(w.new_zeros(*w.shape[:-1], planar_row_bytes(qtype, nsb * SB_VALUES.value) - w.shape[-1]))
    return torch.cat(parts, -1).contiguous()


def unpack_planar(w, qtype: int, k: int):
    """pack_planar's inverse for rows of k values: the file's layout again."""
    import torch
    nsb, nbytes = k // SB_VALUES.value, _block_bytes(qtype)
    lead = w.shape[:-1]
    out = torch.empty(*lead, nsb, nbytes, dtype=w.dtype, device=w.device)
    at = 0
    for plane in PLANES[int(qtype)]:
        out[..., list(plane)] = w[..., at:at + nsb * len(plane)].reshape(*lead, nsb, len(plane))
        at += nsb * len(plane)
    return out.reshape(*lead, nsb * nbytes)


def q6_k_packed_row_bytes(k: int) -> int:
    return planar_row_bytes(Q6_K, k)


def pack_q6_k(w):
    return pack_planar(w, Q6_K)


def iq2_xxs_packed_row_bytes(k: int) -> int:
    return planar_row_bytes(IQ2_XXS, k)


# Packed IQ2_XXS also re-encodes each sub-block's sign/scale word.  The file's holds grid row g's 7-bit sign index at
# bits 7 g .. 7 g + 6 (sign i of the row's 8 values at bit 7 g + i; the eighth is their parity) and the scale at
# 28-31.  Packed, sign i = 2 j + e of row g sits at bit 4 j + g + 16 e (the eighth, j = 3 and e = 1, left out: bits
# 28-31 keep the scale): the two signs of the values one bf16x2 register holds are then one shift from bits 15 and
# 31, where the decode xors them in (_iq_weights_spread), instead of an extract, a popc and a multiply a row.
IQ2XXS_SIGN_MOVES = tuple((7 * g + i, 4 * (i >> 1) + g + 16 * (i & 1)) for g in range(4) for i in range(7))
_SCALE_BITS = -(1 << 28)   # 0xF0000000 as int32


def _move_bits(words, moves):
    """words (int32) with bit src moved to bit dst for each (src, dst) of moves, the scale bits kept: one shift and
    mask for all the bits that move by the same distance."""
    import torch
    by_shift = {}
    for src, dst in moves:
        by_shift[dst - src] = by_shift.get(dst - src, 0) | (1 << dst)
    out = words & _SCALE_BITS
    for shift, mask in sorted(by_shift.items()):
        moved = torch.bitwise_left_shift(words, shift) if shift >= 0 else torch.bitwise_right_shift(words, -shift)
        out |= moved.bitwise_and_(mask)
    return out


def spread_iq2xxs_signs(words):
    """int32 sign/scale words of IQ2_XXS sub-blocks, the file's encoding -> the packed one (IQ2XXS_SIGN_MOVES)."""
    return _move_bits(words, IQ2XXS_SIGN_MOVES)


def gather_iq2xxs_signs(words):
    """spread_iq2xxs_signs' inverse."""
    return _move_bits(words, tuple((dst, src) for src, dst in IQ2XXS_SIGN_MOVES))


def pack_iq2_xxs(w):
    """pack_planar's layout with each sign/scale word spread (spread_iq2xxs_signs)."""
    packed = pack_planar(w, IQ2_XXS)
    nsb = w.shape[-1] // _block_bytes(IQ2_XXS)
    _map_sign_words(packed, nsb, spread_iq2xxs_signs)
    return packed


def unpack_iq2_xxs(w, k: int):
    """pack_iq2_xxs' inverse: the file's layout again."""
    w = w.contiguous().clone()
    _map_sign_words(w, k // SB_VALUES.value, gather_iq2xxs_signs)
    return unpack_planar(w, IQ2_XXS, k)


def _map_sign_words(packed, nsb: int, recode) -> None:
    """recode every sign/scale word of a packed IQ2_XXS weight [..., row bytes] (contiguous), in place: the code plane
    (the row's first 64 nsb bytes, rows 8-byte aligned) is 8 bytes a sub-block, the word in bytes 4-7."""
    import torch
    words = packed.view(torch.int32)[..., :16 * nsb][..., 1::2]
    words.copy_(recode(words))


# the packed layouts: qtype -> (pack(w), unpack(w, k)).  Serving repacks the types of
# traits.LOAD_PACKED_TYPES (measured faster); a type here and not there is for the bench and tests only.
PACKERS = {Q8_0: (pack_q8_0, lambda w, k: unpack_q8_0(w)),
           **{qt: (lambda w, qt=qt: pack_planar(w, qt), lambda w, k, qt=qt: unpack_planar(w, qt, k)) for qt in PLANES
              if qt != IQ2_XXS},
           IQ2_XXS: (pack_iq2_xxs, unpack_iq2_xxs)}   # planar, and its sign words re-encoded
if set(PACKERS) != set(traits.PACKED_LAYOUT_TYPES):
    raise AssertionError(f"register_mma.PACKERS {sorted(PACKERS)} against traits' packed layouts "
                         f"{sorted(traits.PACKED_LAYOUT_TYPES)}")


def packed_row_bytes(qtype: int, k: int) -> int:
    """Bytes of a row of k values (a multiple of 256) in its type's packed layout."""
    if int(qtype) in PLANES:
        return planar_row_bytes(qtype, k)
    if int(qtype) == Q8_0:
        return k // SB_VALUES.value * Q8_0_GROUP_BLOCKS * Q8_0_BLOCK_BYTES
    raise ValueError(f"GGUF type {qtype} has no packed layout (PACKERS: {tuple(PACKERS)})")


def pack(w, qtype: int):
    """w (the file's layout) in its type's packed layout (PACKERS)."""
    return PACKERS[int(qtype)][0](w)


def unpack(w, qtype: int, k: int):
    return PACKERS[int(qtype)][1](w, k)


def with_default_constexprs(cfgs: list[dict]) -> list[dict]:
    """The configs with every constexpr their kernel defaults spelled out.  Triton 3.6 keys an offline compile
    (ASTSource.hash) on the constexprs' values in argument order, not their names: a config naming PACKED=True
    and one naming SWAP=True (the others defaulted) hash alike, and the second compile returns the first's cubin."""
    import inspect

    out = []
    for c in cfgs:
        fn = getattr(c["kernel"], "fn", c["kernel"])   # the Python function (a JIT or interpreted kernel's)
        defaults = {n: p.default for n, p in inspect.signature(fn).parameters.items()
                    if p.default is not inspect.Parameter.empty and "constexpr" in str(p.annotation)}
        out.append(dict(c, constexprs={**defaults, **c["constexprs"]}))
    return out


def kernel_configs() -> list[dict]:
    """Every variant the plans launch, for the offline compile test (bf16 activations)."""
    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "out_ptr": "*fp32", "route_w_ptr": "*fp32", "sorted_ids_ptr": "*i32",
           "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32", "final_ptr": "*bf16", "counter_ptr": "*i32",
           "grid_ptr": "*u8",
           "num_valid": "i32", "N": "i32", "num_units": "i32", "units_per_split": "i32", "sb_per_expert": "i32",
           "num_splits": "i32", "a_row_div": "i32", "top_k": "i32", "stride_xm": "i32", "stride_we": "i32",
           "stride_wn": "i32", "stride_os": "i32", "stride_om": "i32", "stride_fm": "i32"}
    # (name, MOE, ROUTE_WEIGHTED, ROUTING, EPILOGUE, out): what gguf_matmul's plans launch
    variants = (("linear -> bf16", False, False, SORTED, STORE, "*bf16"),
                ("linear split-K, reduced -> bf16", False, False, SORTED, REDUCE, "*fp32"),
                ("moe -> fp32 planes", True, False, SORTED, STORE, "*fp32"),
                ("moe weighted -> bf16", True, True, SORTED, STORE, "*bf16"),
                ("moe w13, SiLU reduced", True, False, SORTED, REDUCE_SILU, "*fp32"),
                ("moe pairs w13, SiLU reduced", True, False, PAIRS, REDUCE_SILU, "*fp32"),
                ("moe top-k sum -> bf16", True, False, TOKEN_SUM, STORE, "*bf16"),
                ("moe top-k sum split-K, reduced", True, False, TOKEN_SUM, REDUCE, "*fp32"))
    # the SORTED and dense variants also with COLUMN_BLOCKS' wider programs (prefill-sized rows an expert)
    wide = [(what, moe, weighted, routing, epilogue, out, cols) for what, moe, weighted, routing, epilogue, out
            in variants if routing is SORTED for cols in COLUMN_BLOCKS]
    cfgs = []
    for qtype in KERNEL_TYPES:
        t = tuning_for(qtype)
        for what, moe, weighted, routing, epilogue, out, cols in wide + [(*v, TOKENS) for v in variants
                                                                         if v[3] is not SORTED]:
            cfgs.append(dict(name=f"mma {gguf.GGMLQuantizationType(qtype).name.lower()} {what}"
                                  f"{f' x{cols} rows' if cols != TOKENS else ''}",
                             kernel=_mma_moe_kernel if moe else _mma_kernel,
                             signature={**sig, "out_ptr": out},
                             constexprs=dict(QTYPE=qtype, WARPS=t["num_warps"], REPS=t["reps"],
                                             MOE=moe, ROUTE_WEIGHTED=weighted, ROUTING=routing.value,
                                             EPILOGUE=epilogue.value, TOPK=8, COLS=cols, PACKED=False,
                                             AHEAD=ahead_for(t, cols, routing.value), L2_AHEAD=t["l2_ahead"],
                                             UNIT_BYTES=unit_bytes(qtype)),
                             num_warps=t["num_warps"], num_stages=1, gluon=True,
                             divisible_by_16=("x_ptr", "w_ptr", "out_ptr", "grid_ptr", "stride_xm", "stride_we",
                                              "stride_wn", "stride_om")))
    # weights repacked at load (PACKERS' types: loading/gguf_repack.py): every variant again on their layout
    packed = []
    for qtype in PACKERS:
        lower = gguf.GGMLQuantizationType(qtype).name.lower()
        packed += [dict(c, name=c["name"].replace(f"mma {lower}", f"mma {lower} packed"),
                        constexprs=dict(c["constexprs"], PACKED=True, UNIT_BYTES=unit_bytes(qtype, True))) for c in cfgs
                   if c["constexprs"]["QTYPE"] == qtype]
    return with_default_constexprs(cfgs + packed)
