"""The indexer patch: on a mocked SM120 (or without DeepGEMM) vLLM's indexer calls resolve to the shim's Triton
kernels and the decode builder skips DeepGEMM's schedule; on 9.0 with DeepGEMM they stay DeepGEMM unless forced."""
from __future__ import annotations

from tests.helpers import last_json, run_python

PROBE = """
import json, traceback
import vllm.model_executor.layers.sparse_attn_indexer as sai
import vllm.v1.attention.backends.mla.indexer as idx
import vllm.utils.import_utils as iu
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
import glm5_shim.kernels.indexer_logits as kernels
from glm5_shim.patches.indexer import triton_indexer_reason

kernels.mqa_logits = lambda *a, **k: "shim-prefill"
kernels.paged_mqa_logits = lambda *a, **k: "shim-decode"

def where(fn):
    try:
        out = fn()
        return out
    except Exception as exc:
        frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
        return "deepgemm" if any("deep_gemm" in f for f in frames) else f"error {type(exc).__name__}: {exc}"

results = {}
for name, cap, has_dg in CASES:
    type(current_platform).get_device_capability = classmethod(lambda cls, device_id=0, c=cap: DeviceCapability(*c))
    iu.has_deep_gemm = (lambda v=has_dg: v)
    triton_indexer_reason.cache_clear()
    results[name] = {"reason": triton_indexer_reason(),
                     "prefill": where(lambda: sai.fp8_fp4_mqa_logits((None, None), (None, None), None, None, None,
                                                                      False)),
                     "decode": where(lambda: sai.fp8_fp4_paged_mqa_logits((None, None), None, None, None, None, None,
                                                                           64, False)),
                     "op_builds": sai.has_deep_gemm(), "builder_asks_deepgemm": idx.has_deep_gemm()}
print(json.dumps(results))
"""
CASES = [("sm120", (12, 0), True), ("sm86", (8, 6), False), ("h200", (9, 0), True), ("h200-no-toolkit", (9, 0), False)]
# (name, mocked compute capability, what vLLM's has_deep_gemm() reports)


def _run(env=None):
    return last_json(run_python(f"CASES = {CASES!r}\n" + PROBE, env))


def test_routing_follows_the_gpu():
    r = _run()
    for name in ("sm120", "sm86", "h200-no-toolkit"):
        assert r[name]["prefill"] == "shim-prefill" and r[name]["decode"] == "shim-decode", (name, r[name])
        assert r[name]["op_builds"] is True and r[name]["builder_asks_deepgemm"] is False
        assert r[name]["reason"]
    assert "12.0" in r["sm120"]["reason"] and "toolkit" in r["h200-no-toolkit"]["reason"]
    assert r["h200"]["reason"] is None
    assert r["h200"]["prefill"] == "deepgemm" and r["h200"]["decode"] == "deepgemm"
    assert r["h200"]["op_builds"] is True and r["h200"]["builder_asks_deepgemm"] is True


def test_forced_triton_on_hopper():
    r = _run({"GLM5_SHIM_INDEXER": "triton"})
    assert r["h200"]["decode"] == "shim-decode" and r["h200"]["builder_asks_deepgemm"] is False
    assert "GLM5_SHIM_INDEXER=triton" in r["h200"]["reason"]
