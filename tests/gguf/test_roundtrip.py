"""Write a tiny model per quant type, read it back through the tensor map, compare with the reference."""

from __future__ import annotations

import numpy as np
import pytest

from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.dequant import dequantize
from glm5_shim.gguf.fixture import QUANT_TYPES
from glm5_shim.gguf.kv_b import rebuild_kv_b, split_kv_b
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.gguf.tensor_map import (ROLE_EXPERTS, ROLE_FORCE_FLOAT, ROLE_MTP, ROLE_NORMAL, ROLE_REBUILD_KV_B,
                                       build_tensor_map)

# Max |dequantized - reference| as a fraction of the tensor's max |reference|, from each format's step:
# Q8_0 d=amax/127 → ≤ d/2 (+ f16 scale); Q6_K sub-block step ≤ amax/31 → ≤ step/2; Q5_0 range -16..15 of
# d=amax/16 → ≤ d at the clipped end; Q4_K step (max-min)/15 ≤ 2amax/15 → ≤ amax/15 plus 6-bit scale/min
# rounding; Q4_0 range -8..7 of d=amax/8 → ≤ d.
QUANT_ERROR_BOUND = {"Q8_0": 0.006, "Q6_K": 0.02, "Q5_0": 0.07, "Q4_K": 0.08, "Q4_0": 0.13}


def _bf16_round(values: np.ndarray) -> np.ndarray:
    import torch
    return torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16).to(torch.float32).numpy()


def assert_matches(actual: np.ndarray, reference: np.ndarray, type_name: str, what: str) -> None:
    assert actual.shape == reference.shape, what
    assert actual.dtype == np.float32, what
    if type_name == "F32":
        np.testing.assert_array_equal(actual, reference, err_msg=what)
    elif type_name == "F16":
        np.testing.assert_array_equal(actual, reference.astype(np.float16).astype(np.float32), err_msg=what)
    elif type_name == "BF16":
        np.testing.assert_array_equal(actual, _bf16_round(reference), err_msg=what)
    else:
        bound = QUANT_ERROR_BOUND[type_name] * float(np.abs(reference).max())
        err = float(np.abs(actual - reference).max())
        assert err <= bound, f"{what} ({type_name}): max error {err:.3g} > bound {bound:.3g}"
        assert err > 0, f"{what} ({type_name}) is bit-exact, so it was not quantized"


def reference_for(spec, weights: dict[str, np.ndarray], config: dict) -> np.ndarray:
    """The float tensor a GGUF tensor was made from, rebuilt from the HF reference checkpoint."""
    base = spec.base_role
    if base == ROLE_EXPERTS:
        prefix, proj = spec.hf_name.split(".experts.0.")
        return np.stack([weights[f"{prefix}.experts.{e}.{proj}"] for e in range(config["n_routed_experts"])])
    if base == ROLE_REBUILD_KV_B:
        k_b, v_b = split_kv_b(weights[spec.hf_name], config, layer=spec.layer)
        return k_b if spec.gguf_name.endswith("attn_k_b.weight") else v_b
    return weights[spec.hf_name]


@pytest.mark.parametrize("quant", QUANT_TYPES)
def test_every_tensor_round_trips(tiny_by_quant, quant):
    tiny = tiny_by_quant(quant)
    model = open_gguf(tiny.path)
    config = build_hf_config(model)
    assert config == tiny.config
    tensor_map = build_tensor_map(config)
    weights = tiny.weights
    covered: set[str] = set()
    for info in model:
        spec = tensor_map[info.name]
        assert info.shape == spec.shape, info.name
        reference = reference_for(spec, weights, config)
        assert_matches(dequantize(info), reference, info.type_name, info.name)
        if spec.base_role == ROLE_EXPERTS:
            prefix, proj = spec.hf_name.split(".experts.0.")
            covered.update(f"{prefix}.experts.{e}.{proj}" for e in range(config["n_routed_experts"]))
        else:
            covered.add(spec.hf_name)
    # Every reference tensor is reachable through the map, MTP block included.
    assert covered == set(weights)


@pytest.mark.parametrize("quant", QUANT_TYPES)
def test_tensor_types_follow_llama_cpp_rules(tiny_by_quant, quant):
    model = open_gguf(tiny_by_quant(quant).path)
    for info in model:
        if len(info.shape) == 1 or info.name.endswith("ffn_gate_inp.weight"):
            assert info.type_name == "F32", info.name
        elif info.name.endswith("indexer.proj.weight") and quant in ("F16", "BF16", "Q8_0"):
            # convert_hf_to_gguf.py keeps the indexer's head-weight projection in F32 for its outtypes.
            assert info.type_name == "F32", info.name
        elif info.name.endswith("attn_k_b.weight"):
            # ne0 = 192 does not fit a 256-value K-quant block: llama-quantize's fallback.
            assert info.type_name == {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}.get(quant, quant), info.name
        else:
            assert info.type_name == quant, info.name


