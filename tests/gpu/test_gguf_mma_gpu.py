"""The register-MMA decode kernels (kernels/gguf/register_mma.py, Gluon) compiled on a real GPU, against
float64 on the ``gguf`` package's dequantization.

Bound (elementwise, derived in kernels/gguf/register_mma.py): each weight is off by at most u (|s n| + |m| + |w|) (Q4_K,
Q5_K) or 2 u |w| (Q6_K, Q8_0) with u the activation dtype's unit roundoff (bf16 2**-8, fp16 2**-11), the float32 sums by
K 2**-24 sum |x w|, the output by its own rounding u |out| (gguf_matmul_reference.mma_error_bound).  The MoE rounds
SiLU(gate)*up and the top-k terms once more: relative Frobenius error within 8u there (the weights' 2-3 roundings,
the intermediate's, the output's).  A wrong permutation, scale or routing is off by O(1).
"""
import pytest
import torch

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.device import device_figures

pytestmark = pytest.mark.gpu
COMPILED_KERNELS = ("_mma_kernel", "_mma_moe_kernel")
U = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _arrivals():
    from glm5_shim.kernels import arrivals
    return arrivals


def _mods():
    from glm5_shim.kernels.gguf import tiles as gm
    from glm5_shim.kernels.gguf import reference as ref
    from glm5_shim.kernels.gguf import register_mma as mma
    return gm, ref, mma


# gguf_mma.KERNEL_TYPES
KERNEL_TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ2_XXS", "IQ2_S", "IQ3_XXS", "IQ3_S", "Q2_K"]


