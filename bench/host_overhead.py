#!/usr/bin/env python
"""Host (Python) cost per call of the sparse-MLA and indexer-logits wrappers, measured on CPU without a GPU.

    python bench/host_overhead.py [--launch noop|bind] [--compare REV] [--iters N]

Every Triton kernel's ``run`` (what ``kernel[grid](...)`` calls) is replaced, so nothing is compiled or launched:

* ``--launch noop`` (default): ``run`` returns at once; the time is the wrapper's own Python work (checks,
  heuristics, allocations, views, argument preparation).
* ``--launch bind``: ``run`` also does what Triton 3.6's ``JITFunction.run`` does before the driver call (argument
  binding and specialisation against an sm_90 CUDA backend, the kernel-cache key, the global-value check), so
  ``bind - noop`` estimates Triton's launch path up to ``CompiledKernel.run`` (the C launcher + cuLaunchKernel,
  a few µs more on a GPU host, are not included).

Tensors are small CPU tensors of the real shapes (q bf16 [T, H, 576], top-k 2048, a 64-block pool of bf16
[nb, 64, 576] or fp8_ds_mla uint8 [nb, 64, 656]; indexer q e4m3 [B, 1, 64, 128], paged cache [nb, 64, 1, 132]),
with sm_90 / 132 SMs passed as the device so the same heuristics run as on an H200.  torch.empty on CUDA costs a
little more than on CPU, so a GPU host pays somewhat more than these numbers.

``--compare REV`` times the kernel modules as of git revision REV as well (e.g. ``--compare HEAD`` for the
committed version against the working tree).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # real JITFunction objects (the interpreter has another launch path)
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature  # noqa: E402

MODULES = ("glm5_shim/kernels/sparse_mla.py", "glm5_shim/kernels/indexer_logits.py")
CAP, SMS = (9, 0), 132


def load_modules(rev: str | None):
    """(sparse_mla, indexer_logits) from the working tree, or from git revision ``rev`` (written to a temp dir:
    @triton.jit needs a source file)."""
    if rev is None:
        from glm5_shim.kernels import indexer_logits, sparse_mla
        return sparse_mla, indexer_logits
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="host_overhead_"))
    mods = []
    for rel in MODULES:
        src = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=REPO, capture_output=True, text=True, check=True)
        name = f"_rev_{pathlib.Path(rel).stem}"
        path = tmp / f"{name}.py"
        path.write_text(src.stdout)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mods.append(mod)
    return tuple(mods)


def stub_launches(modules, mode: str) -> None:
    backend = make_backend(GPUTarget("cuda", 90, 32))
    for mod in modules:
        for obj in vars(mod).values():
            if not isinstance(obj, JITFunction) or obj.__module__ != mod.__name__:
                continue
            if mode == "noop":
                obj.run = lambda *args, grid, warmup, **kwargs: None
                continue
            binder = create_function_from_signature(obj.signature, obj.params, backend)
            key_cache = {}

            def run(*args, grid, warmup, _fn=obj, _binder=binder, _keys=key_cache, **kwargs):
                # JITFunction.run up to kernel.run, minus the driver's device/stream queries
                kwargs["debug"] = kwargs.get("debug", _fn.debug) or triton.knobs.runtime.debug
                kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
                bound, spec, opts = _binder(*args, **kwargs)
                compute_cache_key(_keys, spec, opts)
                for (name, _), (val, globals_dict) in _fn.used_global_vals.items():
                    assert globals_dict.get(name) == val
                tuple(bound.values())
                return None

            obj.run = run


def cases(sm, il):
    g = torch.Generator().manual_seed(0)
    pool_blocks, page = 64, 64
    kv = {"bf16": torch.randn(pool_blocks, page, 576, generator=g).to(torch.bfloat16),
          "fp8_ds_mla": torch.zeros(pool_blocks, page, 656, dtype=torch.uint8)}
    out = []
    for fmt in ("bf16", "fp8_ds_mla"):
        for H in (8, 64):
            for T in (1, 64):
                q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16)
                idx = torch.randint(0, pool_blocks * page, (T, 2048), dtype=torch.int32, generator=g)
                fn = (lambda q=q, c=kv[fmt], i=idx, f=fmt: sm.sparse_mla_attention(
                    q, c, i, 0.0625, kv_format=f, capability=CAP, num_sms=SMS))
                out.append((f"sparse_mla {fmt:10s} H={H:<2d} T={T:<3d}", fn))
    cache = torch.zeros(1024, page, 1, 132, dtype=torch.uint8)
    for B in (1, 32):
        for ctx in (4096, 32768):
            q8 = torch.zeros(B, 1, 64, 128, dtype=torch.uint8).view(torch.float8_e4m3fn)
            w = torch.randn(B, 64, generator=g)
            lens = torch.full((B, 1), ctx, dtype=torch.int32)
            bt = torch.zeros(B, ctx // page, dtype=torch.int32)
            fn = (lambda q8=q8, w=w, lens=lens, bt=bt, ctx=ctx: il.paged_mqa_logits(
                (q8, None), cache, w, lens, bt, None, ctx, False))
            out.append((f"paged_mqa_logits B={B:<2d} ctx={ctx:<5d}        ", fn))
    return out


def time_us(fn, iters: int, repeats: int = 7) -> float:
    for _ in range(max(10, iters // 10)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best  # the least disturbed repeat (a shared CPU only ever adds time)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", choices=("noop", "bind"), default="noop")
    ap.add_argument("--compare", metavar="REV", default=None, help="also time the kernel modules at this git rev")
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    torch.set_num_threads(1)

    versions = [("working tree", load_modules(None))]
    if a.compare:
        versions.insert(0, (a.compare, load_modules(a.compare)))
    for _, mods in versions:
        stub_launches(mods, a.launch)
    per_version = [cases(*mods) for _, mods in versions]

    print(f"host µs per call (launch={a.launch}, best of 7 x {a.iters} calls, CPU proxy, sm_90 heuristics)")
    print(f"{'case':45s}" + "".join(f"{label:>16s}" for label, _ in versions))
    for i, (name, _) in enumerate(per_version[0]):
        # versions timed back to back per case, so drift of a shared machine hits them alike
        row = [time_us(cs[i][1], a.iters) for cs in per_version]
        print(f"{name:45s}" + "".join(f"{us:16.1f}" for us in row), flush=True)


if __name__ == "__main__":
    main()
