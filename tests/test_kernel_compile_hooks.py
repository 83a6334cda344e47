"""vLLM 0.23 sets Triton's ``jit_post_compile_hook`` after warm-up (vllm/triton_utils/jit_monitor.py), and Triton then
serialises every new compile's constexprs to JSON before calling it: a kernel parameter that JSON cannot hold (a
Gluon layout object) kills the engine at the first compile mid-serving.  Seen on the H200 (2026-12-02:
the register-MMA lm_head at 8 rows compiled after warm-up, "Object of type DistributedLinearLayout is not JSON
serializable").  Every GGUF kernel variant the plans launch must pass Triton's own serialisation."""
import json
import types

import pytest
import triton.language as tl
from triton.runtime.jit import serialize_specialization_data


def _configs():
    from glm5_shim.kernels.gguf import register_mma as gguf_mma, tiles as gguf_matmul

    return gguf_matmul.kernel_configs() + gguf_mma.kernel_configs()


def test_every_gguf_kernel_variant_survives_the_compile_hooks_serialisation():
    configs = _configs()
    assert any(c.get("gluon") for c in configs)  # the register-MMA kernels are among them
    options = types.SimpleNamespace(num_warps=4, num_stages=1)
    for cfg in configs:
        names = cfg["kernel"].arg_names
        constants = {(names.index(k),): tl.constexpr(v) for k, v in cfg["constexprs"].items()}
        text = serialize_specialization_data(cfg["name"], cfg["signature"], constants, {}, options, "key")
        assert json.loads(text)["name"] == cfg["name"]


def test_a_layout_parameter_would_fail_it():
    """The premise: what the register-MMA kernel took before the fix does not serialise."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma

    options = types.SimpleNamespace(num_warps=4, num_stages=1)
    layout = gguf_mma.layouts(4, 2)[0]
    with pytest.raises(TypeError, match="not JSON serializable"):
        serialize_specialization_data("k", {}, {(0,): tl.constexpr(layout)}, {}, options, "key")
