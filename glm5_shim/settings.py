"""Environment switches, read once per use (cheap: no imports beyond os).

Every switch the shim honours is listed here so that doctor, launch.sh and the README tell the same story.
"""
from __future__ import annotations

import os
import sys

SUPPORTED_VLLM = "0.23"  # major.minor the patches were written against


def _flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def shim_enabled() -> bool:
    """GLM5_SHIM=0 turns the whole shim off: nothing is registered, vLLM is stock."""
    return _flag("GLM5_SHIM", True)


def force_unsupported_vllm() -> bool:
    """GLM5_SHIM_FORCE=1 applies the patches on a vLLM other than 0.23.x (at your own risk)."""
    return _flag("GLM5_SHIM_FORCE")


def allow_gguf_bf16() -> bool:
    """GLM5_SHIM_GGUF_BF16=1 lets an explicit --dtype bfloat16 through vLLM's GGUF gate on compute capability >= 10."""
    return _flag("GLM5_SHIM_GGUF_BF16")


def _choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(name, "").strip().lower() or default
    if raw not in allowed:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(allowed)}")
    return raw


def attention_choice() -> str:
    """GLM5_SHIM_ATTENTION: auto (shim backend only where no native sparse-MLA backend is valid) | triton (always)."""
    return _choice("GLM5_SHIM_ATTENTION", ("auto", "triton"), "auto")


def indexer_choice() -> str:
    """GLM5_SHIM_INDEXER: auto (Triton only where DeepGEMM cannot run) | triton (always)."""
    return _choice("GLM5_SHIM_INDEXER", ("auto", "triton"), "auto")


def gguf_kernels_choice() -> str:
    """GLM5_SHIM_GGUF_KERNELS: shim (the shim's Triton kernels for the GGUF types they cover) | vllm (vLLM's own)."""
    return _choice("GLM5_SHIM_GGUF_KERNELS", ("shim", "vllm"), "shim")


def gguf_decode_choice() -> str:
    """GLM5_SHIM_GGUF_DECODE: mma (default: decode-sized products on the register-MMA kernels of
    kernels/gguf/register_mma.py for the types kernels/gguf/routing.py lists) | tile (the tile kernels of
    kernels/gguf/tiles.py)."""
    return _choice("GLM5_SHIM_GGUF_DECODE", ("mma", "tile"), "mma")


def gguf_split_reduce_choice() -> str:
    """GLM5_SHIM_GGUF_SPLITS: kernel (default: a decode-sized GGUF matmul split over K is summed by the last program
    of each tile, kernels/arrivals.py: one launch) | launch (the float32 split planes are summed by a second launch)."""
    return _choice("GLM5_SHIM_GGUF_SPLITS", ("kernel", "launch"), "kernel")


def consumer_ptx_target() -> int | None:
    """GLM5_SHIM_CONSUMER_PTX: 89 | 86 | 80 runs the consumer GPUs' kernel code on the GPU present (Hopper test
    machines: kernels/consumer.py); unset (default): each GPU's own code."""
    if not os.environ.get("GLM5_SHIM_CONSUMER_PTX", "").strip():
        return None
    return int(_choice("GLM5_SHIM_CONSUMER_PTX", ("89", "86", "80"), "89"))


def gguf_pack() -> bool:
    """GLM5_SHIM_GGUF_PACK: 1 (default) repacks Q8_0, Q6_K, IQ2_XXS and IQ2_S linear and expert weights at
    load for the shim's kernels (aligned code loads; kernels/gguf/routing.LOAD_PACKED_TYPES) | 0 keeps the file's
    layout.  Only where the shim's kernels compute GGUF matmuls (GLM5_SHIM_GGUF_KERNELS=shim)."""
    return _flag("GLM5_SHIM_GGUF_PACK", True)


ENV_SWITCHES = {
    "GLM5_SHIM": "0 disables the shim entirely (vLLM is stock)",
    "GLM5_SHIM_FORCE": "1 patches a vLLM other than 0.23.x",
    "GLM5_SHIM_GGUF_BF16": "1 allows an explicit --dtype bfloat16 for GGUF on compute capability >= 10",
    "GLM5_SHIM_ATTENTION": "auto | triton: force the shim's sparse-MLA backend on any GPU",
    "GLM5_SHIM_INDEXER": "auto | triton: force the shim's Triton indexer on any GPU",
    "GLM5_SHIM_GGUF_KERNELS": "shim | vllm: GGUF matmuls on the shim's kernels (default) or vLLM's ggml kernels",
    "GLM5_SHIM_GGUF_DECODE": "mma | tile: decode-sized GGUF matmuls on the register-MMA kernels (default; Q4_K, Q5_K, "
                             "Q6_K, Q8_0, IQ2_XXS MoE) or the tile kernels",
    "GLM5_SHIM_GGUF_SPLITS": "kernel | launch: decode-sized GGUF matmuls split over K summed by their own last "
                             "program (default) or by a separate launch",
    "GLM5_SHIM_GGUF_PACK": "1 | 0: Q8_0, Q6_K, IQ2_XXS and IQ2_S linear and expert weights repacked at load for "
                           "aligned code loads (default) or kept in the file's layout",
    "GLM5_SHIM_CACHE": "where tokenizers rebuilt from GGUFs are kept (default ~/.cache/glm5_shim)",
    "GLM5_SHIM_CONSUMER_PTX": "89 | 86 | 80: testing on Hopper: compile every kernel for that consumer target, "
                              "assemble it for the GPU present and plan as on an RTX PRO 6000 (89) or RTX 3090",
}


def warn(message: str) -> None:
    """One line on stderr.  The shim reports trouble this way and never raises into the interpreter or vLLM."""
    try:
        sys.stderr.write(f"glm5-shim: WARNING: {message}\n")
    except Exception:
        pass
