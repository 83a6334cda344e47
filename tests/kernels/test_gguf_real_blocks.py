"""The GGUF kernels on blocks llama.cpp's own quantizer wrote (Triton interpreter, CPU), against float64 on the
``gguf`` package's dequantization of the same bytes.

test_gguf_matmul.py has real quantizers only for the K-quants and the legacy types; for the IQ types it uses random
valid blocks.  Here llama-quantize (with llama-imatrix's importance matrix for its very low-bit presets) writes every
very low-bit type a UD file holds (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and the K-quants beside them.
Every GGUF matmul tensor of each file runs through the shim's dense linear (1, 5 and 19 rows), and each MoE layer's
experts through the fused MoE, both within the tolerances of test_gguf_matmul.py (fp32: the kernel's dot and its
decode are exact up to one rounding each; fp16: a rounding of the weights and of the output).
CI builds llama-quantize (tests/helpers.make_llama_real); elsewhere these tests skip without it.
"""
import gguf
import numpy as np
import pytest
import torch

from glm5_shim.kernels.gguf.routing import shim_kernel_covers
from glm5_shim.kernels.gguf import tiles as gm
from glm5_shim.kernels.gguf import reference as ref
from tests.helpers import bench_module, in_ci

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
IMATRIX_PRESETS = bench_module("real_gguf").IMATRIX_PRESETS


def _rel(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def _quantized_files(llama_real) -> dict:
    _, files = llama_real
    chosen = {name: path for name, path in files.items() if name in IMATRIX_PRESETS}
    if not chosen:
        assert not in_ci(), "CI builds llama-quantize and llama-imatrix"
        pytest.skip("no llama-quantize/llama-imatrix here (LLAMA_QUANTIZE and LLAMA_IMATRIX, or "
                    "bench/real_gguf.py --build-tools)")
    return chosen


def _raw(tensor) -> torch.Tensor:
    """A GGUF tensor's bytes as [*rows, row bytes] uint8 (gguf's reader: data shape is numpy order)."""
    return torch.from_numpy(np.array(tensor.data).view(np.uint8)).reshape(*tensor.data.shape[:-1], -1)


def test_linear_on_llama_quantize_blocks(llama_real):
    """Every quantized tensor of every very low-bit preset file (its first 64 rows; the first expert of a 3D
    tensor): the kernels decode a block the same way whatever the tensor is."""
    seen = {}
    for name, path in _quantized_files(llama_real).items():
        for t in gguf.GGUFReader(str(path)).tensors:
            qt = int(t.tensor_type)
            if len(t.shape) < 2 or not shim_kernel_covers(qt, int(t.shape[0])):  # attn_k_b: rebuilt as float
                continue
            w = _raw(t)
            w = (w[0] if w.dim() == 3 else w)[:64]
            k = int(t.shape[0])
            w64 = ref.dequantize(w, qt, k)
            g = torch.Generator().manual_seed(len(seen))
            for m, dtype in ((1, torch.float32), (5, torch.float16), (19, torch.float32)):
                x = torch.randn(m, k, generator=g).to(dtype)
                err = _rel(gm.gguf_linear(x, w, qt), x.double() @ w64.T)
                assert err <= TOL[dtype], (name, t.name, t.tensor_type.name, m, dtype, err)
            seen.setdefault(t.tensor_type.name, []).append(f"{name}:{t.name}")
    # the very low-bit types a UD file's experts carry were all among them (IQ4_NL is only attn_k_b's fallback
    # here: a 192-wide row, which the loader rebuilds as a float kv_b_proj)
    assert {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"} <= set(seen), sorted(seen)


def test_moe_on_llama_quantize_experts(llama_real):
    """Each MoE layer's gate, up and down experts as the shim merges them (w13 = gate rows then up rows), a few
    tokens (the split decode path) and many on one hot expert set (the fused tiles)."""
    checked = 0
    for name, path in _quantized_files(llama_real).items():
        tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        for gate_name in [n for n in tensors if n.endswith("ffn_gate_exps.weight")]:
            gate, up = tensors[gate_name], tensors[gate_name.replace("gate", "up")]
            down = tensors[gate_name.replace("gate", "down")]
            q13, q2 = int(gate.tensor_type), int(down.tensor_type)
            if up.tensor_type != gate.tensor_type or not {q13, q2} <= set(gm.SUPPORTED_TYPES):
                continue
            w13, w2 = torch.cat([_raw(gate), _raw(up)], dim=1), _raw(down)
            e, h = w13.shape[0], int(gate.shape[0])
            g = torch.Generator().manual_seed(checked)
            for t, hot in ((3, False), (24, True)):
                x = torch.randn(t, h, generator=g)
                ids = (torch.arange(2).repeat(t, 1) if hot else
                       torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)])).to(torch.int32)
                wts = torch.rand(t, 2, generator=g)
                want = ref.moe_reference(x, w13, w2, wts, ids, q13, q2)
                err = _rel(gm.gguf_moe(x, w13, w2, wts, ids, q13, q2), want)
                assert err <= TOL[torch.float32], (name, gate_name, gate.tensor_type.name, down.tensor_type.name,
                                                   t, err)
            checked += 1
    assert checked >= len(_quantized_files(llama_real))


def test_register_mma_kernel_on_llama_quantize_iq_blocks(llama_real):
    """The register-MMA kernel (register_mma.py: the decode path of the IQ types it computes, whether or not the
    plans send them there yet) on every IQ2/IQ3 tensor llama-quantize wrote: fp16 activations, 5 rows, split over
    K, within the kernel's float64 bound (gguf_matmul_reference.mma_error_bound: one rounding of the scale, one of
    the weight; float32 sums) plus the output's own rounding."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma

    unit = 2.0 ** -11
    seen = set()
    for name, path in _quantized_files(llama_real).items():
        for t in gguf.GGUFReader(str(path)).tensors:
            qt = int(t.tensor_type)
            if len(t.shape) < 2 or qt not in gguf_mma.GRID_TYPES or not gguf_mma.covers(
                    qt, int(t.shape[0]), torch.float16, gguf_mma.KERNEL_TYPES):
                continue
            w = _raw(t)
            w = (w[0] if w.dim() == 3 else w)[:64].contiguous()
            k = int(t.shape[0])
            x = torch.randn(5, k, generator=torch.Generator().manual_seed(len(seen))).half()
            got = gguf_mma.linear(x, w, qt, w.shape[0], 4, grid_table=gm.grid_table(qt, w.device))
            exact = x.double() @ ref.dequantize(w, qt, k).T
            bound = ref.mma_error_bound(x, w, qt, k, unit) + unit * exact.abs()
            excess = ((got.double() - exact).abs() - bound).max().item()
            assert excess <= 0, (name, t.name, t.tensor_type.name, excess)
            seen.add(t.tensor_type.name)
    assert {"IQ2_XXS", "IQ2_S", "IQ3_XXS", "IQ3_S"} <= seen, sorted(seen)
