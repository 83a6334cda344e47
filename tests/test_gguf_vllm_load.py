"""A tiny glm-dsa GGUF all the way through vLLM's loader on a CPU machine: config, tokenizer, model construction,
the weight stream, post-load processing — for every quant type the fixture generator writes, in the tensor order
llama.cpp's converter writes (attn_kv_a_mqa before attn_q_a), llama-quantize's, and the generator's old one.  The
loaded parameters are compared with the float weights the fixture started from; a quantized fused linear (q_a+kv_a,
gate+up) is read shard by shard in the order GGUFLinearMethod.apply concatenates them.

One child process loads every model of a group (vLLM imports once); the comparisons run here.  Besides the shim as
shipped, two groups switch one of its two fixes off (the loader's shard-order stream, the gguf-shard-order patch):
each fix alone must load llama.cpp's order right; with both off vLLM computes [kv_a | q_a] (the bug's premise).
"""
from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
import pytest

from glm5_shim.gguf.fixture import QUANT_TYPES, make_tiny, reference_dir
from tests.helpers import load_in_cpu_harness

# Max |dequantized - reference| / max|reference| per type (see tests/gguf/test_roundtrip.py for the derivation).
BOUND = {"F32": 0.0, "F16": 2**-11, "BF16": 2**-8, "Q8_0": 0.006, "Q6_K": 0.02, "Q5_0": 0.07, "Q4_K": 0.08,
         "Q4_0": 0.13}
# Types only llama-quantize's files have here (tests/gguf/test_llama_tools_real.py), whose references are decoded
# from the file itself: the loader must reproduce them up to float rounding, so these loose bounds (a few
# quantization steps) only leave room for the float weights the loader rebuilds (kv_b_proj, the indexer's).
BOUND.update({"Q4_1": 0.13, "Q5_1": 0.07, "Q5_K": 0.04, "Q3_K": 0.2, "Q2_K": 0.35, "IQ4_NL": 0.13, "IQ4_XS": 0.13,
              "IQ3_S": 0.25, "IQ3_XXS": 0.25, "IQ2_S": 0.4, "IQ2_XS": 0.4, "IQ2_XXS": 0.4, "IQ1_M": 0.6, "IQ1_S": 0.6})
# attn_k_b's last dim (192) does not fit 256-blocks: llama-quantize falls back (Q4_K → Q5_0, Q6_K → Q8_0).
KV_B_TYPE = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
# case → make_tiny arguments.  Plain type names are the converter's order (the generator's default).
CASES = {q: {"quant": q} for q in QUANT_TYPES}
CASES.update({
    "Q4_K-split3": {"quant": "Q4_K", "shards": 3},
    "Q4_K-legacy": {"quant": "Q4_K", "order": "legacy"},
    "Q8_0-legacy": {"quant": "Q8_0", "order": "legacy"},
    "Q4_K-quantize": {"quant": "Q4_K", "order": "quantize"},
    # llama-quantize presets: its per-tensor types (Q5_0, Q5_K, Q6_K, Q8_0 beside the base type) and its order;
    # "quant" is the base type, whose bound covers the float weights the loader rebuilds.
    "Q4_K_M": {"preset": "Q4_K_M", "quant": "Q4_K"},
    "Q2_K": {"preset": "Q2_K", "quant": "Q2_K"},
    # GLM-5.2: F F F S S S F (shared layers reuse the previous full layer's top-k and have no indexer weights), with
    # glm-dsa.attention.indexer.types; without it at a 1M context (llama.cpp's rule); and with indexer weights in the
    # shared layers anyway (as some published files have), which are ignored.
    "glm52-Q8_0": {"quant": "Q8_0", "layers": 7, "indexer_types": "glm52"},
    "glm52-nokey-Q4_K": {"quant": "Q4_K", "layers": 7, "indexer_types": "glm52", "indexer_types_key": False,
                         "context_length": 1 << 20},
    "glm52-extra-Q8_0": {"quant": "Q8_0", "layers": 7, "indexer_types": "glm52", "indexer_types_key": False,
                         "context_length": 1 << 20, "shared_indexer_weights": True},
})
GLM52_CASES = [c for c in CASES if c.startswith("glm52")]
# One fix at a time, and neither (harness switches, see tests/vllm_cpu_harness.py).
GROUPS = {
    "shipped": ({}, list(CASES)),
    "patch-only": ({"HARNESS_FILE_ORDER": "1"}, ["Q8_0", "Q4_K", "Q6_K", "Q4_K_M"]),
    "loader-only": ({"HARNESS_STOCK_SHARD_ORDER": "1"}, ["Q8_0", "Q4_K", "Q6_K", "Q4_K_M"]),
    "neither": ({"HARNESS_FILE_ORDER": "1", "HARNESS_STOCK_SHARD_ORDER": "1"}, ["Q8_0"]),
    "stock-indexer": ({"HARNESS_STOCK_INDEXER": "1"}, ["glm52-Q8_0"]),
}


