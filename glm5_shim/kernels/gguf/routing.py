"""Which GGUF tensors the shim's own matmul kernels compute (``glm5_shim/kernels/gguf/tiles.py``); the rest keep
vLLM's ggml kernels.  One home for the rule: the kernels, the vLLM dispatch, doctor and inspect all ask here, for a
call (kernel_path, shim_kernel_covers, the thresholds below) or a whole file (matmul_paths,
every_matmul_on_shim_kernels).  Pure: imports neither torch, Triton nor vLLM."""
from __future__ import annotations

import functools
from collections import Counter

import gguf

from glm5_shim.gguf.dequant import is_float_type
from glm5_shim.kernels.gguf import traits

_T = gguf.GGMLQuantizationType
SHIM_KERNEL_TYPES = traits.TILE_TYPES  # every type the kernels read (all GPU-tested: tests/gpu/test_gguf_matmul_gpu.py)
# Up to how many tokens vLLM's vector MoE kernel beats the shim's tile kernels, by the type of w13 (H200, TP-8
# expert shapes, bench/journal/2026-12-02.md): the 1-3-bit IQ grids cost the tile kernels 11-17
# instructions a weight, so there vLLM wins to T = 32 (IQ2_S's tiles: 107 vs 59 µs at T = 1, 1677 vs 1237 at 32)
# and the shim from T = 256 (2657 vs 9742); IQ4_XS to T = 8 (326 vs 338), the shim from 32 (903 vs 1227).  IQ4_NL
# shares IQ4_XS's decode and was not measured apart.  Where vLLM's kernels are trusted with the activations, such
# calls go to vLLM.  Not IQ3_S: see VLLM_MISDECODED_TYPES.  Not IQ2_XXS, IQ2_S and IQ3_XXS: on the register-MMA
# kernel (IQ2_XXS since 2026-12-03: 28 vs vLLM's 64 µs at T = 1, 330 vs 1390 at 32; IQ2_S since 2026-12-03: 31 vs 59,
# 359 vs 1238; IQ3_XXS since 2026-12-06: 27 vs 59, 117 vs 329 at 8, 290 vs 1243 at 32).
VLLM_MOE_DECODE_TOKENS = {int(_T.IQ2_XS): 32, int(_T.IQ1_S): 32, int(_T.IQ1_M): 32, int(_T.IQ4_XS): 8,
                          int(_T.IQ4_NL): 8}
# Types vLLM 0.23's ggml kernels decode wrongly, which the shim never hands them.  IQ3_S: vLLM's grid
# (csrc/quantization/gguf/ggml-common.h, iq3xs_grid) is llama.cpp's from before March 2024, whose top level reads
# 15.5 where today's files mean 15 (the gguf package and llama.cpp agree on 15): the largest weights of every
# sub-block come out 3.3 % too large, ~2 % per matrix and 3.9 % through a gated MoE on the H200 (2026-12-02).
VLLM_MISDECODED_TYPES = (int(_T.IQ3_S),)
# Types whose decode-sized MoE passes run on the register-MMA kernels (kernels/gguf/register_mma.py) by default
# (GLM5_SHIM_GGUF_DECODE=tile keeps the tile kernels).  Measured on the H200 (bench/journal/2026-12-02.md;
# IQ2_XXS 2026-12-03, IQ2_S 2026-12-03): 1.1-2.5x faster than the tile kernels at TP-8 MoE shapes, T = 1-64
# (IQ2_XXS 3.7-5x, IQ2_S 3.5-4.6x).  IQ3_XXS, IQ3_S, Q2_K since 2026-12-06 (bench/results/2026-12-06-s22-decode.md),
# µs at T = 1 / 8 / 32 / 64, register-MMA against the tile kernels: IQ3_XXS 27 / 117 / 290 / 372 vs 174 / 966 / 2620 /
# 3535, IQ3_S 29 / 126 / 307 / 401 vs 164 / 1024 / 2752 / 3725, Q2_K 20 / 75 / 202 / 248 vs 52 / 262 / 625 / 831.
MMA_DECODE_TYPES = (int(_T.Q4_K), int(_T.Q6_K), int(_T.Q5_K), int(_T.Q8_0), int(_T.IQ2_XXS), int(_T.IQ2_S),
                    int(_T.IQ3_XXS), int(_T.IQ3_S), int(_T.Q2_K))
