"""The speculators patch: a glm-dsa GGUF gets past speculator detection (and fails, if at all, further on)."""
from __future__ import annotations

import pathlib

from tests.helpers import USE_CPU_PLATFORM, last_json, run_python, script, write_minimal_glm_dsa_gguf

PROBE = """
import json, sys, traceback
from vllm.engine.arg_utils import EngineArgs
try:
    EngineArgs(model=sys.argv[1] if len(sys.argv) > 1 else {path!r}).create_engine_config()
    print(json.dumps({{"ok": True}}))
except Exception as exc:
    frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
    print(json.dumps({{"ok": False, "frames": frames, "error": f"{{type(exc).__name__}}: {{exc}}"[:400]}}))
"""


def test_gguf_passes_speculator_detection(tmp_path: pathlib.Path):
    gguf_path = write_minimal_glm_dsa_gguf(tmp_path / "tiny-glm-dsa.gguf")
    stock = last_json(run_python(script(USE_CPU_PLATFORM, PROBE.format(path=str(gguf_path))), {"GLM5_SHIM": "0"}))
    assert not stock["ok"] and "maybe_override_with_speculators" in stock["frames"], stock
    assert "glm-dsa" in stock["error"]

    shimmed = last_json(run_python(script(USE_CPU_PLATFORM, PROBE.format(path=str(gguf_path)))))
    if not shimmed["ok"]:
        assert "maybe_override_with_speculators" not in shimmed["frames"], shimmed
        # Where it stops next depends on the later patches; it is never the speculator probe.
        assert "create_model_config" in shimmed["frames"], shimmed


def test_replacement_only_short_circuits_gguf(tmp_path: pathlib.Path):
    from glm5_shim.patches.speculators import _make_replacement

    calls = []

    def original(model, tokenizer, trust_remote_code, revision=None, vllm_speculative_config=None,
                 hf_token=None, **kwargs):
        calls.append(model)
        return "from-original", tokenizer, vllm_speculative_config

    replacement = _make_replacement(original)
    gguf_path = write_minimal_glm_dsa_gguf(tmp_path / "m.gguf")
    spec = {"method": "ngram"}
    assert replacement(model=str(gguf_path), tokenizer="tok", trust_remote_code=False,
                       vllm_speculative_config=spec) == (str(gguf_path), "tok", spec)
    assert calls == []
    assert replacement(str(tmp_path), None, False)[0] == "from-original"
    assert calls == [str(tmp_path)]
