"""The names in glm5_shim.names and the shim's tensor table against gguf-py's own tables for GLM-DSA."""
from __future__ import annotations

import re

import gguf

from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.gguf.tensor_map import build_tensor_map
from glm5_shim.names import GGUF_ARCH, HF_MODEL_TYPE


def test_the_architecture_is_gguf_pys():
    assert GGUF_ARCH == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GLM_DSA]
    assert HF_MODEL_TYPE == "glm_moe_dsa"


def test_every_tensor_of_the_table_is_one_gguf_py_knows_for_glm_dsa(q8):
    """A typo in the table would make a tensor "missing" in every real file: each name must be one of gguf-py's."""
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GLM_DSA]}
    config = build_hf_config(open_gguf(q8.path))
    names = [spec.gguf_name for spec in build_tensor_map(config, include_mtp=True)]
    assert len(names) > 50
    for name in names:
        base = re.sub(r"^blk\.\d+\.", "blk.{bid}.", name).rsplit(".", 1)[0]
        assert base in known, name
