"""On a GPU machine, the interpreter kernel tests (tests/kernels) in a child process of their own.

This process compiles kernels for the GPU (tests/gpu); Triton decides per process whether a kernel is
interpreted, so the interpreter tests get a process with the GPU hidden and TRITON_INTERPRET=1.  Without a GPU
the root conftest collects tests/kernels in this process and this test has nothing to add.
"""
import os
import subprocess
import sys

import pytest

from tests.conftest import INTERPRETING, REPO

pytestmark = pytest.mark.gpu


def test_interpreter_kernel_tests_in_their_own_process():
    if INTERPRETING:
        pytest.skip("this process interprets kernels: tests/kernels is collected here")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=3000)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout, tail
