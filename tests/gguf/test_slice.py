"""make-slice: random GLM-5 slices at the real sizes (glm5_shim.gguf.slice).

One file is written for the module: a --rank-of 8 slice of 2 layers (1 dense + 1 MoE) with the MTP block, Q4_K_M
(~1.8 GB); a 1-layer UD-IQ2_M-like one goes through the command line.  Everything else checks plans (no data).
The rank-of-8 file also goes through vLLM's loader on the CPU (tests/vllm_cpu_harness.py), and what vLLM holds is
compared with the file's bytes.
"""
from __future__ import annotations

import json
import math
import re

import gguf
import numpy as np
import pytest

from glm5_shim.gguf import build_hf_config, open_gguf, rebuild_kv_b
from glm5_shim.gguf.fixture import GLM5_SIZES, hf_to_gguf_shapes, hf_to_gguf_tensors, hf_weight_shapes, \
    random_hf_weights, tiny_hf_config, tiny_tokenizer
from glm5_shim.gguf.llama_tools import PRESET_FILE_TYPES, quantize_types
from glm5_shim.gguf.slice import SCALE_FIELDS, SUPPORTED_TYPES, RandomBlocks, make_slice, plan_slice, rank_config
from glm5_shim.gguf.slice.blocks import block_geometry, calibration
from glm5_shim.gguf.tensor_map import TP_COLUMN, TP_REPLICATED, TP_ROW, build_tensor_map
from glm5_shim.gguf.validate import validate

from tests.gguf.test_real_glm5_scale import GLM5

PRESETS_ASKED = ("Q4_K_M", "Q8_0", "Q2_K", "Q3_K_M", "UD-IQ2_M-like")


def _dequantize(raw: np.ndarray, type_name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).astype(np.float64)


