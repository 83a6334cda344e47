"""The one predicate every patch asks (loading/served.py): which models of a vLLM config are glm-dsa GGUFs — by the
config vLLM built *and* the file's header — and the shared-indexer patch that asks it."""
from types import SimpleNamespace

import pytest

from glm5_shim.loading.served import served_glm_ggufs, serves_glm_gguf
from glm5_shim.names import HF_MODEL_TYPE, HF_MTP_MODEL_TYPE
from tests.helpers import last_json, run_python, write_minimal_glm_dsa_gguf, write_other_architecture_gguf


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    glm = write_minimal_glm_dsa_gguf(root / "glm.gguf")   # the predicate reads headers only
    other = write_other_architecture_gguf(root / "llama.gguf", "llama")   # vLLM serves it alone
    return {"glm": str(glm), "other": str(other), "hf": str(root)}


def _model(path, model_type):
    return SimpleNamespace(model=path, hf_config=SimpleNamespace(model_type=model_type), quantization="gguf")


def _config(target, draft=None, draft_parallel=None):
    spec = SimpleNamespace(draft_model_config=draft, draft_parallel_config=draft_parallel) if draft else None
    return SimpleNamespace(model_config=target, parallel_config="target-parallel", speculative_config=spec)


def test_target_and_draft(files):
    cfg = _config(_model(files["glm"], HF_MODEL_TYPE), _model(files["glm"], HF_MTP_MODEL_TYPE), "draft-parallel")
    served = served_glm_ggufs(cfg)
    assert [(s.role, s.parallel_config) for s in served] == [("target", "target-parallel"),
                                                             ("draft", "draft-parallel")]
    assert serves_glm_gguf(cfg) and serves_glm_gguf(cfg, "target") and serves_glm_gguf(cfg, "draft")


def test_a_draft_without_its_own_parallel_config_runs_at_the_targets(files):
    cfg = _config(_model(files["hf"], "llama"), _model(files["glm"], HF_MTP_MODEL_TYPE))
    assert [(s.role, s.parallel_config) for s in served_glm_ggufs(cfg)] == [("draft", "target-parallel")]
    assert not serves_glm_gguf(cfg, "target")


@pytest.mark.parametrize("case", ["other GGUF", "other model type", "not a GGUF", "no model"])
def test_nothing_else_counts(files, case):
    """Another architecture's GGUF is vLLM's even where vLLM's config claims GLM-5's model type (the shared-indexer
    patch once asked only whether the model was any GGUF); a GLM-5 GGUF whose config vLLM did not build as GLM-5 (or
    as its MTP draft) is not served by the shim either."""
    target = {"other GGUF": _model(files["other"], HF_MODEL_TYPE),
              "other model type": _model(files["glm"], "deepseek_v32"),
              "not a GGUF": _model(files["hf"], HF_MODEL_TYPE),
              "no model": None}[case]
    cfg = _config(target, _model(files["other"], HF_MTP_MODEL_TYPE))
    assert served_glm_ggufs(cfg) == () and not serves_glm_gguf(cfg)


def test_shared_indexer_keeps_indexer_a_class():
    """The shared-indexer patch puts a subclass of vLLM's Indexer in its module (it was a factory function, which
    made ``isinstance(x, Indexer)`` raise): vLLM's own layers are still instances of it."""
    out = last_json(run_python("""
import json
import vllm.model_executor.models.deepseek_v2 as dsv2   # the shim is active in the child (sitecustomize)
from glm5_shim.registry import REGISTRY
patched = dsv2.Indexer
stock = getattr(patched, "stock", None)
plain = object.__new__(patched)   # what copy and pickle make
applied = [p.name for p in REGISTRY.patches() if p.name == "shared-indexer" and p.state.value == "applied"]
print(json.dumps({"applied": applied,
                  "is_class": isinstance(patched, type), "subclass": stock is not None and issubclass(patched, stock),
                  "name": patched.__qualname__, "module": patched.__module__,
                  "isinstance": isinstance(plain, patched) and isinstance(plain, stock),
                  "copy_new": type(patched.__new__(patched)).__name__}))
"""))
    assert out == {"applied": ["shared-indexer"], "is_class": True, "subclass": True, "name": "Indexer",
                   "module": "vllm.model_executor.models.deepseek_v2", "isinstance": True, "copy_new": "Indexer"}
