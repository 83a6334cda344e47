"""Every indexer-logits kernel configuration compiles offline (no GPU) for the shim's targets and fits the
101376-byte shared-memory budget of sm_120/121 (also below the sm_80/86/89 limits).

Compilation runs in a subprocess with TRITON_INTERPRET removed: other CPU tests set it at import time, and
the interpreter replaces the JIT's compile path.
"""
import json
import textwrap

import pytest

from glm5_shim.kernels.limits import smem_limit
from tests.kernels.compile_driver import compile_records

TARGETS = [120, 121, 89, 86, 80, 90]  # the shim's targets, plus sm_90: the H200 that runs the GPU tests/bench

_SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from glm5_shim.kernels import indexer_logits as il

    cc = int(sys.argv[1])
    for cfg in il.kernel_configs((cc // 10, cc % 10)):
        names = cfg.kernel.arg_names
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in cfg.divisible_by_16}
        src = triton.compiler.ASTSource(cfg.kernel, cfg.signature, constexprs=cfg.constexprs, attrs=attrs)
        rec = {"name": cfg.name, "constexprs": {k: v for k, v in cfg.constexprs.items()},
               "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        try:
            k = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                               options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
            ptx = k.asm["ptx"]
            rec.update(ok=True, shared=int(k.metadata.shared),
                       fp8_mma=("e4m3.e4m3" in ptx), fp8_any=("e4m3" in ptx))
        except Exception as e:  # report, do not stop: the test lists every failure
            rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
        print("RESULT " + json.dumps(rec), flush=True)
    """
)


def _compile_all(cc, repo_root):
    return compile_records(_SCRIPT, cc, repo_root, timeout=600, targets=TARGETS)


@pytest.mark.parametrize("cc", TARGETS)
def test_indexer_configs_compile(cc, repo_root):
    recs = _compile_all(cc, repo_root)
    failed = [r for r in recs if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    too_big = [r for r in recs if r["shared"] > smem_limit(cc)]
    assert not too_big, json.dumps(too_big, indent=1)
    native = cc >= 89
    for r in recs:
        if r["name"] == "fill_outside":
            continue
        assert r["constexprs"]["NATIVE"] is native
        if cc in (120, 89, 90):  # Triton 3.6 lowers an fp8 dot on sm_121 to cvt + f16 MMAs (still exact)
            assert r["fp8_mma"], f"expected fp8 MMAs on sm_{cc}: {r}"
        if not native:
            assert not r["fp8_any"], f"sm_{cc} must not touch fp8 types: {r}"
    print(f"\nsm_{cc}: " + ", ".join(f"{r['name']}{'/' + str(r['constexprs'].get('H', ''))}"
                                    f"{'x' + str(r['constexprs']['NN']) if 'NN' in r['constexprs'] else ''}"
                                    f"={r['shared']}" for r in recs))
