"""Float64 torch reference for the DSA indexer logits, input builders, and the top-k agreement guard.

    logit[m, n] = sum_h w[m, h] * relu(q[m, h, :] . k[n, :]) * k_scale[n]

Everything here is written from the formula and the cache layout, independently of the Triton kernels
(``indexer_logits.py``); the tests compare the two.
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0


def e4m3_to_f64(x: torch.Tensor) -> torch.Tensor:
    """e4m3 tensor (float8_e4m3fn or its uint8 bytes) -> float64, exactly."""
    if x.dtype == torch.uint8:
        x = x.view(torch.float8_e4m3fn)
    return x.to(torch.float64)


def quant_e4m3_ue8m0(x: torch.Tensor, amax_floor: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise the last dim to e4m3 with one power-of-two scale per row (vLLM's ue8m0 indexer format).
    Returns (fp8 values, fp32 scale [...])."""
    amax = x.abs().amax(dim=-1).float().clamp_min(amax_floor)
    scale = torch.pow(2.0, torch.ceil(torch.log2(amax / FP8_MAX)))
    q = (x.float() / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float32)


def make_indexer_qw(rows: int, heads: int, *, generator=None, device="cpu", dim: int = 128):
    """Random q (fp8 [rows, heads, dim]) and weights (fp32 [rows, heads]) the way the model produces them: per
    (token, head) ue8m0 scale folded into weights together with dim**-0.5 * heads**-0.5."""
    qf = torch.randn(rows, heads, dim, generator=generator, device=device)
    q8, q_scale = quant_e4m3_ue8m0(qf)
    w = torch.randn(rows, heads, generator=generator, device=device)
    weights = (w * q_scale * dim ** -0.5 * heads ** -0.5).float()
    return q8, weights


def make_indexer_k(n: int, *, generator=None, device="cpu", dim: int = 128):
    """Random layer-normed k quantised per token: (fp8 [n, dim], fp32 scale [n])."""
    kf = torch.randn(n, dim, generator=generator, device=device)
    kf = (kf - kf.mean(-1, keepdim=True)) / kf.std(-1, keepdim=True).clamp_min(1e-6) if n else kf
    return quant_e4m3_ue8m0(kf)


def mqa_logits_reference(q_fp8, k_fp8, k_scale, weights, ks, ke, *, with_bound=False, row_chunk=64):
    """Float64 [M, N] logits, -inf outside [ks[m], ke[m]).  ``with_bound`` also returns sum_h |w| sum_d |q k| s,
    the scale of the rounding error any fp32 implementation makes (for tolerances)."""
    q = e4m3_to_f64(q_fp8)
    k = e4m3_to_f64(k_fp8)
    s = k_scale.to(torch.float64)
    w = weights.to(torch.float64)
    M, N = q.shape[0], k.shape[0]
    out = torch.full((M, N), float("-inf"), dtype=torch.float64, device=q.device)
    bound = torch.zeros((M, N), dtype=torch.float64, device=q.device) if with_bound else None
    cols = torch.arange(N, device=q.device)
    for m0 in range(0, M, row_chunk):
        qs = q[m0:m0 + row_chunk]
        dots = torch.einsum("mhd,nd->mhn", qs, k)
        val = (w[m0:m0 + row_chunk, :, None] * dots.clamp_min(0)).sum(1) * s[None, :]
        lo, hi = ks[m0:m0 + row_chunk, None].long(), ke[m0:m0 + row_chunk, None].long()
        valid = (cols[None, :] >= lo) & (cols[None, :] < hi)
        out[m0:m0 + row_chunk] = torch.where(valid, val, out[m0:m0 + row_chunk])
        if with_bound:
            absdots = torch.einsum("mhd,nd->mhn", qs.abs(), k.abs())
            bound[m0:m0 + row_chunk] = (w[m0:m0 + row_chunk, :, None].abs() * absdots).sum(1) * s[None, :]
    return (out, bound) if with_bound else out


# ---------------------------------------------------------------------------------------------------------------
# paged cache: per physical block of PAGE tokens, PAGE x 128 e4m3 bytes, then PAGE fp32 scales
# ---------------------------------------------------------------------------------------------------------------


