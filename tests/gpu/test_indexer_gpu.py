"""Indexer logits on a real GPU: vs the float64 reference, vs DeepGEMM (vLLM's ``vllm.utils.deep_gemm``) where it
runs (sm_90 / sm_100), under CUDA-graph capture, and the top-2048 agreement guard at realistic sizes.

Run:  python -m pytest -q -s tests/gpu/test_indexer_gpu.py
Both FP8 paths run on any GPU of sm_89+: the native one, and the sm_80/86 byte-decoding one forced with
native=False (it only uses integer ops and fp16 MMAs, so it also runs on newer GPUs).
"""
import pytest
import torch

from glm5_shim.kernels import indexer_logits as il
from glm5_shim.kernels import indexer_logits_reference as ref
from glm5_shim.kernels.device import device_figures

pytestmark = pytest.mark.gpu
# every test must run one of these compiled (tests/gpu/conftest.py)
COMPILED_KERNELS = ("_mqa_logits_kernel", "_paged_mqa_logits_kernel")

# fp8 tensor-core accumulation (Hopper keeps ~14 mantissa bits inside a wgmma chain) and fp32 head sums; a wrong
# index, scale or block would be off by O(1) of the bound.
RTOL_BOUND = 2e-3


def _cap():
    # the capability the launchers plan for (a consumer GPU's under GLM5_SHIM_CONSUMER_PTX: tests/gpu/conftest.py)
    return device_figures(0).capability


def _paths():
    return [True, False] if il.native_fp8_supported(_cap()) else [False]


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def _check(out, want, bound, *, clean, what=""):
    valid = torch.isfinite(want)
    err = (out.double() - want)[valid].abs()
    tol = RTOL_BOUND * bound[valid] + 1e-30
    assert torch.isfinite(out[valid]).all(), what
    worst = (err / tol).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{what}: max error / tolerance = {worst:.3g}"
    if clean:
        assert torch.isneginf(out[~valid]).all(), what
    return worst


def _decode_case(seed, heads, next_n, lens, *, two_d, block_pad=0):
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    k_list, s_list = zip(*[ref.make_indexer_k(L, generator=g) for L in lens])
    cache, bt = ref.make_paged_cache(list(k_list), list(s_list), generator=g, block_pad=block_pad, device="cuda")
    q8, w = ref.make_indexer_qw(B * next_n, heads, generator=g)
    q8, w = q8.view(B, next_n, heads, 128).cuda(), w.cuda()
    L = torch.tensor(lens, dtype=torch.int32)
    if two_d:
        cl = L[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32)[None, :]
    else:
        cl = L[:, None] if next_n == 1 else L
    return q8, w, cache, bt, cl.contiguous().cuda()


@pytest.mark.parametrize("heads", [32, 64])
def test_prefill_gpu_vs_reference(heads):
    g = torch.Generator().manual_seed(1000 + heads)
    M, N = 300, 2100
    q8, w = ref.make_indexer_qw(M, heads, generator=g)
    k8, ksc = ref.make_indexer_k(N, generator=g)
    ks = torch.randint(0, N, (M,), generator=g, dtype=torch.int32)
    ke = (ks + torch.randint(0, N, (M,), generator=g, dtype=torch.int32)).clamp(max=N)
    ks[:100] = 0
    ke[:100] = torch.arange(1800, 1900, dtype=torch.int32)  # a causal-looking block
    q8, w, k8, ksc, ks, ke = (t.cuda() for t in (q8, w, k8, ksc, ks, ke))
    want, bound = ref.mqa_logits_reference(q8, k8, ksc, w, ks, ke, with_bound=True)
    for native in _paths():
        for clean in (False, True):
            out = il.mqa_logits_impl((q8, None), (k8, ksc), w, ks, ke, clean, native=native)
            torch.cuda.synchronize()
            _check(out, want, bound, clean=clean, what=f"prefill native={native} clean={clean}")
        out = il.mqa_logits_impl((q8, None), (k8, ksc), w, ks, ke, True, native=native, n_split=7)
        _check(out, want, bound, clean=True, what=f"prefill native={native} n_split=7")


@pytest.mark.parametrize("heads,next_n,two_d", [(32, 1, False), (32, 2, True), (64, 1, False), (32, 4, True),
                                                (64, 3, False)])
def test_decode_gpu_vs_reference(heads, next_n, two_d):
    lens = [1, 63, 64, 65, 1000, 4097, 7777]
    q8, w, cache, bt, cl = _decode_case(2000 + heads + next_n, heads, next_n, lens, two_d=two_d, block_pad=128)
    max_model_len = 8192
    want, bound = ref.paged_mqa_logits_reference(q8, cache, w, cl, bt, max_model_len, with_bound=True)
    for native in _paths():
        for clean in (False, True):
            out = il.paged_mqa_logits_impl((q8, None), cache, w, cl, bt, None, max_model_len, clean, native=native)
            torch.cuda.synchronize()
            _check(out, want, bound, clean=clean, what=f"decode native={native} clean={clean}")
    out = il.paged_mqa_logits((q8, None), cache, w, cl, bt, None, max_model_len, True)  # public wrapper
    _check(out, want, bound, clean=True, what="decode public wrapper")


