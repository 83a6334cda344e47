"""The real llama.cpp tools against the project's imitation of them, and their files through the shim's loader.

llama.cpp's `convert_hf_to_gguf.py` (from the pinned llama-cpp-python sdist, bench/real_gguf.py) converts the tiny
model's HF checkpoint to BF16, F16 and Q8_0 GGUFs: `make_tiny` must write the same tensors, in the same order, with
the same types and the same metadata keys; and vLLM, through the shim, must load the converter's files to the
values they store.  Where a `llama-quantize` build is named by LLAMA_QUANTIZE (it needs a C++ build, so CI has
none), its presets are checked the same way.

CI must run the converter: there (CI or GLM5_SHIM_CI set; .ci/run sets the latter) a missing sdist fails; elsewhere it skips with the reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from glm5_shim.gguf.fixture import make_tiny
from glm5_shim.gguf.llama_tools import QUANTIZE_PRESETS, quantize_types
from tests.helpers import REPO, bench_module, child_env

OUTTYPES = ("BF16", "F16", "Q8_0")
# presets whose every type the generator can encode (IQ4_XS/IQ4_NL have no quantizer here)
PRESETS = ("Q4_0", "Q5_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K")
LLAMA_QUANTIZE = os.environ.get("LLAMA_QUANTIZE", "")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    real_gguf = bench_module("real_gguf")
    root = tmp_path_factory.mktemp("real")
    try:
        real_gguf.llama_cpp_tree()
    except RuntimeError as exc:
        if os.environ.get("CI") or os.environ.get("GLM5_SHIM_CI"):
            raise
        pytest.skip(f"llama.cpp's converter is not available here: {exc}")
    presets = PRESETS + ("IQ4_XS",) if LLAMA_QUANTIZE else ()
    files = real_gguf.make_real(root, outtypes=[t.lower() for t in OUTTYPES], presets=presets,
                                llama_quantize=LLAMA_QUANTIZE or None, seed=0)
    return root, files


def _layout(path) -> tuple[list, list]:
    reader = gguf.GGUFReader(str(path))
    tensors = [(t.name, t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in reader.tensors]
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    return tensors, keys


def _values(path, keys) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {k: reader.fields[k].contents() for k in keys}


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_make_tiny_writes_what_the_converter_writes(real, outtype, tmp_path):
    _, files = real
    ours = make_tiny(tmp_path / "ours.gguf", quant=outtype, seed=0, write_reference=False)[0]
    real_tensors, real_keys = _layout(files[outtype])
    our_tensors, our_keys = _layout(ours)
    assert [t[0] for t in our_tensors].index("blk.0.attn_kv_a_mqa.weight") < \
        [t[0] for t in our_tensors].index("blk.0.attn_q_a.weight")  # the order that broke quantized files
    assert our_tensors == real_tensors
    assert our_keys == real_keys
    compared = [k for k in real_keys if k != "general.name"]  # the converter names the model after its folder
    assert _values(ours, compared) == _values(files[outtype], compared)
    # same quantizer, same rounding: the tensor bytes are the converter's too
    ours_data = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(ours)).tensors}
    for t in gguf.GGUFReader(str(files[outtype])).tensors:
        assert np.array_equal(np.asarray(t.data), ours_data[t.name]), t.name


@pytest.mark.skipif(not LLAMA_QUANTIZE, reason="no llama-quantize build named by LLAMA_QUANTIZE")
@pytest.mark.parametrize("preset", PRESETS + ("IQ4_XS",))
def test_presets_assign_what_llama_quantize_assigns(real, preset, tmp_path):
    _, files = real
    real_tensors, _ = _layout(files[preset])
    if preset in PRESETS:
        ours = make_tiny(tmp_path / "ours.gguf", preset=preset, seed=0, write_reference=False)[0]
        our_tensors, _ = _layout(ours)
        assert our_tensors == real_tensors
        assert _values(ours, ["general.file_type"]) == _values(files[preset], ["general.file_type"])
    else:  # no quantizer for IQ4_XS here: the type rules alone, on the converter's BF16 file
        source = {n: (ty, tuple(reversed(ne))) for n, ty, ne in _layout(files["BF16"])[0]}
        types = quantize_types(source, preset, n_layers_all=4, n_experts=8, n_gqa=4)
        assert types == {n: ty for n, ty, _ in real_tensors}


def test_the_shim_loads_the_converters_files(real):
    """Each real file through vLLM's loader (CPU harness, shim active) against what the file stores."""
    from tests import test_gguf_vllm_load as load_test

    root, files = real
    names = list(files)
    out = root / "loaded"
    out.mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), str(out),
                           *[str(files[n]) for n in names]], env=child_env(), capture_output=True, text=True,
                          timeout=1500, cwd=str(REPO))
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(names), proc.stderr[-4000:]
    for i, (name, result) in enumerate(zip(names, results)):
        quant = QUANTIZE_PRESETS.get(name, name)
        load_test.check_every_parameter(result, out / f"{i}.npz", files[name], quant, f"real {name}")

