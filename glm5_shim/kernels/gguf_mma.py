"""Decode-sized GGUF matmuls with the weights fed to tensor cores straight from registers (Gluon; Q4_K).

Why: the tile kernels of :mod:`gguf_matmul` decode a weight tile in one register layout and ``tl.dot`` wants it in
another, so every decoded weight went through shared memory and a barrier, and each weight cost ~8 SASS
instructions: decode ran at 12-30 % of the memory floor (bench/RESULTS.md).  Here the weight is the MMA's A operand
(rows = output features, 16 a warp and instruction; the N side is 8 routed tokens, mma.m16n8k16), and each thread
loads exactly the bytes its A fragments need:

* a thread holds, for rows r and r + 8 of its warp's 16, the 16 contiguous code bytes p = 16 j .. 16 j + 15 of a
  half super-block (64 bytes, 128 values) — one 16-byte load a row;
* the K order of the dot is not the file's: the products of a dot can be summed in any order, so the kernel sums
  over a permutation of K chosen so that those bytes *are* the thread's fragments (k = bits of p rearranged:
  :data:`A_ORDER`), and loads the activations in the same permuted order (:data:`X_ORDER`; 16-byte loads too);
* both permutations are reshape + permute of register-resident tensors, and the conversion to the MMA operand
  layouts is asserted trivial at compile time (no data moves; the offline compiles in CI would fail otherwise).

Q4_K codes become exact 16-bit numbers q = 2 + n/8 by bit operations (prmt, shift, lop3 — as in
:mod:`gguf_matmul`), and the weight is one packed 16-bit FMA, w = S q - C with S = 8 d sc and C = 2 S + dmin m per
group of 32 (``fma.rn.bf16x2`` / ``f16x2``): S and C are rounded to the activation dtype, then w once.  Error of a
weight against the GGUF value, with u the dtype's unit roundoff (bf16 2**-8, fp16 2**-11):
|dw| <= u (|S q| + |C| + |w|) (+ O(u**2)), i.e. under 0.2 of a quantization step s for bf16 — that bound is
what the tests hold the kernels to (:func:`weight_error_bound`).  Activations are not quantized; sums are float32.

One kernel serves a dense linear (tokens are rows of x) and a MoE pass (rows grouped by expert with the usual
(sorted ids, expert of each block of 8, padded count) layout; a w2 pass scales by the routing weight).  K is split
over ``program_id(1)`` for decode-sized calls; partial sums go to float32 planes the caller adds.  Loads of the
next half super-block are issued before the current one is decoded (Gluon has no automatic pipeliner).

Not yet run on a GPU (as of 2026-12-02): the plans in :mod:`gguf_matmul` use it only with
``GLM5_SHIM_GGUF_DECODE=mma`` until the GPU tests and the bench have.
"""

import functools

import gguf
import triton.language as tl

from glm5_shim.kernels.gluon_compat import INTERPRET_K, DistributedLinearLayout, NVMMADistributedLayout, gl, jit, mma_v2

Q4_K = int(gguf.GGMLQuantizationType.Q4_K)
MMA_TYPES = (Q4_K,)
TOKENS = 8                         # the MMA's N: routed rows (MoE) or activation rows (linear) a program multiplies
SB_VALUES = gl.constexpr(256)      # a Q4_K super-block: 256 values in 144 bytes = 36 words (4 of header, 32 of codes)
SB_WORDS = gl.constexpr(36)
HEAD_WORDS = gl.constexpr(4)
HALF_WORDS = gl.constexpr(16)      # code words of a half super-block (128 values)

