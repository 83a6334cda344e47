"""GLM-5.2's shared indexers: which layers run their own DSA indexer, from the key or from llama.cpp's rule, and what
the validator says about indexer tensors that are missing or surplus."""
from __future__ import annotations

import pytest

from glm5_shim.gguf.config import build_hf_config, indexer_layout
from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.gguf.validate import ERROR, WARNING, validate

ONE_M = 1 << 20
KEY = "glm-dsa.attention.indexer.types"


def _layout(path):
    return indexer_layout(open_gguf(path))


def test_the_key_decides(tiny):
    model = tiny("layout-key", layers=7, indexer_types="FSFSSFS")
    layout = _layout(model.path)
    assert layout.pattern == "FSFSSFS" and layout.shared_layers == [1, 3, 4, 6]
    assert layout.source == f"from {KEY}"
    config = build_hf_config(open_gguf(model.path))
    assert config["index_topk_pattern"] == "FSFSSFS"
    assert config["indexer_types"] == ["full", "shared", "full", "shared", "shared", "full", "shared"]
    assert [f for f in validate(model.path) if f.level == ERROR] == []


def test_without_the_key_a_1m_context_means_glm52s_layout(tiny):
    model = tiny("layout-rule-1m", layers=11, indexer_types="glm52", indexer_types_key=False, context_length=ONE_M)
    layout = _layout(model.path)
    assert layout.pattern == "FFFSSSFSSSF"  # layers 0, 1, then every fourth from 2
    assert "absent" in layout.source and str(ONE_M) in layout.source
    assert "F F F S S S F S S S F" in layout.describe()
    assert [f for f in validate(model.path) if f.level == ERROR] == []


def test_without_the_key_a_shorter_context_means_all_full(tiny):
    """GLM-5 / 5.1: no key, context below 1M, every layer full; a GLM-5.2 file in that state misses indexers."""
    glm5 = tiny("layout-glm5", layers=4)
    assert _layout(glm5.path).pattern == "FFFF" and "all full" in _layout(glm5.path).source
    assert "index_topk_pattern" not in build_hf_config(open_gguf(glm5.path))
    broken = tiny("layout-52-short", layers=4, indexer_types="FFFS", indexer_types_key=False)
    errors = [f for f in validate(broken.path) if f.level == ERROR]
    assert errors and all("blk.3.indexer." in f.message for f in errors)
    assert f"layer 3 runs its own DSA indexer: {KEY} absent, context_length 8192 < {ONE_M}" in errors[0].message


def test_indexer_tensors_in_shared_layers_are_one_warning(tiny):
    model = tiny("layout-extra", layers=7, indexer_types="glm52", indexer_types_key=False, context_length=ONE_M,
                 shared_indexer_weights=True)
    findings = validate(model.path)
    assert [f for f in findings if f.level == ERROR] == []
    warned = [f for f in findings if "shared-indexer layer" in f.message]
    assert len(warned) == 1 and warned[0].level == WARNING
    assert "15 indexer tensors" in warned[0].message and "(3, 4, 5)" in warned[0].message


@pytest.mark.parametrize("value, expected", [
    ([True, False], "3 entries"),                      # wrong length
    ([False, True, True], "layer 0 full"),             # layer 0 cannot share
    (["full", "shared", "full"], "an array of bools"),  # HF's strings are not the GGUF encoding
])
def test_a_bad_key_is_one_line(tiny, value, expected):
    model = tiny(f"layout-bad-{len(value)}-{value[0]}", layers=3, metadata_overrides={KEY: value})
    with pytest.raises(GGUFError) as err:
        _layout(model.path)
    message = str(err.value)
    assert message.startswith(f"{model.path}: metadata key {KEY}") and expected in message and "\n" not in message


def test_one_value_for_every_layer(tiny):
    model = tiny("layout-scalar", layers=3, metadata_overrides={KEY: True})
    assert _layout(model.path).pattern == "FFF"