# Of those, the types whose dense linears at 1-8 rows run there too: Q8_0's dense decode was as fast or faster on the
# tile kernel (q_a+kv_a 24.4 vs 26.3 µs, 2026-12-03), the K-quants' 10-40 % and IQ2_XXS's and IQ2_S's 2.3-4x faster
# on the register-MMA kernels (IQ2_S lm_head 66 vs 255 µs, q_a+kv_a 19 vs 44; 2026-12-03); 2026-12-06, lm_head at 1 /
# 32 rows: IQ3_XXS 52 / 96 vs 379 / 397, IQ3_S 62 / 98 vs 402 / 433, Q2_K 33 / 79 vs 87 / 108.
MMA_LINEAR_TYPES = (int(_T.Q4_K), int(_T.Q6_K), int(_T.Q5_K), int(_T.IQ2_XXS), int(_T.IQ2_S), int(_T.IQ3_XXS),
                    int(_T.IQ3_S), int(_T.Q2_K))
# Up to how many rows a dense linear of those types stays on the register-MMA kernel (measured below in 8-row
# programs, each re-reading the weight from L2 after the first; since 2026-12-03 one program takes up to 32 rows,
# gguf_mma.cols_for); a type not listed stops at 8 rows (gguf_mma.TOKENS).
# H200, 2026-12-03, µs at 16 / 32 / 64 rows, register-MMA against the tile kernel, every GLM-5 TP-8 dense shape:
#   IQ2_XXS  lm_head 108 / 205 / 388 vs 237 / 254 / 256, q_a+kv_a 21 / 34 / 65 vs 42 / 47 / 48, o_proj 16 / 28 / 46
#            vs 36 / 39 / 41, shared down 4.2 / 6.0 / 7.8 vs 9.5 / 13.6 / 15.0 (both IQ types faster in all nine
#            shapes at 16 and 32 rows; at 64 slower in five (IQ2_XXS) and seven (IQ2_S))
#   Q4_K     lm_head 83 / 153 vs 65 / 108, q_a+kv_a 14.2 / 20.1 vs 14.2 / 24.9, q_b 7.7 / 12.0 vs 8.3 / 13.1: mixed
#            at 16 rows, so the K-quants keep 8 (Q6_K and Q8_0 slower in most shapes from 16)
# (the tiles then were one 64-row tile and a sum launch; the 32-row self-summing tiles that 17-32 rows run since
# were not measured against the IQ types' register-MMA linears)
# (2026-12-06: IQ3_XXS, IQ3_S and Q2_K at 32 rows faster than the tiles on lm_head, above)
MMA_LINEAR_MAX_ROWS = {int(_T.IQ2_XXS): 32, int(_T.IQ2_S): 32, int(_T.IQ3_XXS): 32, int(_T.IQ3_S): 32,
                       int(_T.Q2_K): 32}