def _run_group(root: pathlib.Path, env: dict, cases: list[str], paths: dict) -> dict:
    out = root / f"out-{len(list(root.glob('out-*')))}"
    results = load_in_cpu_harness(out, [paths[c] for c in cases], env)
    # the reference sits beside the name make_tiny was given (a split file's first shard has another name)
    return {case: (res, out / f"{i}.npz", root / f"tiny-{case}.gguf") for i, (case, res) in
            enumerate(zip(cases, results))}


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-load")
    paths = {case: make_tiny(root / f"tiny-{case}.gguf", seed=0, **kwargs)[0] for case, kwargs in CASES.items()}
    return {group: _run_group(root, env, cases, paths) for group, (env, cases) in GROUPS.items()}


@pytest.fixture(scope="module")
def loaded(groups):
    return groups["shipped"]


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


def _fused(params: dict, types: dict, name: str) -> np.ndarray:
    """A quantized fused linear's weight as GGUFLinearMethod.apply uses it: each shard's rows dequantized with its
    own type, concatenated in qweight.shard_id order."""
    rows = []
    for _, start, end, size, ggml_type in types[name]["shards"]:
        rows.append(_dequant(np.ascontiguousarray(params[name][start:end, :size]), ggml_type))
    return np.concatenate(rows)


def _shard_type(types: dict, name: str) -> str:
    """The loosest type among a fused linear's shards (its bound applies to the whole)."""
    names = [gguf.GGMLQuantizationType(s[-1]).name for s in types[name]["shards"]]
    return max(names, key=BOUND.get)


@pytest.mark.parametrize("case", [(g, c) for g, (_, cases) in GROUPS.items() if g not in ("neither", "stock-indexer")
                                  for c in cases],
                         ids=lambda gc: f"{gc[0]}-{gc[1]}")
def test_every_parameter_matches_the_reference(groups, case):
    group, case = case
    result, npz, gguf_path = groups[group][case]
    check_every_parameter(result, npz, gguf_path, CASES[case]["quant"], case)


def parameter_checker(result: dict, npz: pathlib.Path, case: str):
    """expect(name, reference, type_name): the loaded parameter `name` (dequantized as vLLM reads it) within the
    type's bound of `reference`; returns (expect, the set of names checked so far, the loaded parameters)."""
    params = dict(np.load(npz))
    types = result["types"]
    checked = set()

    def expect(name: str, reference: np.ndarray, type_name: str) -> None:
        if name.endswith("qweight") and isinstance(types[name], dict):
            value = _fused(params, types, name).reshape(reference.shape)
            type_name = _shard_type(types, name)
        elif name.endswith("qweight"):
            t = types[name]
            assert isinstance(t, int), (name, t)
            value = _dequant(params[name], t).reshape(reference.shape)
            type_name = gguf.GGMLQuantizationType(t).name
        else:
            value = params[name]
        _close(value, reference, type_name, f"{case}: {name}")
        checked.add(name)

    return expect, checked, params


