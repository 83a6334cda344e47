"""The loader's weight stream, without vLLM's model: every (name, tensor) it yields, dequantized, against the float
weights the fixture started from, for every quant type — plus the stream's shape: types before data, suffix-only
renames, MTP skipped, kv_b rebuilt, the indexer made float, float experts re-quantized."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from glm5_shim.loading.gguf_weights import iter_weights
from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.fixture import QUANT_TYPES, make_tiny, reference_dir
from glm5_shim.gguf.load_plan import plan_load
from glm5_shim.gguf.reader import open_gguf

BOUND = {"F32": 0.0, "F16": 2**-11, "BF16": 2**-8, "Q8_0": 0.006, "Q6_K": 0.02, "Q5_0": 0.07, "Q4_K": 0.08,
         "Q4_0": 0.13}


def _reference_for(name: str, ref: dict, config: dict) -> np.ndarray:
    if ".experts.0." in name:
        prefix, proj = name.split(".experts.0.")
        return np.stack([ref[f"{prefix}.experts.{e}.{proj}"] for e in range(config["n_routed_experts"])])
    return ref[name]


@pytest.mark.parametrize("quant", QUANT_TYPES)
def test_every_yielded_tensor_matches_the_reference(tmp_path, quant):
    from safetensors.numpy import load_file

    path = make_tiny(tmp_path / f"t-{quant}.gguf", quant=quant, layers=3)[0]
    ref = load_file(str(reference_dir(path) / "model.safetensors"))
    model = open_gguf(path)
    config = build_hf_config(model)
    plan = plan_load(model, config)
    stream = list(iter_weights(plan))
    names = [n for n, _ in stream]
    types = {n[: -len("qweight_type")] + "weight": int(t) for n, t in stream if n.endswith(".qweight_type")}
    first_data = next(i for i, n in enumerate(names) if not n.endswith("qweight_type"))
    assert all(not n.endswith("qweight_type") for n in names[first_data:]), "types must all come before data"
    assert not any("qweights_proj" in n or "qweight_types_proj" in n for n in names)  # suffix-only renames
    assert not any(n.startswith(f"model.layers.{config['num_hidden_layers']}.") for n in names)  # MTP skipped
    checked = 0
    for name, tensor in stream:
        if name.endswith("qweight_type"):
            continue
        if name.endswith(".qweight"):
            hf = name[: -len("qweight")] + "weight"
            qtype = gguf.GGMLQuantizationType(types[hf])
            value = gguf.quants.dequantize(tensor.numpy(), qtype).astype(np.float32)
            type_name = qtype.name
        else:
            hf, value = name, tensor.float().numpy()
            type_name = quant if quant in ("F32", "F16", "BF16") else "F32"
        expected = _reference_for(hf, ref, config)
        value = value.reshape(expected.shape)
        if ".kv_b_proj." in hf or ".indexer.wk." in hf or ".indexer.weights_proj." in hf:
            # made float from quantized parts (attn_k_b may fall back to a 32-block type)
            type_name = max(quant, {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}.get(quant, quant), key=BOUND.get)
        if ".experts." in hf and quant in ("F32", "F16", "BF16"):
            assert qtype.name == "Q8_0", hf  # vLLM 0.23 runs only quantized experts
            type_name = "Q8_0"
        err = float(np.abs(value.astype(np.float64) - expected).max())
        assert err <= BOUND[type_name] * float(np.abs(expected).max()), (hf, type_name, err)
        checked += 1
    assert checked >= 60
    rebuilt = [n for n in names if n.endswith("kv_b_proj.weight")]
    assert len(rebuilt) == config["num_hidden_layers"]
    if quant in ("F32",):  # exact float source: the rebuild is exact
        kv_b = dict(stream)["model.layers.0.self_attn.kv_b_proj.weight"].numpy()
        np.testing.assert_array_equal(kv_b, ref["model.layers.0.self_attn.kv_b_proj.weight"])


FUSED = {"self_attn.q_a_proj.weight": ("self_attn.fused_qkv_a_proj", 0),
         "self_attn.kv_a_proj_with_mqa.weight": ("self_attn.fused_qkv_a_proj", 1),
         "mlp.gate_proj.weight": ("mlp.gate_up_proj", 0), "mlp.up_proj.weight": ("mlp.gate_up_proj", 1),
         "mlp.shared_experts.gate_proj.weight": ("mlp.shared_experts.gate_up_proj", 0),
         "mlp.shared_experts.up_proj.weight": ("mlp.shared_experts.gate_up_proj", 1)}


@pytest.mark.parametrize("order", ["converter", "quantize", "legacy"])
@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_fused_members_arrive_together_in_shard_order(tmp_path, quant, order):
    """vLLM 0.23 concatenates a quantized fused linear's shards in arrival order: whatever the file's order
    (llama.cpp's writes attn_kv_a_mqa before attn_q_a), the stream yields each fused module's members one after
    the other, shard 0 first."""
    path = make_tiny(tmp_path / "t.gguf", quant=quant, layers=3, order=order, write_reference=False)[0]
    model = open_gguf(path)
    file_order = [info.name for info in model]
    if order != "legacy":
        assert file_order.index("blk.0.attn_kv_a_mqa.weight") < file_order.index("blk.0.attn_q_a.weight")
    data = [n for n, _ in iter_weights(plan_load(model, build_hf_config(model))) if not n.endswith("qweight_type")]
    members: dict[str, list[tuple[int, int]]] = {}
    for i, name in enumerate(data):
        base = name.replace(".qweight", ".weight")
        for suffix, (module, shard) in FUSED.items():
            if base.endswith(suffix):
                layer_prefix = base[: -len(suffix)]
                members.setdefault(layer_prefix + module, []).append((i, shard))
    assert len(members) == 3 + 1 + 2  # fused_qkv_a_proj in 3 layers, 1 dense gate_up, 2 MoE shared gate_up
    for module, arrivals in members.items():
        positions, shards = zip(*arrivals)
        assert shards == (0, 1), (module, arrivals)
        assert positions[1] == positions[0] + 1, (module, arrivals)