# Up to how many routed rows an expert (T x top_k / experts) every MoE takes the decode regime (gguf_matmul.moe_plan:
# w13 split over K, then SiLU); past it, the fused gate/up prefill tiles unless a rule below says otherwise
MOE_DECODE_MAX_ROWS_PER_EXPERT = 4
# Up to how many routed rows an expert (T x top_k / experts) a MoE whose two passes both run on the register-MMA
# kernels stays in the decode regime (moe_align's blocks of 8, 16 or 32 rows, gguf_mma.cols_for, each block reading
# its expert's weights) instead of the prefill tiles; a type not listed keeps the regimes' common threshold
# (MOE_DECODE_MAX_ROWS_PER_EXPERT).  H200, TP-8 shapes, 2026-12-03, µs register-MMA in blocks of 8 / 16
# / 32 rows, prefill tiles (vLLM on bf16 weights 637 / 657 / 801 / 882 at 8 / 16 / 32 / 64 rows):
#   8 rows (T = 256):   Q4_K 420 / 407 / 545, 849;  Q5_K 529 / 482 / 664, 954;  Q6_K 820 / 661 / 746, 2939;
#                       Q8_0 1198 / 922 / 985, 1472;  IQ2_XXS 700 / 557 / 700, 2448
#   16 (T = 512):       Q4_K 687 / 635 / 655, 874;  Q5_K 871 / 728 / 762, 976;  Q6_K 1376 / 955 / 804, 2968;
#                       Q8_0 2021 / 1351 / 1096, 1493;  IQ2_XXS 1174 / 821 / 763, 2471
#   32 (T = 1024):      Q4_K 1250 / 1109 / 1103, 926;  Q5_K 1557 / 1246 / 1248, 1027;  Q6_K 2484 / 1573 / 1212, 3020;
#                       Q8_0 3629 / 2291 / 1641, 1541;  IQ2_XXS 2110 / 1381 / 1186, 2513
#   64 (T = 2048):      Q6_K 4619 / 2814 / 2027, 4288;  IQ2_XXS 3961 / 2497 / 2007, 3706 (dequantized: 2377, 2125)
# (IQ2_S: IQ2_XXS's limit, not measured past 8 rows.)  H100, 2026-12-06 (bench/journal/2026-12-06.md),
# register-MMA in blocks of 8 / 16 / 32 rows, prefill tiles, dequantized (vLLM on bf16 weights 870 / 897 / 997):
#   8 rows (T = 256):   IQ3_XXS 580 / 480 / 642, 3808, 2163;  IQ3_S 656 / 548 / 653, 4203, 2201;
#                       Q2_K 406 / 341 / 491, 1114, 2155
#   16 (T = 512):       IQ3_XXS 968 / 696 / 707, 3825, 2190;  IQ3_S 1114 / 795 / 732, 4227, 2232;
#                       Q2_K 662 / 488 / 547, 1140, 2189
#   32 (T = 1024):      IQ3_XXS 1748 / 1170 / 1075, 3870, 2238;  IQ3_S 2027 / 1353 / 1120, 4261, 2289;
#                       Q2_K 1175 / 829 / 878, 1193, 2239
# and 2026-12-06 (H100, bench/results/2026-12-06-s24a-gguf_matmul.md; vLLM on bf16 weights 1076, 1412):
#   64 (T = 2048):      IQ3_XXS 3301 / 2158 / 1860, 5728, 2312;  IQ3_S 3842 / 2494 / 1943, 6293, 2349;
#                       Q2_K 2178 / 1498 / 1555, 1800, 2309
#   128 (T = 4096):     IQ3_XXS 32 rows 3383, 9562, 2763;  IQ3_S 3558, 10503, 2788;  Q2_K 2827, 3096, 2754
# The rule reads the mean rows an expert, measured with uniform random routings; a skewed prefill routing reads a
# hot expert's weights once per block (not measured).
MMA_MOE_MAX_ROWS_PER_EXPERT = {int(_T.Q4_K): 16, int(_T.Q5_K): 16, int(_T.Q6_K): 64, int(_T.Q8_0): 16,
                               int(_T.IQ2_XXS): 64, int(_T.IQ2_S): 64, int(_T.IQ3_XXS): 64, int(_T.IQ3_S): 64,
                               int(_T.Q2_K): 64}


def mma_moe_rows_text(types) -> str:
    """Up to how many routed rows an expert MoEs of ``types`` (ggml type ints, at least one) stay on the
    register-MMA kernels, as reports say it ("16-64")."""
    limits = sorted({MMA_MOE_MAX_ROWS_PER_EXPERT.get(int(t), MOE_DECODE_MAX_ROWS_PER_EXPERT) for t in types})
    return str(limits[0]) if len(limits) == 1 else f"{limits[0]}-{limits[-1]}"


