"""The GGUF dtype patches with the platform's compute capability mocked (12.0 Blackwell, 8.9 Ada)."""
from __future__ import annotations

import pathlib

import gguf
import pytest
import torch

from tests.helpers import shim_in_this_process, write_minimal_glm_dsa_gguf


@pytest.fixture(scope="module")
def patched():
    with shim_in_this_process("vllm.config.model", "vllm.model_executor.layers.quantization.gguf") as registry:
        import vllm.config.model as model_module
        import vllm.model_executor.layers.quantization.gguf as gguf_module

        for name in ("dtype-auto", "dtype-gate"):
            assert registry.get(name).state == "applied", registry.get(name)
        yield model_module, gguf_module


@pytest.fixture
def capability(monkeypatch):
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    def set_capability(major: int, minor: int):
        monkeypatch.setattr(type(current_platform), "get_device_capability",
                            classmethod(lambda cls, device_id=0: DeviceCapability(major, minor)))

    return set_capability


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> str:
    return str(write_minimal_glm_dsa_gguf(tmp_path_factory.mktemp("dtype") / "m.gguf"))


def _bf16_config():
    from transformers import PretrainedConfig

    config = PretrainedConfig()
    config.dtype = torch.bfloat16
    return config


def _resolve(model_module, model, dtype):
    return model_module._get_and_verify_dtype(model, _bf16_config(), dtype, is_pooling_model=False)


def test_blackwell_auto_picks_float16_for_gguf(patched, capability, gguf_file, monkeypatch):
    model_module, _ = patched
    monkeypatch.delenv("GLM5_SHIM_GGUF_BF16", raising=False)
    capability(12, 0)
    assert _resolve(model_module, gguf_file, "auto") == torch.float16
    assert _resolve(model_module, gguf_file, "float16") == torch.float16


def test_blackwell_explicit_bf16_is_refused_with_the_way_out(patched, capability, gguf_file, monkeypatch):
    model_module, gguf_module = patched
    monkeypatch.delenv("GLM5_SHIM_GGUF_BF16", raising=False)
    capability(12, 0)
    with pytest.raises(ValueError) as err:
        _resolve(model_module, gguf_file, "bfloat16")
    message = str(err.value)
    assert "\n" not in message and "GLM5_SHIM_GGUF_BF16=1" in message and "12.0" in message and gguf_file in message
    assert torch.bfloat16 not in gguf_module.GGUFConfig().get_supported_act_dtypes()


def test_blackwell_bf16_behind_the_switch(patched, capability, gguf_file, monkeypatch):
    model_module, gguf_module = patched
    monkeypatch.setenv("GLM5_SHIM_GGUF_BF16", "1")
    capability(12, 0)
    assert _resolve(model_module, gguf_file, "bfloat16") == torch.bfloat16
    assert torch.bfloat16 in gguf_module.GGUFConfig().get_supported_act_dtypes()


def test_non_gguf_models_are_untouched_on_blackwell(patched, capability, tmp_path: pathlib.Path, monkeypatch):
    model_module, _ = patched
    monkeypatch.delenv("GLM5_SHIM_GGUF_BF16", raising=False)
    capability(12, 0)
    assert _resolve(model_module, str(tmp_path), "auto") == torch.bfloat16
    assert _resolve(model_module, str(tmp_path), "bfloat16") == torch.bfloat16


def test_ada_keeps_bf16(patched, capability, gguf_file, monkeypatch):
    model_module, gguf_module = patched
    monkeypatch.delenv("GLM5_SHIM_GGUF_BF16", raising=False)
    capability(8, 9)
    assert _resolve(model_module, gguf_file, "auto") == torch.bfloat16
    assert _resolve(model_module, gguf_file, "bfloat16") == torch.bfloat16
    assert torch.bfloat16 in gguf_module.GGUFConfig().get_supported_act_dtypes()


@pytest.mark.parametrize("cap", [(12, 0), (12, 1), (10, 0), (9, 0), (8, 9), (8, 6)])
def test_doctor_shows_the_dtype_the_patch_picks(patched, capability, gguf_file, monkeypatch, cap):
    """doctor's per-GPU plan and the dtype-auto patch answer from one rule (loading/gguf_dtype.gguf_dtype_for_auto)."""
    from glm5_shim.doctor import _plan_for

    model_module, _ = patched
    monkeypatch.delenv("GLM5_SHIM_GGUF_BF16", raising=False)
    capability(*cap)
    resolved = _resolve(model_module, gguf_file, "auto")
    assert _plan_for(cap)["attention"]["dtype"] == str(resolved).replace("torch.", "")
    assert resolved == (torch.float16 if cap[0] >= 10 else torch.bfloat16)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, str]:
    """make-tiny files: Q4_K (every quantized matmul on the shim's kernels) and Q4_0 (a type they do not cover)."""
    from glm5_shim.gguf.fixture import make_tiny

    out = tmp_path_factory.mktemp("tiny")
    return {q: str(make_tiny(out / f"{q}.gguf", quant=q, write_reference=False)[0]) for q in ("Q4_K", "Q4_0")}


def test_blackwell_keeps_bf16_when_the_shim_kernels_run_every_matmul(patched, capability, tiny_files, monkeypatch):
    """A file whose quantized matmuls all run on the shim's kernels: auto stays bfloat16, explicit bf16 is accepted
    and the gate admits it; a file with a type the kernels do not cover, or the kernels switched off: float16."""
    from glm5_shim.doctor import _plan_for
    from glm5_shim.kernels.gguf.routing import every_matmul_on_shim_kernels
    from glm5_shim.patches import dtype_gate

    model_module, gguf_module = patched
    monkeypatch.delenv("GLM5_SHIM_GGUF_BF16", raising=False)
    monkeypatch.setattr(dtype_gate, "_BF16_BY_SHIM_KERNELS", set())
    capability(12, 0)
    # every quantized type make-tiny writes has a shim kernel now: Q4_0 stands for one that has none
    from glm5_shim.kernels.gguf import routing

    monkeypatch.setattr(routing, "SHIM_KERNEL_TYPES",
                        tuple(t for t in routing.SHIM_KERNEL_TYPES if t != int(gguf.GGMLQuantizationType.Q4_0)))
    every_matmul_on_shim_kernels.cache_clear()
    covered, uncovered = tiny_files["Q4_K"], tiny_files["Q4_0"]
    assert every_matmul_on_shim_kernels(covered) and not every_matmul_on_shim_kernels(uncovered)
    assert _resolve(model_module, uncovered, "auto") == torch.float16
    assert torch.bfloat16 not in gguf_module.GGUFConfig().get_supported_act_dtypes()
    assert _resolve(model_module, covered, "auto") == torch.bfloat16
    assert _resolve(model_module, covered, "bfloat16") == torch.bfloat16
    assert torch.bfloat16 in gguf_module.GGUFConfig().get_supported_act_dtypes()
    assert _plan_for((12, 0), shim_runs_every_matmul=True)["attention"]["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="GLM5_SHIM_GGUF_BF16=1"):
        _resolve(model_module, uncovered, "bfloat16")
    every_matmul_on_shim_kernels.cache_clear()
    monkeypatch.setenv("GLM5_SHIM_GGUF_KERNELS", "vllm")
    try:
        assert not every_matmul_on_shim_kernels(covered)
        assert _resolve(model_module, covered, "auto") == torch.float16
    finally:
        every_matmul_on_shim_kernels.cache_clear()
