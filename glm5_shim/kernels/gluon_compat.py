"""Gluon (Triton's explicit-layout dialect), or a stand-in that runs the same kernel source in Triton's interpreter.

Gluon kernels name the register layout of every tensor, which is what lets :mod:`register_mma` feed tensor cores from
registers without a shared-memory round trip.  Triton 3.6's interpreter cannot run them; under TRITON_INTERPRET=1
this module hands the kernels a ``gl`` whose layout arguments are ignored and whose ops are ``triton.language``'s
(the interpreter patches those at launch), and ``jit`` is ``triton.jit``.  Layouts never change what a kernel
computes, only where each value lives, so the interpreter checks the kernels' arithmetic and indexing; the GPU and
the offline compiles check the layouts (``convert_layout(..., assert_trivial=True)`` fails to compile if a
conversion would move data).  PTX does not run in the interpreter: kernels branch on :data:`INTERPRET` for it.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.experimental.gluon import language as _gluon_language

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
INTERPRET_K = tl.constexpr(INTERPRET)  # the same, readable from inside kernels

# layout classes are plain Python either way: the host builds them and passes them as constexprs
DistributedLinearLayout = _gluon_language.DistributedLinearLayout
NVMMADistributedLayout = _gluon_language.NVMMADistributedLayout

if not INTERPRET:
    from triton.experimental import gluon as _gluon
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    gl = _gluon_language
    jit = _gluon.jit
else:
    class _InterpretedGluon:
        """``triton.language`` looked up at call time (the interpreter patches it at every launch), with Gluon's
        layout arguments dropped and layout conversions as no-ops."""
        SliceLayout = _gluon_language.SliceLayout
        DotOperandLayout = _gluon_language.DotOperandLayout
        DistributedLinearLayout = DistributedLinearLayout
        NVMMADistributedLayout = NVMMADistributedLayout
        BlockedLayout = _gluon_language.BlockedLayout

        @staticmethod
        def thread_barrier():
            return tl.debug_barrier()

        def __getattr__(self, name):
            return getattr(tl, name)

        @staticmethod
        def arange(start, end, layout=None):
            return tl.arange(start, end)

        @staticmethod
        def zeros(shape, dtype, layout=None):
            return tl.zeros(shape, dtype)

        @staticmethod
        def full(shape, value, dtype, layout=None):
            return tl.full(shape, value, dtype)

        @staticmethod
        def convert_layout(value, layout, assert_trivial=False):
            return value

    def mma_v2(a, b, acc, input_precision=None):
        return tl.dot(a, b, acc)

    gl = _InterpretedGluon()
    jit = triton.jit

__all__ = ["INTERPRET", "INTERPRET_K", "gl", "jit", "mma_v2", "DistributedLinearLayout", "NVMMADistributedLayout"]
