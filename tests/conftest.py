import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Triton decides at import whether @triton.jit functions run in its CPU interpreter.  Without a GPU every kernel
# test runs there, so the switch must be on before any test module (or the kernels) is imported; the offline
# compile tests run in subprocesses without it.
try:
    import torch as _torch

    _has_cuda = _torch.cuda.is_available()
except Exception:
    _has_cuda = False
if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Interpreter kernel tests (tests/kernels) and GPU kernel tests (tests/gpu) must never share a process: Triton
# decorates a kernel once, for the interpreter or for compilation, at import.  Where a GPU is visible this
# process compiles, so tests/kernels is not collected here; tests/test_interpreter_suite.py runs it in a child
# process with the GPU hidden.
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
collect_ignore_glob = [] if INTERPRETING else ["kernels/*"]


def _has_gpu() -> bool:
    return _has_cuda


# The longest files first: the README runs the suite on two pytest workers, a file at a time in collection order
# (pytest-xdist --dist loadfile), so a long file collected last would leave one worker running it alone at the end.
# The offline compile tests (each target compiled in child processes, tens of CPU-minutes) and the vLLM-on-CPU loads
# of the real tools' files lead; everything else keeps its order.
LONG_FILES_FIRST = ("kernels/test_compile_targets_gguf_matmul.py", "kernels/test_compile_targets_sparse_mla.py",
                    "kernels/test_gguf_mma.py", "kernels/test_gguf_matmul.py", "gguf/test_llama_tools_real.py")


def _long_first(item) -> int:
    path = str(item.path)
    return next((i for i, name in enumerate(LONG_FILES_FIRST) if path.endswith(name)), len(LONG_FILES_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_long_first)  # stable: the order within a file, and of all other files, is kept
    # GPU tests run wherever a GPU exists and are skipped only where none does (CI is CPU-only).
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO


@pytest.fixture(scope="session")
def llama_real(tmp_path_factory):
    """(root, name → GGUF): llama.cpp's converter and, where built, llama-quantize on the tiny model
    (tests/helpers.make_llama_real); one set a session for the loader and the kernel tests."""
    from tests.helpers import make_llama_real

    return make_llama_real(tmp_path_factory.mktemp("real"))
