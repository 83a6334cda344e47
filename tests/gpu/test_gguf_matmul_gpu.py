"""The shim's GGUF matmul kernels on a real GPU (compiled), against float64 on the ``gguf`` package's dequantization.

Tolerance (relative Frobenius error of the output), derived: the kernel rounds each weight once to the activation
dtype (relative error uniform in ±u, u = 2**-9 bf16 / 2**-12 fp16: rms u/sqrt(3)), accumulates in fp32, and
rounds the output once (rms u/sqrt(3) again).  With random signs the weight errors add like the output's terms,
so the output's relative rms error is ~ sqrt(2) u/sqrt(3) = 0.82 u (bf16 1.6e-3, fp16 2e-4).  The MoE rounds its
intermediate SiLU(gate)*up once more, and the top-k terms once each before their sum: ~ u.  Bounds: 3u for the
linear, 4u for the MoE (bf16 5.9e-3 / 7.8e-3) — a wrong block, scale or nibble is off by O(1).  Decode tiles of
Q4_K/Q5_K (16 rows) round no weight at all (exact codes in the dot, scales applied to its float32 result; removing
the codes' offset costs ~5 of float32's 24 bits): their error is the output's rounding alone, inside the same bounds.
"""
import gguf
import pytest
import torch

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.gguf.routing import SHIM_KERNEL_TYPES

pytestmark = pytest.mark.gpu
COMPILED_KERNELS = ("_linear_kernel", "_moe_kernel", "_silu_mul_splits_kernel", "_mma_kernel",
                    "_mma_moe_kernel", "_moe_dense_kernel")

U = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -12}
# every type the kernels read (kernels/gguf/routing: pure, no kernel import)
KERNEL_TYPE_NAMES = [gguf.GGMLQuantizationType(t).name for t in SHIM_KERNEL_TYPES]


def _mods():
    from glm5_shim.kernels.gguf import tiles as gm
    from glm5_shim.kernels.gguf import reference as ref
    return gm, ref


def _rel(got, want):
    return ((got.double().cpu() - want).norm() / want.norm()).item()


def _weights(qtype, rows, k, g, quantized):
    gm, ref = _mods()
    if quantized and qtype in ref.QUANTIZABLE:  # random valid blocks where no quantizer exists (IQ types)
        return ref.quantized_blocks(qtype, torch.randn(rows, k, generator=g) * 0.02)
    return ref.random_blocks(qtype, rows, k, g)


@pytest.mark.parametrize("qtype_name", KERNEL_TYPE_NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_vs_float64(qtype_name, dtype):
    gm, ref = _mods()
    qtype = getattr(traits, qtype_name)
    g = torch.Generator().manual_seed(qtype * 7 + (dtype == torch.float16))
    for n, k, quantized in ((333, 1024, False), (2624, 6144, True)):
        w = _weights(qtype, n, k, g, quantized)
        wd, w64 = w.cuda(), ref.dequantize(w, qtype, k)
        for m in (1, 2, 7, 16, 33, 64, 200, 1031):
            x = torch.randn(m, k, generator=g).to(dtype)
            got = gm.gguf_linear(x.cuda(), wd, qtype)
            err = _rel(got, x.double() @ w64.T)
            assert err <= 3 * U[dtype], (qtype_name, dtype, n, k, m, err)


def test_linear_reads_rows_of_a_padded_merged_weight():
    """vLLM pads a merged linear's shards to the widest row; the kernel reads row views of it in place."""
    gm, ref = _mods()
    g = torch.Generator().manual_seed(5)
    a = ref.random_blocks(traits.Q4_K, 96, 2048, g)
    b = ref.random_blocks(traits.Q6_K, 64, 2048, g)
    padded = torch.zeros(160, b.shape[1], dtype=torch.uint8)
    padded[:96, : a.shape[1]] = a
    padded[96:] = b
    pd = padded.cuda()
    x = torch.randn(5, 2048, generator=g).to(torch.bfloat16)
    got_a = gm.gguf_linear(x.cuda(), pd[:96], traits.Q4_K, 96)
    got_b = gm.gguf_linear(x.cuda(), pd[96:], traits.Q6_K, 64)
    assert _rel(got_a, ref.linear_reference(x, a, traits.Q4_K)) <= 3 * U[torch.bfloat16]
    assert _rel(got_b, ref.linear_reference(x, b, traits.Q6_K)) <= 3 * U[torch.bfloat16]


def _moe_case(qtype13, qtype2, e, h, inter, t, top_k, g, hot=None):
    gm, ref = _mods()
    w13 = torch.stack([ref.random_blocks(qtype13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(qtype2, h, inter, g) for _ in range(e)])
    x = torch.randn(t, h, generator=g)
    if hot is None:
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)])
    else:  # every token routed to the same experts
        ids = torch.arange(hot, hot + top_k).repeat(t, 1) % e
    wts = torch.rand(t, top_k, generator=g)
    return w13, w2, x, ids.to(torch.int32), wts / wts.sum(1, keepdim=True)