@pytest.mark.parametrize("name", KERNEL_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_within_bound(name, dtype):
    gm, ref, mma = _mods()
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(qtype + (dtype == torch.float16))
    sms = device_figures(0).sms
    for n, k, quantized in ((333, 1024, False), (2624, 6144, True)):   # the float64 bound is built on the host
        w = (ref.quantized_blocks(qtype, torch.randn(n, k, generator=g) * 0.02)
             if quantized and qtype not in mma.GRID_TYPES else ref.random_blocks(qtype, n, k, g))
        wd, w64 = w.cuda(), ref.dequantize(w, qtype, k)
        table = gm.grid_table(qtype, wd.device) if qtype in mma.GRID_TYPES else None
        # past 8 rows where the plans keep the type there (IQ2_XXS/IQ2_S to 32: several 8-row blocks, the last
        # partly filled), through the plans' own dispatch
        for m in (1, 2, 3, 7, 8) + ((17, gm.mma_linear_max_rows(qtype)) if gm.mma_linear_max_rows(qtype) > 8 else ()):
            x = torch.randn(m, k, generator=g).to(dtype)
            got = (mma.linear(x.cuda(), wd, qtype, n, sms, grid_table=table) if m <= mma.TOKENS
                   else gm.gguf_linear(x.cuda(), wd, qtype, n))
            want = x.double() @ w64.T
            bound = ref.mma_error_bound(x, w, qtype, k, U[dtype]) + U[dtype] * want.abs()
            excess = ((got.double().cpu() - want).abs() - bound).max().item()
            assert excess <= 0, (name, dtype, n, k, m, excess)


@pytest.mark.parametrize("types", [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q6_K", "Q4_K"), ("Q4_K", "Q8_0"),
                                   ("Q5_K", "Q5_K"), ("Q4_K", "Q2_K"), ("Q2_K", "Q2_K"), ("Q3_K", "Q6_K"),
                                   ("IQ2_XXS", "IQ2_XXS"),
                                   ("IQ2_XXS", "Q4_K"), ("IQ2_XXS", "IQ2_S"), ("IQ3_XXS", "IQ3_S"),
                                   ("IQ3_S", "IQ3_XXS")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_decode(types, dtype):
    gm, ref, mma = _mods()
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(q13 * 31 + q2)
    e, h, inter, top_k = 32, 1024, 256, 8
    w13 = torch.stack([ref.random_blocks(q13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(q2, h, inter, g) for _ in range(e)])
    d13, d2 = w13.cuda(), w2.cuda()
    # 1-4 tokens: each routed pair on its own (4 hot: every expert read by 4 pairs), w2 summing each token's top-k
    # slots; 5-20: the sorted blocks of 8 (20 hot: 20 rows an expert, 3 blocks of 8)
    for t, hot in ((1, None), (3, None), (4, 3), (5, None), (16, None), (20, 3)):
        x = torch.randn(t, h, generator=g).to(dtype)
        if hot is None:
            ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])
        else:
            ids = torch.arange(hot, hot + top_k).repeat(t, 1) % e
        ids = ids.to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        wts = wts / wts.sum(1, keepdim=True)
        plan = {**gm.moe_plan(t, top_k, e), "mma": True, "fused_gate": False, "mma_cols": 8}   # wide: below
        got = gm.gguf_moe(x.cuda(), d13, d2, wts.cuda(), ids.cuda(), q13, q2, plan=plan)
        want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
        err = ((got.double().cpu() - want).norm() / want.norm()).item()
        assert err <= 8 * U[dtype], (types, dtype, t, hot, err)
        assert not _arrivals().counters(d13.device).any()   # every arrival counter left at zero


@pytest.mark.parametrize("name", KERNEL_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wide_blocks_within_bound(name, dtype):
    """Programs of 16 and 32 activation rows (gguf_mma.COLUMN_BLOCKS: the token bits past 8 in registers, the B
    operand repeated along N): a dense linear of 9-64 rows, blocks partly filled, and a MoE with 16 and 32-row
    sorted blocks (one expert group hot with 40 rows each: two 32-row blocks, the second partly filled; random
    routings), within the same bounds as 8-row programs."""
    gm, ref, mma = _mods()
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(7 * qtype + (dtype == torch.float16))
    sms = device_figures(0).sms
    n, k = 333, 1024
    w = ref.random_blocks(qtype, n, k, g)
    wd, w64 = w.cuda(), ref.dequantize(w, qtype, k)
    table = gm.grid_table(qtype, wd.device) if qtype in mma.GRID_TYPES else None
    for m, cols in ((9, 16), (16, 16), (17, 32), (32, 32), (45, 16), (64, 32)):
        x = torch.randn(m, k, generator=g).to(dtype)
        got = mma.linear(x.cuda(), wd, qtype, n, sms, grid_table=table, cols=cols)
        want = x.double() @ w64.T
        bound = ref.mma_error_bound(x, w, qtype, k, U[dtype]) + U[dtype] * want.abs()
        excess = ((got.double().cpu() - want).abs() - bound).max().item()
        assert excess <= 0, (name, dtype, m, cols, excess)
    e, h, inter, top_k = 32, 1024, 256, 8
    w13 = torch.stack([ref.random_blocks(qtype, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(qtype, h, inter, g) for _ in range(e)])
    d13, d2 = w13.cuda(), w2.cuda()
    for t, hot, cols in ((40, 3, 32), (40, 3, 16), (64, None, 16), (96, None, 32), (7, None, 32)):
        x = torch.randn(t, h, generator=g).to(dtype)
        ids = (torch.arange(hot, hot + top_k).repeat(t, 1) % e if hot is not None
               else torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])).to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        wts = wts / wts.sum(1, keepdim=True)
        plan = {**gm.moe_plan(t, top_k, e, decode=True), "mma": True, "direct": False, "mma_cols": cols}
        got = gm.gguf_moe(x.cuda(), d13, d2, wts.cuda(), ids.cuda(), qtype, qtype, plan=plan)
        want = ref.moe_reference(x, w13, w2, wts, ids, qtype, qtype)
        err = ((got.double().cpu() - want).norm() / want.norm()).item()
        assert err <= 8 * U[dtype], (name, dtype, t, hot, cols, err)
        assert not _arrivals().counters(d13.device).any()


def test_cuda_graph_capture_and_replay(monkeypatch):
    gm, ref, mma = _mods()
    monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", "mma")
    g = torch.Generator().manual_seed(7)
    e, h, inter, top_k, t = 16, 512, 256, 4, 6
    w13 = torch.stack([ref.random_blocks(traits.Q4_K, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(traits.Q4_K, h, inter, g) for _ in range(e)])
    wl = ref.random_blocks(traits.Q4_K, 200, h, g)
    d13, d2, dl = w13.cuda(), w2.cuda(), wl.cuda()
    xs = torch.zeros(t, h, dtype=torch.bfloat16, device="cuda")
    idss = torch.zeros(t, top_k, dtype=torch.int32, device="cuda")
    wts = torch.full((t, top_k), 1.0 / top_k, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gm.gguf_moe(xs, d13, d2, wts, idss, traits.Q4_K, traits.Q4_K)
        gm.gguf_moe(xs[:2], d13, d2, wts[:2], idss[:2], traits.Q4_K, traits.Q4_K)
        gm.gguf_linear(xs, dl, traits.Q4_K)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # 6 tokens: sorted blocks; 2: routed pairs (its own counters' stream)
        out_moe = gm.gguf_moe(xs, d13, d2, wts, idss, traits.Q4_K, traits.Q4_K)
        out_two = gm.gguf_moe(xs[:2], d13, d2, wts[:2], idss[:2], traits.Q4_K, traits.Q4_K)
        out_lin = gm.gguf_linear(xs, dl, traits.Q4_K)
    for seed in (1, 2):
        g2 = torch.Generator().manual_seed(100 + seed)
        x2 = torch.randn(t, h, generator=g2).bfloat16()
        ids2 = torch.stack([torch.randperm(e, generator=g2)[:top_k] for _ in range(t)]).to(torch.int32)
        xs.copy_(x2)
        idss.copy_(ids2)
        graph.replay()
        torch.cuda.synchronize()
        want = ref.moe_reference(x2, w13, w2, wts.cpu(), ids2, traits.Q4_K, traits.Q4_K)
        assert ((out_moe.double().cpu() - want).norm() / want.norm()).item() <= 8 * U[torch.bfloat16]
        want2 = ref.moe_reference(x2[:2], w13, w2, wts[:2].cpu(), ids2[:2], traits.Q4_K, traits.Q4_K)
        assert ((out_two.double().cpu() - want2).norm() / want2.norm()).item() <= 8 * U[torch.bfloat16]
        want_l = x2.double() @ ref.dequantize(wl, traits.Q4_K, h).T
        assert ((out_lin.double().cpu() - want_l).norm() / want_l.norm()).item() <= 4 * U[torch.bfloat16]


def test_compiles_under_a_post_compile_hook():
    """vLLM sets Triton's jit_post_compile_hook after warm-up, and Triton serialises a new compile's constexprs to
    JSON before calling it (tests/test_kernel_compile_hooks.py): a variant compiled with such a hook set must launch
    and compute as any other."""
    from triton import knobs

    gm, ref, mma = _mods()
    g = torch.Generator().manual_seed(12)
    w = ref.random_blocks(traits.Q4_K, 96, 512, g)
    x = torch.randn(3, 512, generator=g).to(torch.bfloat16)
    compiled = []
    previous = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["fn"].name)
    try:   # a launch shape no other test uses: it compiles here
        got = mma.linear(x.cuda(), w.cuda(), traits.Q4_K, 96, 7, tuning=dict(num_warps=2, reps=1, ctas_per_sm=1))
    finally:
        knobs.runtime.jit_post_compile_hook = previous
    assert "_mma_kernel" in compiled
    want = ref.linear_reference(x, w, traits.Q4_K)
    assert ((got.double().cpu() - want).norm() / want.norm()).item() <= 4 * U[torch.bfloat16]


def _blocks(ref, qtype, rows, k, g):
    """[*rows, row bytes]: a real quantizer's blocks where there is one, random valid blocks (IQ types) otherwise."""
    rows = (rows,) if isinstance(rows, int) else tuple(rows)
    if qtype in ref.QUANTIZABLE:
        n = 1
        for r in rows:
            n *= r
        return ref.quantized_blocks(qtype, torch.randn(n, k, generator=g) * 0.02).view(*rows, -1)
    return ref.random_blocks(qtype, rows, k, g)


PACKED_TYPES = ["Q8_0", "Q6_K", "IQ2_XXS", "IQ2_S"]   # gguf_mma.PACKERS, all repacked at load (LOAD_PACKED_TYPES)


@pytest.mark.parametrize("name", PACKED_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_weights_give_the_file_layouts_output(name, dtype):
    """gguf_mma.pack's layouts (16-byte code loads) through the compiled kernel: the file layout's output bit for
    bit (the same arithmetic in the same order), from one super-block a row to K = 6144 and 1-8 rows, split or not,
    and within the float64 bound."""
    gm, ref, mma = _mods()
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(77 + qtype + (dtype == torch.float16))
    sms = device_figures(0).sms
    table = gm.grid_table(qtype, torch.device("cuda")) if qtype in mma.GRID_TYPES else None
    for n, k in ((333, 1024), (96, 256), (2624, 6144)):
        w = _blocks(ref, qtype, n, k, g)
        wd, packed, w64 = w.cuda(), mma.pack(w, qtype).cuda(), ref.dequantize(w, qtype, k)
        for m, num_sms in ((1, sms), (3, sms), (8, sms), (2, 1)):
            x = torch.randn(m, k, generator=g).to(dtype)
            want = mma.linear(x.cuda(), wd, qtype, n, num_sms, grid_table=table)
            got = mma.linear(x.cuda(), packed, qtype, n, num_sms, grid_table=table, packed=True)
            assert torch.equal(got, want), (n, k, m, num_sms)
            exact = x.double() @ w64.T
            bound = ref.mma_error_bound(x, w, qtype, k, U[dtype]) + U[dtype] * exact.abs()
            assert ((got.double().cpu() - exact).abs() - bound).max().item() <= 0, (n, k, m, num_sms)


@pytest.mark.parametrize("name", PACKED_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_repacked_weights_on_every_serving_plan_give_the_file_layouts_output(name, dtype):
    """Weights repacked at load (gguf_mma.pack, loading/gguf_repack.py) through the plans serving takes, compiled:
    dense linears of 1-200 rows (register MMA, tile kernels split over K and in prefill tiles, dequantized for cuBLAS)
    and MoEs of 1-1024 tokens (register-MMA decode, direct and sorted; prefill tiles; dequantized experts), TP-8
    dense shapes and experts with a w2 at K = 256 (packed rows grow: Q6_K to 224 bytes, IQ2_XXS 72, IQ2_S 88).  Each
    gives the file layout's output bit for bit (the same arithmetic: its float64 bound is the file layout's tests')."""
    gm, ref, mma = _mods()
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(91 + qtype + (dtype == torch.float16))
    sms = device_figures(0).sms
    table = gm.grid_table(qtype, torch.device("cuda")) if qtype in mma.GRID_TYPES else None
    for n, k in ((2624, 6144), (96, 256)):
        w = _blocks(ref, qtype, n, k, g).cuda()
        packed = mma.pack(w, qtype)
        for m in (1, 3, 8, 20, 64, 200):
            x = torch.randn(m, k, generator=g).to(dtype).cuda()
            on_mma = m <= gm.mma_linear_max_rows(qtype) and gm.mma_decode(qtype, k, dtype, weight=packed,
                                                                            linear=True, packed=True)
            want = mma.linear(x, w, qtype, n, sms, grid_table=table) if on_mma else gm.gguf_linear(x, w, qtype)
            got = gm.gguf_linear(x, packed, qtype, packed=True)
            assert torch.equal(got, want), (n, k, m, on_mma)
    e, h, inter, top_k = 64, 1024, 256, 8
    w13 = _blocks(ref, qtype, (e, 2 * inter), h, g).cuda()
    w2 = _blocks(ref, qtype, (e, h), inter, g).cuda()
    p13, p2 = mma.pack(w13, qtype), mma.pack(w2, qtype)
    regimes = set()
    for t in (1, 3, 16, 200, 1024):
        x = (torch.randn(t, h, generator=g) * 0.5).to(dtype).cuda()
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32).cuda()
        wts = torch.rand(t, top_k, generator=g).cuda()
        plan = gm.chosen_moe_plan(t, top_k, dtype, p13, p2, qtype, qtype, (True, True))
        assert plan == gm.chosen_moe_plan(t, top_k, dtype, w13, w2, qtype, qtype), t
        regimes.add(gm.moe_regime(plan))
        got = gm.gguf_moe(x, p13, p2, wts, ids, qtype, qtype, packed13=True, packed2=True)
        assert torch.equal(got, gm.gguf_moe(x, w13, w2, wts, ids, qtype, qtype)), t
        assert torch.isfinite(got).all()
    assert len(regimes) >= 2, regimes


# explicit: the defaults already take AHEAD=2 for Q4_K and Q2_K, so {} would compare 2 with 2 there
AHEAD_TUNINGS = ({"ahead": 1}, {"ahead": 2}, {"ahead": 1, "l2_ahead": 2}, {"ahead": 2, "l2_ahead": 3})


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_loads_ahead_give_the_same_output(name):
    """AHEAD=2 (the next unit's two halves in flight while this unit is decoded) and L2_AHEAD (units prefetched into
    L2) through the compiled kernel: AHEAD=1's output bit for bit (the same products summed in the same order)
    for a dense linear split over K or not,
    and a decode MoE on both routings (pairs with the w2 top-k sum split inside a slot; sorted blocks of 8), on the
    layout serving loads (gguf_mma.pack for PACKERS' types)."""
    gm, ref, mma = _mods()
    qtype = getattr(traits, name)
    pk = qtype in mma.PACKERS
    g = torch.Generator().manual_seed(91 + qtype)
    sms = device_figures(0).sms
    table = gm.grid_table(qtype, torch.device("cuda")) if qtype in mma.GRID_TYPES else None
    w = _blocks(ref, qtype, 2624, 6144, g)
    w = (mma.pack(w, qtype) if pk else w).cuda()
    for m, num_sms in ((1, sms), (8, sms), (3, 1)):
        x = torch.randn(m, 6144, generator=g).to(torch.bfloat16).cuda()
        outs = [mma.linear(x, w, qtype, 2624, num_sms, tuning=tun, grid_table=table, packed=pk)
                for tun in AHEAD_TUNINGS]
        assert all(torch.equal(o, outs[0]) for o in outs[1:]), (name, m, num_sms)
    e, h, inter, top_k = 16, 1024, 512, 8
    w13 = _blocks(ref, qtype, (e, 2 * inter), h, g)
    w2 = _blocks(ref, qtype, (e, h), inter, g)
    d13, d2 = ((mma.pack(w13, qtype), mma.pack(w2, qtype)) if pk else (w13, w2))
    d13, d2 = d13.cuda(), d2.cuda()
    for t, direct in ((3, True), (12, False)):
        x = torch.randn(t, h, generator=g).to(torch.bfloat16).cuda()
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32).cuda()
        wts = torch.rand(t, top_k, generator=g).cuda()
        outs = [gm.gguf_moe(x, d13, d2, wts, ids, qtype, qtype, packed13=pk, packed2=pk,
                            plan={**gm.moe_plan(t, top_k, e), "mma": True, "direct": direct,
                                  "mma_tuning": tun}) for tun in AHEAD_TUNINGS]
        assert all(torch.equal(o, outs[0]) for o in outs[1:]), (name, t, direct)
        want = ref.moe_reference(x.cpu(), w13, w2, wts.cpu(), ids.cpu(), qtype, qtype)
        assert ((outs[1].double().cpu() - want).norm() / want.norm()).item() <= 8 * U[torch.bfloat16], (name, t)
