"""Sparse-MLA kernels under the Triton interpreter (CPU), checked against the float64 torch reference.

Interpreter limits: Triton 3.6's interpreter computes ``tl.dot`` on bf16 wrongly, so these tests use fp16 and
fp32 queries (bf16 is covered by tests/gpu).  The fp8_ds_mla rope is bf16 in the cache and is converted, not
multiplied, so it is still exercised.

Error bounds (relative Frobenius error of ``out`` against float64, absolute error of ``lse``):
* fp32: the interpreter's dot is fp32 and the kernel keeps every intermediate in fp32 -> 1e-5 / 1e-5.
* fp16: P is rounded to fp16 before PV (2**-11 relative) and out is stored in fp16 -> 2e-3 / 1e-4.
* fp8_ds_mla is compared with the float64 attention over the *dequantised* cache, so quantisation error is not
  counted; the kernel additionally rounds P*scale to the query dtype -> same bounds as above.
"""
import math

import pytest
import torch
import triton

import glm5_shim.kernels.sparse_mla as sm

from glm5_shim.kernels.fp8 import e4m3_bytes_to_f32_torch
from glm5_shim.kernels.sparse_mla_reference import (dequant_fp8_ds_mla, fp8_ds_mla_rope_dtype,
                                                    quantize_fp8_ds_mla, sparse_mla_reference)


# bf16: out stored in bf16
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 1e-4), torch.bfloat16: (8e-3, 2e-3)}


