"""Rebuild MLA's kv_b_proj from llama.cpp's attn_k_b / attn_v_b, and the inverse split.

Layouts (numpy order, H heads):
  kv_b_proj  [H * (nope + v), kv_lora]   rows per head: [k_nope (nope) | v (v)]
  attn_k_b   (H, kv_lora, nope)          = k_nope part, transposed per head
  attn_v_b   (H, v, kv_lora)             = v part as is
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import GGUFError


def _dims(config: dict[str, Any]) -> tuple[int, int, int, int]:
    return (config["num_attention_heads"], config["kv_lora_rank"], config["qk_nope_head_dim"], config["v_head_dim"])


def _check_shape(array: np.ndarray, expected: tuple[int, ...], what: str, where: str) -> None:
    if tuple(array.shape) != tuple(expected):
        raise GGUFError(f"{where}: tensor {what}: expected shape {list(expected)} (from the config), "
                        f"found {list(array.shape)}")


def rebuild_kv_b(k_b: np.ndarray, v_b: np.ndarray, config: dict[str, Any], *, layer: int | str = "?",
                 where: str = "kv_b") -> np.ndarray:
    """kv_b_proj weight [H*(nope+v), kv_lora] from k_b (H, kv_lora, nope) and v_b (H, v, kv_lora).

    `where` (usually the GGUF file) and `layer` only feed the error message.
    """
    heads, kv_lora, nope, v_dim = _dims(config)
    _check_shape(k_b, (heads, kv_lora, nope), f"blk.{layer}.attn_k_b.weight", where)
    _check_shape(v_b, (heads, v_dim, kv_lora), f"blk.{layer}.attn_v_b.weight", where)
    dtype = np.result_type(k_b.dtype, v_b.dtype)
    per_head = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).astype(dtype, copy=False)
    return np.ascontiguousarray(per_head.reshape(heads * (nope + v_dim), kv_lora))


def check_kv_b(kv_b: np.ndarray, config: dict[str, Any], *, layer: int | str = "?", where: str = "kv_b") -> np.ndarray:
    """Validate a legacy unsplit attn_kv_b tensor and return it (already in kv_b_proj layout)."""
    heads, kv_lora, nope, v_dim = _dims(config)
    _check_shape(kv_b, (heads * (nope + v_dim), kv_lora), f"blk.{layer}.attn_kv_b.weight", where)
    return kv_b


def split_kv_b(kv_b: np.ndarray, config: dict[str, Any], *, layer: int | str = "?",
               where: str = "kv_b") -> tuple[np.ndarray, np.ndarray]:
    """The inverse of rebuild_kv_b: (k_b (H, kv_lora, nope), v_b (H, v, kv_lora)), as the converter writes them."""
    heads, kv_lora, nope, v_dim = _dims(config)
    _check_shape(kv_b, (heads * (nope + v_dim), kv_lora), f"model.layers.{layer}.self_attn.kv_b_proj.weight", where)
    per_head = kv_b.reshape(heads, nope + v_dim, kv_lora)
    k_b = np.ascontiguousarray(per_head[:, :nope, :].transpose(0, 2, 1))
    v_b = np.ascontiguousarray(per_head[:, nope:, :])
    return k_b, v_b