# Dimension orders of the two permutations (see the module docstring).  A: codes [rows, 4, 16] viewed as bits
# (row, p5, p4, p3, p2, p1, p0) of the byte p, reordered so that dimension j + 1 is bit 5 - j of the dot's k:
# k = (p3 p2 p1 p5 p4 p0).  X: activations [8, 128] viewed as (token, v6, v5, v4, v3, v2, v1, v0) of the value v,
# reordered to (k bits 5..0, token, v5) with the same k, v5 being the nibble (low: group 2c, high: 2c + 1).  So the
# value at k is x[v] with v = 64 p5 + 32 nibble + (p & 31): byte p's nibble holds value 32 group + (p & 31).
A_ORDER = gl.constexpr((0, 3, 4, 5, 1, 2, 6))
X_ORDER = gl.constexpr((4, 5, 6, 1, 3, 7, 0, 2))


def _code_fma_asm(fp16: bool) -> str:
    """PTX: 4 code bytes ($4) -> low nibbles ($0, $1) and high nibbles ($2, $3) of bytes 0-3 as weights, two to a
    register: q = 2 + n/8 (the code in the top 4 mantissa bits of 2.0), then fma(q, S, -C) with the low group's
    S pair ($5, $6) and -C pair ($7, $8) and the high group's ($9, $10; $11, $12)."""
    top = 10 if fp16 else 7                       # mantissa bits of the 16-bit type
    lo_shift, hi_shift = top - 4, top - 8         # the low nibble sits at bit 0 of its byte, the high at bit 4
    mask = 0xF << (top - 4)
    mask2 = mask | (mask << 16)
    fma = "fma.rn.f16x2" if fp16 else "fma.rn.bf16x2"

    def shift(dst, src, k):
        return f"shl.b32 {dst}, {src}, {k};" if k >= 0 else f"shr.u32 {dst}, {src}, {-k};"

    lines = [".reg .b32 t0, t1, u0, u1, u2, u3;", "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;",
             shift("u0", "t0", lo_shift), shift("u1", "t1", lo_shift), shift("u2", "t0", hi_shift),
             shift("u3", "t1", hi_shift)]
    lines += [f"lop3.b32 {u}, {u}, {mask2:#010x}, 0x40004000, 0xEA;" for u in ("u0", "u1", "u2", "u3")]
    lines += [f"{fma} $0, u0, $5, $7;", f"{fma} $1, u1, $6, $8;", f"{fma} $2, u2, $9, $11;",
              f"{fma} $3, u3, $10, $12;"]
    return "{\n" + "\n".join(lines) + "\n}"


_Q4K_ASM_BF16 = gl.constexpr(_code_fma_asm(False))
_Q4K_ASM_FP16 = gl.constexpr(_code_fma_asm(True))


def weight_error_bound(s: float, q: float, c: float, w: float, fp16: bool) -> float:
    """The bound on one weight's error stated in the module docstring (|S q| + |C| + |w|, times the unit
    roundoff); S, C, q as in w = S q - C."""
    u = 2.0 ** -11 if fp16 else 2.0 ** -8
    return u * (abs(s * q) + abs(c) + abs(w))


@functools.lru_cache(maxsize=None)
def layouts(num_warps: int, reps: int) -> tuple:
    """(codes [BN, 4, 4, 4], activations [8, 128], accumulator [BN, 8]) layouts for BN = 16 * num_warps * reps rows.

    Codes are indexed (row, slot, word, byte) with the half super-block's byte p = 16 slot + 4 word + byte.  Their
    layout is the MMA A operand's (as Triton 3.6 builds it for these warps) with k replaced by the byte p that
    A_ORDER maps it to: registers p0-p3 (one 16-byte load), row + 8, the row repeats; lanes p4, p5 (the slot) and
    rows 0-2; warps the 16-row blocks.  The activations' is the B operand's likewise (registers v0-v3 and the
    nibble v5, lanes v4, v6 and the 8 tokens; every warp holds the whole tile)."""
    if num_warps & (num_warps - 1) or reps & (reps - 1):
        raise ValueError(f"num_warps={num_warps} and reps={reps} must be powers of two")
    bn = 16 * num_warps * reps
    warp_rows = [[16 << j, 0, 0, 0] for j in range(num_warps.bit_length() - 1)]
    rep_rows = [[16 * num_warps << j, 0, 0, 0] for j in range(reps.bit_length() - 1)]
    codes = DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0], [8, 0, 0, 0]] + rep_rows,
        lane_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=warp_rows, block_bases=[], shape=[bn, 4, 4, 4])
    acts = DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 32]],
        lane_bases=[[0, 16], [0, 64], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[0, 0]] * (num_warps.bit_length() - 1), block_bases=[], shape=[TOKENS, 128])
    acc = NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    return codes, acts, acc