@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("Q5_K", "Q8_0"), ("Q6_K", "Q6_K"), ("Q8_0", "Q4_K"),
                                   ("Q2_K", "Q3_K"), ("IQ4_XS", "IQ4_NL"), ("IQ2_XXS", "IQ3_XXS"),
                                   ("IQ2_S", "IQ3_S"), ("IQ2_XS", "Q4_K"), ("IQ1_S", "IQ1_M"),
                                   ("Q4_0", "Q5_0"), ("Q4_1", "Q5_1"), ("IQ3_XXS", "IQ3_S"), ("Q2_K", "Q2_K")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_vs_float64(types, dtype):
    """gguf_moe on the plans serving takes (chosen_moe_plan): decode, 9 and 50 rows an expert (the register-MMA
    kernels past the common threshold where both types run there), 75 (prefill tiles or dequantized experts), one
    expert group hot."""
    gm, ref = _mods()
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(q13 * 31 + q2)
    e, h, inter, top_k = 32, 1024, 256, 8
    for t, hot in ((1, None), (5, None), (37, None), (200, None), (300, None), (64, 3)):
        w13, w2, x, ids, wts = _moe_case(q13, q2, e, h, inter, t, top_k, g, hot)
        got = gm.gguf_moe(x.to(dtype).cuda(), w13.cuda(), w2.cuda(), wts.cuda(), ids.cuda(), q13, q2)
        want = ref.moe_reference(x.to(dtype), w13, w2, wts, ids, q13, q2)
        err = _rel(got, want)
        assert err <= 4 * U[dtype], (types, dtype, t, hot, err)


@pytest.mark.compiled_kernels("_moe_kernel", "_linear_kernel")
@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("Q6_K", "Q4_K"), ("Q8_0", "IQ2_XXS")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiles_tuned_for_mma_sync_targets_vs_float64(types, dtype):
    """The prefill tiles as the mma.sync targets (SM120, sm_80-89) run them (prefill_pass_tuning's choices, forced
    here on any GPU) and in the other variants (SWAP, 32-feature 8-warp w13 blocks), and the dense tile linear with
    SWAP at 16, 40 and 100 rows: compiled for this GPU, against float64, same bounds as the untuned tiles."""
    gm, ref = _mods()
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(q13 * 7 + q2)
    e, h, inter, top_k, t = 16, 1024, 256, 8, 160
    w13, w2, x, ids, wts = _moe_case(q13, q2, e, h, inter, t, top_k, g)
    want = ref.moe_reference(x.to(dtype), w13, w2, wts, ids, q13, q2)
    base = gm.moe_plan(t, top_k, e)
    served = gm.moe_plan(t, top_k, e, qtypes=(q13, q2), capability=None)   # as an mma.sync target serves it
    for w13_t, w2_t in ((served["w13"], served["w2"]), ({"SWAP": True}, {"SWAP": True}),
                        ({"BLOCK_N": 32, "num_warps": 8, "SWAP": True}, {})):
        plan = {**base, "w13": w13_t, "w2": w2_t}
        got = gm.gguf_moe(x.to(dtype).cuda(), w13.cuda(), w2.cuda(), wts.cuda(), ids.cuda(), q13, q2, plan=plan)
        err = _rel(got, want)
        assert err <= 4 * U[dtype], (types, dtype, w13_t, w2_t, err)
    w = w13[0]
    for m in (16, 40, 100):
        xm = torch.randn(m, h, generator=g).to(dtype)
        plan = {**gm.linear_plan(m, w.shape[0], h, 132, tuning={"BLOCK_M": 64} if m == 100 else None), "SWAP": True}
        if q13 == traits.Q4_K:   # what an mma.sync target serves (linear_tile_tuning)
            assert plan == gm.linear_plan(m, w.shape[0], h, 132, tuning={"BLOCK_M": 64} if m == 100 else None,
                                          qtype=q13, capability=(12, 0))
        err = _rel(gm.gguf_linear(xm.cuda(), w.cuda(), q13, plan=plan), ref.linear_reference(xm, w, q13))
        assert err <= 3 * U[dtype], (types, dtype, m, err)


