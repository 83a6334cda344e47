"""tests/kernels runs its kernels in Triton's CPU interpreter; the root conftest collects it only then."""
import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # the root conftest's rule was bypassed (e.g. a direct path)
    raise pytest.UsageError("tests/kernels needs TRITON_INTERPRET=1 and no visible GPU (on a GPU machine: "
                            "CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 python -m pytest tests/kernels)")
