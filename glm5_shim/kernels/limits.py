"""Hardware limits every kernel configuration is held to (checked offline for each target in tests/kernels)."""

# Shared memory a block may opt into on sm_120/121 (RTX PRO 6000 Blackwell, DGX Spark): 99 KiB.  sm_89 and sm_86 allow
# the same, sm_80 more; the shim holds every target to the smallest.
SMEM_LIMIT = 101376