def make_paged_cache(k_fp8_per_req, k_scale_per_req, *, page: int = 64, extra_blocks: int = 3, block_pad: int = 0,
                     generator=None, device="cpu"):
    """Scatter each request's (k_fp8 [L_b, 128], k_scale [L_b]) into a paged cache at random, non-contiguous
    physical blocks.  ``block_pad`` > 0 gives a block stride larger than page * 132 (as a padded allocation
    would).  Unused bytes are random garbage.  Returns (kv_cache [nb, page, 1, 132] uint8 view, block_table
    [B, max_blocks] int32; unused table entries are garbage block ids)."""
    dim = 128
    nblk_req = [-(-int(k.shape[0]) // page) for k in k_fp8_per_req]
    max_blocks = max([1] + nblk_req)
    nb = sum(nblk_req) + extra_blocks
    row_bytes = page * (dim + 4)
    stride = row_bytes + block_pad
    store = torch.randint(0, 256, (nb * stride,), generator=generator, dtype=torch.uint8)
    perm = torch.randperm(nb, generator=generator)
    bt = torch.randint(0, nb, (len(k_fp8_per_req), max_blocks), generator=generator, dtype=torch.int32)
    used = 0
    for b, (k8, ksc) in enumerate(zip(k_fp8_per_req, k_scale_per_req)):
        L = int(k8.shape[0])
        kb = k8.view(torch.uint8).cpu()
        sb = ksc.to(torch.float32).cpu().contiguous().view(torch.uint8).view(L, 4)
        for i in range(nblk_req[b]):
            blk = int(perm[used])
            used += 1
            bt[b, i] = blk
            lo, hi = i * page, min(L, (i + 1) * page)
            base = blk * stride
            n = hi - lo
            store[base:base + n * dim] = kb[lo:hi].reshape(-1)
            store[base + page * dim:base + page * dim + n * 4] = sb[lo:hi].reshape(-1)
    store = store.to(device)
    cache = torch.as_strided(store, (nb, page, 1, dim + 4), (stride, dim + 4, dim + 4, 1))
    return cache, bt.to(device)


def read_paged_k(kv_cache, block_table_row, length: int):
    """Read (k float64 [length, 128], scale float64 [length]) of one request back from the paged cache."""
    page = kv_cache.shape[1]
    dim = kv_cache.shape[-1] - 4
    flat = torch.as_strided(kv_cache, (kv_cache.shape[0], page * (dim + 4)), (kv_cache.stride(0), 1))
    pos = torch.arange(length, device=kv_cache.device)
    blk = block_table_row.long()[pos // page]
    slot = pos % page
    vals = flat[blk[:, None], (slot * dim)[:, None] + torch.arange(dim, device=kv_cache.device)[None, :]]
    sbytes = flat[blk[:, None], (page * dim + slot * 4)[:, None] + torch.arange(4, device=kv_cache.device)[None, :]]
    scale = sbytes.contiguous().view(torch.float32).reshape(length)
    return e4m3_to_f64(vals.contiguous()), scale.to(torch.float64)


def decode_row_lens_reference(context_lens, batch: int, next_n: int) -> list[int]:
    """Length seen by output row b * next_n + j: context_lens[b, j] for [B, next_n] lens, else
    L_b - next_n + j + 1 with L_b = context_lens[b] (the 1D / [B, 1] convention of DeepGEMM)."""
    cl = context_lens.cpu().long()
    out = []
    for b in range(batch):
        for j in range(next_n):
            if cl.dim() == 2 and cl.shape[1] == next_n and next_n > 1:
                out.append(int(cl[b, j]))
            else:
                L = int(cl[b, -1]) if cl.dim() == 2 else int(cl[b])
                out.append(L - next_n + j + 1)
    return out


def paged_mqa_logits_reference(q_fp8, kv_cache, weights, context_lens, block_table, max_model_len, *,
                               with_bound=False, rows=None):
    """Float64 [B * next_n, max_model_len] logits, -inf at positions >= the row's length.  ``rows`` limits the
    work to those output rows (others stay -inf)."""
    B, next_n, H, D = q_fp8.shape
    lens = decode_row_lens_reference(context_lens, B, next_n)
    q = e4m3_to_f64(q_fp8).reshape(B * next_n, H, D)
    w = weights.to(torch.float64)
    out = torch.full((B * next_n, max_model_len), float("-inf"), dtype=torch.float64, device=q.device)
    bound = torch.zeros_like(out) if with_bound else None
    for r in (range(B * next_n) if rows is None else rows):
        L = min(max(lens[r], 0), max_model_len)
        if L == 0:
            continue
        k, s = read_paged_k(kv_cache, block_table[r // next_n], L)
        dots = q[r] @ k.T  # [H, L]
        out[r, :L] = (w[r, :, None] * dots.clamp_min(0)).sum(0) * s
        if with_bound:
            bound[r, :L] = (w[r, :, None].abs() * (q[r].abs() @ k.abs().T)).sum(0) * s
    return (out, bound) if with_bound else out


# ---------------------------------------------------------------------------------------------------------------
# top-k guard
# ---------------------------------------------------------------------------------------------------------------


def topk_disagreement(logits: torch.Tensor, ref: torch.Tensor, lo, hi, k: int = 2048, tie_eps: float = 1e-6):
    """How often the shim's top-k set differs from the float64 reference's, ties aside.

    For each row, positions [lo, hi) are valid.  The shim's top-k (torch.topk on its fp32 logits, as vLLM's
    top-k kernels pick the k largest) is compared with the reference top-k; a selected index counts as wrong if
    it is not in the reference set AND its reference value is not within ``tie_eps * |v_k| (+1e-30)`` of the
    reference k-th value v_k (an equal-valued swap is not an error).  Rows with <= k valid positions select
    everything and cannot disagree.  Returns a dict: mean / max fraction of wrong selections per row, the number
    of rows with any wrong selection, and rows checked."""
    fracs = []
    for r in range(logits.shape[0]):
        a, b = int(lo[r]), int(hi[r])
        n = b - a
        if n <= k:
            fracs.append(0.0)
            continue
        got = logits[r, a:b].double()
        want = ref[r, a:b].double()
        sel = torch.topk(got, k).indices
        ref_vals, ref_idx = torch.topk(want, k)
        vk = ref_vals[-1]
        in_ref = torch.zeros(n, dtype=torch.bool, device=want.device)
        in_ref[ref_idx] = True
        wrong = (~in_ref[sel]) & ((want[sel] - vk).abs() > tie_eps * vk.abs() + 1e-30)
        fracs.append(wrong.double().mean().item())
    t = torch.tensor(fracs or [0.0], dtype=torch.float64)
    return {"mean_wrong_frac": t.mean().item(), "max_wrong_frac": t.max().item(),
            "rows_with_error": int((t > 0).sum().item()), "rows": len(fracs)}
