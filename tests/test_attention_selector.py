"""vLLM's own attention selector, with the platform's compute capability mocked, picks the shim's backend for
GLM-5's sparse MLA where no native backend is valid (12.0, 8.9, 8.6; fp16 on 9.0) and leaves 9.0 native unless
forced.

This CPU machine has no CUDA driver, so vllm.platforms.cuda cannot load its compiled ops: the child stubs the
two extension modules it imports for side effects and marks the backends that allocate CUDA memory at import as
unimportable (what they are here).  The selector logic and every validation that runs are vLLM's own.
"""
from __future__ import annotations


import pytest

from tests.helpers import last_json, run_python

PROBE = """
import json, sys, types
for name in ("vllm._C", "vllm._C_stable_libtorch"):
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["vllm.v1.attention.backends.mla.flashinfer_mla"] = None  # allocates CUDA memory at import
import torch
from vllm.platforms import cuda
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm.v1.attention.backends.registry import AttentionBackendEnum

results = {}
for cap, dtype, kv in CASES:
    cuda.CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0, c=cap: DeviceCapability(*c))
    cfg = AttentionSelectorConfig(head_size=576, dtype=getattr(torch, dtype), kv_cache_dtype=kv, block_size=None,
                                  use_mla=True, use_sparse=True)
    key = f"{cap[0]}.{cap[1]}/{dtype}/{kv}"
    try:
        results[key] = cuda.CudaPlatform.get_attn_backend_cls(None, cfg, num_heads=8)
    except Exception as exc:
        results[key] = f"ERROR {type(exc).__name__}: {exc}"[:300]
# dense attention is left alone
dense = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
                                use_mla=False, use_sparse=False)
cuda.CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(12, 0))
try:
    results["dense"] = cuda.CudaPlatform.get_attn_backend_cls(None, dense, num_heads=8)
except Exception as exc:
    results["dense"] = f"ERROR {type(exc).__name__}: {exc}"[:300]
try:
    results["custom"] = AttentionBackendEnum.CUSTOM.get_path()
except ValueError:
    results["custom"] = None  # stock vLLM: nothing registered in the CUSTOM slot
print(json.dumps(results))
"""
CASES = [((12, 0), "float16", "auto"), ((12, 0), "bfloat16", "fp8_ds_mla"), ((12, 0), "bfloat16", "fp8"),
         ((12, 1), "float16", "auto"),
         ((8, 9), "bfloat16", "auto"), ((8, 6), "bfloat16", "auto"), ((8, 0), "float16", "auto"),
         ((9, 0), "bfloat16", "auto"), ((9, 0), "float16", "auto")]
SHIM = "glm5_shim.attention.backend.Glm5SparseMLABackend"
NATIVE = "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"


def _run(extra_env=None):
    return last_json(run_python(f"CASES = {CASES!r}\n" + PROBE, extra_env))


@pytest.fixture(scope="module")
def auto():
    return _run()


@pytest.mark.parametrize("key", ["12.0/float16/auto", "12.0/bfloat16/fp8_ds_mla", "12.1/float16/auto",
                                 "8.9/bfloat16/auto", "8.6/bfloat16/auto", "8.0/float16/auto",
                                 "9.0/float16/auto"])
def test_no_native_backend_means_the_shim(auto, key):
    assert auto[key] == SHIM, auto[key]


def test_plain_fp8_kv_names_the_supported_layout(auto):
    message = auto["12.0/bfloat16/fp8"]
    assert message.startswith("ERROR ValueError") and "--kv-cache-dtype fp8_ds_mla" in message


@pytest.fixture(scope="module")
def stock():
    return _run({"GLM5_SHIM": "0"})


def test_hopper_bf16_stays_native_and_dense_is_untouched(auto, stock):
    assert auto["9.0/bfloat16/auto"] == NATIVE
    assert auto["custom"] == SHIM
    # dense attention gets exactly what stock vLLM picks (FlashAttention on this mocked 12.0), not an error
    assert auto["dense"] == stock["dense"] == "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"


def test_forced_triton_on_hopper():
    forced = _run({"GLM5_SHIM_ATTENTION": "triton"})
    assert forced["9.0/bfloat16/auto"] == SHIM and forced["12.0/float16/auto"] == SHIM


def test_stock_vllm_has_no_backend_on_sm120(stock):
    assert stock["12.0/float16/auto"].startswith("ERROR ValueError: No valid attention backend found")
    assert stock["9.0/bfloat16/auto"] == NATIVE
    assert stock["custom"] is None
