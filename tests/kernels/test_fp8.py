
import pytest
import torch
import triton
import triton.language as tl

from glm5_shim.kernels.fp8 import (BF16_DECODE_EXPONENT, e4m3_bytes_to_bf16_scaled, e4m3_bytes_to_bf16_scaled_torch,
                                   e4m3_bytes_to_f32, e4m3_bytes_to_f32_torch, native_fp8_supported)


def _all_bytes_reference():
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ref = raw.view(torch.float8_e4m3fn).to(torch.float32)
    finite = ~torch.isnan(ref)  # 0x7f and 0xff are NaN in e4m3fn; never written by vLLM's quantisers
    return raw, ref, finite


def test_torch_twin_decodes_all_256_bytes():
    raw, ref, finite = _all_bytes_reference()
    got = e4m3_bytes_to_f32_torch(raw)
    assert finite.sum() == 254
    assert torch.equal(got[finite], ref[finite])
    # signed zero and the largest finite value
    assert got[0x80].item() == 0.0 and torch.signbit(got[0x80])
    assert got[0x7E].item() == 448.0 and got[0xFE].item() == -448.0


@triton.jit
def _decode_kernel(src, dst, n, BLOCK: tl.constexpr, TO_BF16: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask, other=0)
    if TO_BF16:
        tl.store(dst + offs, e4m3_bytes_to_bf16_scaled(x), mask=mask)
    else:
        tl.store(dst + offs, e4m3_bytes_to_f32(x), mask=mask)


def test_triton_decoder_all_256_bytes():
    raw, ref, finite = _all_bytes_reference()
    out = torch.empty(256, dtype=torch.float32)
    _decode_kernel[(1,)](raw, out, 256, BLOCK=256)
    assert torch.equal(out[finite], ref[finite])


@pytest.mark.parametrize("cap,native",
                         [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True), ((12, 0), True)])
def test_native_fp8_gate(cap, native):
    assert native_fp8_supported(cap) is native


def _bf16_bits_exact(got_bf16, ref, finite):
    # value * 2**-120 is exact in bf16 for every finite e4m3 byte (subnormals land on bf16 subnormals)
    back = got_bf16.to(torch.float64) * 2.0 ** BF16_DECODE_EXPONENT
    assert torch.equal(back[finite], ref[finite].to(torch.float64))
    assert torch.equal(torch.signbit(got_bf16[finite]), torch.signbit(ref[finite]))


def test_bf16_bit_trick_all_256_bytes_torch_twin():
    raw, ref, finite = _all_bytes_reference()
    got = e4m3_bytes_to_bf16_scaled_torch(raw)
    assert got.dtype == torch.bfloat16
    _bf16_bits_exact(got, ref, finite)
    assert got[1].item() * 2.0 ** 120 == 2.0 ** -9  # smallest subnormal
    assert got[0x08].item() * 2.0 ** 120 == 2.0 ** -6  # smallest normal


def test_bf16_bit_trick_all_256_bytes_triton():
    raw, ref, finite = _all_bytes_reference()
    out = torch.empty(256, dtype=torch.bfloat16)
    _decode_kernel[(1,)](raw, out, 256, BLOCK=256, TO_BF16=True)
    _bf16_bits_exact(out, ref, finite)
