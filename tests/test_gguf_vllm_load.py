"""A tiny glm-dsa GGUF all the way through vLLM's loader on a CPU machine: config, tokenizer, model construction,
the weight stream, post-load processing — for every quant type the fixture generator writes.  The loaded
parameters are compared with the float weights the fixture started from.

One child process loads every model (vLLM imports once); the comparisons run here.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import gguf
import numpy as np
import pytest

from glm5_shim.gguf.fixture import QUANT_TYPES, make_tiny, reference_dir
from tests.helpers import REPO, child_env

# Max |dequantized - reference| / max|reference| per type (see tests/gguf/test_roundtrip.py for the derivation).
BOUND = {"F32": 0.0, "F16": 2**-11, "BF16": 2**-8, "Q8_0": 0.006, "Q6_K": 0.02, "Q5_0": 0.07, "Q4_K": 0.08,
         "Q4_0": 0.13}
# attn_k_b's last dim (192) does not fit 256-blocks: llama-quantize falls back (Q4_K → Q5_0, Q6_K → Q8_0).
KV_B_TYPE = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
CASES = list(QUANT_TYPES) + ["Q4_K-split3"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-load")
    paths = {}
    for case in CASES:
        quant, _, split = case.partition("-split")
        files = make_tiny(root / f"tiny-{case}.gguf", quant=quant, shards=int(split or 1), seed=0)
        paths[case] = files[0]
    out = root / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), str(out),
                           *[str(paths[c]) for c in CASES]], env=child_env(), capture_output=True, text=True,
                          timeout=1500, cwd=str(REPO))
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(CASES), proc.stderr[-4000:]
    return {case: (res, out / f"{i}.npz", root / f"tiny-{case}.gguf") for i, (case, res) in
            enumerate(zip(CASES, results))}


def _reference(case_path: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(reference_dir(case_path) / "model.safetensors"))


def _close(actual: np.ndarray, reference: np.ndarray, type_name: str, what: str) -> None:
    assert actual.shape == reference.shape, (what, actual.shape, reference.shape)
    bound = BOUND[type_name] * float(np.abs(reference).max())
    err = float(np.abs(actual.astype(np.float64) - reference).max())
    assert err <= bound, f"{what} ({type_name}): max error {err:.3g} > bound {bound:.3g}"


def _dequant(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type)).astype(np.float32)


@pytest.mark.parametrize("case", CASES)
def test_every_parameter_matches_the_reference(loaded, case):
    result, npz, gguf_path = loaded[case]
    assert result["ok"], result
    assert result["model_type"] == "glm_moe_dsa" and result["tokenizer"]["vocab"] > 256
    quant = case.split("-")[0]
    ref = _reference(gguf_path)
    config = json.loads((reference_dir(gguf_path) / "config.json").read_text())
    params = dict(np.load(npz))
    types = result["types"]
    float_quant = quant in ("F32", "F16", "BF16")
    checked = set()

    def expect(name: str, reference: np.ndarray, type_name: str) -> None:
        if name.endswith("qweight"):
            t = types[name]
            assert isinstance(t, int), (name, t)
            value = _dequant(params[name], t).reshape(reference.shape)
            type_name = gguf.GGMLQuantizationType(t).name
        else:
            value = params[name]
        _close(value, reference, type_name, f"{case}: {name}")
        checked.add(name)

    for layer in range(config["num_hidden_layers"]):
        p, h = f"model.layers.{layer}.", f"model.layers.{layer}."
        for norm in ("input_layernorm", "post_attention_layernorm", "self_attn.q_a_layernorm",
                     "self_attn.kv_a_layernorm", "self_attn.indexer.k_norm"):
            expect(p + norm + ".weight", ref[h + norm + ".weight"], "F32")
        expect(p + "self_attn.indexer.k_norm.bias", ref[h + "self_attn.indexer.k_norm.bias"], "F32")
        # kv_b_proj is rebuilt from attn_k_b/attn_v_b: the float weight vLLM absorbs into W_UK/W_UV
        # (attn_v_b keeps the requested type, attn_k_b may fall back: the looser bound of the two applies)
        expect(p + "self_attn.kv_b_proj.weight", ref[h + "self_attn.kv_b_proj.weight"],
               max(quant, KV_B_TYPE.get(quant, quant), key=BOUND.get))
        # wk and weights_proj are dequantized and fused (shard 0 = wk, shard 1 = weights_proj)
        expect(p + "self_attn.indexer.wk_weights_proj.weight",
               np.concatenate([ref[h + "self_attn.indexer.wk.weight"], ref[h + "self_attn.indexer.weights_proj.weight"]]),
               quant)
        for proj in ("self_attn.q_b_proj", "self_attn.o_proj", "self_attn.indexer.wq_b"):
            expect(p + proj + (".weight" if float_quant else ".qweight"), ref[h + proj + ".weight"], quant)
        fused_q = np.concatenate([ref[h + "self_attn.q_a_proj.weight"], ref[h + "self_attn.kv_a_proj_with_mqa.weight"]])
        if float_quant:
            expect(p + "self_attn.fused_qkv_a_proj.weight", fused_q, quant)
        if layer < config["first_k_dense_replace"]:
            if float_quant:
                expect(p + "mlp.gate_up_proj.weight",
                       np.concatenate([ref[h + "mlp.gate_proj.weight"], ref[h + "mlp.up_proj.weight"]]), quant)
                expect(p + "mlp.down_proj.weight", ref[h + "mlp.down_proj.weight"], quant)
            else:
                expect(p + "mlp.down_proj.qweight", ref[h + "mlp.down_proj.weight"], quant)
            continue
        expect(p + "mlp.gate.weight", ref[h + "mlp.gate.weight"], "F32")
        expect(p + "mlp.gate.e_score_correction_bias", ref[h + "mlp.gate.e_score_correction_bias"], "F32")
        experts = range(config["n_routed_experts"])
        w13 = np.stack([np.concatenate([ref[f"{h}mlp.experts.{e}.gate_proj.weight"],
                                        ref[f"{h}mlp.experts.{e}.up_proj.weight"]]) for e in experts])
        w2 = np.stack([ref[f"{h}mlp.experts.{e}.down_proj.weight"] for e in experts])
        # float experts are re-quantized to Q8_0 at load (vLLM 0.23 runs only quantized GGUF experts)
        expect(p + "mlp.experts.w13_qweight", w13, quant)
        expect(p + "mlp.experts.w2_qweight", w2, quant)
        down = p + "mlp.shared_experts.down_proj." + ("weight" if float_quant else "qweight")
        expect(down, ref[h + "mlp.shared_experts.down_proj.weight"], quant)
    expect("model.norm.weight", ref["model.norm.weight"], "F32")
    for name, src in (("model.embed_tokens", "model.embed_tokens.weight"), ("lm_head", "lm_head.weight")):
        expect(name + (".weight" if float_quant else ".qweight"), ref[src], quant)
    assert len(checked) > 20 * config["num_hidden_layers"] // 2


def test_split_file_loads_exactly_like_one_file(loaded):
    single = dict(np.load(loaded["Q4_K"][1]))
    split = dict(np.load(loaded["Q4_K-split3"][1]))
    assert single.keys() == split.keys()
    for name in single:
        np.testing.assert_array_equal(single[name], split[name], err_msg=name)