# The widest moe_align block a MoE of these types takes on the register-MMA kernels (else gguf_mma.cols_for's 32
# from 16 rows an expert): 16-row blocks were the fastest at every size measured above for Q2_K (8 / 16 / 32 / 64
# rows: 341 / 488 / 829 / 1498 µs against 491 / 547 / 878 / 1555 in blocks of 32) and at 16 rows, the last these run
# there, for Q4_K and Q5_K (635 / 728 against 655 / 762)
MMA_MOE_MAX_BLOCK_ROWS = {int(_T.Q4_K): 16, int(_T.Q5_K): 16, int(_T.Q2_K): 16}
# From how many routed rows an expert a MoE not on the register-MMA kernels (past their limit above, or a type or
# setting they do not take) dequantizes its experts to the activation dtype a chunk at a time and multiplies 16-bit
# tiles (gguf_matmul._moe_dequantized: a weight decoded once a call) instead of decoding weight tiles in every 64-row
# block (the prefill tiles).  H200, TP-8 shapes, 2026-12-03, µs,
# prefill tiles / dequantized (best tile shape) at 128 and 256 rows an expert (T = 4096, 8192; vLLM on bf16 weights
# 1256, 2088): Q4_K 2376 / 2534, 4315 / 3430;  Q5_K 2655 / 2582, 4736 / 3520;  Q6_K 7074 / 2653, 12518 / 3593;
# Q8_0 3840 / 2606, 6780 / 3547;  IQ2_XXS 6144 / 2391, 10967 / 3335; at 64 rows Q8_0 2275 / 2355.  The dequantizing
# path costs ~1.8 ms whatever T (its dequantization of every expert), so the K-quants' tiles stay below 128 rows.
# The other types were not timed on the dequantizing path (GPU-tested only); their tiles (2026-12-02: Q2_K, Q3_K,
# IQ4_XS/NL, Q4_0, Q5_0 1.0-1.6 ms at 8-32 rows; IQ1/IQ3/IQ2_XS 2.4-4.4 ms already at 8 rows) grow with each 64-row
# block as the measured types' do, so they switch where every measured type's dequantized path had won: IQ1/IQ3/
# IQ2_XS (tiles already slower than the IQ2_XXS dequantized path at 8 rows) from 64 rows, the rest from 128.
# (Q6_K and IQ2 at 64 rows: 2377 and 2125 µs dequantized against 4288 and 3706 on the tiles, where the register-MMA
# kernels, at 64 rows the faster, do not take them.)  Q2_K, H200, 2026-12-06 (bench/results/2026-12-06-s24b-*), µs
# tiles / dequantized: 1224 / 1815 at 32 rows, 2441 / 1982 at 96 (the tiles grow 19 µs a row, the dequantized path
# 2.6: even near 66 rows), so past its register-MMA limit (64) Q2_K dequantizes.
MOE_DEQUANT_DEFAULT_MIN_ROWS = 128
MOE_DEQUANT_MIN_ROWS_PER_EXPERT = {int(_T.Q4_K): 192, int(_T.Q5_K): 128, int(_T.Q6_K): 64, int(_T.Q8_0): 128,
                                   int(_T.IQ2_XXS): 64, int(_T.IQ2_S): 64, int(_T.IQ2_XS): 64, int(_T.IQ3_XXS): 64,
                                   int(_T.IQ3_S): 64, int(_T.IQ1_S): 64, int(_T.IQ1_M): 64, int(_T.Q2_K): 64}
K_MULTIPLE = 256  # the kernels step through K in half super-blocks; GLM-5's input widths are all multiples of 256


# A MoE whose w13 runs on the register-MMA kernel but whose w2 is an IQ type vLLM's vector kernel decodes faster
# than the tile kernels (e.g. IQ2_XXS gate/up with an IQ3_XXS down): vLLM up to this many tokens.  Measured on the
# UD-IQ2_M mix of the rank-of-8 slice while its IQ2_S down ran on the tile kernel (2026-12-03, H200): 1 token, shim
# 63 µs a layer (IQ2_XXS register-MMA 19 + IQ2_S tile 36 + align and sum) against vLLM's 52; 32 tokens, shim 603
# against vLLM's 1366.  That mix no longer meets the rule (IQ2_S is on the register-MMA kernel since 2026-12-03).
MIXED_VLLM_MOE_DECODE_TOKENS = 1


# The expert types vLLM 0.23 multiplies with its tile MoE kernel (``ggml_moe_a8``) past 64 tokens, when both of a
# MoE's types are among them (its gguf.py MMQ_QUANT_TYPES); a MoE with any other type (the IQ types) runs its vector
# kernel (``ggml_moe_a8_vec``) at every size, which launches one block per routed token along the grid's z axis
# (csrc/quantization/gguf/moe_vec.cuh: block_nums(..., 1, tokens * top_k)).  CUDA allows 65 535 there: a step of
# more routed tokens fails with "CUDA error: invalid argument" (H200, 2026-12-04: a UD-IQ2_M-like GLM-5 slice on
# vLLM's kernels at vLLM's default 8 192 batched tokens x top-8 = 65 536, in start-up's profile run).
VLLM_MOE_TILE_TYPES = (int(_T.Q4_0), int(_T.Q4_1), int(_T.Q5_0), int(_T.Q5_1), int(_T.Q8_0), int(_T.Q8_1), int(_T.Q2_K),
                       int(_T.Q3_K), int(_T.Q4_K), int(_T.Q5_K), int(_T.Q6_K))
VLLM_MOE_VECTOR_MAX_ROUTED = 65535


def vllm_moe_max_tokens(top_k: int, *qtypes: int) -> int | None:
    """The most tokens a step may have for vLLM's kernels to run a MoE of these expert types (None: no limit)."""
    if all(int(t) in VLLM_MOE_TILE_TYPES for t in qtypes):
        return None
    return VLLM_MOE_VECTOR_MAX_ROUTED // top_k


