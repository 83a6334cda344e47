"""Indexer logits kernels vs a float64 torch reference of the formula (CPU, Triton interpreter).

Both FP8 paths run here: the native one (float8e4nv bitcast + fp8 tl.dot; the 3.6 interpreter computes those
exactly) and the sm_80/86 one (bytes decoded by integer ops + fp16 tl.dot).  Inputs are fresh random tensors
every run (seeded per test only so that a failure can be reproduced).
"""
import os

import ast
import importlib.util
import pathlib

import pytest
import torch
import triton
import triton.language as tl

from glm5_shim.kernels import indexer_logits as il
from glm5_shim.kernels import indexer_logits_reference as ref
from glm5_shim.kernels.fp8 import e4m3_bytes_to_f16_div256, e4m3_bytes_to_f32_torch

# fp32 accumulation of exact fp8 products: error <= ~(128 + 32) * 2**-24 of sum_h |w| sum_d |q k| s.
RTOL_BOUND = 2e-5

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),      # numpy overflow on stale (never stored) cache bytes
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # Triton 3.6 interpreter's scalar __index__
]


def _seed(*key) -> torch.Generator:
    """A fresh random seed per run, printed so that pytest shows it with a failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {key}: {seed}")
    return torch.Generator().manual_seed(seed)


def _check(out, want, bound, *, clean):
    valid = torch.isfinite(want)
    err = (out.double() - want)[valid].abs()
    tol = RTOL_BOUND * bound[valid] + 1e-30
    assert torch.isfinite(out[valid]).all()
    worst = (err / tol).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"max error / tolerance = {worst:.3g}"
    if clean:
        assert torch.isneginf(out[~valid]).all(), "clean_logits must put -inf outside the valid range"


# ---------------------------------------------------------------------------------------------------------------
# the sm_80/86 decoder
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _decode16_kernel(src, dst, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs, e4m3_bytes_to_f16_div256(tl.load(src + offs)).to(tl.float32))


def test_manual_e4m3_decoder_all_bytes():
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256, dtype=torch.float32)
    _decode16_kernel[(1,)](raw, out, BLOCK=256)
    want = raw.view(torch.float8_e4m3fn).to(torch.float32)
    finite = ~torch.isnan(want)
    assert torch.equal(out[finite] * 256.0, want[finite])
    assert torch.equal(out * 256.0, e4m3_bytes_to_f32_torch(raw))  # same bit trick as fp8.py, NaN bytes too


# ---------------------------------------------------------------------------------------------------------------
# prefill (ragged)
# ---------------------------------------------------------------------------------------------------------------


def _ragged_ranges(g, M, N):
    ks = torch.randint(0, N, (M,), generator=g, dtype=torch.int32)
    ke = ks + torch.randint(0, N // 2 + 1, (M,), generator=g, dtype=torch.int32)
    ke = ke.clamp(max=N)
    ks[0], ke[0] = 0, N                   # full row
    if M > 2:
        ks[1], ke[1] = 5, 5               # empty row
        ks[2], ke[2] = N - 1, N           # single key at the end
    return ks, ke


@pytest.mark.parametrize("native", [True, False], ids=["fp8", "manual"])
@pytest.mark.parametrize("heads", [32, 64])
def test_prefill_ragged(native, heads):
    g = _seed("prefill", native, heads)
    M, N = 11, 203  # neither a multiple of the row group nor of the 64-key tile
    q8, w = ref.make_indexer_qw(M, heads, generator=g)
    k8, ksc = ref.make_indexer_k(N, generator=g)
    ks, ke = _ragged_ranges(g, M, N)
    want, bound = ref.mqa_logits_reference(q8, k8, ksc, w, ks, ke, with_bound=True)
    for n_split, clean in ((None, True), (3, False)):
        out = il.mqa_logits_impl((q8, None), (k8, ksc), w, ks, ke, clean, native=native, n_split=n_split)
        assert out.shape == (M, N) and out.dtype == torch.float32
        _check(out, want, bound, clean=clean)


@pytest.mark.parametrize("native", [True, False], ids=["fp8", "manual"])
def test_prefill_causal_chunk_like_vllm(native):
    """Layout of a vLLM prefill chunk: several requests, K gathered per request back to back, each query row
    sees [request start, request start + its position + 1) (with a cached prefix before the new tokens)."""
    g = _seed("causal", native)
    heads = 32
    prefix = [70, 0, 5]
    new = [9, 4, 6]
    ks_l, ke_l, start = [], [], 0
    for p, t in zip(prefix, new):
        for i in range(t):
            ks_l.append(start)
            ke_l.append(start + p + i + 1)
        start += p + t
    N, M = start, sum(new)
    ks, ke = torch.tensor(ks_l, dtype=torch.int32), torch.tensor(ke_l, dtype=torch.int32)
    q8, w = ref.make_indexer_qw(M, heads, generator=g)
    k8, ksc = ref.make_indexer_k(N, generator=g)
    want, bound = ref.mqa_logits_reference(q8, k8, ksc, w, ks, ke, with_bound=True)
    out = il.mqa_logits_impl((q8, None), (k8, ksc), w, ks, ke, True, native=native)
    _check(out, want, bound, clean=True)


def test_prefill_public_wrapper_16_heads_and_strided_q():
    g = _seed("wrapper16")
    M, N, heads = 5, 77, 16
    q8, w = ref.make_indexer_qw(M + 3, heads, generator=g)
    q8, w = q8[3:], w[3:]  # a row slice, as vLLM passes q_quant[token_start:token_end]
    k8, ksc = ref.make_indexer_k(N, generator=g)
    ks, ke = _ragged_ranges(g, M, N)
    want, bound = ref.mqa_logits_reference(q8, k8, ksc, w, ks, ke, with_bound=True)
    out = il.mqa_logits((q8, None), (k8, ksc), w, ks, ke, clean_logits=True)
    _check(out, want, bound, clean=True)


# ---------------------------------------------------------------------------------------------------------------
# decode (paged)
# ---------------------------------------------------------------------------------------------------------------


def _decode_case(g, heads, next_n, lens, *, two_d, block_pad=0):
    B = len(lens)
    k_list, s_list = zip(*[ref.make_indexer_k(L, generator=g) for L in lens])
    cache, bt = ref.make_paged_cache(list(k_list), list(s_list), generator=g, block_pad=block_pad)
    q8, w = ref.make_indexer_qw(B * next_n, heads, generator=g)
    q8 = q8.view(B, next_n, heads, 128)
    L = torch.tensor(lens, dtype=torch.int32)
    if two_d:  # vLLM's native MTP layout: [b, j] = L_b - next_n + j + 1
        cl = (L[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32)[None, :]).contiguous()
    else:      # [B] (or [B, 1]): the kernel derives the per-row lengths the same way
        cl = L[:, None].contiguous() if next_n == 1 else L
    return q8, w, cache, bt, cl


@pytest.mark.parametrize("native", [True, False], ids=["fp8", "manual"])
@pytest.mark.parametrize("heads,next_n,two_d", [(32, 1, False), (32, 2, True), (64, 3, True), (32, 4, False),
                                                (64, 1, False)])
def test_decode_paged(native, heads, next_n, two_d):
    g = _seed("decode", native, heads, next_n, two_d)
    lens = [int(x) for x in torch.randint(1, 260, (3,), generator=g)] + [64, next_n]  # incl. exactly one block
    max_model_len = 300
    q8, w, cache, bt, cl = _decode_case(g, heads, next_n, lens, two_d=two_d, block_pad=64)
    want, bound = ref.paged_mqa_logits_reference(q8, cache, w, cl, bt, max_model_len, with_bound=True)
    for num_programs, clean in ((None, True), (3, False), (40, True)):
        out = il.paged_mqa_logits_impl((q8, None), cache, w, cl, bt, None, max_model_len, clean, native=native,
                                       num_programs=num_programs)
        assert out.shape == (len(lens) * next_n, max_model_len) and out.dtype == torch.float32
        _check(out, want, bound, clean=clean)


def test_decode_per_row_lengths_and_empty_rows():
    """2D context lens that are not the L - next_n + j + 1 pattern, zero-length rows (CUDA-graph padding), a
    row hitting max_model_len, and the public wrapper ignoring schedule_metadata."""
    g = _seed("rows")
    heads, next_n, max_model_len = 32, 2, 192
    lens = [150, 0, 192, 65]
    q8, w, cache, bt, _ = _decode_case(g, heads, next_n, lens, two_d=True)
    cl = torch.tensor([[3, 150], [0, 0], [192, 191], [64, 1]], dtype=torch.int32)
    want, bound = ref.paged_mqa_logits_reference(q8, cache, w, cl, bt, max_model_len, with_bound=True)
    out = il.paged_mqa_logits((q8, None), cache, w, cl, bt, torch.zeros(7, 2, dtype=torch.int32), max_model_len,
                              clean_logits=True)
    _check(out, want, bound, clean=True)


def test_decode_one_long_row_many_programs():
    """One row over many tiles split across programs of unequal start offsets (and an empty program tail)."""
    g = _seed("long")
    q8, w, cache, bt, cl = _decode_case(g, 32, 1, [1000], two_d=False)
    want, bound = ref.paged_mqa_logits_reference(q8, cache, w, cl, bt, 1024, with_bound=True)
    for num_programs in (5, 16, 40):
        out = il.paged_mqa_logits_impl((q8, None), cache, w, cl, bt, None, 1024, False, num_programs=num_programs)
        _check(out, want, bound, clean=False)


# ---------------------------------------------------------------------------------------------------------------
# top-k guard
# ---------------------------------------------------------------------------------------------------------------


def test_topk_2048_guard():
    """How often the shim's top-2048 set differs from the float64 reference's, ties aside (see
    ``ref.topk_disagreement``).  Interpreter arithmetic = exact fp8 products, fp32 sums: should be ~0."""
    g = _seed("topk")
    lens = [4100, 2600, 3333]
    q8, w, cache, bt, cl = _decode_case(g, 32, 1, lens, two_d=False)
    out = il.paged_mqa_logits_impl((q8, None), cache, w, cl, bt, None, 4160, False, num_programs=6)
    want = ref.paged_mqa_logits_reference(q8, cache, w, cl, bt, 4160)
    stats = ref.topk_disagreement(out, want, [0] * len(lens), lens, k=2048)
    print(f"\ntop-2048 guard (decode, interpreter): {stats}")
    assert stats["mean_wrong_frac"] <= 1e-3 and stats["max_wrong_frac"] <= 5e-3


# ---------------------------------------------------------------------------------------------------------------
# API / config bookkeeping
# ---------------------------------------------------------------------------------------------------------------


def _vllm_arg_names(func_name):
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    src = pathlib.Path(list(spec.submodule_search_locations)[0]) / "utils" / "deep_gemm.py"
    tree = ast.parse(src.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == func_name:
            return [a.arg for a in node.args.args]
    pytest.fail(f"{func_name} not found in {src}")


@pytest.mark.parametrize("ours,theirs", [("mqa_logits", "fp8_fp4_mqa_logits"),
                                         ("paged_mqa_logits", "fp8_fp4_paged_mqa_logits")])
def test_signatures_match_vllm_wrappers(ours, theirs):
    import inspect

    mine = list(inspect.signature(getattr(il, ours)).parameters)
    assert mine == _vllm_arg_names(theirs)  # read from the source: importing vllm here would swap triton out


@pytest.mark.parametrize("cap", [(12, 0), (12, 1), (8, 9), (8, 6), (8, 0), (9, 0)])
def test_launch_configs_are_listed(cap):
    native = cap >= (8, 9)
    listed = {(c.name, tuple(sorted(c.constexprs.items())), c.num_warps, c.num_stages) for c in il.kernel_configs(cap)}
    picked = [il.prefill_config(native, h) for h in il.SUPPORTED_HEADS]
    picked += [il.decode_config(native, h, n) for h in il.SUPPORTED_HEADS for n in il.SUPPORTED_NEXT_N]
    for c in picked:
        assert (c.name, tuple(sorted(c.constexprs.items())), c.num_warps, c.num_stages) in listed


# ---------------------------------------------------------------------------------------------------------------
# host path (no kernel runs)
# ---------------------------------------------------------------------------------------------------------------


def test_lens_views_without_copies():
    L = torch.tensor([70, 5, 300], dtype=torch.int32)
    col = L[:, None].contiguous()
    wide = torch.stack([L - 9, L - 4, L], dim=1)  # [B, 3] used with next_n 2: the last column is the length
    for next_n in (1, 2):
        t, s_b, s_j, one_d = il._lens_view(col, 3, next_n)
        assert t.data_ptr() == col.data_ptr() and (s_b, s_j, one_d) == (1, 0, 1)
        t, s_b, s_j, one_d = il._lens_view(wide, 3, next_n)
        assert t.data_ptr() == wide[:, -1].data_ptr() and (s_b, s_j, one_d) == (3, 0, 1)
        want = il.decode_row_lens(L, 3, next_n)
        assert torch.equal(il.decode_row_lens(col, 3, next_n), want)
        assert torch.equal(il.decode_row_lens(wide, 3, next_n), want)
    t, s_b, s_j, one_d = il._lens_view(wide[:, :2], 3, 2)  # [B, next_n]: per-row lengths
    assert (s_b, s_j, one_d) == (3, 1, 0)


def test_paged_launch_arguments(monkeypatch):
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    monkeypatch.setattr(il, "_paged_mqa_logits_kernel", Recorder())
    g = _seed("launch")
    q8, w, cache, bt, cl = _decode_case(g, 64, 1, [100, 7], two_d=False)
    for lens in (cl, cl[:, 0].contiguous()):  # [B, 1] and [B]
        for native in (True, False):
            out = il.paged_mqa_logits_impl((q8, None), cache, w, lens, bt, None, 128, False, native=native)
            grid, args, kwargs = calls[-1]
            assert grid == (il.DECODE_CTAS_PER_SM * 8,) and args[15] is out
            assert args[0].dtype == (torch.float8_e4m3fn if native else torch.uint8)
            assert args[0].data_ptr() == q8.data_ptr() and args[6].data_ptr() == cache.data_ptr()
            assert args[8].dtype == torch.float32 and args[8].data_ptr() == cache.data_ptr()
            assert args[9].data_ptr() == lens.data_ptr() and args[10:13] == (lens.stride(0), 0, 1)
            assert args[16:21] == (128, 2, 1, 128, 1.0 if native else il._MANUAL_W_SCALE)
            cfg = il.decode_config(native, 64, 1, cache.shape[1])
            assert kwargs == dict(cfg.constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
