"""tests/kernels runs its kernels in Triton's CPU interpreter; the root conftest collects it only then."""
import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":  # the root conftest's rule was bypassed (e.g. a direct path)
    raise pytest.UsageError("tests/kernels needs TRITON_INTERPRET=1 and no visible GPU (on a GPU machine: "
                            "CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 python -m pytest tests/kernels)")


def _interpreter_index_for_numpy_2_5():
    """Triton 3.6's interpreter turns a scalar (a 1-element array: program ids and everything computed from them)
    into a loop bound with int(array), which NumPy deprecated in 1.25 and refuses from 2.5 (the GPU machine has
    2.5.2: 50 kernel tests failed there).  Take the element explicitly; nothing else of the interpreter changes."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor


_interpreter_index_for_numpy_2_5()
