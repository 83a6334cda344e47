"""Random but valid GGML blocks, fast: random code bytes with each block's fp16 scale fields set, scaled so that the
dequantized values have a chosen standard deviation (and mean ~0).

No float data is quantized.  A GGML block is code bytes (any byte is a valid code: quants, sub-block scales, grid
indexes, sign indexes) plus fp16 fields that scale them; random fp16 bytes would be NaN or inf or 1e4, so exactly
those fields are set.  Their offsets are read off gguf.quants' dequantizers (gguf 0.19), one per type:

  "d"    multiplies the codes          Q4_0/Q5_0/Q8_0 d at 0; Q4_1/Q5_1 d at 0; Q4_K/Q5_K d at 0; Q2_K d at 80;
                                       Q3_K d at 108; Q6_K d at 208; IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S/IQ1_S/IQ4_NL/
                                       IQ4_XS d at 0
  "min"  the block's offset term       Q4_1/Q5_1 m at 2 (+m); Q4_K/Q5_K dmin at 2, Q2_K dmin at 82 (-dmin x 4/6-bit
                                       mins)

(IQ1_M spreads its scale over four nibbles and is not supported.)  Each block's "d" is base x jitter (uniform
0.5..1.5, one of 4096 levels); "min" is ratio x d, the ratio that makes the mean of random codes zero.  The base per
unit of standard deviation is calibrated once per type on dequantized random blocks (`calibration`).

The code bytes come from a pool of random bytes drawn once (RandomBlocks): each chunk is a view of the pool at a
random offset whose scale fields are set in place (and put back once the chunk is written, so the pool stays
uniform random bytes): writing runs at memory speed, not at the speed of a random generator.  Tensors therefore
share code bytes at different offsets; they are test data, not a model.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import gguf
import numpy as np

# (byte offset, role) of the fp16 fields of one block, from gguf.quants' dequantize_blocks.
SCALE_FIELDS: dict[str, tuple[tuple[int, str], ...]] = {
    "Q4_0": ((0, "d"),), "Q4_1": ((0, "d"), (2, "min")), "Q5_0": ((0, "d"),), "Q5_1": ((0, "d"), (2, "min")),
    "Q8_0": ((0, "d"),), "Q2_K": ((80, "d"), (82, "min")), "Q3_K": ((108, "d"),), "Q4_K": ((0, "d"), (2, "min")),
    "Q5_K": ((0, "d"), (2, "min")), "Q6_K": ((208, "d"),), "IQ2_XXS": ((0, "d"),), "IQ2_XS": ((0, "d"),),
    "IQ2_S": ((0, "d"),), "IQ3_XXS": ((0, "d"),), "IQ3_S": ((0, "d"),), "IQ1_S": ((0, "d"),), "IQ4_NL": ((0, "d"),),
    "IQ4_XS": ((0, "d"),),
}
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = (*FLOAT_TYPES, *SCALE_FIELDS)

POOL_BYTES = 256 << 20
CHUNK_BYTES = 32 << 20
_CALIBRATION_BLOCKS = 8192
JITTER_LEVELS = 4096


def block_geometry(type_name: str) -> tuple[int, int]:
    """(values a block, bytes a block)."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def tensor_nbytes(type_name: str, n_values: int) -> int:
    block, size = block_geometry(type_name)
    if n_values % block:
        raise ValueError(f"{n_values} values are not whole {type_name} blocks of {block}")
    return n_values // block * size


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.random(n, dtype=np.float32) + np.float32(0.5)


def set_scale_fields(blocks: np.ndarray, type_name: str, d: np.ndarray, min_ratio: float) -> None:
    """Write the fp16 fields of `blocks` ([n, bytes a block] uint8, in place): d per block, min = min_ratio x d."""
    _write_fields(blocks, type_name, d, d * np.float32(min_ratio))


def _write_fields(blocks: np.ndarray, type_name: str, d: np.ndarray, mins: np.ndarray) -> None:
    values = {"d": d.astype(np.float16), "min": mins.astype(np.float16)}
    for offset, role in SCALE_FIELDS[type_name]:
        blocks[:, offset:offset + 2] = values[role].view(np.uint8).reshape(-1, 2)


