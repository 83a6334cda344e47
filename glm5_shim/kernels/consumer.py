"""The code a consumer GPU runs, executed on the Hopper test machine (issue #52).

On an RTX PRO 6000 (sm_120) or an sm_80/86/89 card the shim's kernels are mma.sync / ldmatrix / cp.async code with
their own tile shapes, split counts and plans (188 SMs, 99 KiB of shared memory a block); on the H200 the same
source compiles to wgmma / TMA code with other plans.  Hopper executes the consumer instructions too, and its ptxas
assembles PTX written for an older target.  `install(ptx_cc)` makes every Triton kernel this process compiles go
through the consumer target's whole pipeline (TTGIR, LLVM, PTX for sm_{ptx_cc}) and only the last step, PTX to
machine code, for the GPU present; `device.pretend` makes the launchers plan as on the consumer GPU.  So the same
programs, tiles, split counts and shared-memory sizes run, on other silicon (clock, SM count and memory are Hopper's).

PTX targets: sm_89 (the fp8 paths: e4m3 MMAs), sm_86 and sm_80 (no fp8: integer decode).  sm_120/121 PTX names a
newer target than Hopper's ptxas takes; its code is sm_89's mma.sync code with the same plans (the plans come from
`pretend`, not from the PTX target), which is what runs here.

`launched()` lists every kernel loaded since `install` (compiled or from Triton's cache) with its PTX target and the
architecture its machine code was assembled for, so a test can prove which binary ran.  A separate Triton cache
directory keeps these binaries apart from the ordinary ones (Triton's cache key does not see the assembly step).
GLM5_SHIM_CONSUMER_PTX=89|86|80 installs it in every process the shim activates in (served end to end) and in
tests/gpu; nothing else does.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from glm5_shim.kernels.device import DeviceFigures, pretend

PTX_TARGETS = (89, 86, 80)  # consumer PTX that Hopper's ptxas assembles
# RTX PRO 6000 Blackwell (sm_120): 188 SMs, 1536 threads and 100 KiB of shared memory a multiprocessor (99 KiB a
# block: kernels/limits.py) — NVIDIA's published figures for compute capability 12.0
RTX_PRO_6000 = DeviceFigures(capability=(12, 0), sms=188, max_threads_per_sm=1536, smem_per_sm=102400)
# RTX 3090 (sm_86): 82 SMs, 1536 threads and 100 KiB a multiprocessor — the plans of the no-fp8 targets
RTX_3090 = DeviceFigures(capability=(8, 6), sms=82, max_threads_per_sm=1536, smem_per_sm=102400)
# whose plans each PTX target runs with: sm_89's fp8 code is what an RTX PRO 6000 runs (its sm_120 code is the same
# mma.sync code), sm_86/80's the no-fp8 plans of an Ampere card
FIGURES_BY_PTX = {89: RTX_PRO_6000, 86: RTX_3090, 80: RTX_3090}


@dataclass(frozen=True)
class Compiled:
    name: str
    ptx_target: int  # the .target of the kernel's PTX (sm_NN)
    machine_arch: int  # what its machine code was assembled for
    shared: int


_state: dict = {}


def installed() -> int | None:
    """The PTX target install() set, or None."""
    return _state.get("ptx_cc")


def launched() -> list[Compiled]:
    return list(_state.get("compiled", []))


def cubin_arch(cubin: bytes) -> int:
    """The sm_NN a cubin's machine code is for, from its ELF header's e_flags (CUDA ELF ABI 7: the low byte; ABI 8,
    sm_100 and later: the second byte)."""
    if cubin[:4] != b"\x7fELF":
        raise ValueError("not an ELF cubin")
    flags = int.from_bytes(cubin[48:52], "little")
    return flags & 0xFF if cubin[8] < 8 else (flags >> 8) & 0xFF


def ptx_target(ptx: str) -> int:
    match = re.search(r"^\s*\.target\s+sm_(\d+)", ptx, re.MULTILINE)
    if not match:
        raise ValueError("PTX without a .target line")
    return int(match.group(1))


def install(ptx_cc: int, run_cc: int | None = None, figures: DeviceFigures | None | str = "default") -> None:
    """Compile this process's Triton kernels for sm_{ptx_cc} and assemble them for sm_{run_cc} (default: the current
    GPU's capability, read at the first compile); launchers plan with `figures` (default FIGURES_BY_PTX's; None:
    the real device's)."""
    if ptx_cc not in PTX_TARGETS:
        raise ValueError(f"consumer PTX target sm_{ptx_cc}: expected one of {', '.join(map(str, PTX_TARGETS))} "
                         "(sm_120/121 PTX is newer than Hopper's ptxas takes)")
    if _state:
        if _state["ptx_cc"] != ptx_cc:
            raise RuntimeError(f"consumer variants already installed for sm_{_state['ptx_cc']}")
        return
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver

    _state.update(ptx_cc=ptx_cc, run_cc=run_cc, compiled=[])
    real_target = CudaDriver.get_current_target

    def run_arch() -> int:
        if _state["run_cc"] is None:
            target = real_target(CudaDriver())  # the device present (its capability)
            _state["run_cc"] = target.arch
        return _state["run_cc"]

    def consumer_target(self):
        return GPUTarget("cuda", ptx_cc, 32)

    CudaDriver.get_current_target = consumer_target
    previous_hook = knobs.runtime.add_stages_inspection_hook

    def stages_hook(backend, stages, options, language, capability):
        if previous_hook is not None:
            previous_hook(backend, stages, options, language, capability)
        if backend.target.arch != ptx_cc:
            return
        stages["cubin"] = lambda src, metadata: backend.make_cubin(src, metadata, options, run_arch())

    knobs.runtime.add_stages_inspection_hook = stages_hook
    from triton.compiler.compiler import CompiledKernel

    init = CompiledKernel.__init__

    def recording_init(self, src, metadata_group, hash):
        init(self, src, metadata_group, hash)
        asm = getattr(self, "asm", {})
        if "ptx" in asm and "cubin" in asm:
            _state["compiled"].append(Compiled(self.name, ptx_target(asm["ptx"]), cubin_arch(asm["cubin"]),
                                               int(self.metadata.shared)))

    CompiledKernel.__init__ = recording_init
    # Triton's cache key does not see the assembly step: these binaries get a cache of their own
    knobs.cache.dir = os.path.join(knobs.cache.dir or os.path.expanduser("~/.triton/cache"),
                                   f"consumer-sm{ptx_cc}")
    figures = FIGURES_BY_PTX[ptx_cc] if figures == "default" else figures
    if figures is not None:
        pretend(figures)


def install_from_settings() -> int | None:
    """GLM5_SHIM_CONSUMER_PTX=89|86|80: install(that) (the shim's activation calls this in every process it
    activates in, tests/gpu's conftest in its own); None when unset."""
    from glm5_shim import settings

    ptx_cc = settings.consumer_ptx_target()
    if ptx_cc is not None:
        install(ptx_cc)
    return ptx_cc