def test_decode_grid_from_occupancy():
    q8, w, cache, bt, cl = _decode_case(5, 32, 1, [3000, 5], two_d=False)
    il.paged_mqa_logits((q8, None), cache, w, cl, bt, None, 4096, False)
    sms = device_figures(0).sms
    grids = {k: v for k, v in il._DECODE_GRID.items() if k[0] == q8.device.index}
    print(f"\ndecode grids (CTAs = per-SM occupancy x {sms} SMs): {grids}")
    assert grids and all(sms <= v <= il.MAX_DECODE_CTAS_PER_SM * sms for v in grids.values())


def test_decode_cuda_graph_replay():
    """Captured once, replayed with new q, weights, context lengths and block tables (same cache): no host sync
    and no grid that depends on the lengths."""
    heads, B, max_model_len = 32, 4, 4096
    q8, w, cache, bt, cl = _decode_case(7, heads, 1, [max_model_len] * B, two_d=False)
    sq, sw, scl, sbt = q8.clone(), w.clone(), cl.clone(), bt.clone()
    il.paged_mqa_logits((sq, None), cache, sw, scl, sbt, None, max_model_len, False)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = il.paged_mqa_logits((sq, None), cache, sw, scl, sbt, None, max_model_len, False)
    for seed, lens, perm in ((8, [17, 4096, 1, 2222], [2, 0, 3, 1]), (9, [0, 64, 3000, 4000], [1, 1, 0, 2])):
        g = torch.Generator().manual_seed(seed)
        q2, w2 = ref.make_indexer_qw(B, heads, generator=g)
        sq.copy_(q2.view(B, 1, heads, 128))
        sw.copy_(w2)
        scl.copy_(torch.tensor(lens, dtype=torch.int32)[:, None])
        sbt.copy_(bt[perm])
        graph.replay()
        torch.cuda.synchronize()
        want, bound = ref.paged_mqa_logits_reference(sq, cache, sw, scl, sbt, max_model_len, with_bound=True)
        _check(out, want, bound, clean=False, what=f"graph replay {lens}")


def test_topk_2048_guard_gpu():
    """Fraction of the shim's top-2048 picks that are not in the float64 reference's top-2048 set (ties aside),
    at decode sizes (32 rows x 32k context) and for a causal 8k prefill (every 64th row checked)."""
    lens = [32768 - 97 * i for i in range(32)]
    q8, w, cache, bt, cl = _decode_case(11, 32, 1, lens, two_d=False)
    out = il.paged_mqa_logits((q8, None), cache, w, cl, bt, None, 32768, False)
    want = ref.paged_mqa_logits_reference(q8, cache, w, cl, bt, 32768)
    dec = ref.topk_disagreement(out, want, [0] * len(lens), lens, k=2048)
    print(f"\ntop-2048 guard, decode 32 x ~32k: {dec}")

    g = torch.Generator().manual_seed(12)
    M = 8192
    q8p, wp = ref.make_indexer_qw(M, 32, generator=g)
    k8p, kscp = ref.make_indexer_k(M, generator=g)
    q8p, wp, k8p, kscp = q8p.cuda(), wp.cuda(), k8p.cuda(), kscp.cuda()
    ks = torch.zeros(M, dtype=torch.int32, device="cuda")
    ke = torch.arange(1, M + 1, dtype=torch.int32, device="cuda")
    outp = il.mqa_logits((q8p, None), (k8p, kscp), wp, ks, ke, False)
    rows = torch.arange(63, M, 64, device="cuda")
    wantp = ref.mqa_logits_reference(q8p[rows], k8p, kscp, wp[rows], ks[rows], ke[rows])
    pre = ref.topk_disagreement(outp[rows], wantp, ks[rows].tolist(), ke[rows].tolist(), k=2048)
    print(f"top-2048 guard, prefill causal 8k (128 rows): {pre}")
    for s in (dec, pre):
        assert s["mean_wrong_frac"] <= 1e-3 and s["max_wrong_frac"] <= 1e-2, s


# ---------------------------------------------------------------------------------------------------------------
# vs DeepGEMM
# ---------------------------------------------------------------------------------------------------------------


def _deep_gemm():
    if _cap()[0] not in (9, 10):
        pytest.skip(f"DeepGEMM's indexer kernels run only on sm_90/sm_100; this GPU is sm_{_cap()[0]}{_cap()[1]}")
    try:
        import vllm.utils.deep_gemm as dg
        from vllm.utils.import_utils import has_deep_gemm
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"vllm.utils.deep_gemm does not import: {type(e).__name__}: {e}")
    if not has_deep_gemm():
        pytest.skip("vLLM reports no DeepGEMM (no vendored deep_gemm or no CUDA toolkit for its JIT)")
    return dg


