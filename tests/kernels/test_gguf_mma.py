"""The register-MMA decode kernels (kernels/gguf/register_mma.py: Q4_K, Q5_K, Q6_K, Q8_0) under the Triton interpreter,
against float64 on the ``gguf`` package's dequantization.

The interpreter runs the Gluon source through kernels/gluon_compat (layouts ignored: they never change a result)
with the PTX replaced by the same arithmetic, so these tests check the permuted K order, the scale decode, the
splits and the routing; the layouts are checked by the offline compiles (test_compile_targets_gguf_matmul), the PTX
by tests/kernels/test_mma_asm.py, the numbers again on the GPU (tests/gpu/test_gguf_mma_gpu.py).  fp16 only (the
interpreter's bf16 dot is wrong).

Bound, elementwise: each weight is off by at most u (|s n| + |m| + |w|) (Q4_K, Q5_K) or 2 u |w| (Q6_K, Q8_0)
(u = 2**-11, fp16's unit roundoff: s and m rounded, then w), the float32 sums by K 2**-24 sum |x w|, the fp16 output
by u |out| (gguf_matmul_reference.mma_error_bound).  A wrong permutation or scale is off by O(|out|), far outside it.
"""
import pytest
import torch

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels import arrivals
from glm5_shim.kernels.gguf import tiles as gm
from glm5_shim.kernels.gguf import reference as ref
from glm5_shim.kernels.gguf import register_mma as mma

U16 = 2.0 ** -11


def _within_bound(got, x, w, qtype, k):
    want = x.double() @ ref.dequantize(w, qtype, k).T
    bound = ref.mma_error_bound(x, w, qtype, k, U16) + U16 * want.abs()
    excess = ((got.double() - want).abs() - bound).max().item()
    return excess <= 0, excess, ((got.double() - want).norm() / want.norm()).item()


def test_q4k_parts_are_the_gguf_dequantization():
    g = torch.Generator().manual_seed(11)
    w = ref.random_blocks(traits.Q4_K, 6, 512, g)
    s, m, n = ref.q4k_parts(w, 512)
    rebuilt = s.repeat_interleave(32, 1) * n - m.repeat_interleave(32, 1)
    assert torch.equal(rebuilt, ref.dequantize(w, traits.Q4_K, 512))


def test_q2k_parts_are_the_gguf_dequantization():
    g = torch.Generator().manual_seed(12)
    w = ref.random_blocks(traits.Q2_K, 6, 512, g)
    s, m, n = ref.q2k_parts(w, 512)
    assert int(n.max()) == 3 and int(n.min()) == 0
    rebuilt = s.repeat_interleave(16, 1) * n - m.repeat_interleave(16, 1)
    assert torch.equal(rebuilt, ref.dequantize(w, traits.Q2_K, 512))


def test_permuted_k_orders_pair_every_code_with_its_activation():
    """k -> (code byte p, nibble) through A_ORDER and k -> activation v through X_ORDER meet where byte p's nibble
    holds value v: Q4_K v = 64 p5 + 32 nibble + (p & 31) (groups of 32: chunk p >> 5 holds groups 2c, 2c + 1),
    Q6_K v = 64 nibble + p."""
    import numpy as np
    p = np.arange(64).reshape(2, 2, 2, 2, 2, 2)                    # (p5 .. p0)
    p_of_k = np.transpose(p, [i - 1 for i in mma.A_ORDER.value[1:]]).reshape(64)
    assert sorted(p_of_k) == list(range(64))
    v = np.arange(128).reshape(2, 2, 2, 2, 2, 2, 2)                # (v6 .. v0)
    for order, value in ((mma.X_ORDER_Q4K, lambda nib: 64 * (p_of_k >> 5) + 32 * nib + (p_of_k & 31)),
                         (mma.X_ORDER_Q6K, lambda nib: 64 * nib + p_of_k)):
        v_of_k = np.transpose(v, [i - 1 for i in order.value if i != 0]).reshape(64, 2)   # [k, nibble]
        for nib in range(2):
            assert (v_of_k[:, nib] == value(nib)).all(), order


