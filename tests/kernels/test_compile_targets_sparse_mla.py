"""Offline compile of every sparse-MLA kernel configuration for the consumer targets (no GPU needed).

Triton decides interpreter-vs-compiler when a ``@triton.jit`` function is *decorated* (module import), reading
``TRITON_INTERPRET`` then.  Other test modules set that variable and import the kernels, so this process cannot
compile them.  The compile therefore runs in a fresh subprocess (this file run as a script) with the variable
removed, and the tests here only read its JSON report.  This module must not import ``glm5_shim.kernels``.

Run by hand for a table of shared memory / registers / spills:
    python tests/kernels/test_compile_targets_sparse_mla.py [--caps 120,86] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from glm5_shim.kernels.limits import smem_limit

REPO = pathlib.Path(__file__).resolve().parents[2]
CAPS = (120, 121, 89, 86, 80)
DTYPES = ("bfloat16", "float16")  # fp32 queries are interpreter-only (no GPU configs)
KV_FORMATS = ("bf16", "fp8_ds_mla")


# ----------------------------------------------------------------------------------------------------------------
# child side: compile
# ----------------------------------------------------------------------------------------------------------------

def _example_args(kernel: str, dtype_name: str, kv_format: str, cfg):
    """Argument values shaped like a real GLM-5 launch, so Triton's specialisation (== 1 -> constexpr,
    % 16 -> divisibility) matches what the launcher will produce at run time."""
    import torch

    dt = getattr(torch, dtype_name)
    H, K, bs, nb = 64, 2048, 64, 8
    c = cfg.as_dict()
    if kernel == "fwd":
        partial = c["WRITE_PARTIAL"]
        splits = 4 if partial else 1
        kv = torch.empty(1, dtype=torch.uint8 if kv_format == "fp8_ds_mla" else dt)
        width = 656 if kv_format == "fp8_ds_mla" else 576
        out_dt = torch.float32 if partial else dt
        return dict(
            q_ptr=torch.empty(1, dtype=dt), qpe_ptr=torch.empty(1, dtype=dt), kv_ptr=kv,
            idx_ptr=torch.empty(1, dtype=torch.int32), out_ptr=torch.empty(1, dtype=out_dt),
            lse_ptr=torch.empty(1, dtype=torch.float32), sm_scale_log2=0.06,
            H=H, K=K, num_slots=nb * bs, block_size=bs, num_hb=7, splits=splits,
            stride_qt=H * 576, stride_qh=576, stride_pt=H * 576, stride_ph=576,
            stride_kb=bs * width, stride_kr=width, stride_it=K,
            stride_ot=(splits * H * 512) if partial else H * 512, stride_os=(H * 512) if partial else 0,
            stride_oh=512,
            stride_lt=(splits * H) if partial else H, stride_ls=H if partial else 0, stride_lh=1,
        )
    return dict(
        ws_out_ptr=torch.empty(1, dtype=torch.float32), ws_lse_ptr=torch.empty(1, dtype=torch.float32),
        out_ptr=torch.empty(1, dtype=dt), lse_ptr=torch.empty(1, dtype=torch.float32),
        H=H, splits=5,
        stride_wt=5 * H * 512, stride_ws=H * 512, stride_wh=512,
        stride_vt=5 * H, stride_vs=H, stride_vh=1,
        stride_ot=H * 512, stride_oh=512, stride_lt=H, stride_lh=1,
    )


def _resource_usage(cubin: bytes) -> dict:
    """Registers and local memory (spills) per thread from the cubin (works for cache hits, unlike ptxas -v)."""
    import tempfile

    import triton

    tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            txt = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True,
                                 timeout=60).stdout
        except Exception:
            return {"regs": None, "stack_bytes": None}
    reg = re.search(r"REG:(\d+)", txt)
    stack = re.search(r"STACK:(\d+)", txt)  # register spills live on the per-thread stack
    return {"regs": int(reg.group(1)) if reg else None, "stack_bytes": int(stack.group(1)) if stack else None}


def _compile_one(job):
    cap, dtype_name, kv_format, cfg = job
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget

    from glm5_shim.kernels import sparse_mla as sm

    fn = sm._sparse_mla_fwd_kernel if cfg.kernel == "fwd" else sm._sparse_mla_combine_kernel
    args = _example_args(cfg.kernel, dtype_name, kv_format, cfg)
    constexprs = dict(cfg.as_dict())
    signature, attrs = {}, {}
    unspecialised = {p.name for p in fn.params if p.do_not_specialize}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        # arguments the kernel marks do_not_specialize get neither the == 1 nor the % 16 treatment at launch
        ty, spec = native_specialize_impl(BaseBackend, args[name], False, name not in unspecialised,
                                          name not in unspecialised)
        if ty == "constexpr":  # ints equal to 1 become constants, exactly as at launch
            signature[name] = "constexpr"
            constexprs[name] = spec
            continue
        signature[name] = ty
        if spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    rec = dict(cap=cap, dtype=dtype_name, kv_format=kv_format, kernel=cfg.kernel, constexprs=cfg.as_dict(),
               num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                                  options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        rec["shared"] = int(compiled.metadata.shared)
        rec.update(_resource_usage(compiled.asm["cubin"]))
        ttgir = compiled.asm.get("ttgir", "")
        rec["async_copies"] = ttgir.count("async_copy_global_to_local")
        rec["error"] = None
    except Exception as exc:  # reported per config by the tests
        rec["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    return rec


def _jobs(caps):
    import torch

    from glm5_shim.kernels.sparse_mla import kernel_configs

    jobs = []
    for cap in caps:
        for dtype_name in DTYPES:
            for kv_format in KV_FORMATS:
                for cfg in kernel_configs((cap // 10, cap % 10), getattr(torch, dtype_name), kv_format):
                    if cfg.kernel == "combine" and kv_format != KV_FORMATS[0]:
                        continue  # the combine kernel does not depend on the cache format
                    jobs.append((cap, dtype_name, kv_format, cfg))
    return jobs


def _child_main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", default=",".join(map(str, CAPS)))
    ap.add_argument("--json", default=None)
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("run without TRITON_INTERPRET: the kernels must be decorated for compilation")
    sys.path.insert(0, str(REPO))
    caps = [int(c) for c in a.caps.split(",") if c]
    jobs = _jobs(caps)
    if a.workers > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(a.workers) as pool:
            recs = pool.map(_compile_one, jobs, chunksize=1)
    else:
        recs = [_compile_one(j) for j in jobs]
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(recs, indent=1))
    else:
        for r in recs:
            c = r["constexprs"]
            desc = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted(c.items()))
            print(f"sm_{r['cap']} {r['dtype']:8s} {r['kv_format']:10s} {r['kernel']:7s} {desc} w{r['num_warps']} "
                  f"s{r['num_stages']}: smem={r.get('shared')} regs={r.get('regs')} "
                  f"stack(spill)={r.get('stack_bytes')} cp.async={r.get('async_copies')} "
                  f"{r['error'] or ''}")


# ----------------------------------------------------------------------------------------------------------------
# pytest side: read the report
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse_mla_compile") / "report.json"
    # the defaults are what ships: no interpreter, no benchmarking override of the fp8 decode
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GLM5_SPARSE_MLA_FP8_DECODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, "--json", str(out)], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"compile child failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("cap", CAPS)
def test_every_config_compiles_within_smem(report, cap):
    recs = [r for r in report if r["cap"] == cap]
    assert any(r["kernel"] == "fwd" for r in recs) and any(r["kernel"] == "combine" for r in recs)
    for dtype_name in DTYPES:
        for kv_format in KV_FORMATS:
            assert any(r["dtype"] == dtype_name and r["kv_format"] == kv_format and r["kernel"] == "fwd"
                       for r in recs), (dtype_name, kv_format)
    failures = [r for r in recs if r["error"]]
    assert not failures, "\n".join(f"{r['dtype']} {r['kv_format']} {r['constexprs']}: {r['error']}" for r in failures)
    too_big = [r for r in recs if r["shared"] > smem_limit(cap)]
    assert not too_big, [(r["dtype"], r["kv_format"], r["constexprs"], r["shared"]) for r in too_big]


def test_fp8_decodes_fit_their_targets(report):
    # the conversion from sm_89 on; below, the packed PTX bit trick into bf16 (prmt/lop3 are sm_80): the fp8 cache's
    # dots are bf16 for fp16 queries too
    for r in report:
        if r["kernel"] != "fwd":
            continue
        decode, compute = r["constexprs"]["FP8_DECODE"], r["constexprs"]["COMPUTE"]
        if r["kv_format"] == "bf16":
            assert decode == "none" and compute == "q", r
            continue
        assert compute == ("bf16" if r["dtype"] == "float16" else "q"), r
        assert decode == ("cvt" if r["cap"] >= 89 else "bf16ptx"), r


if __name__ == "__main__":
    _child_main()