def vllm_moe_decode_faster(qtype13: int, tokens: int, qtype2: int | None = None) -> bool:
    """Whether vLLM's vector MoE kernel computed a call of this many tokens faster than the shim's (by w13's type,
    or the mixed rule above when w13 is a register-MMA type and w2 an IQ type vLLM decodes faster)."""
    if qtype2 is not None and int(qtype13) in MMA_DECODE_TYPES and int(qtype2) in VLLM_MOE_DECODE_TOKENS:
        return tokens <= MIXED_VLLM_MOE_DECODE_TOKENS
    return tokens <= VLLM_MOE_DECODE_TOKENS.get(int(qtype13), 0)


def vllm_decodes(*qtypes: int) -> bool:
    """False when vLLM's ggml kernels cannot read one of these weights: a type they decode wrongly
    (VLLM_MISDECODED_TYPES) or a weight repacked at load (is_packed)."""
    return not any(int(t) in VLLM_MISDECODED_TYPES or is_packed(t) for t in qtypes)


def shim_kernel_covers(ggml_type: int, k: int) -> bool:
    """True when a weight of this type (or its packed layout) with input width ``k`` runs on the shim's kernels."""
    return file_type(ggml_type) in SHIM_KERNEL_TYPES and k % K_MULTIPLE == 0


# Weights the loader repacks once so the kernels' code loads are aligned (kernels/gguf_mma.pack; 16 bytes, IQ2 8; the
# same bytes moved, so the products are bit-equal): the file's Q8_0 (34-byte) and Q6_K (210-byte) blocks are only 2-byte
# aligned.  H200, TP-8 shapes, bench/journal/2026-12-05.md, register-MMA kernels, µs file -> packed: Q8_0 MoE 38 -> 22
# (T = 1), 529 -> 279 (32), 718 -> 347 (64: 75 % of the floor); Q6_K MoE 33 -> 26, 379 -> 285, 508 -> 392; lm_head Q8_0
# 104 -> 43, Q6_K 77 -> 52 (1 row; vLLM's vector kernel 60 and 64).  IQ2_XXS (66-byte) and IQ2_S (82-byte) blocks,
# 8-byte code loads packed: H200, 2026-12-06, MoE 5-11 % faster (IQ2_XXS 266.0 -> 235.9 µs at T = 32), lm_head at 32
# rows 95.8 -> 81.8; H100, 2026-12-06, IQ2_XXS MoE 379 -> 353 (T = 128), 456 -> 421 (256), 1056 -> 977 (1024); H200,
# 2026-12-06: IQ2_XXS MoE 268 -> 237 (T = 32), 668 -> 625 (512), 1072 -> 995 (1024), lm_head 44.5 -> 41.3 (1 row), 96.6
# -> 83.0 (32); IQ2_S MoE 272 -> 254 (T = 32) and lm_head 53.0 -> 45.8 (1 row) but MoE 615 -> 667 (512) and 1003 -> 1068
# (1024) in 32-row blocks: kept packed for decode, the 16-32-rows-an-expert prefill chunk 6-8 % slower (an IQ2_S down
# projection alone: a third of those bytes).  Outputs bit-equal on every serving plan (tests/gpu/test_gguf_mma_gpu.py).
# Linears and experts only: vLLM's embedding lookup reads the file's layout. GLM5_SHIM_GGUF_PACK=0 keeps the file's
# layout.
LOAD_PACKED_TYPES = traits.LOAD_PACKED_TYPES
# A packed weight's type, as the loader records it in its layer (qweight_type.weight_type / shard_weight_type), so
# that the type alone routes every call: vLLM's kernels never see it (vllm_decodes), the shim's read it packed
PACKED_TYPE_OFFSET = 1 << 10
# The same types' dense linears at 1-8 rows run on the register-MMA kernels once packed (2026-12-05, µs, packed
# register-MMA / tile kernel on the file's layout: lm_head Q8_0 43 / 110, q_a+kv_a 10.3 / 24.4, o_proj 8.8 / 18.6;
# Q6_K 52 / 131, 14.1 / 24.0, 12.2 / 20.0), where the file's Q8_0 stayed on the tile kernel (MMA_LINEAR_TYPES); the
# packed IQ2 types where their file layout does
MMA_PACKED_LINEAR_TYPES = LOAD_PACKED_TYPES


