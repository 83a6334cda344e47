"""Every GGUF matmul kernel variant the plans launch compiles offline (no GPU) for the shim's targets within the
101376-byte shared-memory budget of sm_120/121 (also below sm_80/86/89's limits; sm_90, the H200 the GPU tests run
on, to its own 227 KiB: kernels/limits.smem_limit), and uses tensor-core MMAs; the
register-MMA (Gluon) kernels use no shared memory but a word and spill nothing, and their layout conversions are
trivial (``assert_trivial``: a conversion that moved data would not compile).

Compilation runs in a subprocess without TRITON_INTERPRET (this process interprets kernels)."""
import json
import textwrap

import pytest

from glm5_shim.kernels.limits import smem_limit
from tests.kernels.compile_driver import compile_records

TARGETS = [120, 121, 89, 86, 80, 90]  # the shim's targets, plus sm_90: the H200 that runs the GPU tests/bench

_SCRIPT = textwrap.dedent(
    r"""
    import json, os, re, subprocess, sys, tempfile
    import triton
    from glm5_shim.kernels.gguf import register_mma as gguf_mma, tiles as gm

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    cc = int(sys.argv[1])
    for cfg in gm.kernel_configs() + gguf_mma.kernel_configs():
        if cfg.get("family") == "mma" and not gm.mma_sync_target((cc // 10, cc % 10)):   # tuned for mma.sync only
            continue
        kernel = cfg["kernel"]
        names = kernel.arg_names
        rec = {"name": cfg["name"], "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
               "gluon": bool(cfg.get("gluon")),
               # named here as constexprs, but a run-time launch would pass them as scalars (compiles below, fails
               # on the GPU): the kernel object itself must declare them
               "not_constexpr": sorted(set(cfg["constexprs"]) - {names[i] for i in kernel.constexprs})}
        try:
            k = gm.compile_offline(cfg, cc)
            ptx = k.asm["ptx"]
            rec.update(ok=True, shared=int(k.metadata.shared), mma=("mma" in ptx),
                       # global loads by width: 16-bit ones (2-byte aligned blocks) against 16-byte ones
                       b16_loads=len(re.findall(r"ld\.global(?:\.\w+)*\.[bsu]16\b", ptx)),
                       v4_loads=len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.", ptx)),
                       # 8-byte ones: IQ2 grid rows (both layouts), packed IQ2_XXS sub-blocks
                       b64_loads=len(re.findall(r"ld\.global(?:\.\w+)*\.(?:v2\.[bsu]32|[bsu]64)\b", ptx)))
            if cfg.get("gluon") or "max_stack" in cfg:  # registers and spills, from the cubin
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(k.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
                rec.update(regs=int(re.search(r"REG:(\d+)", usage).group(1)),
                           local=int(re.search(r"LOCAL:(\d+)", usage).group(1)),
                           stack=int(re.search(r"STACK:(\d+)", usage).group(1)), max_stack=cfg.get("max_stack"))
        except Exception as e:  # report, do not stop: the test lists every failure
            rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
        print("RESULT " + json.dumps(rec), flush=True)
    """
)


@pytest.mark.parametrize("cc", TARGETS)
def test_gguf_matmul_configs_compile(cc, repo_root):
    recs = compile_records(_SCRIPT, cc, repo_root, targets=TARGETS)
    runtime_scalars = [(r["name"], r["not_constexpr"]) for r in recs if r["not_constexpr"]]
    assert not runtime_scalars, runtime_scalars
    failed = [r for r in recs if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    too_big = [r for r in recs if r["shared"] > smem_limit(cc)]
    assert not too_big, json.dumps(too_big, indent=1)
    no_mma = [r["name"] for r in recs if not r["mma"] and not r["name"].startswith(("dequant", "silu_mul"))]
    assert not no_mma, no_mma
    # the tiles tuned for the mma.sync targets (gguf_matmul.prefill_pass_tuning, linear_tile_tuning) keep spills off
    # the stack (the 64x64 four-warp Q6_K tile: 6 KB a thread); sm_90 keeps the untuned tiles (measured faster there)
    tuned = [r for r in recs if r.get("max_stack") is not None]
    assert tuned or cc // 10 == 9, "no tuned tile among the configs"
    assert all(r["stack"] <= r["max_stack"] for r in tuned), \
        json.dumps([r for r in tuned if r["stack"] > r["max_stack"]], indent=1)
    # the register-MMA kernels exist to keep decoded weights out of shared memory (the reducing epilogues use a
    # word of it to hand the arrival count to every thread), and must not spill
    gluon = [r for r in recs if r["gluon"]]
    assert gluon and all(r["shared"] <= 16 and r["local"] == 0 for r in gluon), json.dumps(gluon, indent=1)
    # packed weights (gguf_mma.pack): a thread's 16 code bytes are one 16-byte load instead of eight 2-byte loads;
    # only the scales stay narrow (sm_120: Q8_0 24 v4 + 12 b16 against 12 v4 + 108 b16, Q6_K 36 v4 + 12 b16
    # against 12 v4 + 204 b16)
    by_name = {r["name"]: r for r in recs}
    for qtype in ("q8_0", "q6_k"):
        file_, packed = by_name[f"mma {qtype} linear -> bf16"], by_name[f"mma {qtype} packed linear -> bf16"]
        assert packed["b16_loads"] * 4 <= file_["b16_loads"] and packed["v4_loads"] > file_["v4_loads"], \
            (file_, packed)
    # IQ2_XXS: a grid row is one 8-byte gather in either layout (sm_120: 32); packed, a sub-block's 8 bytes are one
    # 8-byte load instead of four 2-byte loads (12 b16 + 44 b64 against 60 b16 + 32 b64)
    # (IQ2_S: its index and sign words 4 b16 loads, now one b64)
    for qtype in ("iq2_xxs", "iq2_s"):
        file_, packed = by_name[f"mma {qtype} linear -> bf16"], by_name[f"mma {qtype} packed linear -> bf16"]
        assert file_["b64_loads"] > 0 and packed["b16_loads"] * 4 <= file_["b16_loads"], (file_, packed)
        assert packed["b64_loads"] > file_["b64_loads"], (file_, packed)
    print(f"\nsm_{cc}: " + ", ".join(f"{r['name']}={r['shared']}" for r in recs))
