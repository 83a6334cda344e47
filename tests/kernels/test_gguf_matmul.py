"""GGUF matmul kernels under the Triton interpreter (CPU), against float64 on the ``gguf`` package's dequantization.

fp32 activations: the kernel's dot is fp32 (ieee), weights decode exactly in fp32 (d*sc is exact, q*scale and
its min subtraction round once each): 1e-5 relative.  fp16: weights and the output round once to fp16
(2**-12 relative, rms 2**-12/sqrt(3) each): 2e-3 (bf16 is covered on the GPU; the interpreter's bf16 dot is wrong).
"""
import gguf
import pytest
import torch

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.gguf import tiles as gm
from glm5_shim.kernels.gguf import reference as ref


TYPES = {gguf.GGMLQuantizationType(t).name: t for t in gm.SUPPORTED_TYPES}  # every type the kernels read
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _rel(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


# blocks from a real quantizer where one exists here (none for the IQ types: random valid blocks, every bit pattern)
@pytest.mark.parametrize("name,blocks", [(n, b) for n in TYPES for b in ("random", "quantizer")
                                         if b == "random" or TYPES[n] in ref.QUANTIZABLE])
def test_linear_every_type(name, blocks):
    qt = TYPES[name]
    g = torch.Generator().manual_seed(qt * 3 + (blocks == "random"))
    n, k = 40, 512
    w = ref.random_blocks(qt, n, k, g) if blocks == "random" else ref.quantized_blocks(
        qt, torch.randn(n, k, generator=g) * 0.02)
    w64 = ref.dequantize(w, qt, k)
    for m, dtype in ((1, torch.float32), (5, torch.float16), (19, torch.float32)):
        x = torch.randn(m, k, generator=g).to(dtype)
        assert _rel(gm.gguf_linear(x, w, qt), x.double() @ w64.T) <= TOL[dtype], (name, m, dtype)


def test_linear_plans_split_decode_and_dequantize_prefill():
    """Decode splits K to fill the GPU, prefill above DENSE_DEQUANT_MIN_M rows dequantizes for a plain matmul;
    both give the same product."""
    g = torch.Generator().manual_seed(2)
    w = ref.random_blocks(traits.Q4_K, 70, 1024, g)
    w64 = ref.dequantize(w, traits.Q4_K, 1024)
    decode = gm.linear_plan(3, 70, 1024, num_sms=16)
    assert not decode["dequant"] and decode["split"] > 1
    assert decode["split"] * decode["steps_per_split"] >= 1024 // gm.STEP_K
    m = gm.DENSE_DEQUANT_MIN_M + 1
    assert gm.linear_plan(m, 70, 1024, num_sms=16)["dequant"]
    x = torch.randn(m, 1024, generator=g)
    assert _rel(gm.gguf_linear(x, w, traits.Q4_K), x.double() @ w64.T) <= TOL[torch.float32]
    x = x[:3]
    assert _rel(gm.gguf_linear(x, w, traits.Q4_K, plan=decode), x.double() @ w64.T) <= TOL[torch.float32]


@pytest.mark.parametrize("tuning", [{"BLOCK_M": 16}, {"BLOCK_M": 32, "self_reduce": True},
                                    {"BLOCK_M": 32, "self_reduce": False}, {"BLOCK_M": 64, "self_reduce": True}])
def test_row_tiles_past_16_rows_sum_their_splits_either_way(tuning):
    """The bench's row-tile arms for 17-64 rows (16- or 32-row tiles, the kernel summing its own split planes or a
    second launch): the same product as float64 (40 rows: a last row tile partly filled)."""
    from glm5_shim.kernels import arrivals

    g = torch.Generator().manual_seed(9)
    w = ref.random_blocks(traits.Q4_K, 70, 1024, g)
    x = torch.randn(40, 1024, generator=g).half()
    plan = gm.linear_plan(40, 70, 1024, num_sms=16, tuning=tuning)
    assert plan["BLOCK_M"] == tuning["BLOCK_M"] and plan["split"] > 1
    assert plan["self_reduce"] == tuning.get("self_reduce", True)
    got = gm.gguf_linear(x, w, traits.Q4_K, plan=plan)
    assert _rel(got, x.double() @ ref.dequantize(w, traits.Q4_K, 1024).T) <= TOL[torch.float16]
    assert not arrivals.counters(x.device).any()
    # the plans: 17-32 rows in self-summing 32-row tiles, 33-64 in one 64-row tile and a sum launch
    assert all(gm.linear_plan(m, 70, 1024, num_sms=16)["BLOCK_M"] == 32 for m in (17, 32))
    assert gm.linear_plan(32, 70, 1024, num_sms=16)["self_reduce"]
    assert gm.linear_plan(40, 70, 1024, num_sms=16)["BLOCK_M"] == 64
    assert not gm.linear_plan(40, 70, 1024, num_sms=16)["self_reduce"]


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "IQ2_XXS"])
def test_linear_tiles_with_the_weights_on_the_left_give_the_same_product(name):
    """SWAP (the tile computed transposed, the decoded weights as the dot's left operand, stored back in row order)
    on every tile plan: 3 rows split over K (self-summed), 40 rows in a 64-row tile, 100 rows unsplit; in fp32 the
    unswapped tile's products up to float32 summation order (the interpreter's dot is numpy's matmul, whose order
    inside a 32-value group depends on the BLAS kernel the CPU picks: 2**-20 of the norm, 8x float32's unit
    roundoff), within the float64 bound in fp16.
    The interpreter's own plans take it for Q4_K (linear_tile_tuning: the mma.sync targets')."""
    qt = TYPES[name]
    g = torch.Generator().manual_seed(qt + 5)
    w = ref.random_blocks(qt, 70, 1024, g)
    w64 = ref.dequantize(w, qt, 1024)
    for m in (3, 40, 100):
        x = torch.randn(m, 1024, generator=g)
        plan = gm.linear_plan(m, 70, 1024, num_sms=16, tuning={"BLOCK_M": 64} if m == 100 else None)
        plain = gm.gguf_linear(x, w, qt, plan={**plan, "SWAP": False})
        assert _rel(gm.gguf_linear(x, w, qt, plan={**plan, "SWAP": True}), plain.double()) <= 2 ** -20, m
        got = gm.gguf_linear(x.half(), w, qt, plan={**plan, "SWAP": True})
        assert _rel(got, x.half().double() @ w64.T) <= TOL[torch.float16], m


