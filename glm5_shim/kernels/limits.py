"""Hardware limits every kernel configuration is held to (checked offline for each target in tests/kernels)."""

# Shared memory a block may opt into on sm_120/121 (RTX PRO 6000 Blackwell, DGX Spark): 99 KiB.  sm_89 and sm_86 allow
# the same, sm_80 more; the shim holds every target to the smallest.
SMEM_LIMIT = 101376
# sm_90 (the H200 the GPU tests and benchmarks run on, not a target) gets its own 227 KiB: Triton pipelines the same
# tile configuration deeper there (wgmma), e.g. the dequantizing MoE's 128x128 gated tile takes 144 KiB on sm_90 and
# 96 KiB on sm_120.
SMEM_LIMIT_BY_CC = {90: 232448}


def smem_limit(cc: int) -> int:
    """The shared memory a kernel configuration compiled for sm_{cc} may use."""
    return SMEM_LIMIT_BY_CC.get(cc, SMEM_LIMIT)
