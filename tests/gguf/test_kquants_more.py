"""Q5_K, Q3_K and Q2_K encoders: byte shapes, and an error bound derived from each block format.

(The Q4_K / Q6_K encoder tests live in test_fixture.py.)

Error bounds. Every encoder rounds to the nearest step; what it stores is (per block) a f16 super-scale
d (and dmin), per sub-block small integer scales (and mins), and per value a small integer q. Notation
for one sub-block: lo = min(x, 0), hi = max(x, 0), a = max|x|; s = the ideal step for the sub-block;
Nq = the largest q, Ns = the largest integer scale. Writing S = rint(s / d) for the stored scale
(S <= Ns because d is the largest s over Ns, up to f16 rounding), the step used is t = d * S with
|t - s| <= d / 2; likewise the stored offset m = dmin * M with |m - (-lo)| <= dmin / 2.

  Q5_K / Q2_K (value = t * q - m, q in 0..Nq; s = (hi - lo) / Nq; d = max s / Ns; dmin = max(-lo) / Ns):
    no clipping:    |err| <= t / 2 <= s / 2 + d / 4
    clipped at 0:   x + m < 0 and x >= lo, so |err| = -m - x <= dmin / 2
    clipped at Nq:  err = x + m - Nq t <= hi - lo + dmin / 2 - Nq (s - d / 2) = dmin / 2 + Nq d / 2
    t == 0 (S = 0, s < d / 2): x^ = -m, |err| <= (hi - lo) + dmin / 2 < Nq d / 2 + dmin / 2
    => bound = max(s / 2 + d / 4, dmin / 2 + Nq d / 2)      Q5_K: Nq = 31, Ns = 63;  Q2_K: Nq = 3, Ns = 15
  Q3_K (value = t * (q - 4), q - 4 in -4..3; s = a / 3; d = max s / 31; the stored signed scale is S >= 0):
    no clipping:    |err| <= t / 2 <= s / 2 + d / 4
    clipped at 3:   err = x - 3 t <= 3 s - 3 d S <= 3 (S + 1/2) d - 3 d S = 1.5 d      (rint: s < (S + 1/2) d)
    clipped at -4:  |err| = -x - 4 t <= 3 s - 4 d S <= 1.5 d - d S <= 1.5 d
    t == 0:         |err| <= a = 3 s < 1.5 d
    => bound = max(s / 2 + d / 4, 1.5 d)
  d and dmin are the f16 roundings of the ideal values: d16 <= d (1 + 2^-11) + 2^-25 (relative half-ulp for
  normal f16, absolute half-ulp of the subnormal range); the test uses 2^-10 to also cover the float32
  arithmetic before the cast, plus a float32 slack of a few ulp of the block's magnitude for the dequantizer.
  (The S <= Ns argument needs d16 >= max s / (Ns + 1/2), i.e. d not deep in the f16 subnormals: true here.)

A corrupted packing (swapped qs halves, swapped scale fields, a lost offset, swapped high-bit planes) puts
values in the wrong place or scales them by the wrong sub-block's scale; since the sub-blocks below have
ranges spread over a factor of 64, that shows up far above the bound, which the last test checks.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from glm5_shim.gguf.kquants import quantize_q2_k, quantize_q3_k, quantize_q5_k

Q = gguf.GGMLQuantizationType

# encoder, type, sub-block size, scheme ("asym": d*sc*q - dmin*m, "sym": d*sc*(q - 4)), Nq, Ns
FORMATS = {
    "Q5_K": (quantize_q5_k, Q.Q5_K, 32, "asym", 31, 63),
    "Q3_K": (quantize_q3_k, Q.Q3_K, 16, "sym", 3, 31),
    "Q2_K": (quantize_q2_k, Q.Q2_K, 16, "asym", 3, 15),
}


def _inputs(seed: int, row: int) -> np.ndarray:
    """8 rows of `row` values: random with per-16-value ranges spread over 2^-3..2^3, and special rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((10, row // 16, 16)) * 2.0 ** rng.uniform(-3, 3, (10, row // 16, 1))
    x = x.reshape(10, row)
    x[0] = 0.0                          # all zero
    x[1] = 0.7                          # constant positive
    x[2] = -2.5                         # constant negative
    x[3] = -np.abs(x[3])                # all negative
    x[4] = np.abs(x[4])                 # all positive
    x[5] *= 1e3                         # large magnitude
    x[6] = x[6] * 1e3 + 5e3             # large, positive and off-centre
    return x.astype(np.float32)


def _bound(x: np.ndarray, name: str) -> np.ndarray:
    """The per-value bound derived in the module docstring, computed from the input only."""
    _, _, sub, scheme, nq, ns = FORMATS[name]
    xb = x.reshape(-1, 256 // sub, sub).astype(np.float64)
    f16_up = 1 + 2.0 ** -10

    def f16_hi(v):
        return v * f16_up + 2.0 ** -25

    if scheme == "asym":
        lo = np.minimum(xb.min(axis=2), 0.0)
        hi = np.maximum(xb.max(axis=2), 0.0)
        s = (hi - lo) / nq
        d = f16_hi(s.max(axis=1, keepdims=True) / ns)
        dmin = f16_hi((-lo).max(axis=1, keepdims=True) / ns)
        b = np.maximum(s / 2 + d / 4, dmin / 2 + nq * d / 2)
    else:
        s = np.abs(xb).max(axis=2) / 3
        d = f16_hi(s.max(axis=1, keepdims=True) / ns)
        b = np.maximum(s / 2 + d / 4, 1.5 * d)
    slack = 8 * 2.0 ** -24 * np.abs(xb).max(axis=(1, 2), keepdims=True)
    return np.broadcast_to(b[:, :, None] + slack, xb.shape).reshape(x.shape)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", [(1, 256), (3, 1024), (2, 3, 512)])
def test_byte_shape_matches_ggml_quant_sizes(name, shape):
    encode, qtype = FORMATS[name][:2]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    out = encode(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    assert out.dtype == np.uint8
    assert out.shape == (*shape[:-1], shape[-1] // block_size * type_size)


@pytest.mark.parametrize("name", FORMATS)
def test_rejects_rows_that_are_not_whole_blocks(name):
    with pytest.raises(ValueError):
        FORMATS[name][0](np.zeros((2, 300), np.float32))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("row", [256, 1024])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_round_trip_within_derived_bound(name, row, seed):
    encode, qtype = FORMATS[name][:2]
    x = _inputs(seed, row)
    y = gguf.quants.dequantize(encode(x), qtype)
    assert y.shape == x.shape
    assert np.isfinite(y).all()
    err = np.abs(y.astype(np.float64) - x)
    bound = _bound(x, name)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{name}: err {err[worst]} > bound {bound[worst]} at {worst}"
    np.testing.assert_array_equal(y[0], 0.0)                    # all-zero rows stay exactly zero
    # Constant rows land on the grid's end point: only the f16 rounding of d (and dmin) remains.
    np.testing.assert_allclose(y[1], 0.7, rtol=2e-3)
    np.testing.assert_allclose(y[2], -2.5, rtol=2e-3)
    assert err.max() > 0                                        # not a lossless copy: the grid shows


def _swap(a: np.ndarray, i: slice, j: slice) -> None:
    a[:, i], a[:, j] = a[:, j].copy(), a[:, i].copy()


def _swap_nibbles(a: np.ndarray, cols: slice) -> None:
    a[:, cols] = (a[:, cols] >> 4) | (a[:, cols] << 4)


# Byte offsets inside one block, from the layouts in glm5_shim/gguf/kquants.py.
CORRUPTIONS = {
    "Q5_K": {  # d 0:2, dmin 2:4, scales 4:16, qh 16:48, qs 48:176
        "qs halves swapped": lambda b: _swap(b, slice(48, 112), slice(112, 176)),
        "scale and min fields swapped": lambda b: _swap(b, slice(4, 8), slice(8, 12)),
        "qh bit planes swapped": lambda b: _swap_nibbles(b, slice(16, 48)),
    },
    "Q3_K": {  # hmask 0:32, qs 32:96, scales 96:108, d 108:110
        "qs halves swapped": lambda b: _swap(b, slice(32, 64), slice(64, 96)),
        "scale nibbles swapped": lambda b: _swap_nibbles(b, slice(96, 104)),
        "scale offset 32 lost": lambda b: b.__setitem__((slice(None), slice(104, 108)), b[:, 104:108] & 0x55),
        "hmask bit planes swapped": lambda b: _swap_nibbles(b, slice(0, 32)),
    },
    "Q2_K": {  # scales 0:16, qs 16:80, d 80:82, dmin 82:84
        "qs halves swapped": lambda b: _swap(b, slice(16, 48), slice(48, 80)),
        "scale and min nibbles swapped": lambda b: _swap_nibbles(b, slice(0, 16)),
        "d and dmin swapped": lambda b: _swap(b, slice(80, 82), slice(82, 84)),
    },
}


@pytest.mark.parametrize("name, corruption", [(n, c) for n, cs in CORRUPTIONS.items() for c in cs])
def test_a_corrupted_packing_breaks_the_bound(name, corruption):
    encode, qtype = FORMATS[name][:2]
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    x = _inputs(7, 1024)[7:]                                    # the plain random rows
    out = encode(x)
    bound = _bound(x, name)
    assert (np.abs(gguf.quants.dequantize(out, qtype) - x) <= bound).all()
    blocks = out.reshape(-1, type_size).copy()
    CORRUPTIONS[name][corruption](blocks)
    y = gguf.quants.dequantize(blocks.reshape(out.shape), qtype)
    assert (np.abs(y - x) > bound).any(), f"{name}: '{corruption}' stays within the bound"
