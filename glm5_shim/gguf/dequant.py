"""Dequantize GGUF tensors to float32 numpy, and which GGML types vLLM 0.23 can run."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import gguf
import numpy as np

from .errors import GGUFError

# The type names of vllm/model_executor/layers/quantization/gguf.py (vLLM 0.23.0):
# UNQUANTIZED_TYPES, and DEQUANT_TYPES = STANDARD_QUANT_TYPES | KQUANT_TYPES | IMATRIX_QUANT_TYPES.
VLLM_UNQUANTIZED_TYPES = frozenset({"F32", "F16", "BF16"})
VLLM_STANDARD_QUANT_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1"})
VLLM_KQUANT_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
VLLM_IMATRIX_QUANT_TYPES = frozenset({
    "IQ1_M", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL",
})
VLLM_DEQUANT_TYPES = VLLM_STANDARD_QUANT_TYPES | VLLM_KQUANT_TYPES | VLLM_IMATRIX_QUANT_TYPES
VLLM_RUNNABLE_TYPES = VLLM_UNQUANTIZED_TYPES | VLLM_DEQUANT_TYPES


def type_name(ggml_type: Any) -> str:
    if isinstance(ggml_type, str):
        return ggml_type
    return gguf.GGMLQuantizationType(int(ggml_type)).name


def is_float_type(ggml_type: Any) -> bool:
    return type_name(ggml_type) in VLLM_UNQUANTIZED_TYPES


@lru_cache(maxsize=None)
def can_dequantize(ggml_type: Any) -> bool:
    """gguf-py can dequantize this type on the CPU (probed with one zero block)."""
    qtype = gguf.GGMLQuantizationType[type_name(ggml_type)]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return True
    try:
        out = gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError, TypeError):
        return False
    return out.shape == (1, block_size)


def dequantize(tensor: Any, *, where: str | None = None) -> np.ndarray:
    """A tensor (reader.TensorInfo or gguf ReaderTensor) as a float32 array in numpy order (reversed ne)."""
    reader_tensor = getattr(tensor, "reader_tensor", tensor)
    qtype = reader_tensor.tensor_type
    shape = tuple(int(d) for d in reversed(reader_tensor.shape.tolist()))
    location = where or str(getattr(tensor, "path", "gguf"))
    if not can_dequantize(qtype):
        raise GGUFError(f"{location}: tensor {reader_tensor.name}: type {qtype.name} has no CPU dequantizer in "
                        f"the gguf package, expected a type gguf.quants can dequantize")
    data = np.asarray(reader_tensor.data)
    if qtype.name in ("F32", "F16"):
        out = data.astype(np.float32)  # copy: detaches from the memory map
    else:
        out = np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)
    if out.shape != shape:
        out = out.reshape(shape)
    return out
