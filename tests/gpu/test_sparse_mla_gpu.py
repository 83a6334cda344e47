"""Sparse-MLA kernels on a real GPU at GLM-5 shapes (bf16 and fp8_ds_mla), against the float64 torch reference.

Run: ``python -m pytest -q tests/gpu/test_sparse_mla_gpu.py`` (skipped where torch sees no GPU).

Error bounds (relative Frobenius error of ``out``; absolute error of ``lse``):
* bf16 queries: P is rounded to bf16 before PV (2**-9 relative) and out is stored in bf16 -> 8e-3 / 2e-3.
  (FlashMLA measured 2.2e-3 against a float32 reference at these shapes.)
* fp8_ds_mla: compared with float64 attention over the *dequantised* cache (the kernel's own error, same bounds);
  against the unquantised cache e4m3 quantisation (with jittered, not tight, scales) dominates -> 1e-1
  (measured ~4e-2 on CPU at small shapes; FlashMLA: 2.4e-2 on its data).
* fp16 queries: 2**-11 rounding -> 3e-3 / 1e-3.  On the fp8 cache they are rounded to bf16 in the kernel
  (``compute_dtype``) while the reference keeps them in fp16: q's 2**-9 rounding moves every score of a head the
  same way, ~scale * 2**-9 * |q . k| / sqrt(3) (~1.5e-3 here), so lse gets 1e-2 (measured <= 4.2e-3 on the H200)
  and out the bf16 bound.  That is far below the cache's own e4m3 error (~4e-2 against the unquantised cache).
"""
import pytest
import torch

pytestmark = pytest.mark.gpu
COMPILED_KERNELS = ("_sparse_mla_fwd_kernel",)  # every test must run it compiled (tests/gpu/conftest.py)

TOL = {torch.bfloat16: (8e-3, 2e-3), torch.float16: (3e-3, 1e-3)}
TOL_FP16_Q_AS_BF16 = (8e-3, 1e-2)  # fp16 queries on the fp8 cache: see above
DEV = "cuda"
SCALE = 256 ** -0.5  # what vLLM passes for GLM-5: qk_head_dim ** -0.5 with qk_head_dim = 192 nope + 64 rope


def _mods():
    from glm5_shim.kernels import sparse_mla as sm
    from glm5_shim.kernels import sparse_mla_reference as ref
    return sm, ref


def _case(T, H, K, dtype, kv_format, *, num_blocks=64, block_size=64, pad_rows=0, invalid_frac=0.1, seed=0):
    sm, ref = _mods()
    dev = DEV
    g = torch.Generator(device=dev).manual_seed(seed)
    slots = num_blocks * block_size
    assert slots >= K
    q = (torch.randn(T, H, 576, generator=g, device=dev) * 0.5).to(dtype)
    kv_f = torch.randn(num_blocks, block_size + pad_rows, 576, generator=g, device=dev)
    kv_f[..., :512] *= (torch.rand(num_blocks, block_size + pad_rows, 4, generator=g, device=dev) * 3 + 0.1
                        ).repeat_interleave(128, -1)
    kv_bf = kv_f.to(dtype)
    # an fp8 cache holds the rope in the model's dtype, as vLLM's cache writer stores it
    kv = (ref.quantize_fp8_ds_mla(kv_bf.float(), generator=g, rope_dtype=ref.fp8_ds_mla_rope_dtype(dtype))
          if kv_format == "fp8_ds_mla" else kv_bf)
    if pad_rows:
        kv, kv_bf = kv[:, :block_size], kv_bf[:, :block_size]
    keys = torch.rand(T, slots, generator=g, device=dev)
    idx = keys.topk(K, dim=1).indices.to(torch.int32)  # distinct random slots per token
    if invalid_frac:
        idx[torch.rand(T, K, generator=g, device=dev) < invalid_frac] = -1
    return q, kv, kv_bf, idx