@pytest.mark.parametrize("quant", QUANT_TYPES)
def test_kv_b_rebuilt_from_k_b_and_v_b(tiny_by_quant, quant):
    tiny = tiny_by_quant(quant)
    model = open_gguf(tiny.path)
    config = build_hf_config(model)
    n_blocks = config["num_hidden_layers"] + config["num_nextn_predict_layers"]
    for layer in range(n_blocks):
        k_b = model.tensors[f"blk.{layer}.attn_k_b.weight"]
        v_b = model.tensors[f"blk.{layer}.attn_v_b.weight"]
        kv_b = rebuild_kv_b(dequantize(k_b), dequantize(v_b), config, layer=layer)
        reference = tiny.weights[f"model.layers.{layer}.self_attn.kv_b_proj.weight"]
        assert kv_b.shape == reference.shape == (config["num_attention_heads"] * (192 + 256), 512)
        if quant in ("F32", "F16", "BF16"):
            assert k_b.type_name == v_b.type_name == quant
            assert_matches(kv_b, reference, quant, f"kv_b layer {layer}")
        else:
            # k_b and v_b may differ in type (block-size fallback): check each half with its own bound.
            heads = config["num_attention_heads"]
            rebuilt = kv_b.reshape(heads, 448, 512)
            ref = reference.reshape(heads, 448, 512)
            assert_matches(np.ascontiguousarray(rebuilt[:, :192]), np.ascontiguousarray(ref[:, :192]),
                           k_b.type_name, f"kv_b k-part layer {layer}")
            assert_matches(np.ascontiguousarray(rebuilt[:, 192:]), np.ascontiguousarray(ref[:, 192:]),
                           v_b.type_name, f"kv_b v-part layer {layer}")


def test_roles_cover_the_loader_cases(q8):
    model = open_gguf(q8.path)
    config = build_hf_config(model)
    tensor_map = build_tensor_map(config)
    roles = {info.name: tensor_map[info.name].role for info in model}
    assert roles["blk.0.indexer.attn_k.weight"] == ROLE_FORCE_FLOAT
    assert tensor_map["blk.0.indexer.attn_k.weight"].hf_name == "model.layers.0.self_attn.indexer.wk.weight"
    assert tensor_map["blk.1.indexer.proj.weight"].hf_name == "model.layers.1.self_attn.indexer.weights_proj.weight"
    assert roles["blk.1.ffn_up_exps.weight"] == ROLE_EXPERTS
    assert tensor_map["blk.1.ffn_up_exps.weight"].hf_name == "model.layers.1.mlp.experts.0.up_proj.weight"
    assert tensor_map["blk.2.exp_probs_b.bias"].hf_name == "model.layers.2.mlp.gate.e_score_correction_bias"
    assert roles["blk.0.attn_k_b.weight"] == roles["blk.0.attn_v_b.weight"] == ROLE_REBUILD_KV_B
    mtp = [name for name, role in roles.items() if role == ROLE_MTP]
    assert mtp and all(name.startswith("blk.3.") for name in mtp)
    assert len(mtp) == 27  # a full MoE decoder block (23) + eh_proj, enorm, hnorm, shared_head_norm
    assert tensor_map["blk.3.nextn.eh_proj.weight"].hf_name == "model.layers.3.eh_proj.weight"
    assert tensor_map["blk.3.nextn.shared_head_norm.weight"].hf_name == "model.layers.3.shared_head.norm.weight"
    assert tensor_map["blk.3.ffn_gate_exps.weight"].base_role == ROLE_EXPERTS
    assert roles["token_embd.weight"] == roles["blk.0.attn_q_b.weight"] == ROLE_NORMAL
    # The name map for vLLM: normal + experts, no kv_b parts, no force-float, no MTP.
    name_map = tensor_map.gguf_to_hf()
    assert "blk.0.attn_k_b.weight" not in name_map and "blk.0.indexer.attn_k.weight" not in name_map
    assert not any(k.startswith("blk.3.") for k in name_map)
    assert len(model.tensors) == 3 + 18 + 2 * 23 + 27