_LINEAR_CASES = [(n, b) for n in ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q2_K") for b in ("random", "quantizer")]


_IQ_CASES = [(n, "random") for n in ("IQ2_XXS", "IQ2_S", "IQ3_XXS", "IQ3_S")]   # no IQ quantizer here


@pytest.mark.parametrize("name,blocks", _LINEAR_CASES + _IQ_CASES)
def test_linear_within_bound(name, blocks):
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(3 + (blocks == "random") + qtype)
    n, k = 200, 1024                      # 200: two row tiles, the second partly outside the weight
    w = (ref.random_blocks(qtype, n, k, g) if blocks == "random"
         else ref.quantized_blocks(qtype, torch.randn(n, k, generator=g) * 0.02))
    table = gm.grid_table(qtype, w.device) if qtype in mma.GRID_TYPES else None
    # 1 SM: no split; 16: a split a super-block; 19 rows: three blocks of 8, the last partly filled (the bench's
    # dense arm past the plans' 8 rows)
    for m, num_sms in ((1, 4), (5, 1), (8, 16), (19, 4)):
        x = torch.randn(m, k, generator=g).half()
        got = mma.linear(x, w, qtype, n, num_sms, grid_table=table)
        ok, excess, rel = _within_bound(got, x, w, qtype, k)
        assert ok, (name, blocks, m, num_sms, excess)
        assert rel <= 2e-3, (name, blocks, m, num_sms, rel)


def test_linear_dispatch_follows_the_switch(monkeypatch):
    g = torch.Generator().manual_seed(5)
    w = ref.random_blocks(traits.Q4_K, 64, 512, g)
    x = torch.randn(3, 512, generator=g).half()
    calls = []
    real = mma.launch
    monkeypatch.setattr(mma, "launch", lambda *a, **kw: (calls.append(kw["n"]), real(*a, **kw))[1])
    monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", "tile")
    tile = gm.gguf_linear(x, w, traits.Q4_K)
    assert not calls
    monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", "mma")
    got = gm.gguf_linear(x, w, traits.Q4_K)
    assert calls == [64]
    assert ((got.double() - tile.double()).norm() / tile.double().norm()).item() <= 2e-3
    gm.gguf_linear(torch.randn(9, 512, generator=g).half(), w, traits.Q4_K)     # 9 rows: the tile kernel
    gm.gguf_linear(x.float(), w, traits.Q4_K)                                   # float32: the tile kernel
    assert calls == [64]


def test_iq_linears_stay_on_the_register_mma_kernel_to_their_row_limit(monkeypatch):
    """IQ2_XXS/IQ2_S dense linears run there up to routing.MMA_LINEAR_MAX_ROWS (measured faster to 32
    rows), the K-quants only up to one program's 8 rows; both paths agree with float64 within the bound."""
    g = torch.Generator().manual_seed(7)
    k, n = 512, 40
    calls = []
    real = mma.launch
    monkeypatch.setattr(mma, "launch", lambda *a, **kw: (calls.append(kw["n"]), real(*a, **kw))[1])
    monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", "mma")
    for name, rows_on_mma in (("IQ2_XXS", 32), ("IQ2_S", 32), ("Q4_K", mma.TOKENS)):
        qtype = getattr(traits, name)
        assert gm.mma_linear_max_rows(qtype) == rows_on_mma
        w = ref.random_blocks(qtype, n, k, g)
        for m in (rows_on_mma, rows_on_mma + 1):
            calls.clear()
            x = torch.randn(m, k, generator=g).half()
            got = gm.gguf_linear(x, w, qtype)
            assert bool(calls) == (m <= rows_on_mma), (name, m, calls)
            ok, excess, _ = _within_bound(got, x, w, qtype, k)
            assert ok or m > rows_on_mma, (name, m, excess)   # the tile kernel's own bound is its test's
            want = x.double() @ ref.dequantize(w, qtype, k).T
            assert ((got.double() - want).norm() / want.norm()).item() <= 2e-3, (name, m)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "IQ2_XXS", "Q2_K"])
def test_wide_blocks_within_bound(name):
    """Programs of 16 and 32 activation rows (COLUMN_BLOCKS): a dense linear with blocks partly filled, and a MoE
    in 16/32-row sorted blocks (an expert group hot with 40 rows: a full and a partly filled 32-row block), within
    the bound of 8-row programs.  Rows past 8 are what the wider layouts add: a wrong token index would pair an
    activation row with another row's output, O(|out|) off."""
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(11 + qtype)
    n, k = 72, 512
    w = ref.random_blocks(qtype, n, k, g)
    table = gm.grid_table(qtype, w.device) if qtype in mma.GRID_TYPES else None
    for m, cols in ((13, 16), (32, 32), (19, 32)):
        x = torch.randn(m, k, generator=g).half()
        got = mma.linear(x, w, qtype, n, 4, grid_table=table, cols=cols)
        ok, excess, rel = _within_bound(got, x, w, qtype, k)
        assert ok and rel <= 2e-3, (name, m, cols, excess, rel)
    e, h, inter, top_k = 4, 512, 256, 3
    w13 = torch.stack([ref.random_blocks(qtype, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(traits.Q6_K, h, inter, g) for _ in range(e)])
    for t, hot, cols in ((40, 1, 32), (20, None, 16)):
        x = (torch.randn(t, h, generator=g) * 0.5).half()
        ids = (torch.arange(hot, hot + top_k).repeat(t, 1) % e if hot is not None
               else torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])).to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        plan = {**gm.moe_plan(t, top_k, e, decode=True), "mma": True, "direct": False, "mma_cols": cols}
        got = gm.gguf_moe(x, w13, w2, wts, ids, qtype, traits.Q6_K, plan=plan)
        want = ref.moe_reference(x, w13, w2, wts, ids, qtype, traits.Q6_K)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= 4e-3, (name, t, hot, cols, rel)