def test_tile_tunings_reach_the_plans_on_mma_sync_targets_only():
    """The tiles' tunings (linear_tile_tuning, prefill_pass_tuning) are for the mma.sync targets (sm_80-89,
    sm_120/121, the interpreter): the served plans carry them there, under an explicit tuning, and nowhere else
    (sm_90's wgmma and sm_100 keep the untuned tiles)."""
    targets = {None: True, (8, 0): True, (8, 6): True, (8, 9): True, (12, 0): True, (12, 1): True,
               (9, 0): False, (10, 0): False}
    assert {cap: gm.mma_sync_target(cap) for cap in targets} == targets
    tuned_somewhere = False
    for cap, mma_sync in targets.items():
        for q13, q2 in ((traits.Q4_K, traits.Q6_K), (traits.Q6_K, traits.Q4_K), (traits.Q8_0, traits.IQ2_XXS)):
            want13, want2 = gm.prefill_pass_tuning(q13, True, cap), gm.prefill_pass_tuning(q2, False, cap)
            tuned_somewhere |= bool(want13 or want2)
            assert mma_sync or not (want13 or want2), cap
            plan = gm.moe_plan(4096, 8, 256, qtypes=(q13, q2), capability=cap)
            assert plan["fused_gate"] and (plan["w13"], plan["w2"]) == (want13, want2), (cap, q13, q2)
            forced = gm.moe_plan(4096, 8, 256, tuning={"w13": {"SWAP": False}}, qtypes=(q13, q2), capability=cap)
            assert forced["w13"] == {**want13, "SWAP": False} and forced["w2"] == want2
            assert "w13" not in gm.moe_plan(1, 8, 256, qtypes=(q13, q2), capability=cap)   # decode: untuned
            linear = gm.linear_plan(40, 70, 1024, 16, qtype=q13, capability=cap)
            assert linear["SWAP"] == gm.linear_tile_tuning(q13, cap).get("SWAP", False), (cap, q13)
            assert not gm.linear_plan(40, 70, 1024, 16, {"SWAP": False}, qtype=q13, capability=cap)["SWAP"]
        assert gm.linear_plan(40, 70, 1024, 16, qtype=traits.Q4_K, capability=cap)["SWAP"] == mma_sync, cap
    assert tuned_somewhere
    # the plan gguf_moe serves on the interpreter's tensors (float32: the prefill tiles): tuned as an mma.sync target
    g = torch.Generator().manual_seed(3)
    e, h, inter = 8, 256, 256
    w13 = ref.random_blocks(traits.Q4_K, e * 2 * inter, h, g).view(e, 2 * inter, -1)
    w2 = ref.random_blocks(traits.Q6_K, e * h, inter, g).view(e, h, -1)
    plan = gm.chosen_moe_plan(512, 8, torch.float32, w13, w2, traits.Q4_K, traits.Q6_K)
    assert plan["fused_gate"] and not plan.get("dequant")
    assert (plan["w13"], plan["w2"]) == (gm.prefill_pass_tuning(traits.Q4_K, True, None),
                                         gm.prefill_pass_tuning(traits.Q6_K, False, None))


