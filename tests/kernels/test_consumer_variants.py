"""Consumer-GPU kernel variants assembled for Hopper (issue #52), checked offline (no GPU).

kernels/consumer.install(ptx_cc) compiles every Triton kernel for a consumer target and assembles that target's PTX
for the GPU present.  Here, on the CPU, every indexer-logits configuration (the fp8 MMA path on sm_89, the integer
decode on sm_80) goes through it with sm_90 as the GPU: the PTX is the consumer target's (its .target line, its fp8
MMAs or none), the machine code is sm_90's (the cubin's ELF header), and `launched()` records each kernel as Triton
loads it.  Compiled in a child process without TRITON_INTERPRET (tests/kernels/compile_driver.py's reason).
"""
import json
import textwrap

import pytest

from tests.kernels.compile_driver import compile_records

TARGETS = [89, 80]

_SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from glm5_shim.kernels import consumer
    from glm5_shim.kernels import indexer_logits as il

    cc = int(sys.argv[1])
    consumer.install(cc, run_cc=90, figures=None)
    assert triton.backends.nvidia.driver.CudaDriver.get_current_target(None).arch == cc
    # the plans of the consumer GPU each target stands for (consumer.FIGURES_BY_PTX): RTX PRO 6000's, RTX 3090's
    for cfg in il.kernel_configs(consumer.FIGURES_BY_PTX[cc].capability):
        names = cfg.kernel.arg_names
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in cfg.divisible_by_16}
        src = triton.compiler.ASTSource(cfg.kernel, cfg.signature, constexprs=cfg.constexprs, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                           options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        rec = {"name": cfg.name, "ptx_target": consumer.ptx_target(k.asm["ptx"]),
               "cubin_arch": consumer.cubin_arch(k.asm["cubin"]), "fp8_mma": "e4m3.e4m3" in k.asm["ptx"],
               "recorded": [c.__dict__ for c in consumer.launched() if c.name == k.name][-1:]}
        print("RESULT " + json.dumps(rec), flush=True)
    """
)


@pytest.mark.parametrize("cc", TARGETS)
def test_consumer_ptx_is_assembled_for_hopper(cc, repo_root):
    recs = compile_records(_SCRIPT, cc, repo_root, timeout=600, targets=TARGETS)
    assert len(recs) >= 3, recs
    for r in recs:
        assert r["ptx_target"] == cc and r["cubin_arch"] == 90, r
        assert r["recorded"] and r["recorded"][0]["ptx_target"] == cc and r["recorded"][0]["machine_arch"] == 90, r
        if r["name"] != "fill_outside":
            assert r["fp8_mma"] is (cc == 89), r   # sm_89's e4m3 MMAs; sm_80 decodes the bytes with integer ops
    print(f"\nsm_{cc} PTX as sm_90 machine code: " + json.dumps([r["name"] for r in recs]))


def test_consumer_targets_are_the_ones_hopper_assembles():
    from glm5_shim.kernels import consumer

    with pytest.raises(ValueError, match="sm_120/121 PTX is newer"):
        consumer.install(120)
    assert consumer.installed() is None
    assert consumer.ptx_target(".version 8.7\n.target sm_89\n.address_size 64\n") == 89
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[8] = 7
    header[48:52] = (0x5A0D5A).to_bytes(4, "little")
    assert consumer.cubin_arch(bytes(header)) == 90
    header[8] = 8
    header[48:52] = (0x900780A).to_bytes(4, "little")
    assert consumer.cubin_arch(bytes(header)) == 120
