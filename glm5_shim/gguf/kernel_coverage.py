"""Which GGUF tensors the shim's own matmul kernels compute (``glm5_shim/kernels/gguf_matmul.py``); the rest keep
vLLM's ggml kernels.  One home for the rule: the kernels, the vLLM dispatch, doctor and inspect all ask here."""
from __future__ import annotations

import gguf

from .dequant import is_float_type

_T = gguf.GGMLQuantizationType
# The order GLM-5 files use them most (Q4_K_M: Q4_K experts, Q6_K down/lm_head; Q8_0; Q5_K in _M mixes).
SHIM_KERNEL_TYPES = (int(_T.Q4_K), int(_T.Q6_K), int(_T.Q5_K), int(_T.Q8_0))
# Kernels written and tested on the CPU (interpreter, offline compiles) that have not yet passed the GPU tests: the
# kernels accept them, the tests and the bench run them, serving keeps vLLM's kernels for them until they have.
KERNEL_TYPES_AWAITING_GPU = (int(_T.Q2_K), int(_T.Q3_K), int(_T.IQ4_XS), int(_T.IQ4_NL), int(_T.IQ2_XXS),
                             int(_T.IQ2_S), int(_T.IQ3_XXS), int(_T.IQ3_S), int(_T.IQ2_XS), int(_T.IQ1_S),
                             int(_T.IQ1_M), int(_T.Q5_0), int(_T.Q4_0), int(_T.Q4_1), int(_T.Q5_1))
# Types whose decode-sized MoE passes run on the register-MMA kernels (kernels/gguf_mma.py) by default
# (GLM5_SHIM_GGUF_DECODE=tile keeps the tile kernels).  Measured on the H200 (bench/RESULTS.md, 2026-12-02 session 6):
# 1.1-2.5x faster than the tile kernels at TP-8 MoE shapes, T = 1-64, every type.
MMA_DECODE_TYPES = (int(_T.Q4_K), int(_T.Q6_K), int(_T.Q5_K), int(_T.Q8_0))
# Of those, the types whose dense linears at 1-8 rows run there too: Q8_0's dense decode was as fast or faster on the
# tile kernel (q_a+kv_a 24.5 vs 28.0 µs), the K-quants' 10-40 % faster on the register-MMA kernels (same run).
MMA_LINEAR_TYPES = (int(_T.Q4_K), int(_T.Q6_K), int(_T.Q5_K))
K_MULTIPLE = 256  # the kernels step through K in half super-blocks; GLM-5's input widths are all multiples of 256


def shim_kernel_covers(ggml_type: int, k: int) -> bool:
    """True when a weight of this type with input width ``k`` runs on the shim's kernels."""
    return int(ggml_type) in SHIM_KERNEL_TYPES and k % K_MULTIPLE == 0


GGUF_BF16_GATE_CAPABILITY = 100  # the threshold vLLM's own gate uses (has_device_capability(100))


def gguf_bf16_refused_at(capability: tuple[int, int]) -> bool:
    """vLLM 0.23's gate: its GGUF kernels are refused bf16 activations from compute capability 10.0 on (they gave
    garbage in bf16 on an RTX 5090; has_device_capability compares major * 10 + minor)."""
    return capability[0] * 10 + capability[1] >= GGUF_BF16_GATE_CAPABILITY


def vllm_vector_kernel_rows(out_features: int) -> int:
    """Up to how many activation rows vLLM 0.23 sends a K-quant or legacy-quant dense linear to its vector kernel
    (``ggml_mul_mat_vec_a8``; ``_fused_mul_mat_gguf``'s ``mmvq_safe``).  There the shim leaves it: measured on the
    H200 (bench/RESULTS.md, 2026-12-01 and 2026-12-02 session 6) that kernel beats the shim's tile and register-MMA
    kernels at one row (e.g. q_a+kv_a Q4_K 10.1 vs 15.5 and 14.0 µs), while at 8 rows the shim's are 4x faster."""
    return 2 if out_features > 5120 else 6


def kernel_path(ggml_type: int, k: int, enabled: bool = True) -> str:
    """'shim', 'vllm' (vLLM's ggml kernels) or 'float' (unquantized: a plain matmul)."""
    if is_float_type(ggml_type):
        return "float"
    return "shim" if enabled and shim_kernel_covers(ggml_type, k) else "vllm"