def test_linear_reads_a_row_view_of_a_padded_merged_weight():
    g = torch.Generator().manual_seed(4)
    a = ref.random_blocks(traits.Q4_K, 24, 512, g)
    b = ref.random_blocks(traits.Q6_K, 16, 512, g)
    padded = torch.zeros(40, b.shape[1], dtype=torch.uint8)
    padded[:24, : a.shape[1]] = a
    padded[24:] = b
    x = torch.randn(3, 512, generator=g)
    assert _rel(gm.gguf_linear(x, padded[:24], traits.Q4_K), ref.linear_reference(x, a, traits.Q4_K)) <= 1e-5
    assert _rel(gm.gguf_linear(x, padded[24:], traits.Q6_K), ref.linear_reference(x, b, traits.Q6_K)) <= 1e-5


def test_bad_weights_are_refused_in_one_line():
    x = torch.randn(2, 512)
    with pytest.raises(ValueError, match="GGUF type 9 has no shim kernel"):  # Q8_1: llama.cpp's activation type
        gm.gguf_linear(x, torch.zeros(4, 576, dtype=torch.uint8), 9)
    with pytest.raises(ValueError, match="expected 288 contiguous bytes"):
        gm.gguf_linear(x, torch.zeros(4, 200, dtype=torch.uint8), traits.Q4_K)
    with pytest.raises(ValueError, match="expected 2-byte aligned rows"):
        gm.gguf_linear(x, torch.zeros(4 * 288 + 1, dtype=torch.uint8)[1:].view(4, 288), traits.Q4_K)
    with pytest.raises(ValueError, match="K=320 is not a multiple of 256"):
        gm.gguf_linear(torch.randn(2, 320), torch.zeros(4, 360, dtype=torch.uint8), traits.Q8_0)