def check_every_parameter(result: dict, npz: pathlib.Path, gguf_path: pathlib.Path, quant: str, case: str) -> None:
    """Every loaded parameter against `<stem>.reference/`; quant: the file's main type (its bounds)."""
    assert result["ok"], result
    assert result["model_type"] == "glm_moe_dsa" and result["tokenizer"]["vocab"] > 256
    ref = _reference(gguf_path)
    config = json.loads((reference_dir(gguf_path) / "config.json").read_text())
    expect, checked, params = parameter_checker(result, npz, case)
    float_quant = quant in ("F32", "F16", "BF16")
    shared_layers = [t == "shared" for t in config.get("indexer_types") or ["full"] * config["num_hidden_layers"]]
    for layer in range(config["num_hidden_layers"]):
        check_decoder_layer(expect, ref, config, layer, f"model.layers.{layer}.", quant, shared_layers[layer], params)
    expect("model.norm.weight", ref["model.norm.weight"], "F32")
    for name, src in (("model.embed_tokens", "model.embed_tokens.weight"), ("lm_head", "lm_head.weight")):
        expect(name + (".weight" if float_quant else ".qweight"), ref[src], quant)
    assert len(checked) > 20 * config["num_hidden_layers"] // 2


def check_decoder_layer(expect, ref: dict, config: dict, layer: int, p: str, quant: str, shared: bool = False,
                        params: dict | None = None) -> None:
    """The parameters of decoder layer `layer` (vLLM's names start with `p`: model.layers.N. in the trunk,
    model.layers.N.mtp_block. in the MTP draft) against the reference's model.layers.N.*; shared: a shared-indexer
    layer, which must hold no indexer parameter (among `params`)."""
    h = f"model.layers.{layer}."
    float_quant = quant in ("F32", "F16", "BF16")
    for norm in ("input_layernorm", "post_attention_layernorm", "self_attn.q_a_layernorm",
                 "self_attn.kv_a_layernorm") + (() if shared else ("self_attn.indexer.k_norm",)):
        expect(p + norm + ".weight", ref[h + norm + ".weight"], "F32")
    if shared:  # reuses the previous full layer's top-k: vLLM holds no indexer weights there
        assert not [n for n in params if n.startswith(p + "self_attn.indexer.")], (p, layer)
    else:
        expect(p + "self_attn.indexer.k_norm.bias", ref[h + "self_attn.indexer.k_norm.bias"], "F32")
    # kv_b_proj is rebuilt from attn_k_b/attn_v_b: the float weight vLLM absorbs into W_UK/W_UV
    # (attn_v_b keeps the requested type, attn_k_b may fall back: the looser bound of the two applies)
    expect(p + "self_attn.kv_b_proj.weight", ref[h + "self_attn.kv_b_proj.weight"],
           max(quant, KV_B_TYPE.get(quant, quant), key=BOUND.get))
    # wk and weights_proj are dequantized and fused (shard 0 = wk, shard 1 = weights_proj)
    if not shared:
        expect(p + "self_attn.indexer.wk_weights_proj.weight",
               np.concatenate([ref[h + "self_attn.indexer.wk.weight"],
                               ref[h + "self_attn.indexer.weights_proj.weight"]]), quant)
    for proj in ("self_attn.q_b_proj", "self_attn.o_proj") + (() if shared else ("self_attn.indexer.wq_b",)):
        expect(p + proj + (".weight" if float_quant else ".qweight"), ref[h + proj + ".weight"], quant)
    fused_q = np.concatenate([ref[h + "self_attn.q_a_proj.weight"], ref[h + "self_attn.kv_a_proj_with_mqa.weight"]])
    suffix = ".weight" if float_quant else ".qweight"
    expect(p + "self_attn.fused_qkv_a_proj" + suffix, fused_q, quant)
    if layer < config["first_k_dense_replace"]:
        expect(p + "mlp.gate_up_proj" + suffix,
               np.concatenate([ref[h + "mlp.gate_proj.weight"], ref[h + "mlp.up_proj.weight"]]), quant)
        expect(p + "mlp.down_proj" + suffix, ref[h + "mlp.down_proj.weight"], quant)
        return
    expect(p + "mlp.gate.weight", ref[h + "mlp.gate.weight"], "F32")
    expect(p + "mlp.gate.e_score_correction_bias", ref[h + "mlp.gate.e_score_correction_bias"], "F32")
    experts = range(config["n_routed_experts"])
    w13 = np.stack([np.concatenate([ref[f"{h}mlp.experts.{e}.gate_proj.weight"],
                                    ref[f"{h}mlp.experts.{e}.up_proj.weight"]]) for e in experts])
    w2 = np.stack([ref[f"{h}mlp.experts.{e}.down_proj.weight"] for e in experts])
    # float experts are re-quantized to Q8_0 at load (vLLM 0.23 runs only quantized GGUF experts)
    expect(p + "mlp.experts.w13_qweight", w13, quant)
    expect(p + "mlp.experts.w2_qweight", w2, quant)
    expect(p + "mlp.shared_experts.gate_up_proj" + suffix,
           np.concatenate([ref[h + "mlp.shared_experts.gate_proj.weight"],
                           ref[h + "mlp.shared_experts.up_proj.weight"]]), quant)
    expect(p + "mlp.shared_experts.down_proj" + suffix, ref[h + "mlp.shared_experts.down_proj.weight"], quant)