@lru_cache(maxsize=None)
def calibration(type_name: str) -> tuple[float, float]:
    """(base d for a standard deviation of 1, min/d ratio) of `type_name`'s random blocks, measured by
    dequantizing random blocks with gguf.quants (deterministic)."""
    if type_name not in SCALE_FIELDS:
        raise ValueError(f"type {type_name}: no random-block recipe (supported: {', '.join(SUPPORTED_TYPES)})")
    qtype = gguf.GGMLQuantizationType[type_name]
    _, size = block_geometry(type_name)
    rng = np.random.default_rng(0x5EED)
    codes = rng.integers(0, 256, (_CALIBRATION_BLOCKS, size), dtype=np.uint8)
    jitter = _jitter(rng, _CALIBRATION_BLOCKS)

    def values(d: np.ndarray, mins: np.ndarray) -> np.ndarray:
        blocks = codes.copy()
        _write_fields(blocks, type_name, d, mins)
        return gguf.quants.dequantize(blocks, qtype).astype(np.float64)

    zero = np.zeros_like(jitter)
    ratio = 0.0
    if any(role == "min" for _, role in SCALE_FIELDS[type_name]):
        # values are linear in (d, min): pick min = ratio x d so that their mean is 0
        ratio = -values(jitter, zero).mean() / values(zero, jitter).mean()
    std = values(jitter, jitter * np.float32(ratio)).std()
    return 1.0 / std, float(ratio)


class RandomBlocks:
    """Random valid tensor data, chunk by chunk (deterministic for a seed)."""

    def __init__(self, seed: int = 0, pool_bytes: int = POOL_BYTES, chunk_bytes: int = CHUNK_BYTES):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, pool_bytes // 2 * 2, dtype=np.uint8)
        self.pool16 = self.pool.view(np.uint16)  # every field offset and block size is even
        self.chunk_bytes = min(chunk_bytes, self.pool.size)
        # Each block's jitter is one of these levels, so that a tensor's fp16 fields are converted once (float32 →
        # float16 of subnormal scales is slow in numpy) and each block only picks an index.
        self.jitter_levels = _jitter(self.rng, JITTER_LEVELS)

    def chunks(self, type_name: str, n_values: int, std: float, mean: float = 0.0) -> Iterator[np.ndarray]:
        """The tensor's bytes (n_values values of `type_name`) as uint8 chunks, each valid until the next one is
        asked for: values of about `std` standard deviation, mean 0 (quantized types) or `mean` (float types)."""
        if type_name in FLOAT_TYPES:
            yield from self._float_chunks(type_name, n_values, std, mean)
            return
        if mean:
            raise ValueError(f"type {type_name}: random blocks have mean 0, not {mean}")
        _, size = block_geometry(type_name)
        n_blocks = tensor_nbytes(type_name, n_values) // size
        per_chunk = max(1, self.chunk_bytes // size)
        d_per_std, ratio = calibration(type_name)
        d = self.jitter_levels * np.float32(std * d_per_std)
        fields = {"d": d.astype(np.float16).view(np.uint16),
                  "min": (d * np.float32(ratio)).astype(np.float16).view(np.uint16)}
        done = 0
        while done < n_blocks:
            m = min(per_chunk, n_blocks - done)
            start = int(self.rng.integers(0, (self.pool.size - m * size) // 2 + 1))
            words = self.pool16[start:start + m * size // 2].reshape(m, size // 2)
            level = self.rng.integers(0, JITTER_LEVELS, m, dtype=np.uint16)
            columns = [(offset // 2, role) for offset, role in SCALE_FIELDS[type_name]]
            # the pool's own bytes there, put back below: the pool stays uniform random bytes
            codes = [words[:, column].copy() for column, _ in columns]
            for column, role in columns:
                words[:, column] = fields[role][level]
            try:
                yield words.reshape(-1).view(np.uint8)
            finally:
                for (column, _), saved in zip(columns, codes):
                    words[:, column] = saved
            done += m

    def pass_through_chunks(self, type_name: str, shape: tuple[int, int], gain: float) -> Iterator[np.ndarray]:
        """A float [n, 2 n] matrix gain x [identity | 0] (rows of 2n values), chunk by chunk."""
        n, cols = shape
        if type_name not in FLOAT_TYPES or cols != 2 * n:
            raise ValueError(f"pass-through: expected a float [n, 2 n] tensor, found {type_name} {list(shape)}")
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.float32}[type_name]
        rows = max(1, self.chunk_bytes // (cols * 4))
        for start in range(0, n, rows):
            m = min(rows, n - start)
            block = np.zeros((m, cols), dtype=dtype)
            block[np.arange(m), start + np.arange(m)] = gain
            if type_name == "BF16":   # the top half of each float32 (gain is exact in bf16)
                block = (block.view(np.uint32) >> 16).astype(np.uint16)
            yield block.reshape(-1).view(np.uint8)

    def _float_chunks(self, type_name: str, n_values: int, std: float, mean: float) -> Iterator[np.ndarray]:
        step = max(1, self.chunk_bytes // 4)
        for start in range(0, n_values, step):
            values = self.rng.standard_normal(min(step, n_values - start), dtype=np.float32)
            values = values * np.float32(std) + np.float32(mean)
            if type_name == "F32":
                yield values.view(np.uint8)
            elif type_name == "F16":
                yield values.astype(np.float16).view(np.uint8)
            else:  # BF16: the top half of each float32 (truncation)
                yield (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