@pytest.mark.compiled_kernels("_moe_dense_kernel", "_dequant_kernel")
@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("Q8_0", "Q5_K"), ("IQ2_XXS", "IQ2_S"), ("Q2_K", "IQ4_XS"),
                                   ("IQ3_S", "IQ1_M")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_dequantized_vs_float64(types, dtype):
    """Prefill-sized MoEs on experts dequantized to 16 bits a chunk at a time (_moe_dequantized): one chunk, chunks
    of 3 experts (evenly filled: 11 chunks; blocks outside a chunk return at once), the default 128x128 tiles and
    64x64 ones; the weights rounded once to the activation dtype, as on the other paths: same bound."""
    gm, ref = _mods()
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(q13 * 17 + q2)
    e, h, inter, top_k = 32, 1024, 256, 8
    per_expert = 2 * inter * h * 2
    small = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4}
    for t, hot, chunk, tuning in ((300, None, 1 << 30, {}), (300, None, 3 * per_expert, {}),
                                  (97, 5, 3 * per_expert, {}), (300, None, 8 * per_expert, small)):
        w13, w2, x, ids, wts = _moe_case(q13, q2, e, h, inter, t, top_k, g, hot)
        plan = {**gm.moe_plan(t, top_k, e, tuning=tuning, dequant=True), "chunk_bytes": chunk}
        got = gm.gguf_moe(x.to(dtype).cuda(), w13.cuda(), w2.cuda(), wts.cuda(), ids.cuda(), q13, q2, plan=plan)
        want = ref.moe_reference(x.to(dtype), w13, w2, wts, ids, q13, q2)
        err = _rel(got, want)
        assert err <= 4 * U[dtype], (types, dtype, t, hot, chunk, tuning, err)


@pytest.mark.compiled_kernels()  # torch ops against vLLM's CUDA op: no Triton kernel runs here
def test_moe_align_matches_vllms():
    """The shim's torch routing layout and vLLM's CUDA moe_align_block_size group rows identically."""
    gm, _ = _mods()
    try:
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"vLLM's moe_align_block_size does not import here: {type(e).__name__}: {e}")
    g = torch.Generator(device="cuda").manual_seed(9)
    for t, e, bm in ((1, 256, 16), (33, 256, 16), (200, 64, 32), (1024, 256, 64)):
        ids = torch.rand(t, e, device="cuda", generator=g).topk(8, dim=1).indices.to(torch.int32)
        ours = gm.moe_align(ids, bm, e)
        theirs = moe_align_block_size(ids, bm, e)
        n = int(ours[2].item())
        assert n == int(theirs[2].item())
        blocks = n // bm
        assert torch.equal(ours[1][:blocks], theirs[1][:blocks])  # the same expert for every used block
        pad = ids.numel()
        for layout in (ours, theirs):  # every routed row exactly once, in a block of its expert
            rows = layout[0][:n].view(blocks, bm).long()
            real = rows < pad
            assert int(real.sum()) == pad and torch.equal(rows[real].sort().values, torch.arange(pad, device="cuda"))
            owner = layout[1][:blocks].long()[:, None].expand(blocks, bm)[real]
            assert torch.equal(owner, ids.reshape(-1).long()[rows[real]])


def test_cuda_graph_capture_and_replay():
    gm, ref = _mods()
    g = torch.Generator().manual_seed(11)
    e, h, inter, top_k, t = 16, 512, 256, 4, 6
    w13, w2, x, ids, wts = _moe_case(traits.Q4_K, traits.Q6_K, e, h, inter, t, top_k, g)
    wl = ref.random_blocks(traits.Q8_0, 200, h, g)
    d = {k: v.cuda() for k, v in dict(w13=w13, w2=w2, wl=wl).items()}
    xs, idss, wtss = x.bfloat16().cuda(), ids.cuda(), wts.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gm.gguf_moe(xs, d["w13"], d["w2"], wtss, idss, traits.Q4_K, traits.Q6_K)
        gm.gguf_linear(xs, d["wl"], traits.Q8_0)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_moe = gm.gguf_moe(xs, d["w13"], d["w2"], wtss, idss, traits.Q4_K, traits.Q6_K)
        out_lin = gm.gguf_linear(xs, d["wl"], traits.Q8_0)
    for seed in (1, 2):  # new inputs and routings, same buffers
        g2 = torch.Generator().manual_seed(100 + seed)
        x2 = torch.randn(t, h, generator=g2)
        ids2 = torch.stack([torch.randperm(e, generator=g2)[:top_k] for _ in range(t)]).to(torch.int32)
        xs.copy_(x2.bfloat16())
        idss.copy_(ids2)
        graph.replay()
        torch.cuda.synchronize()
        want = ref.moe_reference(x2.bfloat16(), w13, w2, wts, ids2, traits.Q4_K, traits.Q6_K)
        assert _rel(out_moe, want) <= 4 * U[torch.bfloat16]
        assert _rel(out_lin, ref.linear_reference(x2.bfloat16(), wl, traits.Q8_0)) <= 3 * U[torch.bfloat16]