def packed_type(ggml_type: int) -> int:
    """The type a weight of ``ggml_type`` is recorded under once repacked (one of LOAD_PACKED_TYPES)."""
    if int(ggml_type) not in LOAD_PACKED_TYPES:
        raise ValueError(f"GGUF type {int(ggml_type)} has no packed layout (those: {LOAD_PACKED_TYPES})")
    return int(ggml_type) + PACKED_TYPE_OFFSET


def is_packed(qtype: int) -> bool:
    return int(qtype) >= PACKED_TYPE_OFFSET


def file_type(qtype: int) -> int:
    """The GGML type of a weight, packed or not."""
    return int(qtype) - PACKED_TYPE_OFFSET if is_packed(qtype) else int(qtype)


def packs_at_load(ggml_type: int, k: int) -> bool:
    """Whether the loader repacks a linear or expert weight of this type and input width (when packing is on)."""
    return int(ggml_type) in LOAD_PACKED_TYPES and k % K_MULTIPLE == 0


GGUF_BF16_GATE_CAPABILITY = 100  # the threshold vLLM's own gate uses (has_device_capability(100))


def gguf_bf16_refused_at(capability: tuple[int, int]) -> bool:
    """vLLM 0.23's gate: its GGUF kernels are refused bf16 activations from compute capability 10.0 on (they gave
    garbage in bf16 on an RTX 5090; has_device_capability compares major * 10 + minor)."""
    return capability[0] * 10 + capability[1] >= GGUF_BF16_GATE_CAPABILITY


# Up to how many activation rows a dense linear goes to vLLM's vector kernel (``mul_mat_vec_q``), where vLLM's
# kernels are trusted with the activations.  At one row it beats the shim's on most TP-8 shapes (H200, 2026-12-03,
# bench/results/2026-12-03-s12-callA-iq2.md: q_a+kv_a IQ2_S 10.6 against 18.7 µs, Q6_K 15.7 against 19.5; lm_head
# Q6_K 63 against 78), but its time grows with every row while the shim's stays flat: at 2 rows the shim's is faster
# on 8 of 9 shapes (lm_head Q6_K 83 against 120, IQ2_XXS 58 against 128), at 4 on all.  Until 2026-12-04 vLLM kept
# what it sends there itself (2 rows past 5120 outputs, else 6), and an MTP verify step's 2-row linears cost 1.57x
# a plain step's (bench/journal/2026-12-04.md).
VLLM_LINEAR_MAX_ROWS = 1
VLLM_LINEAR_ROWS_TEXT = "one row" if VLLM_LINEAR_MAX_ROWS == 1 else f"1-{VLLM_LINEAR_MAX_ROWS} rows"  # for reports


def kernel_path(ggml_type: int, k: int, enabled: bool = True) -> str:
    """'shim', 'vllm' (vLLM's ggml kernels) or 'float' (unquantized: a plain matmul)."""
    if is_float_type(ggml_type):
        return "float"
    return "shim" if enabled and shim_kernel_covers(ggml_type, k) else "vllm"


# -- a whole file: which kernel each of its quantized weights runs on --------------------------------------------
def matmul_paths(plan, shim_kernels: bool = True) -> dict[str, dict[str, int]]:
    """Which GGUF matmul runs each quantized weight vLLM receives: {"shim": {type: tensors}, "vllm": {...}}
    (kernel_path decides; the embedding is a row lookup, not a matmul, and is left out)."""
    out: dict[str, Counter] = {"shim": Counter(), "vllm": Counter()}
    for t in plan.tensors:
        name = t.vllm_type
        if name is None or t.gguf_name == "token_embd.weight":
            continue
        path = kernel_path(int(gguf.GGMLQuantizationType[name]), t.info.shape[-1], shim_kernels)
        if path != "float":
            out[path][name] += 1
    return {path: dict(sorted(c.items())) for path, c in out.items()}


@functools.lru_cache(maxsize=8)
def every_matmul_on_shim_kernels(path: str) -> bool:
    """True when every quantized weight of the GGUF at ``path`` that reaches a GGUF matmul runs on the shim's
    kernels (header-only; False for a file the loader would refuse or that cannot be read)."""
    from glm5_shim import settings
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.errors import GGUFError
    from glm5_shim.gguf.load_plan import plan_tensors
    from glm5_shim.gguf.reader import open_gguf

    if settings.gguf_kernels_choice() != "shim":
        return False
    try:
        model = open_gguf(path)
        config = build_hf_config(model, check_shapes=False)
        plan = plan_tensors(model, config)
    except (GGUFError, OSError, ValueError, KeyError):
        return False
    return not plan.refused and not matmul_paths(plan)["vllm"]