# ----------------------------------------------------------------------------------------------------------------
# device code
# ----------------------------------------------------------------------------------------------------------------


@jit
def _broadcast_like(t, like):
    """[BN, 4] -> like's shape [BN, 4, 4, 4] (t's dtype)."""
    return gl.broadcast(gl.expand_dims(gl.expand_dims(t, 2), 3), like)[0]


@jit
def _q4k_group_scales(h0, h1, h2, h3, jj, HF: tl.constexpr, BF16: tl.constexpr):
    """(S, -C) of the low and high group of each [BN, 4] slot of half HF of the super-blocks whose first 16 bytes
    are h0..h3 ([BN, 4] int32, the same in every slot of a row); jj = 2 * the slot's 32-byte chunk.  Groups of
    half 0 take their 6-bit scale and min from the low bits of bytes 0-3 / 4-7; of half 1 from the nibbles of bytes
    8-11 with their top 2 bits in the high bits of bytes 0-3 / 4-7.  S = 8 d sc, C = 2 S + dmin m (exact in
    float32), rounded to the activation dtype."""
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
    d = (h0 & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32) * 8.0
    dmin = ((h0 >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    s_lo = d * sl.to(gl.float32)
    s_hi = d * sh.to(gl.float32)
    nc_lo = -(2.0 * s_lo + dmin * ml.to(gl.float32))
    nc_hi = -(2.0 * s_hi + dmin * mh.to(gl.float32))
    if BF16:
        return s_lo.to(gl.bfloat16), nc_lo.to(gl.bfloat16), s_hi.to(gl.bfloat16), nc_hi.to(gl.bfloat16)
    else:
        return s_lo.to(gl.float16), nc_lo.to(gl.float16), s_hi.to(gl.float16), nc_hi.to(gl.float16)


@jit
def _q4k_weights(words, s_lo, nc_lo, s_hi, nc_hi, L4: tl.constexpr, BF16: tl.constexpr):
    """Code words [BN, 4, 4] int32 -> (low-nibble weights, high-nibble weights), each [BN, 4, 4, 4] (byte p =
    16 slot + 4 word + byte) in the activation dtype: w = fma(2 + n/8, S, -C) of the byte's group.  The words are
    split into bytes only for the compiler (the asm takes the 4 bytes of a word packed in one register again)."""
    shift = 8 * gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))
    codes = ((gl.expand_dims(words, 3) >> gl.expand_dims(gl.expand_dims(gl.expand_dims(shift, 0), 1), 2))
             & 255).to(gl.uint8)
    if INTERPRET_K:  # the same numbers without PTX: q*S is exact in float32, so is q*S - C but in rare cases
        c = codes.to(gl.int32)
        q_lo = (c & 15).to(gl.float32) * 0.125 + 2.0
        q_hi = (c >> 4).to(gl.float32) * 0.125 + 2.0
        w_lo = q_lo * _broadcast_like(s_lo, q_lo) + _broadcast_like(nc_lo, q_lo)
        w_hi = q_hi * _broadcast_like(s_hi, q_hi) + _broadcast_like(nc_hi, q_hi)
        return w_lo.to(s_lo.dtype), w_hi.to(s_lo.dtype)
    else:
        args = [codes, _broadcast_like(s_lo, codes), _broadcast_like(nc_lo, codes), _broadcast_like(s_hi, codes),
                _broadcast_like(nc_hi, codes)]
        if BF16:
            return gl.inline_asm_elementwise(_Q4K_ASM_BF16, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", args,
                                             (gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
        else:
            return gl.inline_asm_elementwise(_Q4K_ASM_FP16, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", args,
                                             (gl.float16, gl.float16), is_pure=True, pack=4)


@jit
def _q4k_half(acc, words, xt, h0, h1, h2, h3, jj, HF: tl.constexpr, BN: tl.constexpr, L4: tl.constexpr,
              ACC: tl.constexpr, BF16: tl.constexpr):
    """acc [BN, 8] += W[:, half] . x[:, half] over one half super-block: code words [BN, 4, 4], activations xt
    [8, 128] (value v of the half at column v), in the permuted K order of the module docstring."""
    A_DOT: tl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    B_DOT: tl.constexpr = gl.DotOperandLayout(operand_index=1, parent=ACC, k_width=2)
    s_lo, nc_lo, s_hi, nc_hi = _q4k_group_scales(h0, h1, h2, h3, jj, HF, BF16)
    w_lo, w_hi = _q4k_weights(words, s_lo, nc_lo, s_hi, nc_hi, L4, BF16)
    xb = gl.permute(gl.reshape(xt, [8, 2, 2, 2, 2, 2, 2, 2]), X_ORDER.value)
    x_lo, x_hi = gl.split(gl.reshape(xb, [64, 8, 2]))
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
def _q4k_mma_kernel(x_ptr, w_ptr, out_ptr, route_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                    num_valid, N, num_sb, sb_per_split, a_row_div, stride_xm, stride_we, stride_wn, stride_os,
                    stride_om, L4: tl.constexpr, LX: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr,
                    MOE: tl.constexpr, ROUTE_WEIGHTED: tl.constexpr):
    """out[s, row, n] = sum over the super-blocks of split s of x[row // a_row_div, k] * W[n, k], for the 8 rows
    of block program_id(0) // cdiv(N, BN) (MOE: sorted_ids' block, weights of its expert; else rows 8 b ..
    8 b + 7 of x) and the BN output features of program_id(0) % cdiv(N, BN); times the routing weight of the row
    when ROUTE_WEIGHTED.  Rows >= num_valid are neither read nor written."""
    BF16: tl.constexpr = x_ptr.dtype.element_ty == gl.bfloat16
    LWORD: tl.constexpr = gl.SliceLayout(3, L4)     # [BN, 4, 4] code words
    LSLOT: tl.constexpr = gl.SliceLayout(2, LWORD)  # [BN, 4] one value a row and slot (scales, header words)
    pid = gl.program_id(0)
    pid_s = gl.program_id(1)
    num_n = gl.cdiv(N, BN)
    pid_m = pid // num_n
    pid_n = pid % num_n
    w_base = w_ptr
    if MOE:
        if pid_m * 8 >= gl.load(num_padded_ptr):
            return
        w_base = w_ptr + gl.load(expert_ids_ptr + pid_m).to(gl.int64) * stride_we
    # weight rows: code-word pointers [BN, 4, 4] and header-word pointers [BN, 4] (the same words in every slot)
    r1 = gl.arange(0, BN, layout=gl.SliceLayout(1, LSLOT))
    slot = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LSLOT)), 0)
    word = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LWORD)))
    rows = gl.minimum(pid_n * BN + r1, N - 1).to(gl.int64)   # clamped: every weight load is in bounds, unmasked
    rowp = (w_base + rows * stride_wn).to(gl.pointer_type(gl.int32))
    head_p = gl.expand_dims(rowp, 1) + slot * 0
    code_p = gl.expand_dims(head_p + HEAD_WORDS + slot * 4, 2) + gl.expand_dims(gl.expand_dims(word, 0), 1)
    jj = 2 * (slot // 2)
    # activation rows [8, 128]
    tok_x = gl.arange(0, 8, layout=gl.SliceLayout(1, LX))
    val_x = gl.arange(0, 128, layout=gl.SliceLayout(0, LX))
    if MOE:
        ids_x = gl.load(sorted_ids_ptr + pid_m * 8 + tok_x)
    else:
        ids_x = pid_m * 8 + tok_x
    ok_x = ids_x < num_valid
    x_rows = gl.where(ok_x, ids_x, 0).to(gl.int64) // a_row_div
    act_p = x_ptr + gl.expand_dims(x_rows * stride_xm, 1) + gl.expand_dims(val_x, 0)
    x_ok = gl.expand_dims(ok_x, 1)

    first = pid_s * sb_per_split
    last = gl.minimum(first + sb_per_split, num_sb)
    acc = gl.zeros([BN, 8], gl.float32, layout=ACC)
    c0 = gl.load(code_p + first * SB_WORDS)
    x0 = gl.load(act_p + first * SB_VALUES, mask=x_ok, other=0.0)
    h0 = gl.load(head_p + first * SB_WORDS)
    h1 = gl.load(head_p + first * SB_WORDS + 1)
    h2 = gl.load(head_p + first * SB_WORDS + 2)
    h3 = gl.load(head_p + first * SB_WORDS + 3)
    for sb in range(first, last):
        # issue the second half's loads, decode the first; issue the next super-block's first half, decode the second
        c1 = gl.load(code_p + sb * SB_WORDS + HALF_WORDS)
        x1 = gl.load(act_p + sb * SB_VALUES + 128, mask=x_ok, other=0.0)
        acc = _q4k_half(acc, c0, x0, h0, h1, h2, h3, jj, 0, BN, L4, ACC, BF16)
        nxt = gl.minimum(sb + 1, last - 1)
        c0 = gl.load(code_p + nxt * SB_WORDS)
        x0 = gl.load(act_p + nxt * SB_VALUES, mask=x_ok, other=0.0)
        acc = _q4k_half(acc, c1, x1, h0, h1, h2, h3, jj, 1, BN, L4, ACC, BF16)
        h0 = gl.load(head_p + nxt * SB_WORDS)
        h1 = gl.load(head_p + nxt * SB_WORDS + 1)
        h2 = gl.load(head_p + nxt * SB_WORDS + 2)
        h3 = gl.load(head_p + nxt * SB_WORDS + 3)

    feat = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, ACC))
    tok_c = gl.arange(0, 8, layout=gl.SliceLayout(0, ACC))
    if MOE:
        ids_c = gl.load(sorted_ids_ptr + pid_m * 8 + tok_c)
    else:
        ids_c = pid_m * 8 + tok_c
    ok_c = ids_c < num_valid
    ids_c = gl.where(ok_c, ids_c, 0).to(gl.int64)
    if ROUTE_WEIGHTED:
        acc = acc * gl.expand_dims(gl.load(route_w_ptr + ids_c, mask=ok_c, other=0.0).to(gl.float32), 0)
    op = out_ptr + pid_s * stride_os + gl.expand_dims(ids_c * stride_om, 0) + gl.expand_dims(feat, 1)
    gl.store(op, acc.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(ok_c, 0) & gl.expand_dims(feat < N, 1))