# -- blocks ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name", sorted(SCALE_FIELDS))
def test_the_scale_fields_are_exactly_the_fp16_multipliers(type_name):
    """With every listed field zero, random codes dequantize to 0; with d = 1 and then 2 (min = 0), the values
    double: the listed fields are what scales the codes, and no unlisted fp16 field multiplies anything."""
    qtype = gguf.GGMLQuantizationType[type_name]
    _, size = block_geometry(type_name)
    codes = np.random.default_rng(1).integers(0, 256, (512, size), dtype=np.uint8)
    for offset, _ in SCALE_FIELDS[type_name]:
        codes[:, offset:offset + 2] = 0
    assert not np.any(gguf.quants.dequantize(codes, qtype))
    d_offset = next(offset for offset, role in SCALE_FIELDS[type_name] if role == "d")
    ones, twos = codes.copy(), codes.copy()
    ones[:, d_offset:d_offset + 2] = np.full((512, 1), 1.0, np.float16).view(np.uint8)
    twos[:, d_offset:d_offset + 2] = np.full((512, 1), 2.0, np.float16).view(np.uint8)
    one, two = gguf.quants.dequantize(ones, qtype), gguf.quants.dequantize(twos, qtype)
    assert np.any(one) and np.array_equal(2 * one, two)


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
def test_random_blocks_have_the_intended_magnitude(type_name):
    blocks = RandomBlocks(seed=3, pool_bytes=8 << 20, chunk_bytes=1 << 20)
    n = 256 * 8192
    std = 1 / math.sqrt(6144)
    data = np.concatenate([c.copy() for c in blocks.chunks(type_name, n, std)])
    if type_name in ("F32", "F16", "BF16"):
        values = np.frombuffer(data.tobytes(), {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[type_name])
        values = (values.astype(np.uint32) << 16).view(np.float32) if type_name == "BF16" else values
    else:
        values = _dequantize(data.reshape(-1, block_geometry(type_name)[1]), type_name)
    assert values.size == n and np.all(np.isfinite(values))
    assert 0.95 * std < values.std() < 1.05 * std, (type_name, values.std() / std)
    assert abs(values.mean()) < 0.12 * std, (type_name, values.mean() / std)  # Q4_0: codes q - 8 average -0.5


def test_random_blocks_leave_the_pool_as_it_was():
    blocks = RandomBlocks(seed=0, pool_bytes=1 << 20, chunk_bytes=1 << 16)
    before = blocks.pool.copy()
    for type_name in ("Q4_K", "Q6_K", "Q8_0", "IQ2_XXS"):
        for _ in blocks.chunks(type_name, 256 * 4096, 0.01):
            pass
    assert np.array_equal(blocks.pool, before)
    assert calibration("Q4_K")[1] == pytest.approx(7.5, rel=0.02)  # dmin / d: mean of 6-bit scales x q = mins x 7.5


# -- plans -------------------------------------------------------------------------------------------------------

def test_glm5_sizes_are_the_notes():
    """GLM5_SIZES: the config values of ../shared/notes/glm5-gguf-format.md section 1 (tests/gguf/
    test_real_glm5_scale.GLM5), and glm5_hf_config is tiny_hf_config's set of fields at those sizes."""
    for key, value in GLM5.items():
        assert GLM5_SIZES.get(key, value) == value, key
    assert (GLM5_SIZES["index_topk"], GLM5_SIZES["num_experts_per_tok"], GLM5_SIZES["max_position_embeddings"]) == \
        (2048, 8, 202752)
    plan = plan_slice(4, 1, "Q4_K_M", mtp=True)
    tiny = tiny_hf_config(layers=4, heads=4, index_heads=4, index_topk=64, mtp=True, tokenizer=tiny_tokenizer())
    assert plan.config.keys() == tiny.keys()
    for key in GLM5_SIZES.keys() - {"num_hidden_layers", "first_k_dense_replace"}:
        assert plan.config[key] == GLM5_SIZES[key], key
    assert plan.config["moe_layer_freq"] == GLM5["moe_layer_freq"]
    assert (plan.config["num_hidden_layers"], plan.config["first_k_dense_replace"],
            plan.config["num_nextn_predict_layers"]) == (4, 1, 1)


def test_shapes_and_names_are_the_converters():
    """Full width: every name and shape of the notes' table, and the same set as the shim's own tensor table
    (tensor_map, written independently from llama.cpp's layout)."""
    plan = plan_slice(4, 1, "Q4_K_M", mtp=True)
    shapes = {t.name: t.shape for t in plan.tensors}
    expected = {  # numpy order = reversed GGUF ne of the notes' table
        "token_embd.weight": (154880, 6144), "output.weight": (154880, 6144), "output_norm.weight": (6144,),
        "blk.0.attn_q_a.weight": (2048, 6144), "blk.0.attn_q_b.weight": (16384, 2048),
        "blk.0.attn_kv_a_mqa.weight": (576, 6144), "blk.0.attn_k_b.weight": (64, 512, 192),
        "blk.0.attn_v_b.weight": (64, 256, 512), "blk.0.attn_output.weight": (6144, 16384),
        "blk.0.indexer.attn_q_b.weight": (4096, 2048), "blk.0.indexer.attn_k.weight": (128, 6144),
        "blk.0.indexer.proj.weight": (32, 6144), "blk.0.indexer.k_norm.bias": (128,),
        "blk.0.ffn_gate.weight": (12288, 6144), "blk.0.ffn_down.weight": (6144, 12288),
        "blk.1.ffn_gate_inp.weight": (256, 6144), "blk.1.exp_probs_b.bias": (256,),
        "blk.1.ffn_gate_exps.weight": (256, 2048, 6144), "blk.3.ffn_down_exps.weight": (256, 6144, 2048),
        "blk.3.ffn_up_shexp.weight": (2048, 6144), "blk.3.ffn_down_shexp.weight": (6144, 2048),
        "blk.4.nextn.eh_proj.weight": (6144, 12288), "blk.4.nextn.shared_head_norm.weight": (6144,),
        "blk.4.ffn_up_exps.weight": (256, 2048, 6144),
    }
    for name, shape in expected.items():
        assert shapes[name] == shape, name
    assert "blk.1.ffn_gate.weight" not in shapes and "blk.0.ffn_gate_exps.weight" not in shapes
    table = build_tensor_map(plan.config)
    written = {s.gguf_name: s.shape for s in table if s.required or s.gguf_name == "output.weight"}
    assert shapes == written
    # 3 global + 18 per dense block + 23 per MoE block + 27 in the MTP block (the notes' count for GLM-5: 1809)
    assert len(plan.tensors) == 3 + 18 + 3 * 23 + 27


def test_hf_to_gguf_shapes_is_the_converter_on_shapes():
    config = tiny_hf_config(layers=3, heads=4, index_heads=4, index_topk=64, mtp=True, tokenizer=tiny_tokenizer())
    tensors = hf_to_gguf_tensors(random_hf_weights(config, 0), config)
    shapes = hf_to_gguf_shapes(hf_weight_shapes(config), config)
    assert list(shapes) == list(tensors) and shapes == {n: a.shape for n, a in tensors.items()}


def _divided_axis(name: str, split: str, ndim: int) -> int | None:
    if split == TP_REPLICATED:
        return None
    if split == TP_ROW:
        return ndim - 1
    return 1 if ndim == 3 and "_exps." in name else 0  # column: output rows (k_b/v_b: heads; experts: width)


def test_rank_of_8_divides_what_vllm_splits_and_keeps_the_rest():
    """--rank-of 8 against the full-width plan: each tensor the tensor table marks column- or row-parallel (from
    vLLM 0.23's deepseek_v2.py) has that axis divided by 8, every replicated one (norms, q_a/kv_a, the DSA
    indexer, the router, eh_proj) is whole; the types are the whole model's."""
    full = plan_slice(2, 1, "Q4_K_M", mtp=True)
    rank = plan_slice(2, 1, "Q4_K_M", mtp=True, rank_of=8)
    assert [t.name for t in rank.tensors] == [t.name for t in full.tensors]
    table = build_tensor_map(full.config)
    for f, r in zip(full.tensors, rank.tensors):
        axis = _divided_axis(f.name, table[f.name].tp_split, len(f.shape))
        expected = list(f.shape)
        if axis is not None:
            expected[axis] //= 8
        assert list(r.shape) == expected, (f.name, table[f.name].tp_split)
        assert r.type_name == f.type_name and r.std == f.std, f.name
    replicated = {t.name for t in rank.tensors if table[t.name].tp_split == TP_REPLICATED and len(t.shape) == 2}
    assert {"blk.0.attn_q_a.weight", "blk.0.attn_kv_a_mqa.weight", "blk.0.indexer.attn_q_b.weight",
            "blk.0.indexer.attn_k.weight", "blk.0.indexer.proj.weight", "blk.1.ffn_gate_inp.weight",
            "blk.2.nextn.eh_proj.weight"} <= replicated
    assert {t.name for t in rank.tensors if table[t.name].tp_split == TP_COLUMN and len(t.shape) == 2} >= \
        {"token_embd.weight", "output.weight", "blk.0.attn_q_b.weight", "blk.0.ffn_gate.weight"}
    c = rank.config
    assert (c["num_attention_heads"], c["intermediate_size"], c["moe_intermediate_size"], c["vocab_size"],
            c["hidden_size"], c["index_n_heads"], c["n_routed_experts"], c["q_lora_rank"]) == \
        (8, 1536, 256, 19360, 6144, 32, 256, 2048)
    assert len(rank.tokenizer.tokens) == 19360


def test_rank_of_refuses_what_vllm_would_refuse():
    with pytest.raises(ValueError, match="not divisible by 3"):
        plan_slice(1, 1, "Q4_K_M", rank_of=3)
    with pytest.raises(ValueError, match="ffn_down_exps.weight keeps Q6_K.*whole blocks of 256"):
        plan_slice(1, 0, "Q4_K_M", rank_of=16)


# The preset tables: the type of each tensor kind in a 4-layer slice (1 dense) with the MTP block, as
# "type" or {block: type}.  llama-quantize's presets come from llama_tools.quantize_types (checked against the real
# tool in tests/gguf/test_llama_tools_real.py); UD-IQ2_M-like is fixture.tensor_types.OVERRIDE_PRESETS.
_F32 = {k: "F32" for k in ("output_norm", "attn_norm", "ffn_norm", "attn_q_a_norm", "attn_kv_a_norm",
                            "indexer.k_norm", "indexer.k_norm.bias", "ffn_gate_inp", "exp_probs_b.bias",
                            "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")}
_QUANTIZED = ("token_embd", "output", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_k_b", "attn_v_b", "attn_output",
              "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "ffn_gate", "ffn_up", "ffn_down",
              "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
              "nextn.eh_proj")


def _table(base: str, **types) -> dict:
    return {**_F32, **{k: base for k in _QUANTIZED}, **types}


PRESET_TABLES = {
    # llama-quantize counts 5 blocks here (4 + MTP): ffn_down* of blocks 2 and 4 get more bits in *_M mixes
    "Q4_K_M": _table("Q4_K", output="Q6_K", attn_k_b="Q5_0", ffn_down_exps={1: "Q4_K", 2: "Q6_K", 3: "Q4_K", 4: "Q6_K"},
                     ffn_down_shexp={1: "Q4_K", 2: "Q6_K", 3: "Q4_K", 4: "Q6_K"}),
    "Q8_0": _table("Q8_0"),
    "Q2_K": _table("Q2_K", output="Q6_K", attn_k_b="Q4_0", attn_output="Q3_K", ffn_down="Q3_K", ffn_down_exps="Q3_K",
                   ffn_down_shexp="Q3_K"),
    "Q3_K_M": _table("Q3_K", output="Q6_K", attn_k_b="Q4_0", attn_output="Q4_K", ffn_down="Q4_K",
                     ffn_down_exps="Q4_K", ffn_down_shexp="Q4_K"),
    "UD-IQ2_M-like": _table("Q4_K", output="Q6_K", attn_k_b="Q8_0", attn_v_b="Q8_0", attn_output="Q5_K",
                            ffn_down="Q6_K", ffn_down_shexp="Q6_K", ffn_gate_exps="IQ2_XXS", ffn_up_exps="IQ2_XXS",
                            ffn_down_exps="IQ2_S", **{"indexer.attn_q_b": "Q8_0", "indexer.attn_k": "Q8_0",
                                                      "indexer.proj": "Q8_0"}),
}


def _kind(name: str) -> str:
    kind = re.sub(r"^blk\.\d+\.", "", name)
    return kind[:-len(".weight")] if kind.endswith(".weight") else kind


@pytest.mark.parametrize("preset", PRESETS_ASKED)
def test_preset_tables(preset):
    plan = plan_slice(4, 1, preset, mtp=True)
    for t in plan.tensors:
        want = PRESET_TABLES[preset][_kind(t.name)]
        if isinstance(want, dict):
            want = want[int(t.name.split(".")[1])]
        assert t.type_name == want, (preset, t.name)
    if preset in PRESET_FILE_TYPES:  # and the same as llama_tools.quantize_types on the converter's BF16 file
        source = {t.name: ("F32" if t.type_name == "F32" else "BF16", t.shape) for t in plan.tensors}
        assert quantize_types(source, preset, n_layers_all=5, n_experts=256, n_gqa=64) == \
            {t.name: t.type_name for t in plan.tensors}


def test_tensor_orders():
    quantize = [t.name for t in plan_slice(2, 1, "Q4_K_M", mtp=True).tensors]
    converter = [t.name for t in plan_slice(2, 1, "Q4_K_M", mtp=True, order="converter").tensors]
    assert sorted(quantize) == sorted(converter) and quantize != converter
    assert quantize[:3] == ["output.weight", "output_norm.weight", "token_embd.weight"]  # globals first, sorted
    # the converter: HF names sorted; kv_a before q_a; a layer's experts when its last expert arrives: down, gate, up
    assert converter.index("blk.0.attn_kv_a_mqa.weight") < converter.index("blk.0.attn_q_a.weight")
    exps = [n for n in converter if n.startswith("blk.1.ffn_") and n.endswith("_exps.weight")]
    assert exps == ["blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight"]


# -- a written rank-of-8 slice -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rank8(tmp_path_factory):
    path = tmp_path_factory.mktemp("slice") / "glm5-2L-Q4_K_M-rank8.gguf"
    return make_slice(path, 2, 1, "Q4_K_M", mtp=True, rank_of=8, seed=7)


def test_write_speed_is_reported(rank8, capsys):
    assert rank8.nbytes == rank8.plan.nbytes == rank8.path.stat().st_size - _data_offset(rank8.path) - _padding(rank8)
    with capsys.disabled():
        print(f"\nmake-slice: {rank8.summary()}")


def _data_offset(path) -> int:
    return gguf.GGUFReader(path).data_offset


def _padding(result) -> int:
    return sum(-t.nbytes % 32 for t in result.plan.tensors)


def test_file_tensors_are_the_plan(rank8):
    reader = gguf.GGUFReader(rank8.path)
    got = [(t.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type.name) for t in reader.tensors]
    assert got == [(t.name, t.shape, t.type_name) for t in rank8.plan.tensors]


def test_metadata(rank8):
    model = open_gguf(rank8.path)
    md = model.metadata
    a = "glm-dsa."
    expected = {
        a + "block_count": 3, a + "leading_dense_block_count": 1, a + "nextn_predict_layers": 1,
        a + "embedding_length": 6144, a + "attention.head_count": 8, a + "attention.head_count_kv": 1,
        a + "feed_forward_length": 1536, a + "expert_feed_forward_length": 256, a + "expert_count": 256,
        a + "expert_used_count": 8, a + "expert_shared_count": 1, a + "vocab_size": 19360,
        a + "attention.q_lora_rank": 2048, a + "attention.kv_lora_rank": 512, a + "attention.key_length": 576,
        a + "attention.value_length": 512, a + "attention.key_length_mla": 256, a + "attention.value_length_mla": 256,
        a + "rope.dimension_count": 64, a + "attention.indexer.head_count": 32, a + "attention.indexer.key_length": 128,
        a + "attention.indexer.top_k": 2048, a + "context_length": 202752, a + "expert_gating_func": 2,
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_K_M), "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "glm4", "glm5_shim.slice.tp_rank_of": 8, "glm5_shim.slice.layers": 2,
        "glm5_shim.slice.dense_layers": 1, "glm5_shim.slice.mtp": True, "glm5_shim.slice.preset": "Q4_K_M",
    }
    for key, value in expected.items():
        assert md[key] == value, key
    assert "rank of 8" in md["general.description"] and "rank-of-8" in md["general.name"]
    assert len(md["tokenizer.ggml.tokens"]) == len(md["tokenizer.ggml.token_type"]) == 19360
    for key in ("merges", "bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "padding_token_id"):
        assert "tokenizer.ggml." + key in md
    assert md["tokenizer.chat_template"].startswith("[gMASK]<sop>")
    config = build_hf_config(model)
    assert (config["num_hidden_layers"], config["first_k_dense_replace"], config["num_attention_heads"]) == (2, 1, 8)


def test_validator_inspect_and_tokenizer_accept_it(rank8, capsys):
    from glm5_shim.cli import main
    from glm5_shim.gguf.tokenizer import build_hf_tokenizer

    assert validate(rank8.path) == []
    assert main(["inspect", str(rank8.path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == [] and report["config"]["num_attention_heads"] == 8
    tokenizer = build_hf_tokenizer(rank8.path)
    assert len(tokenizer) == 19360
    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    assert ids and tokenizer.decode(ids) == "Hello world"


def test_every_tensor_dequantizes_to_its_magnitude(rank8):
    reader = gguf.GGUFReader(rank8.path)
    plan = {t.name: t for t in rank8.plan.tensors}
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        t = plan[tensor.name]
        if t.type_name == "F32":
            values = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
        else:
            raw = np.asarray(tensor.data).reshape(-1, block_geometry(t.type_name)[1])
            picks = np.sort(rng.choice(len(raw), min(len(raw), 4096), replace=False))
            values = _dequantize(raw[picks], t.type_name)
        assert np.all(np.isfinite(values)), t.name
        # sampling error (4 standard errors) on top of the generator's own (RandomBlocks test: 5% / 0.12 std)
        noise = 4 / math.sqrt(values.size)
        assert abs(values.std() / t.std - 1) < 0.05 + noise / math.sqrt(2), (t.name, t.type_name, values.std())
        assert abs(values.mean() - t.mean) < (0.12 + noise) * t.std, (t.name, t.type_name, values.mean())


def test_make_slice_command_line(tmp_path, capsys):
    from glm5_shim.cli import main

    out = tmp_path / "ud.gguf"
    assert main(["make-slice", str(out), "--layers", "1", "--dense-layers", "0", "--preset", "UD-IQ2_M-like",
                 "--rank-of", "8", "--quiet"]) == 0
    assert re.search(r"GB of tensor data written in .* GB/s", capsys.readouterr().out)
    assert validate(out) == []
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert (types["blk.0.ffn_gate_exps.weight"], types["blk.0.ffn_down_exps.weight"]) == ("IQ2_XXS", "IQ2_S")
    assert open_gguf(out).metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_IQ2_M)
    assert main(["make-slice", str(tmp_path / "bad.gguf"), "--layers", "1", "--dense-layers", "2",
                 "--preset", "Q4_K_M"]) == 2


def test_rank_config_is_what_vllm_builds_per_rank():
    full = plan_slice(1, 1, "Q8_0").config
    assert rank_config(full, 1) == full
    assert rank_config(full, 4)["num_key_value_heads"] == 16


# -- through vLLM's loader on the CPU ----------------------------------------------------------------------------

@pytest.mark.slow
def test_rank_of_8_slice_loads_through_vllms_loader(rank8, tmp_path):
    """The rank-of-8 slice (1 dense + 1 MoE layer; the MTP block is skipped by the loader) through vLLM 0.23's
    GGUF loader with the shim, on the CPU; what vLLM holds equals the file (raw blocks, or the float weights the
    loader makes)."""
    from tests.helpers import load_in_cpu_harness

    (result,) = load_in_cpu_harness(tmp_path / "out", [rank8.path])
    assert result["ok"], result
    assert result["tokenizer"]["vocab"] == 19360
    params = dict(np.load(tmp_path / "out" / "0.npz"))
    reader = gguf.GGUFReader(rank8.path)
    raw = {t.name: np.asarray(t.data) for t in reader.tensors}
    floats = {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) for t in reader.tensors
              if t.name.endswith(("attn_k_b.weight", "attn_v_b.weight", "indexer.attn_k.weight",
                                  "indexer.proj.weight"))}

    vocab = 19360  # vLLM pads each rank's rows to a multiple of 64 (19392); the padding is never sampled
    assert np.array_equal(params["model.embed_tokens.qweight"][:vocab], raw["token_embd.weight"])
    assert np.array_equal(params["lm_head.qweight"][:vocab], raw["output.weight"])
    w13 = params["model.layers.1.mlp.experts.w13_qweight"]
    assert np.array_equal(w13[:, :256], raw["blk.1.ffn_gate_exps.weight"])
    assert np.array_equal(w13[:, 256:], raw["blk.1.ffn_up_exps.weight"])
    assert np.array_equal(params["model.layers.1.mlp.experts.w2_qweight"], raw["blk.1.ffn_down_exps.weight"])
    assert np.array_equal(params["model.layers.0.mlp.down_proj.qweight"], raw["blk.0.ffn_down.weight"])
    assert np.array_equal(params["model.layers.1.mlp.gate.weight"], raw["blk.1.ffn_gate_inp.weight"])
    assert np.array_equal(params["model.layers.0.input_layernorm.weight"], raw["blk.0.attn_norm.weight"])
    config = rank8.plan.config
    for layer in (0, 1):
        kv_b = rebuild_kv_b(floats[f"blk.{layer}.attn_k_b.weight"], floats[f"blk.{layer}.attn_v_b.weight"], config)
        np.testing.assert_allclose(params[f"model.layers.{layer}.self_attn.kv_b_proj.weight"], kv_b, rtol=1e-6)
        wk = np.concatenate([floats[f"blk.{layer}.indexer.attn_k.weight"], floats[f"blk.{layer}.indexer.proj.weight"]])
        np.testing.assert_allclose(params[f"model.layers.{layer}.self_attn.indexer.wk_weights_proj.weight"], wk,
                                   rtol=1e-6)
    assert not any(name.startswith("model.layers.2.") for name in params)  # the MTP block is skipped


def test_peaked_slice_passes_the_embedding_through_its_mtp_layer(tmp_path):
    """make-slice --peaked (for MTP's speed where a step is GPU time): the token embedding at RMS PEAKED_GAIN, the
    final and MTP-side norms exactly 1, eh_proj an F16 PEAKED_GAIN x [identity | 0]; every other tensor as the random
    slice's; the file validates.  --peaked without --mtp is refused."""
    from glm5_shim.cli import main
    from glm5_shim.gguf.slice.plan import PEAKED_GAIN

    out = tmp_path / "peaked.gguf"
    assert main(["make-slice", str(out), "--layers", "1", "--dense-layers", "1", "--preset", "Q4_K_M",
                 "--rank-of", "8", "--mtp", "--peaked", "--quiet"]) == 0
    assert validate(out) == []
    reader = gguf.GGUFReader(out)
    tensors = {t.name: t for t in reader.tensors}
    eh = tensors["blk.1.nextn.eh_proj.weight"]
    assert eh.tensor_type.name == "F16"
    eh = np.asarray(eh.data).reshape(6144, 12288)
    n = eh.shape[0]
    assert np.count_nonzero(eh) == n and np.all(eh[np.arange(n), np.arange(n)] == PEAKED_GAIN)
    for name in ("output_norm.weight", "blk.1.nextn.enorm.weight", "blk.1.nextn.shared_head_norm.weight"):
        assert np.all(np.asarray(tensors[name].data) == 1.0), name
    assert np.asarray(tensors["blk.1.nextn.hnorm.weight"].data).std() > 0.05   # not made unit: eh_proj ignores it
    emb = tensors["token_embd.weight"]
    raw = np.asarray(emb.data).reshape(-1, block_geometry("Q4_K")[1])[:4096]
    assert abs(_dequantize(raw, "Q4_K").std() / PEAKED_GAIN - 1) < 0.1
    assert open_gguf(out).metadata["glm5_shim.slice.peaked"] is True
    random = {t.name: (t.shape, t.type_name) for t in plan_slice(1, 1, "Q4_K_M", mtp=True, rank_of=8).tensors}
    assert {t.name: (t.shape, t.type_name) for t in plan_slice(1, 1, "Q4_K_M", mtp=True, rank_of=8, peaked=True).tensors
            } == {**random, "blk.1.nextn.eh_proj.weight": ((6144, 12288), "F16")}
    assert main(["make-slice", str(tmp_path / "bad.gguf"), "--layers", "1", "--dense-layers", "1",
                 "--preset", "Q4_K_M", "--peaked"]) == 2


# -- --shared-data: full depth in a file of a few GB, and its plain copy for llama.cpp ------------------------------

def _layer_suffix(name: str) -> str:
    return name.split(".", 2)[2]


def test_full_depth_shared_plan_is_the_plain_model_with_few_distinct_layers():
    """GLM-5's 78 layers + MTP at rank-of-8 Q4_K_M: the same tensors (names, shapes, types, order, magnitudes) as the
    plain plan; each sharing tensor points at an earlier layer's tensor of the same suffix, type, shape and magnitude,
    which owns its bytes; the MTP block and the first dense and MoE layers own theirs; the file holds a few GB of a
    model of more than 50."""
    plain = plan_slice(78, 3, "Q4_K_M", mtp=True, rank_of=8, peaked=True)
    shared = plan_slice(78, 3, "Q4_K_M", mtp=True, rank_of=8, peaked=True, shared_data=True)
    assert [dataclasses_replace_data_of(t) for t in shared.tensors] == plain.tensors
    by_name = {t.name: t for t in shared.tensors}
    sharers = [t for t in shared.tensors if t.data_of]
    for t in sharers:
        owner = by_name[t.data_of]
        assert not owner.data_of and _layer_suffix(owner.name) == _layer_suffix(t.name)
        assert int(owner.name.split(".")[1]) < int(t.name.split(".")[1])
        assert (owner.type_name, owner.shape, owner.std, owner.mean) == (t.type_name, t.shape, t.std, t.mean)
    owners_of_layer = {int(t.name.split(".")[1]) for t in sharers}
    assert owners_of_layer == set(range(78)) - set(shared.distinct_layers)
    assert {0, 3, 78} <= set(shared.distinct_layers) and len(shared.distinct_layers) <= 6
    assert not any(t.data_of for t in shared.tensors if t.name.startswith("blk.78."))
    assert shared.nbytes == plain.nbytes > 50e9 and shared.file_data_nbytes < 3e9


def dataclasses_replace_data_of(t):
    import dataclasses

    return dataclasses.replace(t, data_of="")


@pytest.fixture(scope="module")
def shared8(tmp_path_factory):
    """3 layers (1 dense + 2 MoE, the second pointing at the first's bytes), UD-IQ2_M-like, rank of 8 (~0.6 GB)."""
    path = tmp_path_factory.mktemp("shared") / "glm5-3L-IQ2M-rank8-shared.gguf"
    return make_slice(path, 3, 1, "UD-IQ2_M-like", rank_of=8, seed=5, shared_data=True)


def test_shared_file_points_layers_at_one_copy_and_passes_every_check(shared8, capsys):
    from glm5_shim.cli import main
    from glm5_shim.gguf.tokenizer import build_hf_tokenizer

    plan = shared8.plan
    assert plan.distinct_layers == [0, 1]
    reader = gguf.GGUFReader(shared8.path)
    tensors = {t.name: t for t in reader.tensors}
    assert [t.name for t in reader.tensors] == [t.name for t in plan.tensors]
    sharers = [t for t in plan.tensors if t.data_of]
    assert sharers and all(t.name.startswith("blk.2.") for t in sharers)
    assert len(sharers) == sum(t.name.startswith("blk.2.") for t in plan.tensors)
    for t in sharers:
        assert tensors[t.name].data_offset == tensors[t.data_of].data_offset
        assert np.array_equal(np.asarray(tensors[t.name].data), np.asarray(tensors[t.data_of].data))
    owned = sorted(int(tensors[t.name].data_offset) for t in plan.tensors if not t.data_of)
    assert len(set(owned)) == len(owned)   # owners do not overlap one another
    assert shared8.nbytes == plan.file_data_nbytes == plan.nbytes - sum(t.nbytes for t in sharers)
    assert shared8.path.stat().st_size == reader.data_offset + sum(-(-t.nbytes // 32) * 32 for t in plan.tensors
                                                                   if not t.data_of)
    assert open_gguf(shared8.path).metadata["glm5_shim.slice.shared_data"] is True
    assert validate(shared8.path) == []
    assert main(["inspect", str(shared8.path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == []
    assert report["shared_data"] == {"tensors": len(sharers), "tensor_bytes": plan.nbytes}
    assert main(["inspect", str(shared8.path)]) == 0
    assert f"shared data: {len(sharers)} tensors point at another tensor's bytes" in capsys.readouterr().out
    assert len(build_hf_tokenizer(shared8.path)) == 19360


def test_plain_copy_is_the_same_model_in_order(shared8, tmp_path, capsys):
    """--plain-copy-of: every tensor's own bytes, one after another in plan order (what llama.cpp's reader takes),
    equal to the shared file's; the metadata of a plain make-slice of the same arguments."""
    from glm5_shim.cli import main
    from glm5_shim.gguf.slice.writer import describe

    out = tmp_path / "plain.gguf"
    assert main(["make-slice", str(out), "--plain-copy-of", str(shared8.path), "--quiet"]) == 0
    assert f"{shared8.plan.nbytes / 1e9:.2f} GB of tensor data written" in capsys.readouterr().out
    src = {t.name: t for t in gguf.GGUFReader(shared8.path).tensors}
    reader = gguf.GGUFReader(out)
    expected_offset = reader.data_offset
    for t in reader.tensors:
        assert int(t.data_offset) == expected_offset, t.name
        expected_offset += -(-int(t.n_bytes) // 32) * 32
        assert t.tensor_type == src[t.name].tensor_type and list(t.shape) == list(src[t.name].shape)
        assert np.array_equal(np.asarray(t.data), np.asarray(src[t.name].data)), t.name
    assert out.stat().st_size == expected_offset
    assert len(reader.tensors) == len(src)
    plain_md, shared_md = open_gguf(out).metadata, open_gguf(shared8.path).metadata
    assert "glm5_shim.slice.shared_data" not in plain_md and "tensor data shared" not in plain_md["general.description"]
    assert plain_md["general.description"] == describe(plan_slice(3, 1, "UD-IQ2_M-like", rank_of=8))
    differ = {k for k in shared_md.keys() | plain_md.keys() if shared_md.get(k) != plain_md.get(k)}
    assert differ == {"glm5_shim.slice.shared_data", "general.description"}
    assert validate(out) == [] and open_gguf(out).shared_data() == (0, shared8.plan.nbytes)


def test_plain_copy_refuses_what_is_not_a_slice(tmp_path, capsys):
    from glm5_shim.cli import main
    from glm5_shim.gguf.fixture.writer import make_tiny

    tiny = tmp_path / "tiny.gguf"
    make_tiny(tiny, layers=2, mtp=False, write_reference=False)
    assert main(["make-slice", str(tmp_path / "x.gguf"), "--plain-copy-of", str(tiny)]) == 2
    assert "not a make-slice file (no glm5_shim.slice.layers" in capsys.readouterr().err
    assert main(["make-slice", str(tmp_path / "y.gguf"), "--preset", "Q4_K_M"]) == 2
    assert "make-slice needs --layers, --dense-layers (or --plain-copy-of)" in capsys.readouterr().err


@pytest.mark.slow
def test_shared_file_loads_every_layer_as_its_own_tensors_through_vllms_loader(shared8, tmp_path):
    """The --shared-data file through vLLM 0.23's GGUF loader with the shim, on the CPU: layer 2 (whose entries point
    at layer 1's bytes) gets parameters of its own, equal to the bytes its entries name; the model holds the full
    tensor bytes of three layers, not the file's two."""
    from tests.helpers import load_in_cpu_harness

    (result,) = load_in_cpu_harness(tmp_path / "out", [shared8.path])
    assert result["ok"], result
    params = dict(np.load(tmp_path / "out" / "0.npz"))
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(shared8.path).tensors}
    for layer in (1, 2):
        w13 = params[f"model.layers.{layer}.mlp.experts.w13_qweight"]
        assert np.array_equal(w13[:, :256], raw[f"blk.{layer}.ffn_gate_exps.weight"])
        assert np.array_equal(params[f"model.layers.{layer}.mlp.experts.w2_qweight"],
                              raw[f"blk.{layer}.ffn_down_exps.weight"])
        assert np.array_equal(params[f"model.layers.{layer}.mlp.gate.weight"], raw[f"blk.{layer}.ffn_gate_inp.weight"])
    layer_params = [k for k in params if k.startswith("model.layers.")]
    assert {k.split(".")[2] for k in layer_params} == {"0", "1", "2"}
    assert sorted(k.replace("layers.2.", "layers.1.") for k in layer_params if ".2." in k) == \
        sorted(k for k in layer_params if "layers.1." in k)
