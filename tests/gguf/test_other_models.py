"""Other GGUF models in the shim's environment (issue #51): served exactly as vLLM serves them without the shim.

`pip install -e .` makes the shim a vLLM general plugin, active in every vLLM process of the environment whatever
model is served.  Its scope: a glm-dsa GGUF is the shim's; any other GGUF is left to vLLM (config, tokenizer, loader
and GGUF kernels; gguf_ops takes a process's matmuls only once it loaded a glm-dsa GGUF).  The files are llama.cpp's
own: its converter on transformers' own Llama and Qwen3-MoE classes at tiny random sizes (bench/real_gguf.py
OTHER_ARCHS: widths that are multiples of 256 and widths that are not, GQA, 8 experts of width 160), then
llama-quantize's Q4_K_M and Q2_K where its build is at hand (CI builds it).
"""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from tests.helpers import in_ci, load_in_cpu_harness, real_gguf_with_converter

ARCHS = ("llama", "qwen3moe")
LEGACY = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
K_QUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


@pytest.fixture(scope="module")
def other_files(tmp_path_factory) -> dict[str, dict[str, str]]:
    """arch → {file type → path}: BF16 and Q8_0 from the converter, Q4_K_M and Q2_K from llama-quantize."""
    real_gguf = real_gguf_with_converter()
    tools = real_gguf.llama_tools(build=in_ci())
    quantize = str(tools["llama-quantize"]) if tools else None
    root = tmp_path_factory.mktemp("other")
    return {arch: {k: str(v) for k, v in real_gguf.make_other_real(
        root / arch, arch, presets=real_gguf.OTHER_PRESETS if quantize else (), llama_quantize=quantize).items()}
        for arch in ARCHS}


def _types(path: str) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def test_the_files_are_other_architectures_with_fallback_rows(other_files):
    """The converter wrote the architectures asked for; where llama-quantize ran, rows that are not whole 256-blocks
    fell back to a legacy type while the others took K-quants: the shapes issue #51 asks for."""
    for arch, files in other_files.items():
        for path in files.values():
            assert gguf.GGUFReader(path).fields["general.architecture"].contents() == arch
        if "Q4_K_M" not in files:
            continue
        for preset in ("Q4_K_M", "Q2_K"):
            types = set(_types(files[preset]).values())
            assert types & LEGACY and types & K_QUANTS, (arch, preset, types)
    if in_ci():
        assert all("Q2_K" in files for files in other_files.values())
    moe = _types(other_files["qwen3moe"]["Q8_0"])
    assert "blk.0.ffn_gate_exps.weight" in moe and "blk.0.ffn_down_exps.weight" in moe


def test_doctor_and_inspect_say_what_the_shim_does_for_them(other_files, capsys):
    from glm5_shim.cli import main
    from glm5_shim.report import OTHER_MODEL_NOTE

    for arch, files in other_files.items():
        for path in files.values():
            assert main(["inspect", path]) == 0
            out = capsys.readouterr().out
            assert f"architecture: {arch}" in out and OTHER_MODEL_NOTE in out and "error" not in out.lower()
            assert main(["inspect", path, "--json"]) == 0
            report = json.loads(capsys.readouterr().out)
            assert report["findings"] == [] and report["other_model"] == OTHER_MODEL_NOTE
        assert main(["doctor", files["Q8_0"], "--json"]) == 0
        model = json.loads(capsys.readouterr().out)["model"]
        assert model == {"path": files["Q8_0"], "architecture": arch, "errors": [], "warnings": [],
                         "other_model": OTHER_MODEL_NOTE}
        assert main(["doctor", files["Q8_0"]]) == 0
        assert f"(architecture {arch}): {OTHER_MODEL_NOTE}" in capsys.readouterr().out


def test_launch_preflight_lets_them_through(other_files):
    from glm5_shim.preflight import problem

    for files in other_files.values():
        for path in files.values():
            assert problem(path) is None


@pytest.mark.slow
def test_vllms_loader_gives_the_same_parameters_with_and_without_the_shim(other_files, tmp_path):
    """Every file through vLLM 0.23's GGUF loader on the CPU, once with the shim active and once with GLM5_SHIM=0:
    the same outcome, and where it loads, every parameter the same (name, raw GGUF blocks or float values, GGML type
    and merged-shard layout); the shim's kernels never take these processes' matmuls.  (vLLM 0.23 with transformers 5
    cannot map Qwen3-MoE's fused experts, `Failed to map GGUF parameters`; with transformers 4.57 it loads: either
    way the shim changes nothing; so does a BF16 Llama file, `KeyError: 'embed_tokens.weight'`, both ways.)"""
    # the MoE first: the harness sets up vLLM's parallel groups with the first model's config, and an expert-parallel
    # group exists only when that one has experts
    models = [path for arch in reversed(ARCHS) for path in other_files[arch].values()]
    shim = load_in_cpu_harness(tmp_path / "shim", models)
    stock = load_in_cpu_harness(tmp_path / "stock", models, env={"GLM5_SHIM": "0"})
    loaded = []
    for i, (a, b) in enumerate(zip(shim, stock)):
        assert a["ok"] == b["ok"], (a, b)
        if not a["ok"]:  # vLLM's own failure, the same without the shim
            print(f"\nnot loaded, with and without the shim: {a['model']}: {a['error'][:200]}")
            assert a["error"] == b["error"], (a, b)
            continue
        loaded.append(a["model"])
        assert a["shim_kernels"] is False and b["shim_kernels"] is None
        assert a["types"] == b["types"] and a["tokenizer"] == b["tokenizer"]
        pa, pb = np.load(tmp_path / "shim" / f"{i}.npz"), np.load(tmp_path / "stock" / f"{i}.npz")
        assert sorted(pa.files) == sorted(pb.files) and len(pa.files) > 10
        for name in pa.files:
            assert np.array_equal(pa[name], pb[name]), (a["model"], name)
    quantized = [path for files in other_files.values() for t, path in files.items() if t != "BF16"]
    assert set(other_files["llama"][t] for t in other_files["llama"] if t != "BF16") <= set(loaded), loaded
    print(f"\nloaded the same with and without the shim: {len(loaded)} of {len(quantized)} quantized files, "
          f"{len(loaded) - len(set(loaded) & set(quantized))} BF16")