def _far_from_unit_scale(dtype, seed, latent_scale, q_scale):
    """A GLM-5-shaped fp8 case with the latent cache scaled by latent_scale and the queries by q_scale, plus the
    softmax scale that gives the same score distribution as at unit scale."""
    _, ref = _mods()
    q, kv, _, idx = _case(5, 16, 2048, dtype, "fp8_ds_mla", seed=seed)
    rope = ref.fp8_ds_mla_rope_dtype(dtype)
    kv = ref.quantize_fp8_ds_mla(ref.dequant_fp8_ds_mla(kv, rope_dtype=rope) * latent_scale, rope_dtype=rope)
    q = (q.float() * q_scale).to(dtype)
    return q, kv, idx, SCALE / (q_scale * latent_scale)


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def _check(q, kv, idx, kv_format, scale=SCALE, **kw):
    sm, ref = _mods()
    out, lse = sm.sparse_mla_attention(q, kv, idx, scale, kv_format=kv_format, **kw)
    torch.cuda.synchronize()
    r_out, r_lse = ref.sparse_mla_reference(q, kv, idx, scale, kv_format=kv_format, token_chunk=8)
    rounded = sm.compute_dtype(q.dtype, kv_format) != q.dtype
    rtol, ltol = TOL_FP16_Q_AS_BF16 if rounded else TOL[q.dtype]
    assert _rel(out, r_out) <= rtol, _rel(out, r_out)
    finite = torch.isfinite(r_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert bool((out[~finite] == 0).all())
    if finite.any():
        assert (lse.double()[finite] - r_lse[finite]).abs().max().item() <= ltol
    return out, lse


@pytest.mark.parametrize("H", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("T", [1, 16, 130])
def test_bf16_glm5_shapes(T, H):
    q, kv, _, idx = _case(T, H, 2048, torch.bfloat16, "bf16", seed=T * 131 + H)
    if T > 1:
        idx[1] = -1
    _check(q, kv, idx, "bf16")


@pytest.mark.parametrize("decode", ["auto", "f16bits", "f16ptx", "bf16ptx"])
@pytest.mark.parametrize("H", [8, 16, 64, 128])
@pytest.mark.parametrize("T", [1, 16, 130])
def test_fp8_ds_mla_glm5_shapes(T, H, decode, monkeypatch):
    sm, ref = _mods()
    monkeypatch.setenv("GLM5_SPARSE_MLA_FP8_DECODE", decode)
    q, kv, kv_bf, idx = _case(T, H, 2048, torch.bfloat16, "fp8_ds_mla", seed=T * 17 + H)
    out, _ = _check(q, kv, idx, "fp8_ds_mla")
    # against the unquantised cache: only e4m3 quantisation error on top
    r_out, _ = ref.sparse_mla_reference(q, kv_bf, idx, SCALE, kv_format="bf16", token_chunk=8)
    assert _rel(out, r_out) <= 1e-1


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_fp16_queries(kv_format):
    q, kv, _, idx = _case(9, 16, 1024, torch.float16, kv_format, seed=3)
    out, _ = _check(q, kv, idx, kv_format)
    assert out.dtype == torch.float16


@pytest.mark.parametrize("decode", ["auto", "f16ptx", "bf16ptx"])
@pytest.mark.parametrize("latent_scale,q_scale", [(1e-4, 1.0), (3e3, 1.0), (1.0, 1e-3), (1.0, 30.0)])
def test_fp16_queries_on_fp8_cache_far_from_unit_scale(decode, latent_scale, q_scale, monkeypatch):
    # fp16 queries on the fp8 cache take bf16 dots: P * scale stays in range however small or large the scales
    monkeypatch.setenv("GLM5_SPARSE_MLA_FP8_DECODE", decode)
    q, kv, idx, scale = _far_from_unit_scale(torch.float16, 43, latent_scale, q_scale)
    idx[2, 7:] = -1
    out, _ = _check(q, kv, idx, "fp8_ds_mla", scale=scale)
    assert out.dtype == torch.float16


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_splits_invalid_tails_and_strided_blocks(kv_format):
    q, kv, _, idx = _case(6, 64, 2048, torch.bfloat16, kv_format, pad_rows=1, invalid_frac=0.0, seed=5)
    assert kv.stride(0) != kv.shape[1] * kv.stride(1)  # FlashMLA's test layout: block_size + 1 rows per block
    idx[0, 700:] = -1   # short context: -1 tail
    idx[1] = -1         # no valid slot at all
    idx[2, ::3] = -1    # holes anywhere
    idx[3, :2047] = -1  # a single valid slot at the very end
    base = None
    for splits in (None, 1, 2, 7, 32):
        out, lse = _check(q, kv, idx, kv_format, num_splits=splits)
        if base is None:
            base = (out.float(), lse)
        else:
            # different split counts only reorder fp32 sums (and round P per split): a few bf16 ulps apart
            assert _rel(out, base[0].double()) <= 8e-3
            fin = torch.isfinite(base[1])
            assert (lse[fin] - base[1][fin]).abs().max().item() <= 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_what_vllms_fp8_cache_writer_stores_is_what_the_kernel_reads(dtype):
    # vLLM's own fp8_ds_mla writer (what serving runs): e4m3 latent + fp32 scales, and k_pe copied as it is -- fp16
    # under a float16 model.  The kernel over that cache must match attention over the unquantised rows.
    ops = pytest.importorskip("vllm._custom_ops", reason="needs vLLM's CUDA ops (bench/gpu_session.sh installs them)")
    sm, ref = _mods()
    g = torch.Generator(device=DEV).manual_seed(53)
    nb, bs, T, H, K = 16, 64, 4, 16, 512
    n = nb * bs
    kv_c = (torch.randn(n, 512, generator=g, device=DEV) * 2).to(dtype)
    k_pe = torch.randn(n, 64, generator=g, device=DEV).to(dtype)
    cache = torch.zeros(nb, bs, 656, dtype=torch.uint8, device=DEV)
    slots = torch.randperm(n, generator=g, device=DEV).to(torch.int64)
    ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1, device=DEV))
    rows = cache.view(n, 656)[slots]
    assert torch.equal(rows[:, 528:].contiguous().view(dtype), k_pe)  # the rope, bit for bit, in the model dtype
    assert ref.fp8_ds_mla_rope_dtype(dtype) == dtype
    q = (torch.randn(T, H, 576, generator=g, device=DEV) * 0.5).to(dtype)
    idx = torch.stack([torch.randperm(n, generator=g, device=DEV)[:K] for _ in range(T)]).to(torch.int32)
    out, _ = _check(q, cache, idx, "fp8_ds_mla")  # against the dequantised cache, the kernel's own bounds
    plain = torch.zeros(n, 576, dtype=dtype, device=DEV)
    plain[slots] = torch.cat([kv_c, k_pe], dim=-1)
    r_out, _ = ref.sparse_mla_reference(q, plain, idx, SCALE, kv_format="bf16", token_chunk=8)
    assert _rel(out, r_out) <= 1e-1  # e4m3 quantisation of the latent only


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_ds_mla"])
def test_cuda_graph_capture_and_replay(kv_format):
    sm, _ = _mods()
    T, H = 4, 16
    q, kv, _, idx = _case(T, H, 2048, torch.bfloat16, kv_format, seed=7)
    ws = torch.empty(sm.workspace_numel(T, H, sm.MAX_SPLITS), device="cuda")
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(T, H, device="cuda")
    sm.sparse_mla_attention(q, kv, idx, SCALE, kv_format=kv_format, out=out, lse=lse, workspace=ws)  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sm.sparse_mla_attention(q, kv, idx, SCALE, kv_format=kv_format, out=out, lse=lse, workspace=ws)
    q2, _, _, idx2 = _case(T, H, 2048, torch.bfloat16, kv_format, seed=8)
    q.copy_(q2)
    idx.copy_(idx2)
    g.replay()
    torch.cuda.synchronize()
    want, want_lse = sm.sparse_mla_attention(q, kv, idx, SCALE, kv_format=kv_format)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.compiled_kernels("both")