def _moe(q13, q2, e, h, inter, t, top_k, g, hot=False):
    w13 = torch.stack([ref.random_blocks(q13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(q2, h, inter, g) for _ in range(e)])
    x = torch.randn(t, h, generator=g)
    ids = (torch.arange(top_k).repeat(t, 1) if hot else
           torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])).to(torch.int32)
    wts = torch.rand(t, top_k, generator=g)
    return w13, w2, x, ids, wts


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K", "IQ2_XXS", "IQ2_S"])
def test_packed_weights_on_every_linear_plan_give_the_file_layouts_product(name):
    """A weight repacked at load (gguf_mma.pack) through each plan gguf_linear takes — the tile kernel split over K
    (decode) and in 64-row prefill tiles, the dequantizing path, the register-MMA kernel — gives the file layout's
    product bit for bit (the same bytes decoded the same way), and dequantizes to the same numbers.  Rows of one
    to 8 super-blocks (Q6_K at K = 256 and 512: packed rows padded to 16 bytes, its scales and d found by K)."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma

    qt = TYPES[name]
    g = torch.Generator().manual_seed(qt + 91)
    for n, k in ((40, 256), (24, 512), (16, 2048)):
        w = (ref.quantized_blocks(qt, torch.randn(n, k, generator=g) * 0.02) if qt in ref.QUANTIZABLE
             else ref.random_blocks(qt, n, k, g))
        p = gguf_mma.pack(w, qt)
        assert torch.equal(gm.gguf_dequantize(p, qt, k, torch.float32, packed=True),
                           gm.gguf_dequantize(w, qt, k, torch.float32))
        for m, dtype, plan in ((3, torch.float32, gm.linear_plan(3, n, k, 16)),
                               (70, torch.float32, gm.linear_plan(70, n, k, 16)),
                               (gm.DENSE_DEQUANT_MIN_M + 1, torch.float16, None), (5, torch.float16, None)):
            x = torch.randn(m, k, generator=g).to(dtype)
            want = gm.gguf_linear(x, w, qt, plan=plan)
            got = gm.gguf_linear(x, p, qt, plan=plan, packed=True)
            assert torch.equal(got, want), (name, n, k, m, plan)
        if k == 256 and qt in gguf_mma.PLANES:   # the file's rows are shorter than the packed layout's:
            with pytest.raises(ValueError,              # refused, one line
                               match=rf"expected {gguf_mma.packed_row_bytes(qt, k)} contiguous bytes for K=256 packed"):
                gm.gguf_linear(x, w, qt, packed=True)
    with pytest.raises(ValueError, match="no packed layout"):
        gm.gguf_linear(x, ref.random_blocks(traits.Q4_K, 8, 256, g), traits.Q4_K, packed=True)


@pytest.mark.parametrize("q13,q2", [("Q4_K", "Q6_K"), ("Q5_K", "Q8_0"), ("Q2_K", "Q3_K"), ("IQ4_XS", "IQ4_NL"),
                                    ("IQ2_XXS", "IQ3_XXS"), ("IQ2_S", "IQ3_S"), ("IQ2_XS", "Q4_K"),
                                    ("IQ1_S", "IQ1_M"), ("Q4_0", "Q5_0"), ("Q4_1", "Q5_1")])
def test_moe_decode_split_and_prefill_fused(q13, q2):
    """Few rows per expert: w13 split over K, SiLU after the sum; many rows per expert (one expert set hot):
    gate and up fused in one tile.  Both against float64."""
    q13, q2 = TYPES[q13], TYPES[q2]
    g = torch.Generator().manual_seed(q13 + 17 * q2)
    e, h, inter, top_k = 8, 256, 256, 2
    for t, hot in ((3, False), (24, True)):
        w13, w2, x, ids, wts = _moe(q13, q2, e, h, inter, t, top_k, g, hot)
        plan = gm.moe_plan(t, top_k, e)
        assert plan["fused_gate"] == hot
        want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
        assert _rel(gm.gguf_moe(x, w13, w2, wts, ids, q13, q2), want) <= TOL[torch.float32], (t, hot)
    # fp16 on the fused tiles named explicitly: in 16-bit activations a register-MMA pair (Q4_K/Q6_K, Q5_K/Q8_0)
    # would take the decode regime at these 6 rows an expert (test_gguf_mma's threshold test)
    got = gm.gguf_moe(x.half(), w13, w2, wts, ids, q13, q2, plan=plan)
    assert _rel(got, ref.moe_reference(x.half(), w13, w2, wts, ids, q13, q2)) <= 2 * TOL[torch.float16]


@pytest.mark.parametrize("q13,q2", [("Q4_K", "Q6_K"), ("Q8_0", "IQ2_XXS"), ("Q5_K", "Q3_K"), ("IQ4_XS", "Q4_K")])
def test_prefill_tiles_tuned_per_pass(q13, q2):
    """The prefill tiles with each pass tuned on its own (plan["w13"] / plan["w2"]): the weights as the dot's left
    operand (SWAP: the product computed transposed, stored back in row order) and 32-feature blocks, on the file's
    layout and on packed weights; fp32 and fp16 against float64, and SWAP the unswapped tiles' products in fp32 up
    to float32 summation order (numpy's, in the interpreter: 2**-20 of the norm, as for the linear tiles)."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma

    q13, q2 = TYPES[q13], TYPES[q2]
    g = torch.Generator().manual_seed(3 * q13 + q2)
    e, h, inter, top_k, t = 6, 256, 256, 2, 40
    w13, w2, x, ids, wts = _moe(q13, q2, e, h, inter, t, top_k, g, hot=True)
    base = gm.moe_plan(512, top_k, 8)
    assert base["fused_gate"]
    want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
    plain = gm.gguf_moe(x, w13, w2, wts, ids, q13, q2, plan=base)
    for w13_t, w2_t in ((dict(SWAP=True), dict(SWAP=True)), (dict(BLOCK_N=32, SWAP=True), dict(BLOCK_N=32)),
                        (dict(BLOCK_N=32), dict(BLOCK_N=32, SWAP=True))):
        plan = {**base, "w13": w13_t, "w2": w2_t}
        got = gm.gguf_moe(x, w13, w2, wts, ids, q13, q2, plan=plan)
        assert _rel(got, want) <= TOL[torch.float32], (w13_t, w2_t)
        if w13_t.get("BLOCK_N", 64) == 64 and w2_t.get("BLOCK_N", 64) == 64:
            assert _rel(got, plain.double()) <= 2 ** -20, (w13_t, w2_t)
        half = gm.gguf_moe(x.half(), w13, w2, wts, ids, q13, q2, plan=plan)
        assert _rel(half, ref.moe_reference(x.half(), w13, w2, wts, ids, q13, q2)) <= 2 * TOL[torch.float16]
    if q13 in gguf_mma.PACKERS or q2 in gguf_mma.PACKERS:   # the layout the loader repacks these types to
        p13 = gguf_mma.pack(w13, q13) if q13 in gguf_mma.PACKERS else w13
        p2 = gguf_mma.pack(w2, q2) if q2 in gguf_mma.PACKERS else w2
        plan = {**base, "w13": dict(BLOCK_N=32, SWAP=True), "w2": dict(SWAP=True)}
        got = gm.gguf_moe(x, p13, p2, wts, ids, q13, q2, plan=plan, packed13=q13 in gguf_mma.PACKERS,
                          packed2=q2 in gguf_mma.PACKERS)
        assert torch.equal(got, gm.gguf_moe(x, w13, w2, wts, ids, q13, q2, plan=plan))


@pytest.mark.parametrize("q13,q2", [("Q4_K", "Q6_K"), ("IQ2_XXS", "Q8_0"), ("Q2_K", "IQ4_XS"), ("IQ3_S", "IQ1_M")])
def test_moe_dequantized_chunks(q13, q2):
    """Prefill-sized MoEs on experts dequantized a chunk at a time (gguf_matmul._moe_dequantized): all experts in
    one chunk, chunks of 2 (the last partly filled: 7 experts), one expert a chunk; fp32 (exact weights, ieee dots)
    and fp16 (weights rounded once, as on every path) against float64."""
    q13, q2 = TYPES[q13], TYPES[q2]
    g = torch.Generator().manual_seed(5 * q13 + q2)
    e, h, inter, top_k = 7, 256, 256, 3
    per_expert = 2 * inter * h
    for t, hot, chunk_experts, dtype in ((20, False, e, torch.float32), (20, False, 2, torch.float16),
                                         (9, True, 1, torch.float32)):
        w13, w2, x, ids, wts = _moe(q13, q2, e, h, inter, t, top_k, g, hot)
        x = x.to(dtype)
        plan = {**gm.moe_plan(t, top_k, e, dequant=True),
                "chunk_bytes": chunk_experts * per_expert * x.element_size()}
        want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
        tol = TOL[dtype] * (2 if dtype == torch.float16 else 1)
        assert _rel(gm.gguf_moe(x, w13, w2, wts, ids, q13, q2, plan=plan), want) <= tol, (t, chunk_experts, dtype)


def test_moe_regimes_follow_the_measured_thresholds(monkeypatch):
    """Which path a MoE takes by its mean rows an expert (routing's 2026-12-03 and 2026-12-06 tables), and the
    register-MMA block it launches (cols_for twice the mean, at most MMA_MOE_MAX_BLOCK_ROWS): Q6_K on the
    register-MMA kernel to 64 rows, dequantized past it; Q4_K on the register MMA to 16 rows (in 16-row blocks), the
    prefill tiles to 191, dequantized from 192; Q2_K on the register MMA to 64 rows (16-row blocks), dequantized
    past it; IQ3_XXS on the register MMA to 64 rows, dequantized past it; IQ4_XS (no register-MMA kernel) on the
    tiles below 128 rows; float32 activations never dequantized (its tiles are sized for 16 bits)."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma

    taken = []
    monkeypatch.setattr(gm, "_moe_dequantized", lambda *a, **kw: taken.append("dequant") or a[-1])
    monkeypatch.setattr(gguf_mma, "launch", lambda *a, **kw: taken.append(f"mma x{kw['cols']}"))
    monkeypatch.setattr(gm, "_tile_pass", lambda *a, **kw: taken.append("tiles"))
    monkeypatch.setattr(gm, "mma_decode", lambda qtype, *a, **kw: int(qtype) in gguf_mma.KERNEL_TYPES)
    e, top_k, h, inter = 256, 8, 256, 256
    f16, f32 = torch.float16, torch.float32
    for name, rows, dtype, want in (("Q6_K", 8, f16, "mma x16"), ("Q6_K", 16, f16, "mma x32"),
                                    ("Q6_K", 64, f16, "mma x32"), ("Q6_K", 96, f16, "dequant"),
                                    ("Q4_K", 8, f16, "mma x16"), ("Q4_K", 16, f16, "mma x16"),
                                    ("Q4_K", 32, f16, "tiles"), ("Q4_K", 128, f16, "tiles"),
                                    ("Q4_K", 256, f16, "dequant"),
                                    ("Q2_K", 64, f16, "mma x16"), ("Q2_K", 96, f16, "dequant"),
                                    ("Q2_K", 96, f32, "tiles"),
                                    ("IQ3_XXS", 16, f16, "mma x32"), ("IQ3_XXS", 64, f16, "mma x32"),
                                    ("IQ3_XXS", 96, f16, "dequant"),
                                    ("IQ4_XS", 64, f16, "tiles"), ("IQ4_XS", 128, f16, "dequant")):
        qt = TYPES[name]
        t = rows * e // top_k
        x = torch.zeros(t, h, dtype=dtype)
        w13 = torch.zeros(e, 2 * inter, gm.row_bytes(qt, h), dtype=torch.uint8)
        w2 = torch.zeros(e, h, gm.row_bytes(qt, inter), dtype=torch.uint8)
        ids = torch.zeros(t, top_k, dtype=torch.int32)
        taken.clear()
        gm.gguf_moe(x, w13, w2, torch.zeros(t, top_k), ids, qt, qt, align=lambda *a: (None, torch.zeros(1), None))
        assert taken and taken[0] == want, (name, rows, dtype, taken)


def test_moe_align_groups_every_routed_row_once_in_blocks_of_its_expert():
    g = torch.Generator().manual_seed(8)
    for t, e, top_k, bm in ((1, 16, 4, 16), (7, 8, 3, 4), (50, 6, 2, 8)):
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])
        sorted_ids, expert_ids, num_padded = gm.moe_align(ids, bm, e)
        n = int(num_padded)
        counts = torch.bincount(ids.reshape(-1), minlength=e)
        assert n == int(((counts + bm - 1) // bm * bm).sum())
        rows = sorted_ids[:n].view(-1, bm).long()
        real = rows < ids.numel()
        assert torch.equal(rows[real].sort().values, torch.arange(ids.numel()))
        owner = expert_ids[: n // bm].long()[:, None].expand_as(rows)[real]
        assert torch.equal(owner, ids.reshape(-1).long()[rows[real]])
        assert sorted_ids.numel() >= n and expert_ids.numel() * bm >= n


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_kernel_every_type(name):
    """gguf_dequantize (the dense prefill path's first half) against the gguf package: float32 output rounds each
    weight at most once in float32 (2**-24 relative to the row's largest), float16 once in float16 (2**-11)."""
    qt = TYPES[name]
    g = torch.Generator().manual_seed(qt + 101)
    n, k = 24, 512
    w = ref.random_blocks(qt, n, k, g)
    w64 = ref.dequantize(w, qt, k)
    scale = w64.abs().amax(dim=1, keepdim=True)
    for dtype, u in ((torch.float32, 2.0 ** -24), (torch.float16, 2.0 ** -11)):
        got = gm.gguf_dequantize(w, qt, k, dtype).double()
        assert ((got - w64).abs() <= 2 * u * scale).all(), (name, dtype)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "IQ2_XXS", "Q8_0"])
def test_dequantize_in_runs_of_steps_equals_one_step_a_program(name):
    """A program decodes a run of 128-value steps with the next step's loads in flight (DEQUANT_TUNING["steps"]):
    runs that do not divide the row (10 steps in runs of 3 or 4 or 8), rows past the last block of rows, and one step a
    program give the same bits (Q4_K has its own loop, the rest load a step ahead)."""
    qt = TYPES[name]
    g = torch.Generator().manual_seed(qt + 7)
    n, k = 37, 1280
    w = ref.random_blocks(qt, n, k, g)
    w64 = ref.dequantize(w, qt, k)
    want = gm.gguf_dequantize(w, qt, k, torch.float32, tuning={"steps": 1})
    assert ((want.double() - w64).abs() <= 2.0 ** -23 * w64.abs().amax(dim=1, keepdim=True)).all()
    for tuning in ({"steps": 3}, {"steps": 4, "BLOCK_N": 16}, {"steps": 8, "BLOCK_N": 64}):
        assert torch.equal(gm.gguf_dequantize(w, qt, k, torch.float32, tuning=tuning), want), tuning


def test_grid_tables_hold_the_gguf_grids_as_bytes_and_refuse_values_that_do_not_fit(monkeypatch):
    """The IQ kernels read gguf.quants' own grids from a uint8 table (IQ1: value + 1); a grid the bytes cannot hold
    is refused in one line naming it, not silently truncated."""
    quants = {traits.IQ2_XXS: gguf.quants.IQ2_XXS, traits.IQ2_S: gguf.quants.IQ2_S, traits.IQ3_XXS: gguf.quants.IQ3_XXS,
              traits.IQ3_S: gguf.quants.IQ3_S, traits.IQ2_XS: gguf.quants.IQ2_XS, traits.IQ1_S: gguf.quants.IQ1_S,
              traits.IQ1_M: gguf.quants.IQ1_M}
    for qt, quant in quants.items():
        quant.init_grid()
        table = gm.grid_table(qt, torch.device("cpu"))
        offset = gm.GRID_IQ1_OFFSET if qt in (traits.IQ1_S, traits.IQ1_M) else 0
        assert table.dtype == torch.uint8 and table.shape == quant.grid_shape
        assert torch.equal(table.double() - offset, torch.from_numpy(quant.grid.reshape(quant.grid_shape)).double())
    with pytest.raises(ValueError, match="GGUF type 12 has no grid"):
        gm.grid_table(traits.Q4_K, torch.device("cpu"))
    monkeypatch.setattr(gguf.quants.IQ3_S, "grid", gguf.quants.IQ3_S.grid * 20)
    with pytest.raises(ValueError, match=r"gguf.quants.IQ3_S.grid holds values the kernels cannot hold as bytes"):
        gm._grid_bytes(traits.IQ3_S)
