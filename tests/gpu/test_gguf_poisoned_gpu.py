"""Every output element of the GGUF kernels is written by the kernels themselves: the caching allocator is first
filled with NaN, so an output, partial-sum plane or scratch row that a launch leaves unwritten comes back NaN (or
an old value) instead of the zeros a fresh allocation often holds.  Decode-sized calls (1-8 rows, what MTP verify
steps send) at the per-rank shapes of a TP-8 GLM-5 layer, through the plans' own dispatch, against float64 on the
``gguf`` package's dequantization; a relative Frobenius error within 8u (the bounds of test_gguf_mma_gpu.py) and
no non-finite value."""
import pytest
from glm5_shim.kernels.gguf import traits
import torch

pytestmark = pytest.mark.gpu
COMPILED_KERNELS = ("_linear_kernel", "_mma_kernel", "_mma_moe_kernel", "_moe_kernel")
U = 2.0 ** -8   # bf16

# (name, type, N, K): GLM-5's dense linears on one rank of 8, the types of the UD-IQ2_M-like mix and Q8_0
DENSE = (("q_a+kv_a", "Q4_K", 2624, 6144), ("q_b", "Q4_K", 2048, 2048), ("shared gate_up", "Q4_K", 512, 6144),
         ("dense gate_up", "Q4_K", 3072, 6144), ("o_proj", "Q5_K", 6144, 2048), ("shared down", "Q6_K", 6144, 256),
         ("dense down", "Q6_K", 6144, 1536), ("q_a+kv_a", "Q8_0", 2624, 6144), ("shared gate_up", "IQ2_XXS", 512, 6144))


def _poison():
    """Fill the caching allocator's free blocks, small pool and large, with NaN."""
    held = [torch.full((n,), float("nan"), device="cuda")
            for n in (1 << 8, 1 << 12, 1 << 16, 1 << 18) for _ in range(64)]
    held.append(torch.full((1 << 29,), float("nan"), device="cuda"))   # 2 GiB of float32
    del held


def _mods():
    from glm5_shim.kernels.gguf import tiles as gm
    from glm5_shim.kernels.gguf import reference as ref
    return gm, ref


@pytest.mark.parametrize("shape", DENSE, ids=[f"{s[0]}-{s[1]}" for s in DENSE])
def test_dense_decode_rows_write_every_output(shape):
    gm, ref = _mods()
    _, name, n, k = shape
    qtype = getattr(traits, name)
    g = torch.Generator().manual_seed(n + k + qtype)
    w = ref.random_blocks(qtype, n, k, g)
    wd, w64 = w.cuda(), ref.dequantize(w, qtype, k)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        _poison()
        got = gm.gguf_linear(x.cuda(), wd, qtype, n).double().cpu()
        want = x.double() @ w64.T
        assert torch.isfinite(got).all(), (shape, m, "non-finite output")
        err = ((got - want).norm() / want.norm()).item()
        assert err <= 8 * U, (shape, m, err)


@pytest.mark.parametrize("types", [("IQ2_XXS", "IQ2_S"), ("Q4_K", "Q6_K"), ("Q8_0", "Q8_0")])
def test_moe_decode_tokens_write_every_output(types):
    gm, ref = _mods()
    q13, q2 = getattr(traits, types[0]), getattr(traits, types[1])
    g = torch.Generator().manual_seed(q13 * 7 + q2)
    e, h, inter, top_k = 64, 6144, 256, 8   # a TP-8 rank's expert shapes, fewer experts (host memory for float64)
    w13 = torch.stack([ref.random_blocks(q13, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(q2, h, inter, g) for _ in range(e)])
    d13, d2 = w13.cuda(), w2.cuda()
    for t in range(1, 9):
        x = torch.randn(t, h, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
        wts = torch.rand(t, top_k, generator=g)
        wts = wts / wts.sum(1, keepdim=True)
        _poison()
        got = gm.gguf_moe(x.cuda(), d13, d2, wts.cuda(), ids.cuda(), q13, q2).double().cpu()
        want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
        assert torch.isfinite(got).all(), (types, t, "non-finite output")
        err = ((got - want).norm() / want.norm()).item()
        assert err <= 8 * U, (types, t, err)