# ----------------------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------------------

# Launch shape (offline SASS, sm_90: ~3.1 instructions a weight, no shared memory; not yet tuned on a GPU):
# 4 warps x 2 row repeats = 128 output features a program, K split so programs cover the GPU ctas_per_sm times.
MMA_TUNING = dict(num_warps=4, reps=2, ctas_per_sm=4)


def block_rows(tuning: dict | None = None) -> int:
    t = {**MMA_TUNING, **(tuning or {})}
    return 16 * t["num_warps"] * t["reps"]


def splits(tiles: int, num_sb: int, num_sms: int, tuning: dict | None = None) -> tuple[int, int]:
    """(splits, super-blocks per split) so that tiles x splits covers the GPU ctas_per_sm times."""
    t = {**MMA_TUNING, **(tuning or {})}
    split = max(1, min(num_sb, -(-t["ctas_per_sm"] * num_sms // max(tiles, 1))))
    per = -(-num_sb // split)
    return -(-num_sb // per), per


def covers(qtype: int, k: int, dtype) -> bool:
    """True when this kernel can compute a weight of ``qtype`` with input width k for ``dtype`` activations."""
    import torch
    return int(qtype) in MMA_TYPES and k % SB_VALUES.value == 0 and dtype in (torch.bfloat16, torch.float16)


def launch(x, w, out, *, n: int, num_valid: int, num_blocks: int, split: int, sb_per_split: int,
           a_row_div: int = 1, route=None, tuning: dict | None = None) -> None:
    """One launch: x [rows, K] (bf16/fp16), w [N, row bytes] (linear) or [E, N, row bytes] (with route), out
    [split, out rows, N] float32 partial sums (split > 1) or [out rows, N].

    route: None for a dense linear (rows 8 b .. 8 b + 7 of x for block b), or (sorted_ids, expert_ids, num_padded,
    route weights or None) for a MoE pass whose routing layout has blocks of 8 rows."""
    t = {**MMA_TUNING, **(tuning or {})}
    codes_l, acts_l, acc_l = layouts(t["num_warps"], t["reps"])
    bn = block_rows(t)
    moe = route is not None
    sorted_ids, expert_ids, num_padded, route_w = route if moe else (out, out, out, None)
    grid = (num_blocks * -(-n // bn), split)
    _q4k_mma_kernel[grid](
        x, w, out, route_w if route_w is not None else out, sorted_ids, expert_ids, num_padded, num_valid, n,
        x.shape[1] // SB_VALUES.value, sb_per_split, a_row_div, x.stride(0), w.stride(0) if moe else 0,
        w.stride(-2), out.stride(0) if split > 1 else 0, out.stride(-2), L4=codes_l, LX=acts_l, ACC=acc_l, BN=bn,
        MOE=moe, ROUTE_WEIGHTED=route_w is not None, num_warps=t["num_warps"])


def linear(x, qweight, n: int, num_sms: int, tuning: dict | None = None):
    """x [M, K] @ W[:n].T for a Q4_K weight [>= n, row bytes]: M rows in blocks of 8, K split to fill the GPU."""
    import torch
    m, k = x.shape
    num_blocks = -(-m // TOKENS)
    split, per = splits(num_blocks * -(-n // block_rows(tuning)), k // SB_VALUES.value, num_sms, tuning)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    dst = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    launch(x, qweight, dst, n=n, num_valid=m, num_blocks=num_blocks, split=split, sb_per_split=per, tuning=tuning)
    if split > 1:
        torch.sum(dst, 0, out=out) if out.dtype == torch.float32 else out.copy_(dst.sum(0))
    return out


def kernel_configs() -> list[dict]:
    """Every variant the plans launch, for the offline compile test (bf16 activations)."""
    codes_l, acts_l, acc_l = layouts(MMA_TUNING["num_warps"], MMA_TUNING["reps"])
    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "out_ptr": "*fp32", "route_w_ptr": "*fp32", "sorted_ids_ptr": "*i32",
           "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32", "num_valid": "i32", "N": "i32", "num_sb": "i32",
           "sb_per_split": "i32", "a_row_div": "i32", "stride_xm": "i32", "stride_we": "i32", "stride_wn": "i32",
           "stride_os": "i32", "stride_om": "i32"}
    cfgs = []
    for moe, weighted, out in ((False, False, "*fp32"), (False, False, "*bf16"), (True, False, "*fp32"),
                               (True, True, "*bf16")):
        name = f"mma q4_k {'moe' if moe else 'linear'}{' weighted' if weighted else ''} -> {out[1:]}"
        cfgs.append(dict(name=name, kernel=_q4k_mma_kernel, signature={**sig, "out_ptr": out},
                         constexprs=dict(L4=codes_l, LX=acts_l, ACC=acc_l, BN=block_rows(), MOE=moe,
                                         ROUTE_WEIGHTED=weighted),
                         num_warps=MMA_TUNING["num_warps"], num_stages=1, gluon=True,
                         divisible_by_16=("x_ptr", "w_ptr", "out_ptr", "stride_xm", "stride_we", "stride_wn",
                                          "stride_om")))
    return cfgs