def test_program_rows_follow_the_rows_a_weight_tile_serves():
    """cols_for: 8-row programs up to 8 rows, then the smallest wider block that holds them, at most 32; a launch
    refuses other widths, and wide programs outside the sorted layout or a dense linear."""
    assert [mma.cols_for(r) for r in (1, 4, 8, 8.5, 16, 17, 32, 200)] == [8, 8, 8, 16, 16, 32, 32, 32]
    x = torch.zeros(8, 256, dtype=torch.float16)
    w = torch.zeros(16, 144, dtype=torch.uint8)
    out = torch.empty(8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="cols=24"):
        mma.launch(x, w, out, qtype=traits.Q4_K, n=16, num_valid=8, num_blocks=1, split=1, sb_per_split=1, cols=24)
    with pytest.raises(ValueError, match="cols=16"):
        mma.launch(x, w.view(1, 16, 144), out, qtype=traits.Q4_K, n=16, num_valid=8, num_blocks=8, split=1,
                   sb_per_split=1, route=(None, torch.zeros(8, dtype=torch.int32), None, None),
                   routing=mma.PAIRS.value, cols=16)


@pytest.mark.parametrize("types", [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q6_K", "Q8_0"), ("Q8_0", "Q4_K"),
                                   ("Q5_K", "Q5_K"), ("Q4_K", "Q2_K"), ("Q2_K", "Q2_K"), ("Q3_K", "Q6_K"),
                                   ("IQ2_XXS", "IQ2_XXS"),
                                   ("IQ2_XXS", "Q4_K"), ("IQ2_XXS", "IQ2_S"), ("IQ2_S", "IQ2_S"),
                                   ("IQ3_XXS", "IQ3_S"), ("IQ3_S", "IQ3_XXS")])
def test_moe_decode(types):
    """Both passes on the register-MMA kernels, or one of them (the other on the tile kernel with its own
    routing layout); one expert hot or routings spread; float64 reference."""
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(q13 * 7 + q2)
    e, h, inter, top_k = 8, 512, 256, 3
    w13 = torch.stack([ref.random_blocks(q13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(q2, h, inter, g) for _ in range(e)])
    for t, hot in ((1, None), (6, None), (11, 2)):
        x = (torch.randn(t, h, generator=g) * 0.5).half()
        if hot is None:
            ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])
        else:   # every token on the same experts: 11 rows of expert 2..4, two blocks of 8 each
            ids = torch.arange(hot, hot + top_k).repeat(t, 1) % e
        ids = ids.to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
        got = gm.gguf_moe(x, w13, w2, wts, ids, q13, q2, plan={**gm.moe_plan(t, top_k, e), "mma": True})
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= 4e-3, (types, t, hot, rel)


