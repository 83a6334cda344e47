"""Which GGUF matmul each quantized weight of a file runs on, as inspect and doctor say it (kernels/gguf/routing.py
decides, report.py words it): counted per type from the load plan of real llama-quantize mixes."""
import gguf
import pytest

from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.fixture import make_tiny
from glm5_shim.kernels.gguf.routing import MMA_DECODE_TYPES, SHIM_KERNEL_TYPES, VLLM_MOE_DECODE_TOKENS
from glm5_shim.gguf.load_plan import plan_tensors
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.kernels.gguf.routing import matmul_paths
from glm5_shim.report import format_matmul_paths


def _plan(path):
    model = open_gguf(str(path))
    return plan_tensors(model, build_hf_config(model, check_shapes=False))


@pytest.fixture(scope="module")
def q2k_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("paths") / "q2k.gguf"
    make_tiny(path, preset="Q2_K", write_reference=False)
    return _plan(path)


def test_each_quantized_matmul_weight_is_counted_once_on_the_path_its_type_takes(q2k_plan):
    paths = matmul_paths(q2k_plan)
    expected = {"shim": {}, "vllm": {}}
    for t in q2k_plan.tensors:
        if t.vllm_type is None or t.gguf_name == "token_embd.weight":
            continue
        qt = int(gguf.GGMLQuantizationType[t.vllm_type])
        if t.vllm_type in ("F32", "F16", "BF16"):
            continue
        side = "shim" if qt in SHIM_KERNEL_TYPES else "vllm"
        expected[side][t.vllm_type] = expected[side].get(t.vllm_type, 0) + 1
    assert paths == expected
    assert {"Q2_K", "Q3_K", "Q6_K"} <= set(paths["shim"]) and not paths["vllm"], paths  # every type has a kernel
    off = matmul_paths(q2k_plan, shim_kernels=False)
    assert not off["shim"] and sum(off["vllm"].values()) == sum(map(sum, (d.values() for d in paths.values())))


def test_the_line_names_the_iq_types_whose_moe_decode_stays_on_vllm():
    iq = [gguf.GGMLQuantizationType(t).name for t in VLLM_MOE_DECODE_TOKENS][:2]
    line = format_matmul_paths({"shim": {"Q4_K": 3, iq[0]: 2, iq[1]: 1}, "vllm": {"TQ1_0": 2}})
    assert f"dense linears at one row and {iq[0]}/{iq[1]} MoE decode of up to 8-32 tokens stay on vLLM's" in line
    assert "TQ1_0 x2" in line  # a type with no shim kernel
    assert "MoE decode" not in format_matmul_paths({"shim": {"Q4_K": 3}, "vllm": {}})


def test_the_line_says_where_decode_runs_by_default_and_with_the_tile_switch(monkeypatch):
    paths = {"shim": {"Q4_K": 3, "Q6_K": 1, "Q8_0": 2}, "vllm": {}}
    mma = "/".join(t for t in paths["shim"] if int(gguf.GGMLQuantizationType[t]) in MMA_DECODE_TYPES)
    assert "Q4_K" in mma
    monkeypatch.delenv("GLM5_SHIM_GGUF_DECODE", raising=False)
    line = format_matmul_paths(paths)
    # routing.MMA_MOE_MAX_ROWS_PER_EXPERT: Q4_K and Q8_0 to 16 rows an expert, Q6_K to 64
    assert f"decode-sized {mma} products (MoEs up to 16-64 routed rows an expert) on the register-MMA kernels " \
           "(GLM5_SHIM_GGUF_DECODE=tile" in line
    assert "one row stay on vLLM's vector kernels" in line
    monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", "tile")
    line = format_matmul_paths(paths)
    assert f"GLM5_SHIM_GGUF_DECODE=mma (the default) runs decode-sized {mma} products" in line
    assert "register-MMA" not in format_matmul_paths({"shim": {}, "vllm": {"TQ1_0": 2}})


def test_the_line_warns_when_vllms_kernels_would_decode_iq3_s():
    """vLLM 0.23 decodes IQ3_S with llama.cpp's pre-2024 grid (routing.VLLM_MISDECODED_TYPES): a file whose
    IQ3_S weights would run there (GLM5_SHIM_GGUF_KERNELS=vllm) is told so; on the shim's kernels nothing is said."""
    line = format_matmul_paths({"shim": {}, "vllm": {"IQ3_S": 4, "IQ2_XXS": 2}})
    assert "WARNING: vLLM 0.23's kernels decode IQ3_S wrongly" in line
    assert "stay on vLLM's vector kernels" not in line  # nothing runs on the shim's kernels to leave rows to vLLM
    assert "WARNING" not in format_matmul_paths({"shim": {"IQ3_S": 4}, "vllm": {"IQ2_XXS": 2}})


def test_the_line_says_which_types_are_repacked_at_load(monkeypatch):
    """Q8_0, Q6_K, IQ2_XXS and IQ2_S weights the shim's kernels compute are repacked at load
    (loading/gguf_repack.py) unless GLM5_SHIM_GGUF_PACK=0 or vLLM's kernels compute them; other types never."""
    paths = {"shim": {"Q4_K": 3, "Q6_K": 1, "Q8_0": 2}, "vllm": {}}
    monkeypatch.delenv("GLM5_SHIM_GGUF_PACK", raising=False)
    assert "; Q6_K/Q8_0 linear and expert weights repacked at load" in format_matmul_paths(paths)
    iq = format_matmul_paths({"shim": {"IQ2_XXS": 5, "IQ2_S": 2, "IQ3_XXS": 1}, "vllm": {}})
    assert "; IQ2_XXS/IQ2_S linear and expert weights repacked at load" in iq, iq
    assert "repacked" not in format_matmul_paths({"shim": {"Q4_K": 3}, "vllm": {}})
    monkeypatch.setenv("GLM5_SHIM_GGUF_PACK", "0")
    assert "repacked" not in format_matmul_paths(paths)
    monkeypatch.delenv("GLM5_SHIM_GGUF_PACK")
    monkeypatch.setenv("GLM5_SHIM_GGUF_KERNELS", "vllm")
    assert "repacked" not in format_matmul_paths(paths)