def _make_case(T, H, K, dtype, kv_format, *, num_blocks=None, block_size=16, invalid_frac=0.25,
               valid_counts=None, pad_rows=0, seed=0):
    """Random q, cache and indices.  Valid indices are distinct slots per token; ``invalid_frac`` of the
    positions (anywhere in the row) are -1; ``valid_counts[t]`` instead keeps only the first n of row t.
    ``pad_rows`` > 0 allocates each block with extra rows, so block stride != block_size * row stride."""
    g = torch.Generator().manual_seed(seed)
    if num_blocks is None:
        num_blocks = max(2, math.ceil(1.5 * K / block_size))
    slots = num_blocks * block_size
    assert slots >= K
    q = (torch.randn(T, H, 576, generator=g) * 0.5).to(dtype)
    # a few large latent values so softmax is not flat and fp8 scales differ between chunks
    kv_f = torch.randn(num_blocks, block_size + pad_rows, 576, generator=g)
    chunk_mag = torch.rand(num_blocks, block_size + pad_rows, 4, generator=g) * 3 + 0.1
    kv_f[..., :512] *= chunk_mag.repeat_interleave(128, -1)
    if kv_format == "fp8_ds_mla":
        # the rope in the model's dtype, as vLLM's cache writer stores it
        kv_full = quantize_fp8_ds_mla(kv_f, generator=g, rope_dtype=fp8_ds_mla_rope_dtype(dtype))
    else:
        kv_full = kv_f.to(dtype)
    kv = kv_full[:, :block_size] if pad_rows else kv_full
    idx = torch.stack([torch.randperm(slots, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    if valid_counts is not None:
        for t, n in enumerate(valid_counts):
            idx[t, n:] = -1
    elif invalid_frac:
        idx[torch.rand(T, K, generator=g) < invalid_frac] = -1
    return q, kv, idx


def _check(q, kv, idx, kv_format, scale=None, **kw):
    dtype = (q[0] if isinstance(q, tuple) else q).dtype
    scale = scale if scale is not None else 576 ** -0.5
    out, lse = sm.sparse_mla_attention(q, kv, idx, scale, kv_format=kv_format, **kw)
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, scale, kv_format=kv_format)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    rtol, ltol = TOL[dtype]
    err = (out.double() - ref_out).norm() / ref_out.norm().clamp_min(1e-30)
    assert err <= rtol, f"out relative error {err:.3e} > {rtol}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse must be -inf exactly on rows without a valid slot"
    assert bool((lse[~finite] == float("-inf")).all())
    assert bool((out[~finite] == 0).all()), "rows without a valid slot must be zero"
    if finite.any():
        lerr = (lse.double()[finite] - ref_lse[finite]).abs().max()
        assert lerr <= ltol, f"lse abs error {lerr:.3e} > {ltol}"
    return out, lse


# --------------------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------------------

def test_fp8_ds_mla_quantizer_and_dequant_reference():
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(3, 8, 576, generator=g) * 2
    packed = quantize_fp8_ds_mla(kv, generator=g)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 8, 656)
    scales = packed[..., 512:528].contiguous().view(torch.float32)
    assert bool((scales > 0).all())
    # arbitrary fp32, not UE8M0: at least most scales are not powers of two
    mant, _ = torch.frexp(scales)
    assert (mant != 0.5).float().mean() > 0.9
    deq = dequant_fp8_ds_mla(packed, torch.float64)
    # independent decode of the latent with the integer bit trick from fp8.py
    manual = e4m3_bytes_to_f32_torch(packed[..., :512]).double().view(3, 8, 4, 128) * scales.double()[..., None]
    assert torch.equal(deq[..., :512], manual.view(3, 8, 512))
    # rope is stored as bf16 unchanged
    assert torch.equal(deq[..., 512:], kv[..., 512:].to(torch.bfloat16).double())
    # quantisation error of e4m3 (3 mantissa bits): <= 2**-4 relative to each value, plus a subnormal floor
    lat = kv[..., :512].double()
    err = (deq[..., :512] - lat).abs()
    bound = lat.abs() * 2.0 ** -4 + scales.double().repeat_interleave(128, -1) * 2.0 ** -9
    assert bool((err <= bound + 1e-12).all())
    # explicit scales are stored bit-exactly
    s = torch.full((3, 8, 4), 0.0123, dtype=torch.float32)
    packed2 = quantize_fp8_ds_mla(kv, scales=s)
    assert torch.equal(packed2[..., 512:528].contiguous().view(torch.float32), s)


def test_reference_against_naive_loops():
    q, kv, idx = _make_case(2, 3, 12, torch.float32, "bf16", num_blocks=2, block_size=8, seed=2)
    idx[1, :] = -1
    idx[0, 5] = 10_000  # out of range counts as invalid
    out, lse = sparse_mla_reference(q, kv, idx, 0.1, kv_format="bf16")
    flat = kv.reshape(-1, 576).double()
    for t in range(2):
        for h in range(3):
            slots = [int(i) for i in idx[t] if 0 <= int(i) < flat.shape[0]]
            if not slots:
                assert lse[t, h] == float("-inf") and bool((out[t, h] == 0).all())
                continue
            s = torch.stack([0.1 * (q[t, h].double() @ flat[j]) for j in slots])
            w = torch.softmax(s, 0)
            o = sum(w[i] * flat[j, :512] for i, j in enumerate(slots))
            assert torch.allclose(out[t, h], o, rtol=1e-12, atol=1e-12)
            assert math.isclose(lse[t, h].item(), torch.logsumexp(s, 0).item(), rel_tol=1e-12)


# --------------------------------------------------------------------------------------------------------------
# kernels vs reference
# --------------------------------------------------------------------------------------------------------------

CASES = [
    # T, H, K, dtype, kv_format
    (1, 8, 2048, torch.float16, "bf16"),
    (1, 64, 2048, torch.float16, "fp8_ds_mla"),
    (3, 16, 256, torch.float16, "fp8_ds_mla"),
    (37, 16, 64, torch.float32, "bf16"),
    (3, 64, 96, torch.float32, "bf16"),
    (300, 8, 48, torch.float16, "bf16"),
    (2, 128, 128, torch.float16, "bf16"),
    (2, 128, 96, torch.float32, "fp8_ds_mla"),
    (5, 20, 80, torch.float32, "fp8_ds_mla"),  # odd heads, K not a multiple of the tile
    (4, 4, 100, torch.float16, "bf16"),
]


@pytest.mark.parametrize("T,H,K,dtype,kv_format", CASES,
                         ids=[f"T{c[0]}-H{c[1]}-K{c[2]}-{str(c[3])[6:]}-{c[4]}" for c in CASES])
def test_matches_reference(T, H, K, dtype, kv_format):
    q, kv, idx = _make_case(T, H, K, dtype, kv_format, seed=T * 1000 + H + K)
    if T >= 3:
        idx[1] = -1  # a row without any valid slot
    _check(q, kv, idx, kv_format)


@pytest.mark.parametrize("latent_scale,q_scale", [(1.0, 1.0), (1e-4, 1.0), (3e3, 1.0), (1.0, 1e-3), (1.0, 30.0)])
def test_fp16_queries_on_fp8_cache_far_from_unit_scale(latent_scale, q_scale):
    # fp16 P * scale would leave fp16's range for scales far from 1: fp16 queries on the fp8 cache never take fp16
    # dots (bf16 on a GPU, tests/gpu; fp32 here).  The output is still fp16.
    q, kv, idx = _make_case(4, 16, 96, torch.float32, "fp8_ds_mla", invalid_frac=0.3, seed=23)
    kv = quantize_fp8_ds_mla(dequant_fp8_ds_mla(kv) * latent_scale, rope_dtype=torch.float16)
    q = (q * q_scale).to(torch.float16)
    idx[2, 5:] = -1  # mostly empty row
    _check(q, kv, idx, "fp8_ds_mla", scale=576 ** -0.5 / (q_scale * latent_scale))


def test_fp8_cache_rope_is_read_in_the_model_dtype():
    # vLLM's fp8_ds_mla writer quantises the latent but copies k_pe's 16-bit values: fp16 under a float16 model.
    # The same cache bytes read as bf16 rope would be garbage (the reference reads what the kernel must read).
    assert fp8_ds_mla_rope_dtype(torch.float16) == torch.float16
    assert fp8_ds_mla_rope_dtype(torch.bfloat16) == fp8_ds_mla_rope_dtype(torch.float32) == torch.bfloat16
    q, kv, idx = _make_case(3, 16, 96, torch.float16, "fp8_ds_mla", invalid_frac=0.2, seed=47)
    rope = kv[..., 528:].contiguous().view(torch.float16)
    assert torch.isfinite(rope).all() and rope.abs().max() < 10  # fp16 values, as written
    out, _ = _check(q, kv, idx, "fp8_ds_mla")
    wrong, _ = sparse_mla_reference(q.to(torch.bfloat16), kv, idx, 576 ** -0.5, kv_format="fp8_ds_mla")
    assert (out.double() - wrong).norm() / wrong.norm() > 0.05  # reading it as bf16 is far off


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_fewer_valid_than_topk_and_empty_rows(kv_format):
    T, K = 6, 160
    q, kv, idx = _make_case(T, 16, K, torch.float16, kv_format, valid_counts=[K, 1, 0, 37, 100, 5], seed=5)
    for splits in (1, 4):
        out, lse = _check(q, kv, idx, kv_format, num_splits=splits)
        assert bool((out[2] == 0).all()) and bool((lse[2] == float("-inf")).all())


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_split_count_does_not_change_result(kv_format):
    q, kv, idx = _make_case(2, 16, 160, torch.float32, kv_format, invalid_frac=0.4, seed=7)
    results = [_check(q, kv, idx, kv_format, num_splits=s) for s in (1, 3, 1000)]
    for out, lse in results[1:]:
        assert torch.allclose(out, results[0][0], rtol=1e-5, atol=1e-6)
        assert torch.allclose(lse, results[0][1], rtol=1e-6, atol=1e-6)


def test_forced_split_count_is_capped():
    # 40 tiles of 16 asked for 40 splits: the combine reads at most MAX_SPLITS partials, so the wrapper caps it
    q, kv, idx = _make_case(1, 8, 640, torch.float16, "bf16", invalid_frac=0.1, seed=23)
    _check(q, kv, idx, "bf16", tile=sm.FwdTile(16, 16, 4, 1, 1), num_splits=40)


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_strided_blocks_views_and_preallocated_outputs(kv_format):
    T, H, K = 3, 16, 96
    q, kv, idx = _make_case(T, H, K, torch.float16, kv_format, block_size=8, pad_rows=3, seed=11)
    assert kv.stride(0) != kv.shape[1] * kv.stride(1)
    # split query (no concat) taken from a wider buffer, and outputs living inside bigger tensors
    big_q = torch.zeros(T, H, 640, dtype=torch.float16)
    big_q[..., 10:522] = q[..., :512]
    q_pe_buf = torch.zeros(T, H, 80, dtype=torch.float16)
    q_pe_buf[..., 3:67] = q[..., 512:]
    q_tuple = (big_q[..., 10:522], q_pe_buf[..., 3:67])
    out_buf = torch.full((T, H, 600), 7.0, dtype=torch.float16)
    lse_buf = torch.full((T, 2 * H), 7.0)
    out = out_buf[..., 40:552]
    lse = lse_buf[:, ::2]
    for splits in (1, 3):
        o, l = _check(q_tuple, kv, idx, kv_format, out=out, lse=lse, num_splits=splits)
        assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
    assert bool((out_buf[..., :40] == 7).all()) and bool((out_buf[..., 552:] == 7).all())
    assert bool((lse_buf[:, 1::2] == 7).all())
    # a vLLM-style [nb, bs, 1, W] view and a flat [num_slots, W] cache
    _check(q, kv.unsqueeze(2), idx, kv_format)
    flat = kv.contiguous().reshape(-1, kv.shape[-1])
    _check(q, flat, idx, kv_format)


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("schedule", ["pipelined", "prefetch", "split_loads"])
def test_every_loop_schedule(kv_format, schedule):
    # Triton-pipelined loop (with one latent load for both dots, or one per dot) and the hand-prefetched one
    q, kv, idx = _make_case(3, 16, 112, torch.float16, kv_format, invalid_frac=0.3, seed=19)
    idx[1, 40:] = -1  # masked rows: the second (PV) load fills them with a different value; they must not count
    tile = sm.FwdTile(16, 32, 4, 1, 1, prefetch=schedule == "prefetch", split_loads=schedule == "split_loads")
    for splits in (1, 2):
        _check(q, kv, idx, kv_format, tile=tile, num_splits=splits)


def test_out_of_range_slots_are_skipped_and_workspace_reuse():
    q, kv, idx = _make_case(2, 8, 64, torch.float32, "bf16", invalid_frac=0.0, seed=13)
    num_slots = kv.shape[0] * kv.shape[1]
    idx[0, ::5] = num_slots + 3
    idx[1, 3] = -7
    need = sm.workspace_numel(2, 8, 4)
    ws = torch.full((need + 5,), float("nan"))
    _check(q, kv, idx, "bf16", num_splits=4, workspace=ws)
    with pytest.raises(ValueError):
        sm.sparse_mla_attention(q, kv, idx, 0.1, kv_format="bf16", num_splits=4, workspace=ws[: need - 1])


def test_contract_errors():
    q, kv, idx = _make_case(1, 8, 32, torch.float16, "bf16", seed=17)
    with pytest.raises(NotImplementedError):
        sm.sparse_mla_attention(q, kv, idx, 0.1, kv_format="bf16", d_v=256)
    with pytest.raises(ValueError):
        sm.sparse_mla_attention(q, kv, idx, 0.1, kv_format="fp8")
    with pytest.raises(TypeError):
        sm.sparse_mla_attention(q, kv.float(), idx, 0.1, kv_format="bf16")
    with pytest.raises(ValueError):
        sm.sparse_mla_attention(q, kv[..., :512], idx, 0.1, kv_format="bf16")
    with pytest.raises(TypeError):
        sm.sparse_mla_attention(q, kv, idx.long(), 0.1, kv_format="bf16")
    with pytest.raises(ValueError):
        sm.sparse_mla_attention(q, kv, idx, 0.1, kv_format="fp8_ds_mla")
    out, lse = sm.sparse_mla_attention(q[:0], kv, idx[:0], 0.1, kv_format="bf16")
    assert out.shape == (0, 8, 512) and lse.shape == (0, 8)


# --------------------------------------------------------------------------------------------------------------
# heuristics (pure Python)
# --------------------------------------------------------------------------------------------------------------

CAPS = [(8, 0), (8, 6), (8, 9), (9, 0), (12, 0), (12, 1)]


def test_split_heuristic_shapes_only():
    for sms in (48, 132, 188):
        for bh in (16, 32, 64):
            one = sm.choose_num_splits(1, 64, 2048, sms, bh, 32)
            assert one >= 8, "one decode token must be spread over many SMs"
            assert sm.choose_num_splits(4096, 64, 2048, sms, bh, 32) == 1, "prefill needs no combine"
            for T in (1, 2, 7, 16, 64, 256, 4096):
                s = sm.choose_num_splits(T, 64, 2048, sms, bh, 32)
                assert 1 <= s <= sm.MAX_SPLITS and s <= 2048 // 32 // 2
                assert s == sm.choose_num_splits(T, 64, 2048, sms, bh, 32)
            prev = None
            for T in (1, 4, 16, 64, 256, 1024):
                s = sm.choose_num_splits(T, 8, 2048, sms, 16, 32)
                assert prev is None or s <= prev, "splits must not grow with the token count"
                prev = s
    assert sm.choose_num_splits(1, 8, 64, 132, 16, 32) == 1  # two tiles cannot be split further


@pytest.mark.parametrize("cap", CAPS)
def test_heuristic_picks_are_listed_in_kernel_configs(cap):
    for kv_format in sm.KV_FORMATS:
        assert sm.kernel_configs(cap, torch.float32, kv_format) == []  # fp32: interpreter only
    for dtype in (torch.bfloat16, torch.float16):
        for kv_format in sm.KV_FORMATS:
            listed = sm.kernel_configs(cap, dtype, kv_format)
            fwd = {(c["BLOCK_H"], c["BLOCK_N"], c["FP8_DECODE"], c["WRITE_PARTIAL"], c["PREFETCH"], c.num_warps,
                    c.num_stages) for c in listed if c.kernel == "fwd"}
            combine = {c["BLOCK_S"] for c in listed if c.kernel == "combine"}
            for H in (4, 8, 16, 20, 32, 64, 128):
                decode = sm.fp8_decode_method(cap, dtype) if kv_format == "fp8_ds_mla" else sm.NO_FP8_DECODE
                for T in (1, 3, 64, 4096):
                    tile = sm.select_fwd_tile(cap, dtype, kv_format, H, T, 2048, 132)
                    s = sm.choose_num_splits(T, H, 2048, 132, tile.block_h, tile.block_n, tile.occupancy)
                    key = (tile.block_h, tile.block_n, decode, s > 1, tile.prefetch, tile.num_warps,
                           tile.num_stages)
                    assert key in fwd, (cap, dtype, kv_format, H, T, key)
                    if s > 1:
                        assert sm._combine_block_s(s) in combine and s <= sm._combine_block_s(s)
            decodes = {c["FP8_DECODE"] for c in listed if c.kernel == "fwd"}
            if kv_format == "bf16":
                assert decodes == {sm.NO_FP8_DECODE}
            else:  # no conversion instruction below sm_89: the packed bit trick into bf16 there (fp16 queries too)
                want = "cvt" if cap >= (8, 9) else "bf16ptx"
                assert decodes == {want}, (cap, dtype, decodes)
            # the dots run in the queries' dtype, except fp16 queries on the fp8 cache: bf16
            computes = {c["COMPUTE"] for c in listed if c.kernel == "fwd"}
            assert computes == {"bf16" if (dtype, kv_format) == (torch.float16, "fp8_ds_mla") else "q"}


@pytest.mark.parametrize("cap", CAPS)
def test_few_tokens_with_many_heads_take_the_16_head_tile(cap):
    for dtype in (torch.bfloat16, torch.float16):
        for kv_format in sm.KV_FORMATS:
            wide = sm.select_fwd_tile(cap, dtype, kv_format, 64)
            narrow = sm.select_fwd_tile(cap, dtype, kv_format, 16)
            for sms in (132, 188, 46):
                for T in (1, 2, 3, 4, 5, 8, 64, 4096):
                    got = sm.select_fwd_tile(cap, dtype, kv_format, 64, T, 2048, sms)
                    max_s = min(sm.MAX_SPLITS, 2048 // wide.block_n // 2)
                    fills = T * triton.cdiv(64, wide.block_h) * max_s >= sms * wide.occupancy
                    assert got == (wide if fills else narrow), (cap, dtype, kv_format, sms, T)
                # never for a head count the narrow tile already serves
                assert sm.select_fwd_tile(cap, dtype, kv_format, 8, 1, 2048, sms) == narrow
            assert sm.select_fwd_tile(cap, dtype, kv_format, 64, 1, 2048, 132) == narrow  # 1 x 32 programs


def test_fp8_tile_on_sm90_only():
    # H200 sweep: 64 heads/program without the register prefetch wins for fp8 at >= 64 heads; measured on sm_90 only
    # (fp16 queries on the fp8 cache run bf16 dots, so they take the same tiles)
    t64 = sm.FwdTile(64, 32, 8, 3, 1)
    for dtype in (torch.bfloat16, torch.float16):
        assert sm.select_fwd_tile((9, 0), dtype, "fp8_ds_mla", 64) == t64
        assert sm.select_fwd_tile((9, 0), dtype, "fp8_ds_mla", 128) == t64
        assert sm.select_fwd_tile((9, 0), dtype, "fp8_ds_mla", 32).block_h == 32
    for cap in ((10, 0), (12, 0), (12, 1), (8, 9), (8, 6), (8, 0)):
        for dtype in (torch.bfloat16, torch.float16):
            assert sm.select_fwd_tile(cap, dtype, "fp8_ds_mla", 64) != t64, cap
    fwd = [c for c in sm.kernel_configs((9, 0), torch.bfloat16, "fp8_ds_mla") if c.kernel == "fwd"]
    assert {(c["BLOCK_H"], c["BLOCK_N"], c["PREFETCH"], c.num_warps, c.num_stages) for c in fwd
            if c["BLOCK_H"] == 64} == {(64, 32, False, 8, 3)}


# --------------------------------------------------------------------------------------------------------------
# host path: what the wrapper hands to the kernels (recorded, nothing runs)
# --------------------------------------------------------------------------------------------------------------


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def _recorded_launches(monkeypatch, *args, **kwargs):
    fwd, combine = _Recorder(), _Recorder()
    monkeypatch.setattr(sm, "_sparse_mla_fwd_kernel", fwd)
    monkeypatch.setattr(sm, "_sparse_mla_combine_kernel", combine)
    out, lse = sm.sparse_mla_attention(*args, **kwargs)
    return out, lse, fwd.calls, combine.calls


def _launch_key(calls):
    """Comparable form of recorded fwd launches: inputs by (data pointer, dtype), the freshly allocated outputs
    (arguments 4 and 5) by dtype, everything else as is."""
    def norm(i, v):
        if isinstance(v, torch.Tensor):
            return ("tensor", v.data_ptr() if i < 4 else None, v.dtype)
        return v
    return [(grid, tuple(norm(i, a) for i, a in enumerate(args)), kwargs) for grid, args, kwargs in calls]


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_cache_layouts_launch_identically(monkeypatch, kv_format):
    # [nb, bs, W], its [nb, bs, 1, W] view, a flat single-block cache and (fp8) a float8_e4m3fn-typed cache all read
    # the same pointer with the same strides; the launch must not depend on which view vLLM hands over
    q, kv, idx = _make_case(2, 16, 64, torch.float16, kv_format, block_size=8, seed=29)
    base = _launch_key(_recorded_launches(monkeypatch, q, kv, idx, 0.1, kv_format=kv_format, num_splits=2)[2])
    views = [kv.unsqueeze(2)]
    if kv_format == "fp8_ds_mla":
        views.append(kv.view(torch.float8_e4m3fn))
    for view in views:
        got = _launch_key(_recorded_launches(monkeypatch, q, view, idx, 0.1, kv_format=kv_format, num_splits=2)[2])
        assert got == base
    flat = kv.reshape(-1, kv.shape[-1])
    _, _, calls, _ = _recorded_launches(monkeypatch, q, flat, idx, 0.1, kv_format=kv_format, num_splits=2)
    args = calls[0][1]
    num_slots, bs, stride_kb, stride_kr = args[9], args[10], args[17], args[18]
    assert (num_slots, bs, stride_kr) == (kv.shape[0] * kv.shape[1], kv.shape[0] * kv.shape[1], kv.shape[-1])
    assert stride_kb == bs * stride_kr and args[2].data_ptr() == kv.data_ptr()


def test_launch_plan_is_cached_and_follows_the_decode_override(monkeypatch):
    q, kv, idx = _make_case(1, 16, 256, torch.float16, "fp8_ds_mla", seed=31)
    monkeypatch.delenv("GLM5_SPARSE_MLA_FP8_DECODE", raising=False)
    sm._launch_plan.cache_clear()
    _, _, fwd, combine = _recorded_launches(monkeypatch, q, kv, idx, 0.1, kv_format="fp8_ds_mla", num_splits=2)
    _recorded_launches(monkeypatch, q, kv, idx, 0.1, kv_format="fp8_ds_mla", num_splits=2)
    info = sm._launch_plan.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    # fp16 queries on the fp8 cache run fp32 dots in the interpreter (bf16 on a GPU): the exact decode
    assert fwd[0][2]["FP8_DECODE"] == "f32" and fwd[0][2]["COMPUTE"] == "f32"
    assert fwd[0][2]["WRITE_PARTIAL"] and len(combine) == 1
    # the benchmarking override is read per call, not frozen into the cached plan (CPU default capability: sm_120)
    qb = q.to(torch.bfloat16)
    _, _, fwd, _ = _recorded_launches(monkeypatch, qb, kv, idx, 0.1, kv_format="fp8_ds_mla", num_splits=2)
    assert fwd[0][2]["FP8_DECODE"] == "cvt" and fwd[0][2]["COMPUTE"] == "q"
    monkeypatch.setenv("GLM5_SPARSE_MLA_FP8_DECODE", "f16bits")
    _, _, fwd, _ = _recorded_launches(monkeypatch, qb, kv, idx, 0.1, kv_format="fp8_ds_mla", num_splits=2)
    assert fwd[0][2]["FP8_DECODE"] == "f16bits"


@pytest.mark.parametrize("mode,cap,dtype,on_gpu,expected", [
    ("auto", (12, 0), torch.bfloat16, True, "cvt"),
    ("auto", (8, 9), torch.float16, True, "cvt"),
    ("auto", (8, 0), torch.bfloat16, True, "bf16ptx"),
    ("auto", (8, 6), torch.float16, True, "bf16ptx"),  # fp16 queries: bf16 dots on the fp8 cache
    ("auto", (8, 6), torch.bfloat16, False, "bf16bits"),
    ("auto", (8, 6), torch.float16, False, "f32"),  # fp32 dots in the interpreter
    ("auto", (9, 0), torch.float32, False, "f32"),
    ("bf16bits", (12, 0), torch.bfloat16, True, "bf16bits"),
    ("bf16ptx", (8, 6), torch.bfloat16, True, "bf16ptx"),
    ("f16bits", (12, 0), torch.bfloat16, True, "f16bits"),
    ("cvt", (8, 6), torch.float16, True, "cvt needs sm_89"),
    ("bf16ptx", (12, 0), torch.float16, True, "bf16ptx"),
    ("bf16ptx", (12, 0), torch.bfloat16, False, "GPU only"),
    ("f16ptx", (8, 0), torch.bfloat16, False, "GPU only"),
    ("native", (12, 0), torch.bfloat16, True, "expected auto or one of"),
])
def test_fp8_decode_method_choice_and_refusals(monkeypatch, mode, cap, dtype, on_gpu, expected):
    monkeypatch.setenv("GLM5_SPARSE_MLA_FP8_DECODE", mode)
    if expected in sm.FP8_DECODES:
        assert sm.fp8_decode_method(cap, dtype, on_gpu) == expected
    else:
        with pytest.raises(ValueError, match="GLM5_SPARSE_MLA_FP8_DECODE=") as e:
            sm.fp8_decode_method(cap, dtype, on_gpu)
        assert expected in str(e.value) and "\n" not in str(e.value)


def test_workspace_regions_passed_without_views(monkeypatch):
    T, H, K, S = 3, 16, 96, 3
    q, kv, idx = _make_case(T, H, K, torch.float16, "bf16", seed=37)
    ws = torch.empty(sm.workspace_numel(T, H, S) + 7)
    out, lse, fwd, combine = _recorded_launches(monkeypatch, q, kv, idx, 0.1, kv_format="bf16", num_splits=S,
                                                workspace=ws)
    (_, fa, _), = fwd
    (_, ca, _), = combine
    n_out = T * S * H * 512
    assert fa[4].data_ptr() == ws.data_ptr() and fa[5].data_ptr() == ws.data_ptr() + 4 * n_out
    assert fa[20:26] == (S * H * 512, H * 512, 512, S * H, H, 1) and ca[6:12] == fa[20:26]
    assert ca[2] is out and ca[3] is lse