@pytest.mark.parametrize("splits", ["kernel", "launch"])
@pytest.mark.parametrize("direct", [True, False])
def test_moe_decode_in_two_launches(monkeypatch, direct, splits):
    """Both passes on the register-MMA kernels take two launches (and, sorted, the routing's and the top-k sum):
    w13's last program of each gate/up tile pair writes SiLU(gate) * up; direct, w2 sums each token's top-k slots,
    here split inside a slot's super-blocks (inter 512: 2 a slot, 6 units in 2 splits of 3) and an expert shared by
    two tokens' pairs.  The arrival counters are all back at zero after each call.  GLM5_SHIM_GGUF_SPLITS=launch
    (the splits summed by separate launches) computes the same."""
    monkeypatch.setattr(gm, "CPU_NUM_SMS", 6)
    monkeypatch.setenv("GLM5_SHIM_GGUF_SPLITS", splits)
    g = torch.Generator().manual_seed(41 + direct)
    e, h, inter, top_k, t = 6, 512, 512, 3, 3
    w13 = torch.stack([ref.random_blocks(traits.Q4_K, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(traits.Q6_K, h, inter, g) for _ in range(e)])
    x = (torch.randn(t, h, generator=g) * 0.5).half()
    ids = torch.tensor([[0, 1, 2], [2, 3, 0], [5, 4, 1]], dtype=torch.int32)
    wts = torch.rand(t, top_k, generator=g)
    launched = []
    real = mma.launch
    monkeypatch.setattr(mma, "launch", lambda *a, **kw: (launched.append((kw.get("routing", 0), kw["split"])),
                                                          real(*a, **kw))[1])
    got = gm.gguf_moe(x, w13, w2, wts, ids, traits.Q4_K, traits.Q6_K,
                      plan={**gm.moe_plan(t, top_k, e), "mma": True, "direct": direct})
    want = ref.moe_reference(x, w13, w2, wts, ids, traits.Q4_K, traits.Q6_K)
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel <= 4e-3, (direct, rel)
    if direct:
        assert launched == [(mma.PAIRS.value, 1), (mma.TOKEN_SUM.value, 2)]
    else:
        assert [r for r, _ in launched] == [mma.SORTED.value] * 2
    assert not arrivals.counters(x.device).any()


def test_moe_past_the_decode_threshold_stays_on_the_register_mma_kernels_where_measured_faster(monkeypatch):
    """6 rows an expert (16 tokens x top 3 of 8 experts), past MOE_DECODE_MAX_ROWS_PER_EXPERT: a Q4_K MoE and the
    UD-IQ2_M mix stay in the decode regime on the register-MMA kernels (routing.MMA_MOE_MAX_ROWS_PER_EXPERT),
    sorted into 8-row blocks; Q4_K with an IQ4_XS down projection (no register-MMA kernel for IQ4_XS), any MoE with
    GLM5_SHIM_GGUF_DECODE=tile, and Q4_K past its own limit (18 rows: 48 tokens) take the prefill tiles; float64
    reference either way."""
    from glm5_shim.kernels.gguf.routing import MMA_MOE_MAX_ROWS_PER_EXPERT

    g = torch.Generator().manual_seed(77)
    e, h, inter, top_k = 8, 512, 256, 3
    q4k_rows = MMA_MOE_MAX_ROWS_PER_EXPERT[traits.Q4_K]
    assert gm.MOE_DECODE_MAX_ROWS_PER_EXPERT < 16 * top_k / e <= q4k_rows < 48 * top_k / e
    launched = []
    real = mma.launch
    monkeypatch.setattr(mma, "launch", lambda *a, **kw: (launched.append(kw.get("routing", 0)), real(*a, **kw))[1])
    for (q13, q2), t, decode, want_mma in ((("Q4_K", "Q4_K"), 16, "mma", True),
                                           (("IQ2_XXS", "IQ2_S"), 16, "mma", True),
                                           (("Q4_K", "IQ4_XS"), 16, "mma", False),
                                           (("Q4_K", "Q4_K"), 16, "tile", False),
                                           (("Q4_K", "Q4_K"), 48, "mma", False)):
        monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", decode)
        q13, q2 = getattr(traits, q13), getattr(traits, q2)
        w13 = torch.stack([ref.random_blocks(q13, 2 * inter, h, g) for _ in range(e)])
        w2 = torch.stack([ref.random_blocks(q2, h, inter, g) for _ in range(e)])
        x = (torch.randn(t, h, generator=g) * 0.5).half()
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        launched.clear()
        got = gm.gguf_moe(x, w13, w2, wts, ids, q13, q2)
        want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= 4e-3, (q13, q2, t, decode, rel)
        assert launched == ([mma.SORTED.value] * 2 if want_mma else []), (q13, q2, t, decode, launched)


@pytest.mark.parametrize("splits", ["kernel", "launch", "few counters"])
def test_split_k_linears_reduce_in_the_kernel_or_in_a_launch(monkeypatch, splits):
    """Dense decode products split over K (the register-MMA kernel for Q4_K, the tile kernel for Q8_0 and Q2_K):
    the last program of each tile sums the planes (kernel) or a separate launch does (launch, or a launch with more
    tiles than counters); same numbers within the bound, every counter back at zero."""
    monkeypatch.setenv("GLM5_SHIM_GGUF_SPLITS", "launch" if splits == "launch" else "kernel")
    if splits == "few counters":
        monkeypatch.setattr(arrivals, "COUNTER_SLOTS", 1)
    g = torch.Generator().manual_seed(5)
    n, k = 150, 1024
    for qtype in (traits.Q4_K, traits.Q8_0, traits.Q2_K):
        w = ref.random_blocks(qtype, n, k, g)
        x = torch.randn(3, k, generator=g).half()
        got = mma.linear(x, w, qtype, n, 16) if qtype == traits.Q4_K else gm.gguf_linear(x, w, qtype)
        want = x.double() @ ref.dequantize(w, qtype, k).T
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel <= 2e-3, (qtype, splits, rel)
    assert gm.linear_plan(3, n, k, gm.CPU_NUM_SMS)["split"] > 1
    assert not arrivals.counters(x.device).any()


def test_covers_its_types_in_16_bit_activations_on_aligned_rows():
    assert mma.covers(traits.Q4_K, 6144, torch.bfloat16) and mma.covers(traits.Q6_K, 256, torch.float16)
    assert not mma.covers(traits.Q4_K, 6144, torch.float32)
    assert mma.covers(traits.Q5_K, 6144, torch.bfloat16) and mma.covers(traits.Q8_0, 6144, torch.bfloat16)
    assert mma.covers(traits.Q2_K, 6144, torch.bfloat16) and not mma.covers(traits.Q3_K, 6144, torch.bfloat16)
    assert not mma.covers(traits.Q4_K, 384, torch.bfloat16)
    padded = torch.zeros(4, 146, dtype=torch.uint8)      # a merged weight padded to 146 bytes a row
    assert not mma.aligned(padded[:, :144], traits.Q4_K) and mma.aligned(padded[:, :144], traits.Q6_K)
    assert not mma.aligned(torch.zeros(4, 147, dtype=torch.uint8), traits.Q6_K)
    assert mma.aligned(torch.zeros(2, 4, 144, dtype=torch.uint8), traits.Q4_K)


def test_packed_q8_0_is_the_same_bytes_and_the_same_products():
    """pack_q8_0 moves each 8-block group's scales before its codes (16-byte aligned code loads): same size, unpacked
    back bit for bit, dequantizing to the same values; the kernel reading it gives the file layout's output exactly
    (the same arithmetic in the same order), split or not, for rows of one to 19 activations."""
    g = torch.Generator().manual_seed(21)
    n, k = 200, 1024
    w = ref.quantized_blocks(traits.Q8_0, torch.randn(n, k, generator=g) * 0.02)
    packed = mma.pack_q8_0(w)
    assert packed.shape == w.shape and packed.dtype == torch.uint8 and not torch.equal(packed, w)
    assert torch.equal(mma.unpack_q8_0(packed), w)
    # group 0 of row 0: block b's d at bytes 2b, its codes at 16 + 32 b
    for b in range(8):
        assert torch.equal(packed[0, 2 * b:2 * b + 2], w[0, 34 * b:34 * b + 2])
        assert torch.equal(packed[0, 16 + 32 * b:48 + 32 * b], w[0, 34 * b + 2:34 * b + 34])
    experts = torch.stack([w[:64], w[64:128]])
    assert torch.equal(mma.unpack_q8_0(mma.pack_q8_0(experts)), experts)
    for m, num_sms in ((1, 4), (5, 1), (8, 16), (19, 4)):
        x = torch.randn(m, k, generator=g).half()
        want = mma.linear(x, w, traits.Q8_0, n, num_sms)
        got = mma.linear(x, packed, traits.Q8_0, n, num_sms, packed=True)
        assert torch.equal(got, want), (m, num_sms)
        ok, excess, _ = _within_bound(got, x, w, traits.Q8_0, k)
        assert ok, (m, num_sms, excess)
    # reading the file's bytes as packed is wrong (by O(|out|), or NaN where codes are read as scales)
    x = torch.randn(4, k, generator=g).half()
    wrong = mma.linear(x, w, traits.Q8_0, n, 4, packed=True)
    right = mma.linear(x, w, traits.Q8_0, n, 4)
    close = torch.isclose(wrong.double(), right.double(), rtol=0.1, atol=1e-3)   # NaN (codes read as scales) too
    assert close.double().mean().item() < 0.5
    with pytest.raises(ValueError, match="only, not Q4_K"):
        mma.linear(x, ref.random_blocks(traits.Q4_K, 64, k, g), traits.Q4_K, 64, 4, packed=True)
    with pytest.raises(ValueError, match="whole 272-byte groups"):
        mma.pack_q8_0(torch.zeros(4, 34 * 4, dtype=torch.uint8))


def test_packed_q6_k_is_the_same_bytes_and_the_same_products():
    """pack_q6_k puts a row's code bytes first (16-byte aligned), then its scales, then its d, padded to 16 bytes:
    unpacked back bit for bit; the kernel reading it gives the file layout's output exactly, for one super-block a
    row (a TP-8 expert's w2) to 24 (K = 6144), split or not.  Reading the file's bytes as packed is wrong."""
    g = torch.Generator().manual_seed(22)
    for n, k in ((200, 1024), (72, 256), (64, 6144)):
        w = ref.quantized_blocks(traits.Q6_K, torch.randn(n, k, generator=g) * 0.02)
        packed = mma.pack(w, traits.Q6_K)
        nsb = k // 256
        assert packed.shape == (n, mma.q6_k_packed_row_bytes(k)) and packed.shape[1] % 16 == 0
        assert packed.shape[1] - w.shape[1] < 16
        assert torch.equal(mma.unpack(packed, traits.Q6_K, k), w)
        # super-block 0 of row 0: codes at 0, scales at 192 nsb, d at 208 nsb
        assert torch.equal(packed[0, :192], w[0, :192])
        assert torch.equal(packed[0, 192 * nsb:192 * nsb + 16], w[0, 192:208])
        assert torch.equal(packed[0, 208 * nsb:208 * nsb + 2], w[0, 208:210])
        for m, num_sms in ((1, 4), (5, 1), (8, 16)):
            x = torch.randn(m, k, generator=g).half()
            want = mma.linear(x, w, traits.Q6_K, n, num_sms)
            got = mma.linear(x, packed, traits.Q6_K, n, num_sms, packed=True)
            assert torch.equal(got, want), (n, k, m, num_sms)
    x = torch.randn(4, 1024, generator=g).half()
    w = ref.quantized_blocks(traits.Q6_K, torch.randn(200, 1024, generator=g) * 0.02)
    wrong = mma.linear(x, torch.nn.functional.pad(w, (0, mma.q6_k_packed_row_bytes(1024) - w.shape[1])), traits.Q6_K,
                       200, 4, packed=True)
    close = torch.isclose(wrong.double(), mma.linear(x, w, traits.Q6_K, 200, 4).double(), rtol=0.1, atol=1e-3)
    assert close.double().mean().item() < 0.5
    with pytest.raises(ValueError, match="whole 210-byte super-blocks"):
        mma.pack_q6_k(torch.zeros(4, 300, dtype=torch.uint8))


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_S"])
def test_packed_iq2_is_the_same_bytes_and_the_same_products(name):
    """pack puts an IQ2 row's sub-blocks first, 8 bytes each (IQ2_XXS: the 4 grid indexes and the sign/scale word;
    IQ2_S: the 4 index low bytes and the 4 sign bytes: one aligned load), then (IQ2_S) its qh and scale bytes, then
    its d, padded to 8 bytes: unpacked back bit for bit; the kernel reading it gives the file layout's output
    exactly, for one super-block a row (a TP-8 expert's w2: 72 / 88 bytes for 66 / 82) to 8, split or not.  Reading
    the file's bytes as packed is wrong.  (No quantizer here for IQ types: random valid blocks.)"""
    qt = getattr(traits, name)
    g = torch.Generator().manual_seed(23 + qt)
    nbytes = 66 if qt == traits.IQ2_XXS else 82
    table = gm.grid_table(qt, torch.device("cpu"))
    for n, k in ((72, 256), (40, 1024), (16, 2048)):
        w = ref.random_blocks(qt, n, k, g)
        packed = mma.pack(w, qt)
        nsb = k // 256
        assert packed.shape == (n, mma.packed_row_bytes(qt, k)) and packed.shape[1] % 8 == 0
        assert packed.shape[1] - w.shape[1] < 8 and mma.aligned(packed, qt, packed=True)
        assert torch.equal(mma.unpack(packed, qt, k), w)
        sb = min(1, nsb - 1)   # super-block 1 (or 0) of row 3, where the kernels read it
        blk = w[3, nbytes * sb:nbytes * (sb + 1)]
        for j in range(8):     # sub-block j: its 8 bytes at 64 sb + 8 j (IQ2_XXS: the word spread)
            if qt == traits.IQ2_XXS:
                word = torch.tensor([int.from_bytes(bytes(blk[6 + 8 * j:10 + 8 * j].tolist()), "little")])
                spread = int(mma.spread_iq2xxs_signs(word.to(torch.int32))[0]) & 0xFFFFFFFF
                want = torch.cat([blk[2 + 8 * j:6 + 8 * j], torch.tensor(list(spread.to_bytes(4, "little")),
                                                                         dtype=torch.uint8)])
            else:
                want = torch.cat([blk[2 + 4 * j:6 + 4 * j], blk[34 + 4 * j:38 + 4 * j]])
            assert torch.equal(packed[3, 64 * sb + 8 * j:64 * sb + 8 * j + 8], want), j
        if qt == traits.IQ2_S:    # qh and scales at 64 nsb + 16 sb, d at 80 nsb + 2 sb
            assert torch.equal(packed[3, 64 * nsb + 16 * sb:64 * nsb + 16 * sb + 16], blk[66:82])
        d_at = (64 if qt == traits.IQ2_XXS else 80) * nsb + 2 * sb
        assert torch.equal(packed[3, d_at:d_at + 2], blk[:2])
        for m, num_sms in ((1, 4), (5, 1), (8, 16), (19, 4)):
            x = torch.randn(m, k, generator=g).half()
            want = mma.linear(x, w, qt, n, num_sms, grid_table=table)
            got = mma.linear(x, packed, qt, n, num_sms, grid_table=table, packed=True)
            assert torch.equal(got, want), (n, k, m, num_sms)
    x = torch.randn(4, 1024, generator=g).half()
    w = ref.random_blocks(qt, 200, 1024, g)
    wrong = mma.linear(x, w, qt, 200, 4, grid_table=table, packed=True)
    close = torch.isclose(wrong.double(), mma.linear(x, w, qt, 200, 4, grid_table=table).double(),
                          rtol=0.1, atol=1e-3)
    assert close.double().mean().item() < 0.5
    with pytest.raises(ValueError, match=f"whole {nbytes}-byte super-blocks"):
        mma.pack(torch.zeros(4, 100, dtype=torch.uint8), qt)


def test_iq2_xxs_signs_spread_to_their_bits_and_back():
    """spread_iq2xxs_signs moves sign i = 2 j + e of grid row g (the file's bit 7 g + i, i < 7) to bit 4 j + g + 16 e
    and keeps the scale (bits 28-31) where it is; gather_iq2xxs_signs undoes it, for every bit alone and for random
    words (negative ones too: the scale's top bit is the int32 sign)."""
    for g in range(4):
        for i in range(7):
            one = torch.tensor([1 << (7 * g + i)], dtype=torch.int32)
            assert int(mma.spread_iq2xxs_signs(one)[0]) == 1 << (4 * (i >> 1) + g + 16 * (i & 1)), (g, i)
    for s in range(16):
        scale = torch.tensor([(s << 28) - (1 << 32) if s >= 8 else s << 28], dtype=torch.int32)
        assert torch.equal(mma.spread_iq2xxs_signs(scale), scale)
    words = torch.randint(-2 ** 31, 2 ** 31, (4096,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    words = words.to(torch.int32)
    spread = mma.spread_iq2xxs_signs(words)
    assert not torch.equal(spread, words)
    assert torch.equal(mma.gather_iq2xxs_signs(spread), words)
    # the same number of set bits: a permutation of the bits
    bits = lambda t: sum(int(((t >> b) & 1).sum()) for b in range(32))   # noqa: E731
    assert bits(spread) == bits(words)


def _blocks(qtype, n, k, g):
    """Real quantizer blocks where the test environment has a quantizer, random valid blocks otherwise."""
    if qtype in ref.QUANTIZABLE:
        return ref.quantized_blocks(qtype, torch.randn(n, k, generator=g) * 0.02)
    return ref.random_blocks(qtype, n, k, g)


@pytest.mark.parametrize("types", [("Q8_0", "Q8_0"), ("Q6_K", "Q6_K"), ("Q8_0", "Q6_K"), ("Q6_K", "Q4_K"),
                                   ("IQ2_XXS", "IQ2_S"), ("IQ2_S", "IQ2_XXS")])
def test_packed_experts_give_the_file_layouts_moe(monkeypatch, types):
    """Experts in gguf_mma.pack's layout (packed13 / packed2; a Q4_K weight stays in the file's) on every path a
    MoE takes: the register-MMA decode passes (routed pairs direct and in sorted blocks, the w2 top-k sum split
    inside a slot's super-blocks: Q6_K's scales past them found by K), the tile decode passes, the fused prefill
    tiles and the dequantized experts.  Each gives the file layout's output bit for bit: the same bytes decoded by
    the same arithmetic in the same order."""
    monkeypatch.setattr(gm, "CPU_NUM_SMS", 6)
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    pk13, pk2 = q13 in mma.PACKERS, q2 in mma.PACKERS
    g = torch.Generator().manual_seed(61 + q13 + q2)
    e, h, inter, top_k = 6, 512, 256, 3
    w13 = torch.stack([_blocks(q13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([_blocks(q2, h, inter, g) for _ in range(e)])
    p13 = mma.pack(w13, q13) if pk13 else w13
    p2 = mma.pack(w2, q2) if pk2 else w2
    for t, plan in ((1, {"mma": True, "direct": True}), (3, {"mma": True, "direct": True}),
                    (5, {"mma": True, "direct": False}), (5, {"mma": False}), (40, {}), (40, {"dequant": True})):
        x = (torch.randn(t, h, generator=g) * 0.5).half()
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        full = (gm.moe_plan(t, top_k, e, dequant=True) if plan.get("dequant")
                else {**gm.moe_plan(t, top_k, e), **plan})
        want = gm.gguf_moe(x, w13, w2, wts, ids, q13, q2, plan=full)
        got = gm.gguf_moe(x, p13, p2, wts, ids, q13, q2, plan=full, packed13=pk13, packed2=pk2)
        assert torch.equal(got, want), (types, t, plan)
    # the plan gguf_moe picks itself at 5 tokens (16-bit activations, register-MMA types): the decode regime
    assert torch.equal(gm.gguf_moe(x[:5], p13, p2, wts[:5], ids[:5], q13, q2, packed13=pk13, packed2=pk2),
                       gm.gguf_moe(x[:5], w13, w2, wts[:5], ids[:5], q13, q2))
    if pk2:   # a file-layout weight called packed is refused where its rows are too short for the packed layout
        short = w2[..., : mma.packed_row_bytes(q2, inter) - 2] if q2 in mma.PLANES else None
        if short is not None:
            with pytest.raises(ValueError, match="packed"):
                gm.gguf_moe(x, p13, short, wts, ids, q13, q2, packed13=pk13, packed2=True)


# explicit: the defaults already take AHEAD=2 for Q4_K and Q2_K, so {} would compare 2 with 2 there
AHEAD_TUNINGS = ({"ahead": 1}, {"ahead": 2, "l2_ahead": 2})


@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("IQ2_XXS", "Q8_0")])
def test_loads_ahead_compute_the_same_products(monkeypatch, types):
    """AHEAD=2 (the next unit's two halves loaded before this unit's are decoded) and L2_AHEAD=2 (the unit two on
    prefetched into L2; not run by the interpreter, its unit lookup is) change when loads are issued, not what is
    summed in which order: a dense linear split over K and both MoE routings (the w2 top-k sum split inside a
    slot's super-blocks, units crossing from one slot's expert to the next) give AHEAD=1's output bit for bit,
    on the file's layout and packed."""
    monkeypatch.setattr(gm, "CPU_NUM_SMS", 6)
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(71 + q13 + q2)
    e, h, inter, top_k = 6, 512, 512, 3
    w13 = torch.stack([_blocks(q13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([_blocks(q2, h, inter, g) for _ in range(e)])
    table = gm.grid_table(q13, w13.device) if q13 in mma.GRID_TYPES else None
    for m, sms in ((1, 16), (5, 1)):
        x = torch.randn(m, h, generator=g).half()
        outs = [mma.linear(x, w13[0], q13, 2 * inter, sms, tuning=tun, grid_table=table) for tun in AHEAD_TUNINGS]
        assert torch.equal(*outs), (types, m, sms)
    for pk in (False, True):
        pk13, pk2 = pk and q13 in mma.PACKERS, pk and q2 in mma.PACKERS
        a13, a2 = (mma.pack(w13, q13) if pk13 else w13), (mma.pack(w2, q2) if pk2 else w2)
        for t, direct in ((3, True), (5, False)):
            x = (torch.randn(t, h, generator=g) * 0.5).half()
            ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
            wts = torch.rand(t, top_k, generator=g)
            outs = [gm.gguf_moe(x, a13, a2, wts, ids, q13, q2, packed13=pk13, packed2=pk2,
                                plan={**gm.moe_plan(t, top_k, e), "mma": True, "direct": direct,
                                      "mma_tuning": tun}) for tun in AHEAD_TUNINGS]
            assert torch.equal(*outs), (types, pk, t, direct)
            want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
            assert ((outs[1].double() - want).norm() / want.norm()).item() <= 4e-3, (types, pk, t, direct)


def test_loads_ahead_other_than_one_or_two_are_refused():
    with pytest.raises(ValueError, match="ahead=3"):
        mma.ahead_for({"ahead": 3}, mma.TOKENS, mma.PAIRS.value)
    assert mma.ahead_for({"ahead": 2}, mma.TOKENS, mma.PAIRS.value) == 2
    assert mma.ahead_for({"ahead": 2}, 16, mma.SORTED.value) == 1