def test_paged_vs_deepgemm():
    dg = _deep_gemm()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for heads, next_n in ((32, 1), (64, 1), (32, 2)):
        lens = [5000, 77, 12345, 64, 3000]
        q8, w, cache, bt, cl = _decode_case(3000 + heads + next_n, heads, next_n, lens, two_d=next_n > 1)
        cl2 = cl if cl.dim() == 2 else cl[:, None].contiguous()
        max_model_len = 12800
        try:
            meta = dg.get_paged_mqa_logits_metadata(cl2, 64, sms)
            theirs = dg.fp8_fp4_paged_mqa_logits((q8, None), cache, w, cl2, bt, meta, max_model_len, False)
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"DeepGEMM paged call failed here: {type(e).__name__}: {str(e)[:300]}")
        ours = il.paged_mqa_logits((q8, None), cache, w, cl2, bt, meta, max_model_len, False)
        want, bound = ref.paged_mqa_logits_reference(q8, cache, w, cl2, bt, max_model_len, with_bound=True)
        valid = torch.isfinite(want)
        diff = ((ours.double() - theirs.double()).abs()[valid] / (bound[valid] + 1e-30)).max().item()
        e_ours = _check(ours, want, bound, clean=False, what="ours")
        e_dg = ((theirs.double() - want).abs()[valid] / (RTOL_BOUND * bound[valid] + 1e-30)).max().item()
        print(f"\npaged H={heads} next_n={next_n}: |ours-DeepGEMM|/bound max {diff:.2e}; error/tol ours {e_ours:.3f}, "
              f"DeepGEMM {e_dg:.3f}")
        assert diff <= 2 * RTOL_BOUND


def test_prefill_vs_deepgemm():
    dg = _deep_gemm()
    g = torch.Generator().manual_seed(4000)
    for heads in (32, 64):
        M = N = 2048
        q8, w = ref.make_indexer_qw(M, heads, generator=g)
        k8, ksc = ref.make_indexer_k(N, generator=g)
        q8, w, k8, ksc = q8.cuda(), w.cuda(), k8.cuda(), ksc.cuda()
        ks = torch.zeros(M, dtype=torch.int32, device="cuda")
        ks[M // 2:] = M // 2  # two requests
        ke = torch.arange(1, M + 1, dtype=torch.int32, device="cuda")
        try:
            theirs = dg.fp8_fp4_mqa_logits((q8, None), (k8, ksc), w, ks, ke, clean_logits=False)
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"DeepGEMM prefill call failed here: {type(e).__name__}: {str(e)[:300]}")
        ours = il.mqa_logits((q8, None), (k8, ksc), w, ks, ke, False)
        want, bound = ref.mqa_logits_reference(q8, k8, ksc, w, ks, ke, with_bound=True)
        valid = torch.isfinite(want)
        diff = ((ours.double() - theirs.double()).abs()[valid] / (bound[valid] + 1e-30)).max().item()
        e_ours = _check(ours, want, bound, clean=False, what="ours")
        print(f"\nprefill H={heads}: |ours-DeepGEMM|/bound max {diff:.2e}; error/tol ours {e_ours:.3f}")
        assert diff <= 2 * RTOL_BOUND


def _variants(kernel):
    return len(kernel.device_caches[torch.cuda.current_device()][0])


def test_prefill_shapes_do_not_multiply_compiled_variants():
    # a server sees every row and key count; each one used to be a new "== 1 / % 16 / other" variant compiled on
    # first use (a stall of about a second in the middle of serving).  Only the output row stride (= N) still
    # matters for alignment: at most its two classes.
    g = torch.Generator().manual_seed(77)
    k8, ksc = ref.make_indexer_k(1100, generator=g)
    q8, w = ref.make_indexer_qw(70, 32, generator=g)
    k8, ksc, q8, w = k8.cuda(), ksc.cuda(), q8.cuda(), w.cuda()
    il.mqa_logits((q8[:1], None), (k8[:16], ksc[:16]), w[:1], torch.zeros(1, dtype=torch.int32, device="cuda"),
                  torch.full((1,), 16, dtype=torch.int32, device="cuda"), True)
    before = _variants(il._mqa_logits_kernel), _variants(il._fill_outside_kernel)
    for M in (1, 2, 16, 17, 33, 64, 70):
        for N in (16, 17, 31, 32, 100, 1024, 1100):
            ks = torch.zeros(M, dtype=torch.int32, device="cuda")
            ke = torch.full((M,), N, dtype=torch.int32, device="cuda")
            il.mqa_logits((q8[:M], None), (k8[:N], ksc[:N]), w[:M], ks, ke, True)
    after = _variants(il._mqa_logits_kernel), _variants(il._fill_outside_kernel)
    assert after[0] - before[0] <= 1 and after[1] - before[1] <= 1, (before, after)
