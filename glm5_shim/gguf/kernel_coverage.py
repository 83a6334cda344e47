"""Which GGUF tensors the shim's own matmul kernels compute (``glm5_shim/kernels/gguf_matmul.py``); the rest keep
vLLM's ggml kernels.  One home for the rule: the kernels, the vLLM dispatch, doctor and inspect all ask here."""
from __future__ import annotations

import gguf

_T = gguf.GGMLQuantizationType
# The order GLM-5 files use them most (Q4_K_M: Q4_K experts, Q6_K down/lm_head; Q8_0; Q5_K in _M mixes).
SHIM_KERNEL_TYPES = (int(_T.Q4_K), int(_T.Q6_K), int(_T.Q5_K), int(_T.Q8_0))
K_MULTIPLE = 256  # the kernels step through K in half super-blocks; GLM-5's input widths are all multiples of 256


def shim_kernel_covers(ggml_type: int, k: int) -> bool:
    """True when a weight of this type with input width ``k`` runs on the shim's kernels."""
    return int(ggml_type) in SHIM_KERNEL_TYPES and k % K_MULTIPLE == 0


def kernel_path(ggml_type: int, k: int, enabled: bool = True) -> str:
    """'shim', 'vllm' (vLLM's ggml kernels) or 'float' (unquantized: a plain matmul)."""
    if int(ggml_type) in (int(_T.F32), int(_T.F16), int(_T.BF16)):
        return "float"
    return "shim" if enabled and shim_kernel_covers(ggml_type, k) else "vllm"