def test_split_file_loads_exactly_like_one_file(loaded):
    single = dict(np.load(loaded["Q4_K"][1]))
    split = dict(np.load(loaded["Q4_K-split3"][1]))
    assert single.keys() == split.keys()
    for name in single:
        np.testing.assert_array_equal(single[name], split[name], err_msg=name)


def test_without_either_fix_vllm_computes_kv_a_before_q_a(groups):
    """The premise of both fixes: fed llama.cpp's order (attn_kv_a_mqa first), stock vLLM 0.23 concatenates the
    quantized fused_qkv_a_proj as [kv_a | q_a] where the model splits [q_a | kv_a]."""
    result, npz, gguf_path = groups["neither"]["Q8_0"]
    assert result["ok"], result
    params, types, ref = dict(np.load(npz)), result["types"], _reference(gguf_path)
    h = "model.layers.0."
    name = h + "self_attn.fused_qkv_a_proj.qweight"
    assert [s[0] for s in types[name]["shards"]] == [1, 0]
    swapped = np.concatenate([ref[h + "self_attn.kv_a_proj_with_mqa.weight"], ref[h + "self_attn.q_a_proj.weight"]])
    _close(_fused(params, types, name), swapped, "Q8_0", "stock order")
    shipped, _, _ = groups["shipped"]["Q8_0"]
    assert [s[0] for s in shipped["types"][name]["shards"]] == [0, 1]


@pytest.mark.parametrize("case", GLM52_CASES)
def test_shared_indexer_layers_skip_topk_and_hold_nothing(loaded, case):
    """vLLM skips top-k exactly in GLM-5.2's shared layers, which hold no indexer weights and no indexer K cache (no
    KV memory), and read the one top-k buffer the full layers write."""
    result, _, gguf_path = loaded[case]
    config = json.loads((reference_dir(gguf_path) / "config.json").read_text())
    shared = [t == "shared" for t in config["indexer_types"]]
    assert shared == [False, False, False, True, True, True, False]
    layout = result["indexer_layout"]
    assert layout["index_topk_pattern"] == "FFFSSSF"
    layers = layout["layers"]
    assert [layer["skip_topk"] for layer in layers] == shared
    assert [layer["indexer"] for layer in layers] == ["SharedTopkIndexer" if s else "Indexer" for s in shared]
    assert [layer["indexer_params"] == 0 for layer in layers] == shared
    assert all(layer["shares_buffer"] for layer in layers)
    assert layout["indexer_k_caches"] == sorted(f"model.layers.{i}.self_attn.indexer.k_cache"
                                                for i, s in enumerate(shared) if not s)


def test_glm5_layers_all_run_their_indexer(loaded):
    layout = loaded["Q8_0"][0]["indexer_layout"]
    assert layout["index_topk_pattern"] is None
    assert [layer["skip_topk"] for layer in layout["layers"]] == [False] * 3
    assert all(layer["indexer"] == "Indexer" and layer["indexer_params"] > 0 for layer in layout["layers"])
    assert len(layout["indexer_k_caches"]) == 3


def test_without_the_shared_indexer_patch_shared_layers_are_left_uninitialised(groups):
    """The premise: stock vLLM 0.23 builds an Indexer in every layer; a GLM-5.2 file has no weights for the shared
    ones, and the shim's loader refuses to leave them uninitialised."""
    result, _, _ = groups["stock-indexer"]["glm52-Q8_0"]
    assert not result["ok"]
    assert "model.layers.3.self_attn.indexer" in result["error"], result["error"]