def test_ptx_decodes_match_the_portable_ones_on_all_bytes():
    import triton
    import triton.language as tl

    from glm5_shim.kernels.fp8 import (e4m3_bytes_to_bf16_scaled, e4m3_bytes_to_bf16_scaled_ptx,
                                       e4m3_bytes_to_f16_div256, e4m3_bytes_to_f16_div256_ptx)

    @triton.jit
    def both(src, a, b, c, d, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(src + offs)
        tl.store(a + offs, e4m3_bytes_to_bf16_scaled(x))
        tl.store(b + offs, e4m3_bytes_to_bf16_scaled_ptx(x))
        tl.store(c + offs, e4m3_bytes_to_f16_div256(x))
        tl.store(d + offs, e4m3_bytes_to_f16_div256_ptx(x))

    # every byte, in a few orders (which lane gets which byte of a packed register must not matter)
    raw = torch.arange(256, dtype=torch.int32, device=DEV).to(torch.uint8)
    for perm in (raw, raw.flip(0), raw[torch.randperm(256, device=DEV)]):
        a = torch.empty(256, dtype=torch.bfloat16, device=DEV)
        b = torch.empty_like(a)
        c = torch.empty(256, dtype=torch.float16, device=DEV)
        d = torch.empty_like(c)
        both[(1,)](perm, a, b, c, d, BLOCK=256)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(c.view(torch.int16), d.view(torch.int16))
        ref = perm.view(torch.float8_e4m3fn).float()
        finite = ~torch.isnan(ref)
        assert torch.equal(b.double()[finite] * 2.0 ** 120, ref.double()[finite])
        assert torch.equal(d.double()[finite] * 2.0 ** 8, ref.double()[finite])


@pytest.mark.parametrize("decode", ["auto", "f16ptx", "bf16ptx"])
@pytest.mark.parametrize("latent_scale,q_scale", [(1e-4, 1.0), (3e4, 1.0), (1.0, 1e-3), (1.0, 300.0)])
def test_fp8_bf16_decode_far_from_unit_scale(decode, latent_scale, q_scale, monkeypatch):
    # the bf16 decode carries K as value * 2**-120 and lifts q by 2**64, P by 2**96: tiny or large caches and
    # queries must neither underflow nor overflow
    monkeypatch.setenv("GLM5_SPARSE_MLA_FP8_DECODE", decode)
    q, kv, idx, scale = _far_from_unit_scale(torch.bfloat16, 41, latent_scale, q_scale)
    _check(q, kv, idx, "fp8_ds_mla", scale=scale)


def test_batch_sizes_do_not_multiply_compiled_variants():
    # decode batches of every size pick split counts 1..32; they must not each compile a new variant mid-serving
    sm, _ = _mods()
    dev = torch.cuda.current_device()
    from glm5_shim.kernels.device import cuda_capability_and_sms

    cap, sms = cuda_capability_and_sms(dev)
    fwd, comb = sm._sparse_mla_fwd_kernel, sm._sparse_mla_combine_kernel
    before = len(fwd.device_caches[dev][0]), len(comb.device_caches[dev][0])
    classes, splits = set(), set()
    for T in range(1, 41):
        q, kv, _, idx = _case(T, 16, 2048, torch.bfloat16, "bf16", seed=T)
        sm.sparse_mla_attention(q, kv, idx, SCALE, kv_format="bf16")
        plan = sm._launch_plan(cap, sms, torch.bfloat16, "bf16", sm.NO_FP8_DECODE, T, 16, 2048, None, None)
        splits.add(plan.num_splits)
        classes.add(("fwd", plan.fwd_kwargs["WRITE_PARTIAL"]))
        if plan.num_splits > 1:
            classes.add(("combine", plan.combine_kwargs["BLOCK_S"]))
    torch.cuda.synchronize()
    assert len(splits) >= 4, splits  # several split counts were really used
    grew = len(fwd.device_caches[dev][0]) - before[0], len(comb.device_caches[dev][0]) - before[1]
    # at most one new fwd variant per WRITE_PARTIAL and one combine per BLOCK_S, whatever the split counts were
    assert grew[0] <= sum(c[0] == "fwd" for c in classes) and grew[1] <= sum(c[0] == "combine" for c in classes), (
        splits, classes, grew)
